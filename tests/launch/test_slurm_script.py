"""launch/slurm.sh under stand-ins for SLURM's `scontrol` and `srun` (no cluster here): each
task gets the coordinator (the allocation's first node), the process count, its own rank, and
the arguments unchanged."""

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# scontrol: the allocation's hosts, then the rest of a large listing (200 kB, more than a pipe
# holds): a script that stops reading after the first line must not fail on the writer's
# SIGPIPE (under `set -o pipefail`, `scontrol ... | head -n 1` exits 141).
SCONTROL = """#!/bin/bash
[ "$1 $2 $3" = "show hostnames gpu[07-08]" ] || { echo "unexpected: $*" >&2; exit 2; }
printf 'gpu07\\ngpu08\\n'
for i in $(seq 1 20000); do echo "spare$i"; done
"""
# srun: record its own options, then run the task command once per rank (2 nodes x 1 task).
SRUN = """#!/bin/bash
opts=()
while [[ "$1" == --* ]]; do opts+=("$1"); shift; done
printf '%s\\n' "${opts[@]}" > "$OUT/srun_opts"
for rank in 0 1; do SLURM_PROCID=$rank "$@" || exit $?; done
"""
# The "python" the tasks run: writes what it was given.
PYTHON = """#!/usr/bin/env python3
import json, os, sys
rank = os.environ["JAX_PROCESS_ID"]
keys = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
out = {"argv": sys.argv[1:], "cwd": os.getcwd(), **{k: os.environ[k] for k in keys}}
json.dump(out, open(os.path.join(os.environ["OUT"], f"task{rank}.json"), "w"))
"""


def _tool(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def test_slurm_script_sets_coordinator_count_and_rank_per_task(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir / "scontrol", SCONTROL)
    _tool(bin_dir / "srun", SRUN)
    _tool(bin_dir / "fake_python", PYTHON)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", OUT=str(tmp_path),
               SLURM_JOB_NODELIST="gpu[07-08]", SLURM_NTASKS="2", SLURM_NNODES="2",
               PYTHON=str(bin_dir / "fake_python"), RUBRIC_RL_COORDINATOR_PORT="23456")  # fmt: skip
    args = ["--config=configs/grpo.py:gpu", "--workdir=/shared/runs/a b", "--config.mesh.data=2"]
    subprocess.run(["bash", str(REPO / "launch" / "slurm.sh"), *args], env=env, check=True,
                   cwd=tmp_path, timeout=60)  # fmt: skip
    tasks = [json.loads((tmp_path / f"task{r}.json").read_text()) for r in (0, 1)]
    for rank, task in enumerate(tasks):
        assert task["JAX_COORDINATOR_ADDRESS"] == "gpu07:23456"
        assert task["JAX_NUM_PROCESSES"] == "2" and task["JAX_PROCESS_ID"] == str(rank)
        assert task["argv"] == ["-m", "rubric_rl.launch", *args]  # the space survives
        assert Path(task["cwd"]) == REPO  # rubric_rl and configs/ importable
    opts = (tmp_path / "srun_opts").read_text().split()
    assert "--ntasks-per-node=1" in opts and "--kill-on-bad-exit=1" in opts
