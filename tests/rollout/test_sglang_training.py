"""Training with rollouts from a real SGLang server (``configs/grpo.py:smoke,sglang_cpu``): the
server starts from the model as built, gets every version by weight sync, and its log-probs are
the trainer's; with asynchronous rollouts (k = 1) the stale steps show the one-update gap. Needs
third_party/sglang_cpu/install.sh's venv (skips without it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rubric_rl.metrics import read_metrics
from tests.launch_env import launch_env
from tests.rollout.sglang_env import SERVER_ENV, require_sglang_venv

# Real-model end-to-end runs (launched processes that train): the slow tier.
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 6


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    require_sglang_venv()
    base = tmp_path_factory.mktemp("sglang_train")
    wd = base / "run"
    cmd = [
        sys.executable, "-m", "rubric_rl.launch", "--config=configs/grpo.py:smoke,sglang_cpu",
        f"--config.train.steps={STEPS}", "--config.eval.every=0", "--config.eval.at_start=False",
        "--config.checkpoint.every=3", "--config.loss.mismatch_every=1",
        "--config.rollout.max_staleness=1", f"--workdir={wd}",
    ]  # fmt: skip
    env = dict(launch_env(base / "jax_cache"), **SERVER_ENV)  # the server inherits it
    proc = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return wd, proc.stderr


@pytest.mark.sglang
def test_server_log_probs_are_the_trainers_and_stale_steps_show_the_gap(run):
    wd, _ = run
    rows = [r for r in read_metrics(str(wd / "metrics.jsonl")) if r["step"] > 0]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    # k = 1, checkpoints at 3 and 6 (sync points): steps 1 and 4 sample with the newest weights.
    assert [r["rollout/staleness"] for r in rows] == [0, 1, 1, 0, 1, 1]
    # Whether an update so far has moved the weights: not before the first non-zero gradient
    # (a first step whose groups all have zero reward variance updates nothing; the server's
    # samples vary between runs), and from then on every update does (Adam's first moment).
    moved, stale_checked = False, 0
    for r in rows:
        gap = r["train/rollout_corr/abs_dlogp/max"]
        if r["rollout/staleness"] == 0:
            # The server's sampled-token log-probs against the trainer's recomputation (float32
            # on both sides; only summation order differs).
            assert gap <= 1e-4, (r["step"], gap)
        elif moved:
            # One update old: the behaviour policy differs from π_old measurably.
            assert r["train/rollout_corr/abs_dlogp"] > 1e-3, (r["step"], r)
            stale_checked += 1
        assert r["reward/mean"] == r["reward/mean"]  # finite rewards from the server's samples
        moved = moved or r["train/grad_norm"] > 0
    assert stale_checked >= 2, [(r["step"], r["train/grad_norm"]) for r in rows]


@pytest.mark.sglang
def test_server_starts_from_the_built_model_and_is_stopped_with_the_trainer(run):
    wd, stderr = run
    weights = sorted(p.name for p in (wd / "weights").iterdir())
    # The initial export, and the last two synced versions (WeightSync.keep_last = 2).
    assert weights[-1] == "v6" and "init" in weights and len(weights) == 3, weights
    assert (wd / "sglang_server.log").is_file()
    assert "HTTP Request" not in stderr  # httpx's per-request INFO lines are quiet by default
    # The server ran in its own process group; nothing serving this run is left.
    left = subprocess.run(
        ["pgrep", "-f", str(wd / "weights" / "init")], capture_output=True, text=True
    )
    assert left.stdout.strip() == "", f"server processes left running: {left.stdout}"
