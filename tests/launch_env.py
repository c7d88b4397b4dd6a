"""Environment for tests that run ``python -m rubric_rl.launch`` in subprocesses."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def suite_xla_flags(*extra: str) -> str:
    """The suite's XLA compile flags (conftest.py's ``RUBRIC_RL_TEST_XLA_FLAGS``), then `extra`
    (e.g. a host device count): for subprocesses that set their own ``XLA_FLAGS``."""
    return " ".join(f for f in (os.environ.get("RUBRIC_RL_TEST_XLA_FLAGS", ""), *extra) if f)


def launch_env(cache_dir) -> dict[str, str]:
    """One CPU device (fastest on the 2-core machine) and a shared persistent compilation cache:
    the processes of one test (uninterrupted, killed, resumed) run the same executables, so they
    compute the same numbers, and a resumed run does not recompile. The cache is the session's
    (conftest.py: every test's launches share it, so a program compiles once per session) unless
    ``RUBRIC_RL_TEST_JAX_CACHE=off``, when it is `cache_dir`, the test's own."""
    session = os.environ.get("RUBRIC_RL_TEST_JAX_CACHE", "off")
    env = dict(os.environ)
    env.update(
        XLA_FLAGS=suite_xla_flags(),  # conftest.py
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=str(cache_dir) if session == "off" else session,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    return env


# Wall-clock figures: they differ between any two runs, so run-equality checks leave them out.
VOLATILE = ("time/", "perf/")


def stable_rows(rows):
    """Metrics rows without their ``VOLATILE`` (wall-clock) keys."""
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def metric_diffs(a, b):
    """(step, key, a's value, b's value) for every stable key where two runs' rows differ."""
    return [
        (ra["step"], k, ra.get(k), rb.get(k))
        for ra, rb in zip(stable_rows(a), stable_rows(b))
        for k in sorted(set(ra) | set(rb))
        if ra.get(k) != rb.get(k)
    ]


def launch_train(workdir, steps: int, *overrides: str) -> None:
    """Runs ``python -m rubric_rl.launch`` for `steps` steps with a checkpoint every step in
    `workdir` (compilation cache next to it) and checks that it exited 0 and logged steps
    0..steps with finite losses."""
    import math
    import subprocess
    import sys

    from rubric_rl.metrics import read_metrics

    proc = subprocess.run(
        [
            sys.executable, "-m", "rubric_rl.launch", *overrides,
            f"--config.train.steps={steps}", "--config.checkpoint.every=1", f"--workdir={workdir}",
        ],
        cwd=REPO, env=launch_env(workdir.parent / "jax_cache"), capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(str(workdir / "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(steps + 1))
    for r in rows[1:]:
        assert math.isfinite(r["loss"]), r


def kill_then_resume(cmd, env, workdir, *, after_step: int, checkpoint: int, timeout=900):
    """Runs ``cmd`` (a launch command line writing ``workdir``), SIGKILLs it once ``after_step`` is
    logged and checkpoint ``checkpoint`` is complete (its asynchronous write can finish after
    later steps are logged; ``--resume`` with no checkpoint is an error, not a fresh start), then
    runs ``cmd + ["--resume"]`` to the end. Returns the metrics rows logged at the kill."""
    import signal
    import subprocess
    import time

    from rubric_rl.metrics import read_metrics

    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + timeout
    metrics = workdir / "metrics.jsonl"
    while time.time() < deadline and proc.poll() is None:
        logged = metrics.exists() and any(
            r["step"] >= after_step for r in read_metrics(str(metrics))
        )
        if logged and (workdir / "checkpoints" / str(checkpoint)).is_dir():
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    rows_at_kill = read_metrics(str(metrics))
    resumed = subprocess.run(
        [*cmd, "--resume"], cwd=REPO, env=env, check=True, timeout=timeout, capture_output=True,
        text=True,
    )  # fmt: skip
    assert "resumed from step " in resumed.stderr  # from a checkpoint, not a fresh start
    return rows_at_kill


def resume_from_copy(cmd, env, workdir, copy, *, checkpoint: int, timeout=900) -> list[int]:
    """Copies the finished run directory `workdir` to `copy`, deletes the copy's checkpoints
    after ``checkpoint`` (their metrics rows and controller events stay on disk, as a run killed
    after them leaves them), then runs ``cmd`` (a launch command line writing `copy`) with
    ``--resume`` and checks that it resumed from ``checkpoint``. Returns the checkpoint steps
    the copy held before the deletion."""
    import shutil
    import subprocess

    from rubric_rl.analysis import checkpoint_steps

    shutil.copytree(workdir, copy)
    held = checkpoint_steps(str(copy))
    assert checkpoint in held, (checkpoint, held)
    for step in held:
        if step > checkpoint:
            shutil.rmtree(os.path.join(copy, "checkpoints", str(step)))
    resumed = subprocess.run(
        [*cmd, "--resume"], cwd=REPO, env=env, timeout=timeout, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from step {checkpoint} " in resumed.stderr
    return held


def checkpoint_params(checkpoint_dir) -> dict:
    """The model parameters of an orbax train_state checkpoint, as {"a/b/c": array}."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    tree = ocp.PyTreeCheckpointer().restore(os.path.join(checkpoint_dir, "train_state"))
    flat = jax.tree_util.tree_flatten_with_path(tree["params"])[0]
    return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v) for path, v in flat}
