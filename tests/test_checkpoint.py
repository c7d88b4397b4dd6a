"""Run checkpoints: train state + run state round trip, keep-N, interrupted writes are safe."""

import gc
import glob
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_rl.checkpoint import RunCheckpointer, key_from_json, key_to_json
from rubric_rl.controllers.sampling import UniformSampler
from rubric_rl.core.train_step import TrainConfig, init_train_state
from rubric_rl.models import PRESETS, Qwen3ForCausalLM
from rubric_rl.rubrics.types import Criterion, Rubric, Task


@pytest.fixture(scope="module")
def state():
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
    model = Qwen3ForCausalLM(PRESETS["tiny"], rngs=nnx.Rngs(0))
    _, st = init_train_state(model, TrainConfig(lr=1e-3), mesh)
    return st


def _tasks(n):
    r = Rubric((Criterion("c", "x"),))
    return [
        Task(id=f"t{i}", prompt=({"role": "user", "content": "q"},), rubric=r) for i in range(n)
    ]


def test_round_trip_train_state_controllers_rng(tmp_path, state):
    ckpt = RunCheckpointer(str(tmp_path / "ckpt"), keep=2)
    sampler = UniformSampler(_tasks(7), 3, seed=5)
    sampler.sample_tasks(0, None)
    sampler.sample_tasks(1, None)
    key = jax.random.fold_in(jax.random.key(3), 11)
    raw_key = jax.random.PRNGKey(4)
    run_state = {
        "step": 4,
        "controllers": {"sampler": sampler.state_dict()},
        "rng": key_to_json(key),
        "raw_rng": key_to_json(raw_key),
    }
    assert ckpt.save(4, state, run_state, wait=True)
    assert not ckpt.save(4, state, run_state, wait=True)  # existing step left alone
    ckpt.close()

    ckpt = RunCheckpointer(str(tmp_path / "ckpt"), keep=2)
    assert ckpt.latest_step() == 4
    zeros = jax.tree.map(jnp.zeros_like, state)
    restored, rs = ckpt.restore(zeros)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim)
    assert rs["step"] == 4
    k2 = key_from_json(rs["rng"])
    np.testing.assert_array_equal(jax.random.uniform(k2, (3,)), jax.random.uniform(key, (3,)))
    np.testing.assert_array_equal(key_from_json(rs["raw_rng"]), raw_key)
    resumed = UniformSampler(_tasks(7), 3, seed=5)
    resumed.load_state_dict(rs["controllers"]["sampler"])
    assert [t.id for t in resumed.sample_tasks(2, None).tasks] == [
        t.id for t in sampler.sample_tasks(2, None).tasks
    ]
    ckpt.close()


def test_trees_item_round_trips_when_the_run_state_names_it(tmp_path, state):
    """The ``trees`` item (the sampler's held policies): saved beside the train state, restored
    bit for bit onto the target's shardings when ``trees_like`` gives a target, absent from a
    step saved without trees; the run-state key that returns it is reserved."""
    from rubric_rl.checkpoint import TREES

    ckpt = RunCheckpointer(str(tmp_path / "ckpt"), keep=3, async_save=False)
    held = {"frozen": jax.tree.map(lambda x: x * 2.0, state.params)}
    ckpt.save(1, state, {"held": ["frozen"]}, trees=held)
    ckpt.save(2, state, {"held": []})
    with pytest.raises(ValueError, match="reserved"):
        ckpt.save(3, state, {TREES: 1})

    def like(rs):
        return {name: state.params for name in rs["held"]} or None

    _, rs = ckpt.restore(state, 1, trees_like=like)
    got = rs[TREES]["frozen"]
    for a, b in zip(jax.tree.leaves(held["frozen"]), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim)
    _, rs = ckpt.restore(state, 2, trees_like=like)
    assert TREES not in rs and rs == {"held": []}
    _, rs = ckpt.restore(state, 1)  # no target given: the item is not read
    assert TREES not in rs
    ckpt.close()


def test_keep_n_and_non_json_state_rejected(tmp_path, state):
    ckpt = RunCheckpointer(str(tmp_path / "ckpt"), keep=2, async_save=False)
    for s in (1, 2, 3):
        ckpt.save(s, state, {"step": s})
    assert ckpt.all_steps() == [2, 3]
    with pytest.raises(TypeError, match="JSON"):
        ckpt.save(4, state, {"x": np.zeros(2)})
    ckpt.close()


