"""RISED end to end through ``python -m rubric_rl.launch``: ``configs/rised.py:smoke``
with the hard environment trains 3 steps on the outcome reward with profile selection (k = 4 of
8 groups), per-rollout positive-rubric teachers (the SD term is on and non-zero), anti-patterns
and per-environment evaluation."""

import json

import pytest

from rubric_rl.metrics import read_metrics
from tests.launch_env import launch_train

pytestmark = pytest.mark.slow


def test_rised_smoke_run_trains_through_launch(tmp_path):
    w = tmp_path / "w"
    launch_train(
        w,
        3,
        "--config=configs/rised.py:smoke,hard",
        # The smoke model rarely solves a task, and outcome-conditioned tags give SD only to
        # groups with a success: the unconditioned tagging keeps the teacher path exercised.
        "--config.rised.tagging=unconditioned",
        "--config.domain.n_heldout=16",
        "--config.eval.n=16",
        # One padded shape for every batch (prompts at model.max_prompt_len, teacher prompts at
        # max_teacher_prompt_len): the three steps run one compiled train step. The warm start
        # without its copy phase: one program.
        "--config.model.prompt_buckets=()",
        "--config.warmstart.copy_steps=0",
    )
    config = json.loads((w / "config.json").read_text())
    assert config["method"] == "rised" and config["controllers"]["sampler"] == "env_quota"
    rows = read_metrics(str(w / "metrics.jsonl"))
    for r in rows[1:]:
        assert r["select/groups"] == 4 and r["select/generated_groups"] == 8
        assert r["rised/tag/failed_frac"] == 0.0
        assert 0 < r["sd/context_frac"] <= 0.5  # only selected groups get teachers
    # The SD term trained on some step (teacher prompts differ from the student's).
    assert max(r["train/sd/kl"] for r in rows[1:]) > 0
    assert any(k.startswith("eval/heldout/env/hard/") for k in rows[-1])
    assert "eval/heldout/env_mean/pass_rate" in rows[-1]
    beh = [json.loads(x) for x in open(w / "controllers" / "rised" / "behaviours.jsonl")]
    assert {b["step"] for b in beh} == {1, 2, 3}
