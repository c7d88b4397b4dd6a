"""ARISE-RL end to end through ``python -m rubric_rl.launch``: ``configs/arise_rl.py:
smoke`` runs two co-evolution cycles (a generator step, a pool refresh, two solver steps each) on
the tiny policy with RG-SED on; ``--resume`` from a copy of the run rolled back to a
checkpoint inside the second cycle gives the uninterrupted run's metrics and events, pool
refresh included. (A SIGKILL mid-run, then ``--resume``: ``tests/test_trainer.py``, on the loop
every method shares.)"""

import json
import os
import subprocess
import sys

import pytest

from rubric_rl.metrics import read_metrics
from tests.launch_env import launch_env, resume_from_copy, stable_rows
from tests.trainer_spy import one_device

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 6  # smoke: 2 cycles x (1 generator step + 2 solver steps)
# One padded shape for every batch: prompts at their cap (model.max_prompt_len, the teacher's at
# max_teacher_prompt_len, the warm start's at warmstart.max_prompt_len) and completions at 16
# tokens, so the generator's and the solver's steps run one compiled train step; the warm start
# without its copy phase (ARISE-RL's own setting) is one program too. What is checked does not
# depend on the padding.
ONE_SHAPE = (
    "--config.model.prompt_buckets=()", "--config.warmstart.prompt_buckets=()",
    "--config.rollout.buckets=(16,)", "--config.warmstart.copy_steps=0",
)  # fmt: skip


def _cmd(workdir, *extra):
    return [
        sys.executable, "-m", "rubric_rl.launch", "--config=configs/arise_rl.py:smoke",
        f"--config.train.steps={STEPS}", "--config.checkpoint.every=1",
        "--config.checkpoint.keep=3",
        "--config.domain.n_heldout=8", "--config.eval.every=3", *ONE_SHAPE,
        f"--workdir={workdir}", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("arise_rl_runs")
    env = launch_env(base / "jax_cache")
    full, resumed = base / "full", base / "resumed"
    subprocess.run(_cmd(full), cwd=REPO, env=env, check=True, timeout=900, capture_output=True)
    # Back to checkpoint 4 (the second cycle's generator step), with the metrics rows and
    # controller events of steps 5 and 6 still on disk: the resume rolls them back and replays
    # step 5 (the second cycle's pool refresh) from the restored state.
    held = resume_from_copy(_cmd(resumed), env, full, resumed, checkpoint=4)
    assert held == [4, 5, 6]
    return full, resumed


def test_arise_rl_smoke_cycles(runs):
    full, _ = runs
    rows = read_metrics(str(full / "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(STEPS + 1))
    train = rows[1:]
    assert [r["arise_rl/generator_phase"] for r in train] == [1, 0, 0, 1, 0, 0]
    assert [r["arise_rl/cycle"] for r in train] == [0, 0, 0, 1, 1, 1]
    for r in (train[0], train[3]):  # generator steps: the gates' rates are logged
        assert 0.0 <= r["arise_rl/generator/fmt_rate"] <= 1.0
    for r in train:
        assert "arise_rl/rgsed/memory_frac" in r and "sd/coef_mean" in r
    events = [json.loads(x) for x in open(full / "controllers" / "arise_rl.jsonl")]
    refresh = [e for e in events if e["event"] == "pool_refresh"]
    assert [e["step"] for e in refresh] == [2, 5] and all(e["size"] >= 2 for e in refresh)
    assert "eval/heldout/pass_rate" in rows[-1]  # the solver on the designed held-out tasks


def test_arise_rl_resume_equals_uninterrupted(runs):
    full, resumed = runs
    a = stable_rows(read_metrics(str(full / "metrics.jsonl")))
    b = stable_rows(read_metrics(str(resumed / "metrics.jsonl")))
    assert [r["step"] for r in b] == list(range(STEPS + 1))
    assert a == b
    ev_a = open(full / "controllers" / "arise_rl.jsonl").read()
    ev_b = open(resumed / "controllers" / "arise_rl.jsonl").read()
    assert ev_a == ev_b


@pytest.mark.e2e
def test_gkd_with_an_external_teacher_of_another_shape(tmp_path):
    """GKD (``configs/arise_rl.py:gkd``): the SD term's teacher is a separate, frozen parameter
    set of another preset (``1m`` for the ``tiny`` policy), loaded from an orbax directory; λ is
    λ0 on every group (no gate) and the distillation trains (the teacher differs)."""
    import orbax.checkpoint as ocp
    from flax import nnx

    from configs import arise_rl
    from rubric_rl.config import builders
    from tests.launch_env import launch_train

    c = arise_rl.get_config("smoke,gkd")
    with c.unlocked():
        c.model.update(name="1m", init_seed=7)
    tok = builders.build_tokenizer(c, builders.build_domain(c), str(tmp_path / "tok"))
    model = builders.build_model(c, tok, builders.build_mesh(c, one_device()))
    _, params, _ = nnx.split(model, nnx.Param, ...)
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(str(tmp_path / "teacher"), params)
    ckptr.wait_until_finished()
    w = tmp_path / "w"
    launch_train(
        w, 2, "--config=configs/arise_rl.py:smoke,gkd", "--config.teacher.model=1m",
        f"--config.teacher.params={tmp_path / 'teacher'}", "--config.domain.n_heldout=8",
        *ONE_SHAPE,
    )  # fmt: skip
    rows = read_metrics(str(w / "metrics.jsonl"))[1:]
    for r in rows:
        assert r["sd/coef_mean"] == pytest.approx(0.5)  # λ0 on every group, every step
        assert r["sd/context_frac"] == 1.0
        assert r["train/sd/kl"] > 0  # a different teacher: the JSD is not 0
