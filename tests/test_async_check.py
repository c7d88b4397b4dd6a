"""benchmarks/async_check.py on the smoke config (in-process engine, 3 steps, one round): it
runs both sides through the launcher and prints one JSON line whose figures follow the schedule
(it exists so the benchmark cannot rot; the ratio itself is not asserted: that is a timing)."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.e2e
def test_async_check_prints_one_line_with_both_sides(tmp_path):
    from tests.launch_env import launch_env

    proc = subprocess.run(
        [sys.executable, "benchmarks/async_check.py", "--variant", "smoke", "--steps", "3",
         "--rounds", "1"],
        cwd=REPO, env=launch_env(tmp_path / "jax_cache"), capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert out["config"] == "configs/grpo.py:smoke" and out["k"] == 1 and out["steps"] == 3
    # The timed step (3, the fewest the script allows: steps 1-2 compile): one update behind
    # asynchronously (the last step is the only sync point, after which nothing is generated),
    # never synchronously.
    assert out["async_staleness"] == 1.0 and out["sync_staleness"] == 0.0
    assert out["sync_wait_s"] == 0.0 and out["async_wait_s"] >= 0.0
    assert out["step_ratio"] == out["async_step_s"] / out["sync_step_s"] > 0
