"""Controllers around RISED's selection (``rised_selection.py``): the per-environment quota
sampler and the reward-variance selectors of RISED's baselines (seed §4.2, baselines.md §8.2).

``EnvQuotaSampler`` ("env_quota" in ``SAMPLERS``): each step draws ``batch_size`` tasks with a
fixed quota per environment (``env_quotas`` over the training tasks' environments, equal by
default: RISED trains "preserving fixed environment quotas", seed §2.4). Ours: inside an
environment the draw is uniform without replacement within a step (an environment with fewer
tasks than its quota gives each task ⌊q/n⌋ times and a random ⌊q mod n⌋ of them once more);
tasks come environment by environment in name order; importance weights u = 1 (the seed trains
its quota batches uncorrected). Stateless: the draw is a function of the step's generator
(``default_rng([seed, step])`` when none is given), so a resumed run draws the same tasks.

``VarianceSelector`` (from ``config.variance_select``: ``variance_select_controllers`` below)
keeps exactly k = ``rollout.train_groups`` of the step's candidate groups by within-group reward
variance: ``mode="top"`` (Top-Var) or ``"targeted"`` (Var-Target: ``targeting``, sampling
∝ variance in configs/grpo.py; or the k closest to a fixed ``target``). ``per_env``: inside
per-environment quotas. Ours: the quotas split k in proportion to the candidates' environment
counts (``env_quotas`` weighted by them), which is the equal split when the candidates come from
``EnvQuotaSampler`` and never asks an environment for more groups than it has. Ties at random
from ``default_rng([seed, step])`` (stateless, so observe and select see the same choice and a
resumed run repeats it). ``observe`` logs ``selection_stats`` of the choice
(``variance_select/candidates/*``, ``variance_select/selected/*``).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.controllers.base import Controller, TaskBatch
from rubric_rl.controllers.sampling import GROUP_REWARDS, SAMPLERS
from rubric_rl.loop.evaluation import env_of
from rubric_rl.methods.rised.rised_selection import (
    VARIANCE_TARGETS,
    env_quotas,
    selection_stats,
    top_variance,
    var_target,
    variance_targeted,
)
from rubric_rl.rollout.batch import Rollouts
from rubric_rl.rubrics.types import Task

VARIANCE_MODES = ("top", "targeted")


@SAMPLERS.register("env_quota")
class EnvQuotaSampler(Controller):
    """A fixed number of tasks per environment each step (module docstring); u = 1."""

    name = "sampler"

    def __init__(
        self,
        tasks: Sequence[Task],
        batch_size: int,
        *,
        seed: int = 0,
        weights: Mapping[str, float] | None = None,
    ):
        if not tasks:
            raise ValueError("EnvQuotaSampler: empty task list")
        self.tasks = tuple(tasks)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        by_env: dict[str, list[int]] = collections.defaultdict(list)
        for i, t in enumerate(self.tasks):
            by_env[env_of(t)].append(i)
        if weights is not None:
            for e in sorted(weights):
                if e not in by_env:
                    raise ValueError(
                        f"EnvQuotaSampler: environment {e!r} (weights) has no training task; "
                        f"environments: {sorted(by_env)}"
                    )
        if self.batch_size < len(by_env):
            raise ValueError(
                f"EnvQuotaSampler: batch_size {self.batch_size} < the {len(by_env)} environments "
                f"{sorted(by_env)}: some would never be drawn"
            )
        self.by_env = {e: np.asarray(by_env[e], np.int64) for e in sorted(by_env)}
        self.quotas = env_quotas(list(self.by_env), self.batch_size, weights)

    def draw(self, rng: np.random.Generator) -> list[int]:
        out: list[int] = []
        for e, q in self.quotas.items():
            pool = self.by_env[e]
            reps, rest = divmod(q, len(pool))
            idx = [pool] * reps + [rng.choice(pool, size=rest, replace=False)]
            out.extend(int(i) for i in rng.permutation(np.concatenate(idx)))
        return out

    def sample_tasks(self, step: int, rng: np.random.Generator | None) -> TaskBatch:
        if rng is None:
            rng = np.random.default_rng([self.seed, step])
        idx = self.draw(rng)
        return TaskBatch(tuple(self.tasks[i] for i in idx), np.ones(len(idx)))

    def state_dict(self) -> dict[str, Any]:
        return {"num_tasks": len(self.tasks), "quotas": dict(self.quotas)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state["num_tasks"]) != len(self.tasks) or dict(state["quotas"]) != self.quotas:
            raise ValueError(
                f"env_quota sampler state is for {state['num_tasks']} tasks / quotas "
                f"{state['quotas']}, this run has {len(self.tasks)} tasks / quotas {self.quotas}"
            )


@dataclasses.dataclass(frozen=True)
class VarianceSelectConfig:
    """``config.variance_select`` (k comes from ``rollout.train_groups``)."""

    k: int
    mode: str = "top"
    per_env: bool = True
    reward: str = "evidence"  # a GROUP_REWARDS source: the trained reward, or "task_verifier"
    target: float | None = None  # "targeted": a fixed target variance; None = ``targeting``
    # "targeted" without a fixed target (rised_selection.VARIANCE_TARGETS). The default is the
    # previous rule so that a config written before the key reruns as it ran; configs/grpo.py's
    # varsel=targeted sets "proportional".
    targeting: str = "pool_multiple"
    target_multiple: float = 2.0  # "pool_multiple": the multiple of the pool mean
    seed: int = 0

    def __post_init__(self):
        name = "VarianceSelectConfig"
        if self.k < 1:
            raise ValueError(f"{name}.k must be >= 1 (rollout.train_groups), got {self.k}")
        if self.mode not in VARIANCE_MODES:
            raise ValueError(f"{name}.mode must be one of {VARIANCE_MODES}, got {self.mode!r}")
        if self.target is not None and not self.target >= 0:
            raise ValueError(f"{name}.target must be >= 0 or None, got {self.target}")
        if self.targeting not in VARIANCE_TARGETS:
            raise ValueError(
                f"{name}.targeting must be one of {VARIANCE_TARGETS}, got {self.targeting!r}"
            )
        if not self.target_multiple >= 0:
            raise ValueError(f"{name}.target_multiple must be >= 0, got {self.target_multiple}")
        GROUP_REWARDS.get(self.reward)  # unknown name -> clear error now, not at step 1


class VarianceSelector(Controller):
    """Keeps k groups by within-group reward variance (module docstring)."""

    name = "variance_select"

    def __init__(self, config: VarianceSelectConfig):
        self.config = config

    def keep_indices(self, rollouts: Rollouts) -> list[int]:
        cfg = self.config
        rewards = GROUP_REWARDS.get(cfg.reward)(rollouts)
        envs = [env_of(t) for t in rollouts.tasks]
        if cfg.k > len(envs):
            raise ValueError(
                f"variance_select: k = {cfg.k} (rollout.train_groups) > the step's "
                f"{len(envs)} groups"
            )
        quotas = None
        if cfg.per_env:
            quotas = env_quotas(envs, cfg.k, collections.Counter(envs))
        rng = np.random.default_rng([cfg.seed, rollouts.step])
        if cfg.mode == "top":
            return top_variance(rewards, envs, quotas, cfg.k, rng)
        if cfg.target is not None:
            return variance_targeted(rewards, envs, quotas, cfg.k, cfg.target, rng)
        return var_target(rewards, envs, quotas, cfg.k, rng, cfg.targeting, cfg.target_multiple)

    def keep_mask(self, rollouts: Rollouts) -> np.ndarray:
        mask = np.zeros(len(rollouts), bool)
        mask[self.keep_indices(rollouts)] = True
        return mask

    def observe(self, rollouts: Rollouts) -> dict[str, float]:
        rewards = GROUP_REWARDS.get(self.config.reward)(rollouts)
        return selection_stats(rewards, self.keep_mask(rollouts))

    def select(self, rollouts: Rollouts) -> np.ndarray:
        return self.keep_mask(rollouts)


def variance_select_controllers(config) -> list[Controller]:
    """RISED's reward-variance selector baselines (``config.variance_select``, when the config
    has that section): keep ``rollout.train_groups`` of the step's groups."""
    if config.get("variance_select") is None:
        return []
    from rubric_rl.methods.method import from_section

    k = int(config.rollout.train_groups)
    if k < 1:
        raise ValueError(
            "config.rollout.train_groups: config.variance_select keeps k groups of "
            f"tasks_per_step={config.rollout.tasks_per_step}; set k >= 1, got {k}"
        )
    vc = from_section(
        VarianceSelectConfig, config, "variance_select", k=k, seed=int(config.train.seed)
    )
    return [VarianceSelector(vc)]