_KILLED_WRITER = textwrap.dedent(
    """
    import os, sys, time
    import jax, jax.numpy as jnp
    from rubric_rl.checkpoint import RunCheckpointer
    d = sys.argv[1]
    ckpt = RunCheckpointer(d, keep=3)
    small = {"w": jnp.arange(8.0)}
    ckpt.save(1, small, {"step": 1}, wait=True)
    big = {"w": jnp.ones((64, 1024, 1024), jnp.float32)}  # 256 MB: the write takes a while
    ckpt.save(2, big, {"step": 2})
    # The async write creates its temporary directory in a background thread: wait until it
    # exists, so the kill below lands mid-write (not before the write began).
    deadline = time.time() + 60
    while not any(e.startswith("2.") and "tmp" in e for e in os.listdir(d)):
        if time.time() > deadline:
            sys.exit("the step-2 write never started")
        time.sleep(0.001)
    os._exit(0)  # killed mid-write: no finalisation
    """
)


def test_interrupted_write_leaves_last_good_checkpoint(tmp_path):
    d = str(tmp_path / "ckpt")
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
    subprocess.run([sys.executable, "-c", _KILLED_WRITER, d], check=True, env=env, timeout=120)
    entries = os.listdir(d)
    assert "1" in entries and "2" not in entries, entries  # step 2 never became visible
    assert any(e.startswith("2.") and "tmp" in e for e in entries), entries  # it was cut short
    ckpt = RunCheckpointer(d, keep=3)
    assert ckpt.latest_step() == 1
    restored, rs = ckpt.restore({"w": jnp.zeros(8)})
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.arange(8.0))
    assert rs == {"step": 1}
    ckpt.close()


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _two_steps(d):
    ckpt = RunCheckpointer(d, keep=3, async_save=False)
    for s in (1, 2):
        ckpt.save(s, {"w": jnp.arange(8.0) + s}, {"step": s})
    return ckpt


def test_a_truncated_step_is_named_and_the_previous_one_restored(tmp_path):
    from rubric_rl.checkpoint import CorruptCheckpointError

    d = str(tmp_path / "ckpt")
    ckpt = _two_steps(d)
    metadata = os.path.join(d, "2", "run_state", "metadata")
    _truncate(metadata)
    with pytest.raises(CorruptCheckpointError) as e:
        ckpt.restore({"w": jnp.zeros(8)}, step=2)
    assert str(e.value).startswith(f"checkpoint step 2 is unreadable: {metadata}: not valid JSON")
    step, restored, rs, failed = ckpt.restore_intact({"w": jnp.zeros(8)})
    assert (step, rs, [(e.step, e.path) for e in failed]) == (1, {"step": 1}, [(2, metadata)])
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.arange(8.0) + 1)
    # Set aside (kept, out of the manager's sight): the resumed run saves step 2 afresh.
    assert ckpt.set_aside(2) == str(tmp_path / "ckpt_corrupt" / "2")
    assert os.path.exists(tmp_path / "ckpt_corrupt" / "2" / "run_state" / "metadata")
    assert ckpt.all_steps() == [1]
    assert ckpt.save(2, {"w": jnp.arange(8.0) + 5}, {"step": 2})
    assert ckpt.restore({"w": jnp.zeros(8)})[1] == {"step": 2}
    ckpt.close()


def test_no_intact_step_is_an_error_naming_each_file(tmp_path):
    from rubric_rl.checkpoint import NoIntactCheckpointError

    d = str(tmp_path / "ckpt")
    ckpt = _two_steps(d)
    data = {}
    for s in (1, 2):  # the array data itself (tensorstore's OCDBT files), really truncated
        files = glob.glob(os.path.join(d, str(s), "train_state", "d", "*"))
        data[s] = max(files, key=os.path.getsize)
        _truncate(data[s])
    with pytest.raises(NoIntactCheckpointError) as e:
        ckpt.restore_intact({"w": jnp.zeros(8)})
    msg = str(e.value)
    assert msg.startswith(f"no intact checkpoint in {d}:\n")
    assert f"  step 2: {data[2]}: " in msg and f"  step 1: {data[1]}: " in msg
    assert "tensorstore_spec" not in msg  # the cause, not tensorstore's multi-KB spec
    ckpt.close()


