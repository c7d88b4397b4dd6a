"""End to end: ``configs/arise.py:smoke`` through ``python -m rubric_rl.launch``; the
pool changes during the run; lifecycle events, pool metrics and sampling probabilities are logged
consistently; ``rubric_rl.analysis`` and ``launch/aggregate.py`` read the run directory; resume
from the step-2 checkpoint replays steps 3-4 exactly (pool, estimates and windows restored).

One smoke run is shared by every test (module fixture). Resume: the run directory is copied and
its final checkpoint removed, which leaves it as a kill between step 4's metrics row and its
checkpoint would (rows and events of steps 3-4 on disk, latest checkpoint 2); ``--resume`` must
drop and replay them. The SIGKILL mechanics themselves are tested in tests/test_trainer.py.
"""

import csv
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from launch import aggregate
from rubric_rl import analysis as an
from rubric_rl.methods.arise.arise_pool import STATES
from tests.launch_env import launch_env, resume_from_copy

# Real-model end-to-end runs (launched processes that train): the slow tier.
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 4  # configs/grpo.py apply_smoke: train.steps; checkpoints every 2 (kept: 2, 4)
GROUP = "arise-smoke"
VOLATILE = ("time/", "perf/")  # wall-clock figures differ between any two runs
EVENT_KEYS = {"step", "entry", "event", "from", "to", "evidence"}
POOL_KEYS = ("live", "dormant", "skill_active", "skill_hidden", "added_total", "retired_total",
             "refined_total")  # fmt: skip


def _cmd(workdir, *extra):
    return [sys.executable, "-m", "rubric_rl.launch", "--config=configs/arise.py:smoke",
            f"--workdir={workdir}", *extra]  # fmt: skip


def _launch(workdir, env, *extra):
    proc = subprocess.run(
        _cmd(workdir, *extra), cwd=REPO, env=env, timeout=600, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("arise_e2e")
    env = launch_env(base / "jax_cache")
    run_dir = base / "sweep" / GROUP / "seed0"  # aggregate.py's <root>/<group>/seed<k> layout
    _launch(run_dir, env)
    return {"base": base, "dir": str(run_dir), "root": str(base / "sweep"), "env": env}


@pytest.fixture(scope="module")
def resumed(run):
    d = run["base"] / "resumed"
    assert resume_from_copy(_cmd(d), run["env"], run["dir"], d, checkpoint=2) == [2, STEPS]
    return str(d)


def _sampler_probs(row):
    return {k: v for k, v in row.items() if k.startswith(an.SAMPLER_PREFIX)}


def test_lifecycle_events_are_logged_and_the_pool_changes(run):
    events = an.read_events(run["dir"])
    assert events, "no lifecycle event in controllers/arise.jsonl"
    assert all(set(e) == EVENT_KEYS for e in events), [sorted(e) for e in events][:3]
    assert all(isinstance(e["evidence"], dict) and e["evidence"] for e in events)
    steps = [int(e["step"]) for e in events]
    assert steps == sorted(steps) and 1 <= steps[0] and steps[-1] <= STEPS
    # Each entry's chain starts with "add" from nothing; every later event leaves the state the
    # previous one entered (a log that drops or reorders events fails here).
    state = {}
    for e in events:
        assert e["to"] in STATES, e
        if e["event"] == "add":
            assert e["entry"] not in state and e["from"] is None, e
        else:
            assert state.get(e["entry"]) == e["from"] and e["from"] in STATES, e
        state[e["entry"]] = e["to"]
    added = sum(e["event"] == "add" for e in events)
    transitions = [e for e in events if e["event"] != "add"]
    assert added > 0 and transitions, "the pool did not change during the smoke run"
    final = an.read_metrics(run["dir"])[-1]
    assert final["arise/pool/added_total"] == added
    assert final["arise/pool/live"] == sum(s != "retired" for s in state.values())
    assert final["arise/pool/skill_active"] == sum(s == "active" for s in state.values())


def test_metrics_carry_pool_counts_and_sampling_probabilities(run):
    rows = an.read_metrics(run["dir"])
    assert [r["step"] for r in rows] == list(range(STEPS + 1))  # 0 = warm-start evaluation
    prev_added = 0.0
    for r in rows[1:]:
        for k in POOL_KEYS:
            v = r[f"arise/pool/{k}"]
            assert math.isfinite(v) and v >= 0 and v == int(v), (r["step"], k, v)
        assert r["arise/pool/live"] == r["arise/pool/added_total"] - r["arise/pool/retired_total"]
        assert r["arise/pool/added_total"] >= prev_added
        prev_added = r["arise/pool/added_total"]
        # Capability-sampler probabilities, discovery excluded: one per scored cell, summing to
        # 1; absent (blank heatmap cells) while no cell has evidence.
        probs = _sampler_probs(r)
        assert len(probs) == r["arise/sampler/scored_cells"], r["step"]
        assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in probs.values())
        if probs:
            assert sum(probs.values()) == pytest.approx(1.0, abs=1e-9), r["step"]
        assert 0.0 <= r["arise/task/all_fail_groups"] <= 1.0
    assert _sampler_probs(rows[-1]), "no sampling probabilities by the last step"
    assert rows[-1]["arise/pool/added_total"] > 0


