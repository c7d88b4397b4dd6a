"""Asynchronous rollouts (rubric_rl/loop/async_rollouts.py): the schedule against hand values, the
prefetcher, the config checks, and launched runs — overlapped equals the same schedule run
inline, --resume from a checkpoint inside a segment equals uninterrupted, and the stale weights
are really the ones used (step 2 differs from a synchronous run, step 1 does not)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

import pytest

from rubric_rl.loop.async_rollouts import Prefetcher, Weights, prefetch_steps, weight_version
from rubric_rl.metrics import read_metrics
from rubric_rl.rollout.scripted import ScriptedEngine
from tests.launch_env import launch_env, metric_diffs, stable_rows
from tests.trainer_spy import one_device, serve_scripted, short_words

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_weight_version_hand_values_and_errors():
    # k = 1, last sync 0: steps 1, 2 sample with version 0, then one behind.
    assert [weight_version(s, 1, 0) for s in (1, 2, 3, 4)] == [0, 0, 1, 2]
    # k = 2 after a sync point at 5: 6, 7, 8 use 5; 9 uses 6.
    assert [weight_version(s, 2, 5) for s in (6, 7, 8, 9)] == [5, 5, 5, 6]
    # k = 0: always the newest (synchronous).
    assert [weight_version(s, 0, 0) for s in (1, 2, 7)] == [0, 1, 6]
    for bad in ((0, 1, 0), (3, -1, 0), (3, 1, 3), (3, 1, -1)):
        with pytest.raises(ValueError, match="weight_version"):
            weight_version(*bad)


def test_prefetch_steps_hand_values():
    # Right after a sync point (step 4 follows sync 3): steps 5..4+k start with version 3.
    assert list(prefetch_steps(4, 2, next_sync=10, submitted=3)) == [5, 6]
    # In a segment: only step + k is new.
    assert list(prefetch_steps(5, 2, next_sync=10, submitted=6)) == [7]
    # Never past the next sync point; nothing once it is submitted.
    assert list(prefetch_steps(9, 2, next_sync=10, submitted=10)) == []
    assert list(prefetch_steps(8, 3, next_sync=10, submitted=10)) == []
    assert list(prefetch_steps(6, 1, next_sync=6, submitted=6)) == []


def test_sync_points_are_evaluations_checkpoints_and_the_last_step():
    from configs import grpo
    from rubric_rl.loop.async_rollouts import is_sync_point, next_sync_point

    c = grpo.get_config("smoke")
    c.train.steps = 7
    c.eval.update(every=5, at_start=False)
    c.checkpoint.update(every=3, final=True)
    assert [s for s in range(1, 9) if is_sync_point(c, s)] == [3, 5, 6, 7, 8]
    assert [next_sync_point(c, s) for s in (1, 4, 5, 7)] == [3, 5, 5, 7]
    c.eval.every, c.checkpoint.every = 0, 0
    assert [s for s in range(1, 8) if is_sync_point(c, s)] == [7]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_trainers_schedule_gives_every_step_its_weight_version(k):
    """The trainer's loop, simulated: at the start of step t (state version t - 1) it submits
    prefetch_steps(...) with version t - 1; a step not submitted runs synchronously with the
    newest version. Every step then samples with exactly w(s) = max(s - 1 - k, c(s))."""
    total, syncs = 20, {4, 5, 11, 20}
    got, submitted, last_sync = {}, 0, 0
    for t in range(1, total + 1):
        got.setdefault(t, t - 1)  # not prefetched: generated now, with version t - 1
        assert got[t] == weight_version(t, k, last_sync), (t, got[t])
        assert 0 <= t - 1 - got[t] <= k
        next_sync = min(s for s in syncs if s >= t)
        for s in prefetch_steps(t, k, next_sync, submitted):
            assert s not in got
            got[s] = t - 1
            submitted = s
        if t in syncs:
            last_sync = t
            assert max(got) == t, "a pipeline was started across a sync point"
    assert sorted(got) == list(range(1, total + 1))


@pytest.mark.parametrize("overlap", [True, False])
def test_prefetcher_runs_in_order_on_its_thread_and_reraises(overlap):
    calls = []

    def produce(step, weights):
        calls.append((step, weights.version, threading.current_thread().name))
        if step == 4:
            raise RuntimeError("pipeline 4 failed")
        return step * 10

    p = Prefetcher(produce, overlap=overlap)
    try:
        w = Weights(None, None, 7)
        for s in (2, 3, 4):
            p.submit(s, w)
        with pytest.raises(RuntimeError, match="already submitted"):
            p.submit(3, w)
        assert p.submitted == 4 and p.has(3) and not p.has(5)
        assert p.take(2) == 20 and p.take(3) == 30
        with pytest.raises(RuntimeError, match="pipeline 4 failed"):
            p.take(4)
        assert [c[:2] for c in calls] == [(2, 7), (3, 7), (4, 7)]
        main = threading.current_thread().name
        assert all((c[2] != main) == overlap for c in calls)
        p.submit(5, w)
        p.drain()
        assert not p.has(5)
    finally:
        p.close()


def test_prefetcher_wait_keeps_results():
    gate = threading.Event()

    def produce(step, weights):
        gate.wait(5)
        return step

    p = Prefetcher(produce, overlap=True)
    try:
        p.submit(1, Weights(None, None, 0))
        assert p.pending()
        gate.set()
        p.wait()
        assert p.pending() and p.take(1) == 1 and not p.pending()
    finally:
        p.close()


def test_between_sync_points_save_refuses_and_evaluate_uses_the_live_policy(tmp_path):
    """A manual save() mid-segment would checkpoint controllers that already saw later steps:
    refused, naming why. A manual evaluate() mid-segment evaluates the live policy; the pending
    pipeline keeps the weights it was scheduled with (staleness as scheduled afterwards)."""
    from configs import grpo
    from rubric_rl.trainer import Trainer

    c = grpo.get_config("smoke")
    c.warmstart.steps = 0
    c.eval.at_start, c.eval.every = False, 0
    c.checkpoint.update(every=0, final=False)
    c.train.steps = 10
    c.rollout.update(max_staleness=1, async_overlap=False)  # this session's 8 CPU devices
    t = Trainer(c, str(tmp_path), devices=one_device())
    serve_scripted(t, ScriptedEngine(t.tokenizer, short_words))  # no generation compiled
    try:
        t._restore_or_warmstart(resume=False)
        t.train_one_step()
        t.train_one_step()
        assert t.producer.prefetch.has(3)
        with pytest.raises(RuntimeError, match="Trainer.save at step 2.*sync point"):
            t.save()
        m = t.evaluate(["heldout"])
        assert 0.0 <= m["eval/heldout/pass_rate"] <= 1.0
        assert t.engine.weight_version == 2  # the live policy served for the evaluation
        third = t.train_one_step()
        assert third["rollout/weight_version"] == 1 and third["rollout/staleness"] == 1
    finally:
        t.close()


def test_config_checks_name_the_field():
    from configs import grpo
    from rubric_rl.config.config_validation import validate_config

    # (ConfigDict itself refuses a value of another type, e.g. "1" or 1.0, on assignment.)
    c = grpo.get_config("smoke")
    c.rollout.max_staleness = -1
    with pytest.raises(ValueError, match="rollout.max_staleness"):
        validate_config(c)
    # This session's 8 CPU devices: the in-process engine may not overlap the update there.
    c = grpo.get_config("smoke")
    c.rollout.max_staleness = 1
    with pytest.raises(ValueError, match="rollout.async_overlap.*8 devices.*deadlock"):
        validate_config(c, num_devices=8)
    c.rollout.async_overlap = False  # the same schedule without a thread is fine
    validate_config(c, num_devices=8)
    validate_config(c, num_devices=1)


# ----------------------------------------------------------------------------- launched runs

STEPS = 7
# Sync points: checkpoints at 3 and 6, evaluations at 5 (and the final step 7); all three
# checkpoints kept, so the run can be resumed from 3. No warm start: the schedule and its numbers
# do not depend on where the policy starts.
ARGS = (
    f"--config.train.steps={STEPS}", "--config.checkpoint.every=3", "--config.checkpoint.keep=3",
    "--config.eval.every=5", "--config.eval.at_start=False", "--config.warmstart.steps=0",
)  # fmt: skip
# w(s) for k = 1 with sync points {3, 5, 6, 7}: max(s - 2, c(s)).
VERSIONS = [0, 0, 1, 3, 3, 5, 6]


def _launch(workdir, env, *extra):
    cmd = [
        sys.executable, "-m", "rubric_rl.launch", "--config=configs/grpo.py:smoke", *ARGS,
        f"--workdir={workdir}", *extra,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, timeout=900, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The overlapped run; the same schedule inline; the synchronous run; and the overlapped
    run resumed from its step-3 checkpoint: its directory copied with checkpoints 6 and 7
    removed, as a kill after step 7's metrics row and before checkpoint 6 was complete would
    leave it (rows, rollouts and controller files of steps 4-7 on disk; tests/test_trainer.py
    kills a launched run itself)."""
    base = tmp_path_factory.mktemp("async")
    env = launch_env(base / "jax_cache")
    k1 = "--config.rollout.max_staleness=1"
    out = {name: base / name for name in ("overlap", "inline", "sync", "resumed")}
    _launch(out["overlap"], env, k1)
    _launch(out["inline"], env, k1, "--config.rollout.async_overlap=False")
    _launch(out["sync"], env)
    shutil.copytree(out["overlap"], out["resumed"])
    assert sorted(int(p.name) for p in (out["resumed"] / "checkpoints").iterdir()) == [3, 6, STEPS]
    for step in (6, STEPS):
        shutil.rmtree(out["resumed"] / "checkpoints" / str(step))
    out["resume_log"] = _launch(out["resumed"], env, k1, "--resume").stderr
    return out


