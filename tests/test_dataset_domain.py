"""The "dataset" domain: rubric datasets on disk (the papers' setting) through the same trainer."""

import json
import os
import subprocess
import sys

import pytest

from configs import common, grpo
from rubric_rl.config import builders
from rubric_rl.envs.constraints import ConstraintDomain
from rubric_rl.rubrics.datasets import DatasetError, dump_tasks, load_tasks
from tests.launch_env import suite_xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEALTHBENCH = os.path.join(REPO, "tests", "data", "healthbench_sample.jsonl")


def _dataset_config(**dataset):
    c = grpo.get_config("smoke")
    c.domain.name = "dataset"
    c.domain.dataset.update(dataset)
    c.warmstart.steps = 0
    return c


def _split_fixture(directory):
    """The HealthBench fixture's two rows as <directory>/train.jsonl and test.jsonl."""
    first, second = [ln for ln in open(HEALTHBENCH) if ln.strip()]
    directory.mkdir(exist_ok=True)
    (directory / "train.jsonl").write_text(first)
    (directory / "test.jsonl").write_text(second)
    return str(directory)


def test_dataset_domain_loads_each_split_as_the_loader_does(tmp_path):
    d = _split_fixture(tmp_path / "hb")
    c = _dataset_config(format="healthbench", train=f"{d}/train.jsonl", heldout=f"{d}/test.jsonl")
    common.validate_config(c, num_devices=1)
    domain = builders.build_domain(c)
    assert domain.train == tuple(load_tasks(f"{d}/train.jsonl", format="healthbench"))
    assert domain.heldout == tuple(load_tasks(f"{d}/test.jsonl", format="healthbench"))
    assert domain.ood == () and domain.verify is None and domain.oracle is None
    assert any(c_.weight < 0 for t in domain.train for c_ in t.rubric)  # signed points kept
    c.domain.dataset.update(train=HEALTHBENCH, heldout="", limit=1)
    assert len(builders.build_domain(c).train) == 1


@pytest.mark.parametrize("heldout", ["test.jsonl", ""])
def test_a_directory_given_for_train_reads_only_its_train_split(tmp_path, heldout):
    # The probe: train=<dir> holding train.jsonl and test.jsonl, heldout=<dir>/test.jsonl
    # trained on the held-out task. A directory given for heldout reads its test split.
    d = _split_fixture(tmp_path / "hb")
    c = _dataset_config(format="healthbench", train=d, heldout=os.path.join(d, heldout))
    domain = builders.build_domain(c)
    assert [t.id for t in domain.train] == ["hb-0001"]
    assert [t.id for t in domain.heldout] == ["hb-0002"]
    (tmp_path / "hb" / "train.jsonl").rename(tmp_path / "hb" / "all.jsonl")
    with pytest.raises(ValueError, match=r"^config\.domain\.dataset\.train: directory .* 'train'"):
        builders.build_domain(c)


def test_directory_splits_take_the_first_name_present(tmp_path):
    d = _split_fixture(tmp_path / "hb")  # train.jsonl: hb-0001, test.jsonl: hb-0002
    (tmp_path / "hb" / "heldout.jsonl").write_text((tmp_path / "hb" / "test.jsonl").read_text())
    (tmp_path / "hb" / "test.jsonl").write_text("not read: heldout.jsonl comes first\n")
    other = _split_fixture(tmp_path / "other")  # another dataset's directory as the OOD split
    (tmp_path / "other" / "train.jsonl").write_text("never read\n")
    c = _dataset_config(format="healthbench", train=d, heldout=d, ood=other)
    domain = builders.build_domain(c)
    assert [t.id for t in domain.heldout] == ["hb-0002"]
    assert [t.id for t in domain.ood] == ["hb-0002"]


def test_train_heldout_overlap_is_an_error_naming_both_sources_and_ids(tmp_path):
    d = _split_fixture(tmp_path / "hb")
    c = _dataset_config(format="healthbench", train=HEALTHBENCH, heldout=f"{d}/test.jsonl")
    with pytest.raises(ValueError) as info:
        builders.build_domain(c)
    msg = str(info.value)
    assert msg.startswith("config.domain.dataset.heldout: 1 of its 1 task ids")
    assert f"config.domain.dataset.train={HEALTHBENCH!r}" in msg
    assert f"config.domain.dataset.heldout='{d}/test.jsonl'" in msg
    assert f"'hb-0002' (train {HEALTHBENCH}:3, heldout {d}/test.jsonl:1)" in msg
    c.domain.dataset.update(heldout="", ood=HEALTHBENCH)  # the OOD split as well
    with pytest.raises(ValueError, match="config.domain.dataset.ood: 2 of its 2 task ids"):
        builders.build_domain(c)


