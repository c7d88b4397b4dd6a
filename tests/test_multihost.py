"""Several processes (``jax.distributed`` over loopback, 2 processes × 2 CPU devices) run the
smoke config to the same metrics as one process with the same 4-device mesh, and the run
directory is written once (process 0)."""

import math
import os
import socket
import subprocess
import sys

import pytest

from rubric_rl.metrics import read_metrics
from tests.launch_env import VOLATILE, launch_env, suite_xla_flags

# Real-model end-to-end runs (launched processes that train): the slow tier.
pytestmark = [pytest.mark.slow, pytest.mark.e2e]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cmd(workdir):
    # Two steps, evaluated and checkpointed at each; one padded prompt shape (model.
    # max_prompt_len) and the warm start without its copy phase, so each process compiles one
    # program per kind of batch.
    return [sys.executable, "-m", "rubric_rl.launch", "--config=configs/grpo.py:smoke",
            "--config.train.steps=2", "--config.eval.every=2", "--config.checkpoint.every=1",
            "--config.model.prompt_buckets=()", "--config.warmstart.copy_steps=0",
            f"--workdir={workdir}"]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_equal_one_process_on_the_same_mesh(tmp_path):
    env = launch_env(tmp_path / "jax_cache")
    one = dict(env, XLA_FLAGS=suite_xla_flags("--xla_force_host_platform_device_count=4"))
    subprocess.run(_cmd(tmp_path / "one"), cwd=REPO, env=one, check=True, timeout=600,
                   capture_output=True)  # fmt: skip
    port = _free_port()
    procs = []
    for i in range(2):
        e = dict(env, XLA_FLAGS=suite_xla_flags("--xla_force_host_platform_device_count=2"),
                 JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                 JAX_PROCESS_ID=str(i))  # fmt: skip
        log = open(tmp_path / f"p{i}.log", "w")
        procs.append(subprocess.Popen(_cmd(tmp_path / "two"), cwd=REPO, env=e, stdout=log,
                                      stderr=subprocess.STDOUT))  # fmt: skip
    for i, p in enumerate(procs):
        assert p.wait(timeout=600) == 0, (tmp_path / f"p{i}.log").read_text()[-3000:]
    a = read_metrics(str(tmp_path / "one" / "metrics.jsonl"))
    b = read_metrics(str(tmp_path / "two" / "metrics.jsonl"))
    assert [r["step"] for r in b] == [0, 1, 2]  # written once, not once per process
    for ra, rb in zip(a, b):
        keys = {k for k in ra if not k.startswith(VOLATILE)}
        assert keys == {k for k in rb if not k.startswith(VOLATILE)}
        for k in sorted(keys):
            x, y = ra[k], rb[k]
            if isinstance(x, float) and math.isfinite(x):
                assert math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-6), (ra["step"], k, x, y)
            else:
                assert x == y, (ra["step"], k, x, y)
    assert sorted(os.listdir(tmp_path / "two" / "checkpoints")) == ["1", "2"]
    assert not [f for f in os.listdir(tmp_path / "two") if ".tmp" in f]