def _rows(path):
    return read_metrics(str(path / "metrics.jsonl"))


@pytest.mark.slow
@pytest.mark.e2e
def test_versions_and_staleness_follow_the_schedule(runs):
    rows = [r for r in _rows(runs["overlap"]) if r["step"] > 0]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert [r["rollout/weight_version"] for r in rows] == VERSIONS
    assert [r["rollout/staleness"] for r in rows] == [
        s - 1 - v for s, v in zip(range(1, 8), VERSIONS)
    ]
    assert all(r["time/rollout_wait"] >= 0 and r["time/pipeline"] > 0 for r in rows)
    sync = _rows(runs["sync"])
    assert [r["step"] for r in sync] == list(range(1, STEPS + 1))
    assert all("rollout/staleness" not in r for r in sync)  # k = 0: as before


@pytest.mark.slow
@pytest.mark.e2e
def test_overlapped_equals_the_same_schedule_inline(runs):
    a, b = _rows(runs["overlap"]), _rows(runs["inline"])
    assert len(a) == len(b) == STEPS + (1 if a[0]["step"] == 0 else 0)
    diffs = metric_diffs(a, b)
    assert not diffs, f"overlapped vs inline (step, key, overlapped, inline): {diffs[:10]}"


@pytest.mark.slow
@pytest.mark.e2e
def test_resume_inside_a_segment_equals_uninterrupted(runs):
    """Resumed at checkpoint 3, inside the segment that ends at the evaluation of step 5: the
    rows of steps 4-7 on disk are dropped and replayed (4 and 5 sampled with version 3 again,
    the prefetch scheduled anew), and every row matches the uninterrupted run's."""
    assert "resumed from step 3 " in runs["resume_log"]
    diffs = metric_diffs(_rows(runs["overlap"]), _rows(runs["resumed"]))
    assert [r["step"] for r in _rows(runs["resumed"])] == [
        r["step"] for r in _rows(runs["overlap"])
    ]
    assert not diffs, f"resumed vs uninterrupted (step, key, a, b): {diffs[:10]}"


@pytest.mark.slow
@pytest.mark.e2e
def test_stale_weights_are_the_ones_sampled(runs):
    """Step 1 samples with version 0 in both runs: identical. Step 2 samples with version 0
    asynchronously and version 1 synchronously: its rollouts' log-probs, hence its loss and
    rollout-correction figures, differ."""
    a = {r["step"]: r for r in stable_rows(_rows(runs["overlap"]))}
    s = {r["step"]: r for r in stable_rows(_rows(runs["sync"]))}
    one = {k: v for k, v in a[1].items() if not k.startswith("rollout/")}
    assert one == {k: v for k, v in s[1].items() if k in one}
    assert any(a[2][k] != s[2][k] for k in a[2] if k in s[2]), "step 2 equals the synchronous run"