def test_dataset_domain_refuses_an_unregistered_rule_checker(tmp_path):
    # A misspelt checker failed every verdict of its criterion (judge failure rate 13-15 %,
    # nothing logged): now the build stops at that row and field.
    task = ConstraintDomain(0).tasks("train", 1)[0]
    rule = next(i for i, c_ in enumerate(task.rubric) if c_.verifier.checker == "cf_answer_is")
    path = str(tmp_path / "train.jsonl")
    dump_tasks([task], path)
    text = open(path).read()
    open(path, "w").write(text.replace('"cf_answer_is"', '"cf_answer_iz"'))
    c = _dataset_config(format="jsonl", train=path)
    with pytest.raises(DatasetError) as info:
        builders.build_domain(c)
    err = info.value
    field = f"rubric.criteria[{rule}].verifier.checker"
    assert (err.file, err.row, err.field) == (path, 1, field)
    assert "did you mean 'cf_answer_is'" in str(err)


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(format="nope"), "domain.dataset.format"),
        (dict(train=""), "domain.dataset.train"),
        (dict(heldout="/no/such/file.jsonl"), "domain.dataset.heldout"),
        (dict(limit=-1), "domain.dataset.limit"),
    ],
)
def test_dataset_domain_config_errors_name_the_field(change, field):
    c = _dataset_config(format="healthbench", train=HEALTHBENCH)
    c.domain.dataset.update(change)
    with pytest.raises(ValueError, match=f"config.{field}"):
        common.validate_config(c, num_devices=1)


@pytest.mark.parametrize("split", ["n_train", "n_heldout", "n_ood"])
def test_generated_split_sizes_are_checked_only_on_domains_that_generate_tasks(split):
    c = _dataset_config(format="healthbench", train=HEALTHBENCH)
    c.domain[split] = 0  # unused: the dataset domain reads its splits from files
    common.validate_config(c, num_devices=1)
    assert len(builders.build_domain(c).train) == 2
    for name in ("constraints", "sql"):
        c.domain.name = name
        with pytest.raises(ValueError, match=rf"^config\.domain\.{split}: must be >= 1, got 0$"):
            common.validate_config(c, num_devices=1)


def test_dataset_domain_refuses_a_warm_start_it_has_no_corpus_for():
    c = _dataset_config(format="healthbench", train=HEALTHBENCH)
    c.warmstart.steps = 4
    with pytest.raises(ValueError, match="config.warmstart.steps"):
        common.validate_config(c, num_devices=1)


@pytest.mark.slow
@pytest.mark.e2e
def test_training_on_tasks_reloaded_from_disk(tmp_path):
    # Constraint tasks written in our JSONL format and read back: rule-verified criteria whose
    # checkers are found without importing the domain, judged programmatically, trained end to
    # end through the launcher with the policy's tokenizer given as a directory.
    gen = ConstraintDomain(0)
    train = dump_tasks(gen.tasks("train", 16), str(tmp_path / "train.jsonl"))
    heldout = dump_tasks(gen.tasks("heldout", 4), str(tmp_path / "heldout.jsonl"))
    from rubric_rl.envs.constraints import domain_vocabulary

    tok_dir = str(tmp_path / "tokenizer")
    builders.build_word_tokenizer(domain_vocabulary(), tok_dir)
    workdir = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "rubric_rl.launch", "--config=configs/grpo.py:smoke",
        f"--workdir={workdir}", "--config.domain.name=dataset",
        "--config.domain.dataset.format=jsonl", f"--config.domain.dataset.train={train}",
        f"--config.domain.dataset.heldout={heldout}", "--config.warmstart.steps=0",
        f"--config.model.tokenizer={tok_dir}", "--config.train.steps=2",
        "--config.calibration.enabled=False",  # not what is checked here
    ]  # fmt: skip
    env = dict(os.environ, XLA_FLAGS=suite_xla_flags(), JAX_PLATFORMS="cpu")
    subprocess.run(cmd, cwd=REPO, env=env, check=True, timeout=600, capture_output=True)
    rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        assert r["judge/failure_rate"] == 0.0  # every rule criterion was judged
        assert 0.0 <= r["reward/mean"] <= 1.0
    evals = [r for r in rows if "eval/heldout/score" in r]
    assert evals and all("eval/heldout/oracle" not in r for r in evals)  # no oracle here
    assert all("eval/ood/score" not in r for r in evals)  # no OOD split was given