@pytest.mark.parametrize("wait", [True, False])
def test_a_failed_save_is_one_error_naming_the_step_the_cause_and_the_resume_point(
    tmp_path, state, wait, caplog, monkeypatch
):
    """A real write failure: the process's file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored) makes
    every write past 4 KiB fail with EFBIG while step 2 is saved, as a full disk fails a write.
    The save (wait=True) or the next wait / check (asynchronous) raises one CheckpointSaveError
    naming step 2, the cause and step 1 to resume from; it is raised again, never a second
    different error, and close() does not raise it anew. (A full disk used to print 26
    tracebacks and train two more steps.)"""
    import resource
    import signal

    from rubric_rl.checkpoint import CheckpointSaveError

    ckpt = RunCheckpointer(str(tmp_path / "ckpt"), keep=3)
    assert ckpt.save(1, state, {"step": 1}, wait=True)
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    caplog.set_level("ERROR")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(CheckpointSaveError) as e:
            ckpt.save(2, state, {"step": 2}, wait=wait)
            ckpt.wait()  # the asynchronous save's error surfaces here (or in check())
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    msg = str(e.value)
    assert msg.startswith("checkpoint step 2 could not be saved (")
    assert "Error writing local file" in msg and "/ckpt/2.orbax-checkpoint-tmp/" in msg, msg
    assert msg.endswith("resume from step 1, the last complete checkpoint, with --resume")
    assert (e.value.step, e.value.previous, ckpt.failed) == (2, 1, True)
    with pytest.raises(CheckpointSaveError) as again:
        ckpt.check()
    assert again.value is e.value
    ckpt.close()  # the failure was reported: closing does not raise it again
    assert RunCheckpointer(str(tmp_path / "ckpt")).latest_step() == 1
    # The error is the one report: orbax's threads logged the same traceback 4 times and
    # tensorstore's callbacks raised "Event loop is closed" into a closed loop 5-7 times.
    gc.collect()  # the failed writes' tasks: asyncio's "never retrieved" is logged when freed
    assert [r.getMessage()[:80] for r in caplog.records if r.levelname == "ERROR"] == []
    assert [repr(u.exc_value) for u in unraisable] == []


def test_a_completed_saves_held_background_reports_are_passed_on(caplog, monkeypatch):
    """What orbax's threads report while a save is in flight is held, not lost: when the save
    completes, each record and unraisable exception reaches its logger and hook unchanged."""
    import logging

    from rubric_rl.checkpoint import _HeldSaveNoise

    noise, unraisable = _HeldSaveNoise(), []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    for name in ("absl", "asyncio"):  # without the filter an earlier test's failed save left
        monkeypatch.setattr(logging.getLogger(name), "filters", [])
    caplog.set_level("ERROR")
    noise.begin()
    record = logging.LogRecord(
        "absl", logging.ERROR, f"{os.sep}x{os.sep}orbax{os.sep}future.py", 1, "write retried",
        None, (ValueError, ValueError("transient"), None),
    )  # fmt: skip
    logging.getLogger("absl").handle(record)
    closed = type("Args", (), {"exc_value": RuntimeError("Event loop is closed")})()
    sys.unraisablehook(closed)
    other = type("Args", (), {"exc_value": RuntimeError("something else")})()
    sys.unraisablehook(other)  # not a closed loop's echo: passed on at once
    # Only this test's own reports: an earlier test's failed save frees its futures and echoes
    # whenever the garbage collector runs (asyncio's "never retrieved", closed-loop errors).
    absl = lambda: [r for r in caplog.records if r.name != "asyncio"]  # noqa: E731
    mine = lambda: [u for u in unraisable if u is other or u is closed]  # noqa: E731
    assert absl() == [] and mine() == [other]
    noise.end(failed=False)
    assert absl() == [record] and mine() == [other, closed]
    assert sys.unraisablehook == unraisable.append  # the hook as it was


def test_a_failed_saves_freed_write_futures_are_dropped_and_other_errors_pass(caplog, monkeypatch):
    """asyncio's "Future exception was never retrieved" for one of a failed save's tensorstore
    writes, logged whenever the garbage collector frees it (under load, while the run stops): it
    carries no orbax frame, only the write's path in orbax's temporary directory. It is one of
    the save's echoes and is dropped; an asyncio error about anything else still passes."""
    import logging

    from rubric_rl.checkpoint import _HeldSaveNoise

    noise = _HeldSaveNoise()
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # begin() replaces it
    for name in ("absl", "asyncio"):  # this test's filter only (and none an earlier test left)
        monkeypatch.setattr(logging.getLogger(name), "filters", [])
    logger = logging.getLogger("asyncio")
    caplog.set_level("ERROR")

    def freed(text):
        return logging.LogRecord(
            "asyncio", logging.ERROR, "/usr/lib/python3.11/asyncio/base_events.py", 1771,
            "Future exception was never retrieved\nfuture: <Future finished exception="
            f"ValueError({text!r})>", None, (ValueError, ValueError(text), None),
        )  # fmt: skip

    write = freed(
        'OUT_OF_RANGE: Error writing "opt_state.mu/0" in OCDBT database at local file '
        '"/w/checkpoints/3.orbax-checkpoint-tmp/train_state.orbax-checkpoint-tmp/ocdbt.process_0/'
        '": Failed to write 205514 bytes to file 18: File too large'
    )
    other = freed("a user's coroutine failed")
    noise.begin()
    noise.end(failed=True)
    mine = lambda: [r for r in caplog.records if r in (write, other)]  # noqa: E731
    logger.handle(write)
    assert mine() == []
    logger.handle(other)
    assert mine() == [other]
