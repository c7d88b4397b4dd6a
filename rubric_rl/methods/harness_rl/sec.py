"""SEC, the Self-Evolving Curriculum (Chen et al., arXiv 2505.14970): a Boltzmann bandit over
problem categories whose reward is the batch's mean absolute advantage
(``../shared/notes/baselines.md`` §5, from the released code).

- **Arms** are task categories; SEC's are the dataset's difficulty levels. The embedded domain
  has none, so the arm of a task here (ours) is its type and its number of positive seed
  criteria, ``"<task type>/<n>"`` with n capped at ``max_level`` — more stated requirements,
  harder task (``arm_of``). Quantile bins of the seed policy's mean reward (baselines.md's
  suggestion) would need a cold start over every training task; not implemented.
- **Sampling**: Q(c) = 0 at first; each of the B slots draws an arm from
  P(c) = exp(Q(c)/τ) / Σ exp(Q(c')/τ), then takes the next unused task of that arm (a shuffled
  queue per arm, reshuffled when exhausted; the order of arm a's k-th pass is the permutation
  of ``default_rng([seed, a, k])``, so a resumed run draws the same tasks).
- **Reward**: r(c) = mean over the batch's rollouts of arm c of |A_i| (the trained advantages;
  NaN excluded) — SEC's absolute-advantage proxy for the immediate learning gain.
- **Update** (TD(0)): Q(c) ← (1 − α) Q(c) + α r(c) for **every** arm, with r(c) = 0 for the arms
  absent from the batch (so unvisited arms decay toward 0, as in the released code).
- **Defaults**: α = 0.5 and τ = 1.0 (the paper's runs; the code's defaults are α = 0.1). No
  importance weight on the loss (u = 1), as SEC — HarnessRL's own sampler applies u = 1/(N p).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.controllers.base import Controller, TaskBatch
from rubric_rl.controllers.sampling import SAMPLERS
from rubric_rl.rollout.batch import Rollouts
from rubric_rl.rubrics.types import Task


def arm_of(task: Task, max_level: int = 5) -> str:
    """A task's SEC arm (ours for the embedded domain): type / number of positive seed
    criteria, capped at ``max_level``."""
    kind = task.task_type or task.env_name or task.domain or "task"
    n = sum(1 for c in task.rubric.criteria if c.weight > 0)
    return f"{kind}/{min(n, int(max_level))}"


@dataclasses.dataclass(frozen=True)
class SECConfig:
    lr: float = 0.5  # α (the paper's runs; the code's default 0.1)
    temperature: float = 1.0  # τ
    max_level: int = 5

    def __post_init__(self):
        if not 0.0 < self.lr <= 1.0:
            raise ValueError(f"sec.lr={self.lr}: α must be in (0, 1]")
        if not self.temperature > 0.0:
            raise ValueError(f"sec.temperature={self.temperature}: τ must be > 0")
        if self.max_level < 1:
            raise ValueError(f"sec.max_level={self.max_level}: must be >= 1")


class SECBandit:
    """The bandit over arms and the per-arm task queues (checkpointable)."""

    def __init__(self, arms: Sequence[str], config: SECConfig = SECConfig(), *, seed: int = 0):
        if not arms:
            raise ValueError("SEC: no tasks to sample")
        self.config = config
        self.seed = int(seed)
        self.names = sorted(set(arms))
        col = {a: i for i, a in enumerate(self.names)}
        self.arm_index = np.array([col[a] for a in arms], np.int64)  # task -> arm
        self.members = [np.flatnonzero(self.arm_index == i) for i in range(len(self.names))]
        self.q = np.zeros(len(self.names))
        self.passes = np.zeros(len(self.names), np.int64)  # reshuffles of each arm's queue
        self.position = np.zeros(len(self.names), np.int64)

    def probabilities(self) -> np.ndarray:
        z = self.q / self.config.temperature
        z = np.exp(z - z.max())
        return z / z.sum()

    def _order(self, arm: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, arm, int(self.passes[arm])])
        return self.members[arm][rng.permutation(len(self.members[arm]))]

    def next_task(self, arm: int) -> int:
        if self.position[arm] >= len(self.members[arm]):
            self.passes[arm] += 1
            self.position[arm] = 0
        task = int(self._order(arm)[self.position[arm]])
        self.position[arm] += 1
        return task

    def draw(self, size: int, rng: np.random.Generator) -> np.ndarray:
        """``size`` task indices: an arm per slot from P, then that arm's next task."""
        arms = rng.choice(len(self.names), size=int(size), p=self.probabilities())
        return np.array([self.next_task(int(a)) for a in arms], np.int64)

    def rewards(self, task_indices: Sequence[int], advantages: np.ndarray) -> dict[int, float]:
        """r(c) = mean |A| over the rollouts of arm c's groups (NaN excluded); arms without a
        defined advantage are absent."""
        adv = np.abs(np.asarray(advantages, np.float64))
        out: dict[int, list[float]] = {}
        for row, t in zip(adv, task_indices, strict=True):
            vals = row[~np.isnan(row)]
            if vals.size:
                out.setdefault(int(self.arm_index[int(t)]), []).extend(vals.tolist())
        return {a: float(np.mean(v)) for a, v in out.items()}

    def update(self, rewards: Mapping[int, float]) -> None:
        """TD(0) on every arm, r = 0 for the arms absent from the batch."""
        r = np.zeros_like(self.q)
        for a, v in rewards.items():
            r[a] = v
        self.q = (1.0 - self.config.lr) * self.q + self.config.lr * r

    def observe(self, rollouts: Rollouts, index: Mapping[str, int]) -> None:
        """The step's update: each group of a known task (``index``: task id -> task index)
        contributes its trained advantages to its arm."""
        keep = [g for g, grp in enumerate(rollouts.groups) if grp.task.id in index]
        if keep:
            tasks = [index[rollouts.groups[g].task.id] for g in keep]
            self.update(self.rewards(tasks, rollouts.advantages[keep]))

    def metrics(self, prefix: str = "sec/") -> dict[str, float]:
        p = self.probabilities()
        out = {f"{prefix}p/{n}": float(x) for n, x in zip(self.names, p, strict=True)}
        out[f"{prefix}q/max"] = float(self.q.max())
        out[f"{prefix}entropy"] = float(-(p * np.log(np.maximum(p, 1e-300))).sum())
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "q": self.q.tolist(),
            "passes": self.passes.tolist(),
            "position": self.position.tolist(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if list(state["names"]) != self.names:
            raise ValueError(
                f"SEC checkpoint arms {list(state['names'])[:5]}... differ from this run's "
                f"{self.names[:5]}... (another task bank?)"
            )
        self.q = np.asarray(state["q"], np.float64)
        self.passes = np.asarray(state["passes"], np.int64)
        self.position = np.asarray(state["position"], np.int64)


@SAMPLERS.register("sec")
class SECSampler(Controller):
    """SEC as the step's sampler (GRPO + SEC: ``--config.controllers.sampler=sec``); its Q is
    updated from the step's trained advantages in ``observe``."""

    name = "sec"

    def __init__(
        self,
        tasks: Sequence[Task],
        batch_size: int,
        *,
        seed: int = 0,
        config: SECConfig = SECConfig(),
    ):
        if batch_size < 1:
            raise ValueError(f"SECSampler: batch_size must be >= 1, got {batch_size}")
        self.tasks = tuple(tasks)
        self.index = {t.id: i for i, t in enumerate(self.tasks)}
        self.batch_size = int(batch_size)
        self.bandit = SECBandit(
            [arm_of(t, config.max_level) for t in self.tasks], config, seed=seed
        )

    def sample_tasks(self, step: int, rng: np.random.Generator) -> TaskBatch:
        idx = self.bandit.draw(self.batch_size, rng)
        return TaskBatch(tuple(self.tasks[i] for i in idx), np.ones(len(idx)))

    def observe(self, rollouts: Rollouts) -> dict[str, float]:
        self.bandit.observe(rollouts, self.index)
        return self.bandit.metrics(prefix="")

    def state_dict(self) -> dict[str, Any]:
        return self.bandit.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            self.bandit.load_state_dict(state)


__all__ = ["SECBandit", "SECConfig", "SECSampler", "arm_of"]
