"""Tool-use environments by name, and their task banks (DESIGN.md §7).

``make_env(name, **cfg)`` builds one environment (cheap: one per rollout); ``task_bank(name,
split, n, seed)`` lists its tasks; ``mixed_task_bank`` concatenates several environments' banks
for multi-environment training (RISED keeps fixed per-environment quotas: each task carries
``env_name``, ``task_type`` and ``capabilities``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rubric_rl.envs.base import Env
from rubric_rl.envs.inventory import InventoryEnv
from rubric_rl.envs.sql import SqlEnv
from rubric_rl.registry import Registry
from rubric_rl.rubrics.types import Task

ENVS: Registry[type[Env]] = Registry("env")
ENVS.register("sql")(SqlEnv)
ENVS.register("inventory")(InventoryEnv)


def make_env(name: str, **cfg: Any) -> Env:
    """A fresh environment ``name`` (``cfg`` goes to its constructor, e.g. ``time_limit_s``)."""
    return ENVS.get(name)(**cfg)


def env_for_task(task: Task, **cfg: Any) -> Env:
    """A fresh environment of the kind ``task.env_name`` names."""
    if not task.env_name:
        raise ValueError(f"task {task.id!r} has no env_name; it is not a tool-environment task")
    return make_env(task.env_name, **cfg)


def task_bank(name: str, split: str = "train", n: int = 100, seed: int = 0) -> list[Task]:
    return ENVS.get(name).task_bank(split, n, seed)


def mixed_task_bank(
    names: Sequence[str], split: str = "train", n_per_env: int = 100, seed: int = 0
) -> list[Task]:
    """``n_per_env`` tasks of each environment, in the order of ``names``."""
    return [t for name in names for t in task_bank(name, split, n_per_env, seed)]
