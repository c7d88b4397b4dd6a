#!/bin/bash
# A multi-node run under SLURM: one process per node, each driving all of its node's GPUs.
#
#   sbatch --nodes=2 launch/slurm.sh --config=configs/grpo.py:gpu --workdir=/shared/runs/qwen3-4b \
#       --config.mesh.data=2 --config.mesh.fsdp=8 --config.rollout.sglang.url=http://node3:30000
#
# Every argument goes to `python -m rubric_rl.launch`. What it sets, per node:
# - JAX_COORDINATOR_ADDRESS: the first node of the allocation, port RUBRIC_RL_COORDINATOR_PORT
#   (default 12355); JAX_NUM_PROCESSES: the number of tasks; JAX_PROCESS_ID: the task's rank.
# - One task per node (--ntasks-per-node=1): the launcher then gives jax every GPU SLURM lets the
#   task see (rubric_rl/rollout/placement.py, less rollout.sglang.gpus if set). jax's own SLURM
#   detection would give each process the single GPU numbered by its local task id.
# - PYTHON: the interpreter to run (default python3 on PATH, e.g. an activated venv).
# The workdir and rollout.sglang.weight_sync_dir must be on a filesystem every node reads.
#SBATCH --job-name=rubric_rl
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --output=slurm-%j.out
set -euo pipefail

# The whole listing read, then its first line: `| head -n 1` would stop reading early, and under
# pipefail a long listing's SIGPIPE to scontrol would fail the script (exit 141).
hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
head_node=${hosts%%$'\n'*}
export JAX_COORDINATOR_ADDRESS="${head_node}:${RUBRIC_RL_COORDINATOR_PORT:-12355}"
export JAX_NUM_PROCESSES="${SLURM_NTASKS:-$SLURM_NNODES}"
python_bin="${PYTHON:-python3}"
cd "$(dirname "$0")/.."

# JAX_PROCESS_ID is each task's own rank, so it is read inside the task.
srun --ntasks-per-node=1 --kill-on-bad-exit=1 \
  bash -c 'export JAX_PROCESS_ID=$SLURM_PROCID; exec "$0" -m rubric_rl.launch "$@"' \
  "$python_bin" "$@"