def test_analysis_and_aggregate_read_the_run(run, tmp_path):
    r = an.load_run(run["dir"])
    assert [int(x["step"]) for x in r.metrics] == list(range(STEPS + 1))
    # The event log replayed and the logged pool metrics agree on every step.
    from_events = an.run_pool_dynamics(r)
    from_metrics = an.pool_dynamics_from_metrics(r.metrics)
    for k in ("step", "added", "retired", "refined", "active", "skill_active", "hidden"):
        np.testing.assert_array_equal(from_events[k], from_metrics[k], err_msg=k)
    types, caps, heat = an.stage_heatmap(r.metrics, 1, STEPS)
    assert types and caps and np.nansum(heat) == pytest.approx(1.0)  # stage mean of P(cell)
    assert aggregate.main([run["root"], "--out", str(tmp_path)]) == 0
    with open(tmp_path / "results.csv") as f:
        (res,) = list(csv.DictReader(f))
    last = r.metrics[-1]
    assert res["group"] == GROUP and int(res["final_step"]) == STEPS
    assert float(res["heldout/score_mean"]) == pytest.approx(last[an.HELDOUT_SCORE])
    assert float(res["heldout/pass_rate_mean"]) == pytest.approx(last["eval/heldout/pass_rate"])
    with open(tmp_path / "pool.csv") as f:
        (pool,) = list(csv.DictReader(f))
    assert float(pool["added_mean"]) == from_events["added"][-1]
    assert float(pool["retired_mean"]) == from_events["retired"][-1]
    md = (tmp_path / "results.md").read_text()
    assert GROUP in md and "added" in md and "Calibration before RL" in md


def test_resume_from_checkpoint_replays_exactly(run, resumed):
    def stable(d):
        return [{k: v for k, v in x.items() if not k.startswith(VOLATILE)}
                for x in an.read_metrics(d)]  # fmt: skip

    a, b = stable(run["dir"]), stable(resumed)
    assert [x["step"] for x in b] == list(range(STEPS + 1))
    diffs = [
        (ra["step"], k, ra.get(k), rb.get(k))
        for ra, rb in zip(a, b)
        for k in sorted(set(ra) | set(rb))
        if ra.get(k) != rb.get(k) and not (_nan(ra.get(k)) and _nan(rb.get(k)))
    ]
    assert not diffs, f"resumed metrics differ (step, key, uninterrupted, resumed): {diffs[:10]}"
    assert an.read_events(resumed) == an.read_events(run["dir"])  # no duplicate, none lost
    assert an.final_pool_state(resumed) == an.final_pool_state(run["dir"])


def _nan(v):
    return isinstance(v, float) and math.isnan(v)
