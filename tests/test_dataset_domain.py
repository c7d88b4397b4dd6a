"""The "dataset" domain: rubric datasets on disk (the papers' setting) through the same trainer."""

import json
import os
import subprocess
import sys

import pytest

from configs import common, grpo
from rubric_rl import builders
from rubric_rl.envs.constraints import ConstraintDomain
from rubric_rl.rubrics.datasets import dump_tasks, load_tasks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEALTHBENCH = os.path.join(REPO, "tests", "data", "healthbench_sample.jsonl")


def _dataset_config(**dataset):
    c = grpo.get_config("smoke")
    c.domain.name = "dataset"
    c.domain.dataset.update(dataset)
    c.warmstart.steps = 0
    return c


def test_dataset_domain_loads_each_split_as_the_loader_does():
    c = _dataset_config(format="healthbench", train=HEALTHBENCH, heldout=HEALTHBENCH)
    common.validate_config(c, num_devices=1)
    domain = builders.build_domain(c)
    expected = tuple(load_tasks(HEALTHBENCH, format="healthbench"))
    assert domain.name == "dataset" and domain.train == expected and domain.heldout == expected
    assert domain.ood == () and domain.verify is None and domain.oracle is None
    assert any(c_.weight < 0 for t in domain.train for c_ in t.rubric)  # signed points kept
    c.domain.dataset.limit = 1
    assert len(builders.build_domain(c).train) == 1


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


def test_dataset_domain_refuses_a_warm_start_it_has_no_corpus_for():
    c = _dataset_config(format="healthbench", train=HEALTHBENCH)
    c.warmstart.steps = 4
    with pytest.raises(ValueError, match="config.warmstart.steps"):
        common.validate_config(c, num_devices=1)


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
    ]  # fmt: skip
    env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
    subprocess.run(cmd, cwd=REPO, env=env, check=True, timeout=600, capture_output=True)
    rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        assert r["judge/failure_rate"] == 0.0  # every rule criterion was judged
        assert 0.0 <= r["reward/mean"] <= 1.0
    evals = [r for r in rows if "eval/heldout/score" in r]
    assert evals and all("eval/heldout/oracle" not in r for r in evals)  # no oracle here
    assert all("eval/ood/score" not in r for r in evals)  # no OOD split was given
