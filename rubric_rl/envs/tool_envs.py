"""Tool-use environments by name, and their task banks (DESIGN.md §7).

``is_tool_env(name)`` says whether a task's ``env_name`` names one of them (most environments
are not tool environments: the constraint domain's task types, datasets' categories).
``make_env(name, **cfg)`` builds one environment (cheap: one per rollout); ``task_bank(name,
split, n, seed)`` lists its tasks; ``mixed_task_bank`` concatenates several environments' banks
for multi-environment training (RISED keeps fixed per-environment quotas: each task carries
``env_name``, ``task_type`` and ``capabilities``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rubric_rl.envs.base import ENVS, Env, is_tool_env
from rubric_rl.envs.inventory import InventoryEnv
from rubric_rl.envs.sql import SqlEnv
from rubric_rl.rubrics.types import Task

# ENVS and is_tool_env are defined in base.py (Env.reset needs them); importing the environments'
# modules registers them.
__all__ = [
    "ENVS",
    "InventoryEnv",
    "SqlEnv",
    "env_for_task",
    "is_tool_env",
    "make_env",
    "mixed_task_bank",
    "task_bank",
]


def make_env(name: str, **cfg: Any) -> Env:
    """A fresh environment ``name`` (``cfg`` goes to its constructor, e.g. ``time_limit_s``)."""
    return ENVS.get(name)(**cfg)


def env_for_task(task: Task, **cfg: Any) -> Env:
    """A fresh environment of the kind ``task.env_name`` names."""
    if not is_tool_env(task.env_name):
        raise ValueError(
            f"task {task.id!r}: env_name {task.env_name!r} is not a tool environment "
            f"(registered: {', '.join(ENVS.names())}); it is not a tool-environment task"
        )
    return make_env(task.env_name, **cfg)


def task_bank(name: str, split: str = "train", n: int = 100, seed: int = 0) -> list[Task]:
    return ENVS.get(name).task_bank(split, n, seed)


def mixed_task_bank(
    names: Sequence[str], split: str = "train", n_per_env: int = 100, seed: int = 0
) -> list[Task]:
    """``n_per_env`` tasks of each environment, in the order of ``names``."""
    return [t for name in names for t in task_bank(name, split, n_per_env, seed)]
