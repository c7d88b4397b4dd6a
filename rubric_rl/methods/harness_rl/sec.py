"""SEC, the Self-Evolving Curriculum (Chen et al., arXiv 2505.14970): a Boltzmann bandit over
problem categories whose reward is the batch's mean absolute advantage
(``../shared/notes/baselines.md`` §5, from the released code).

- **Arms** are task categories; SEC's are the dataset's difficulty levels. The embedded domain
  has none, so the arms are one of (``sec.bins``):
  * ``"type_count"`` (default): a task's type and its number of positive seed criteria,
    ``"<task type>/<n>"`` with n capped at ``max_level`` (``arm_of``; ours). The default
    because it costs nothing and keeps existing runs' draws; on the embedded domain most tasks
    share the cap, so it is close to a task-type bandit.
  * ``"pass_rate"``: difficulty bins from the warm-start policy's pass rates (baselines.md's
    suggestion; ours in detail). Once, before the first draw, ``pass_rate_samples`` unguided
    samples of each training task (``pass_rate_tasks`` > 0: that many, drawn by the seed)
    are judged under the seed rubric; a task's pass rate is their mean reward in [0, 1]
    (unjudgeable samples left out). Bins are quantiles of the measured distribution
    (``pass_rate_bins``): a task with rate v goes to bin ⌊n_bins · (#{< v} + #{= v}/2) / N⌋,
    the bin of its tie group's centre in the empirical CDF, so tied tasks always share a bin and
    a bin no group's centre falls in is no arm; bin 0 holds the lowest pass rates (hardest).
    A task never measured (not drawn, or no judgeable sample) is in its own arm,
    ``"pass_rate/unmeasured"`` (ours: no difficulty is assumed for it). The rates are in the
    checkpoint, so a resumed run rebuilds the same arms without measuring again.
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

SEC_BINS = ("type_count", "pass_rate")
UNMEASURED = "pass_rate/unmeasured"
PASS_RATE_STREAM = "sec_pass_rate"


def arm_of(task: Task, max_level: int = 5) -> str:
    """A task's SEC arm (ours for the embedded domain): type / number of positive seed
    criteria, capped at ``max_level``."""
    kind = task.task_type or task.env_name or task.domain or "task"
    n = sum(1 for c in task.rubric.criteria if c.weight > 0)
    return f"{kind}/{min(n, int(max_level))}"


def pass_rate_bins(rates: Sequence[float | None], n_bins: int) -> list[str]:
    """Each task's arm from its measured pass rate (module docstring): quantile bin
    ``"pass_rate/<k>"`` (k = 0: lowest rates), ``UNMEASURED`` for None or NaN."""
    if n_bins < 1:
        raise ValueError(f"sec.n_bins={n_bins}: must be >= 1")
    vals = np.array([np.nan if r is None else float(r) for r in rates], np.float64)
    seen = vals[np.isfinite(vals)]
    if not seen.size:
        raise ValueError("SEC pass-rate bins: no task has a measured pass rate")
    width = len(str(n_bins - 1))
    out = []
    for v in vals:
        if not np.isfinite(v):
            out.append(UNMEASURED)
            continue
        centre = (np.sum(seen < v) + np.sum(seen == v) / 2.0) / seen.size
        out.append(f"pass_rate/{min(n_bins - 1, int(np.floor(n_bins * centre))):0{width}d}")
    return out


def measure_pass_rates(
    services: Any, tasks: Sequence[Task], *, samples: int, n_tasks: int = 0, seed: int = 0
) -> dict[str, float | None]:
    """Task id -> the current policy's pass rate (mean seed-rubric reward of ``samples``
    unguided samples; None: not measured). ``n_tasks`` > 0 measures that many tasks, drawn by
    ``seed``; 0 measures all."""
    from rubric_rl.methods.harness_rl.state import row_reward

    if samples < 1:
        raise ValueError(f"sec.pass_rate_samples={samples}: must be >= 1")
    pick = list(range(len(tasks)))
    if 0 < n_tasks < len(tasks):
        rng = np.random.default_rng([int(seed), 13])
        pick = sorted(rng.choice(len(tasks), int(n_tasks), replace=False).tolist())
    drawn = [tasks[i] for i in pick]
    _, trajs = services.generate(
        [t.messages for t in drawn], int(samples), stream=PASS_RATE_STREAM,
        names=[t.id for t in drawn],
    )  # fmt: skip
    verdicts = services.judge(drawn, [[x.response for x in ts] for ts in trajs])
    out: dict[str, float | None] = {t.id: None for t in tasks}
    for t, vs in zip(drawn, verdicts, strict=True):
        r = np.array([row_reward(t.rubric.evaluated().criteria, row) for row in vs], np.float64)
        r = r[np.isfinite(r)]
        out[t.id] = float(r.mean()) if r.size else None
    return out


@dataclasses.dataclass(frozen=True)
class SECConfig:
    lr: float = 0.5  # α (the paper's runs; the code's default 0.1)
    temperature: float = 1.0  # τ
    max_level: int = 5
    bins: str = "type_count"  # type_count | pass_rate (module docstring)
    n_bins: int = 5  # pass_rate: quantile bins (quintiles)
    pass_rate_samples: int = 4  # pass_rate: samples per task at the start of the run
    pass_rate_tasks: int = 0  # pass_rate: tasks measured (0: every training task)

    def __post_init__(self):
        if not 0.0 < self.lr <= 1.0:
            raise ValueError(f"sec.lr={self.lr}: α must be in (0, 1]")
        if not self.temperature > 0.0:
            raise ValueError(f"sec.temperature={self.temperature}: τ must be > 0")
        if self.max_level < 1:
            raise ValueError(f"sec.max_level={self.max_level}: must be >= 1")
        if self.bins not in SEC_BINS:
            raise ValueError(f"sec.bins={self.bins!r}: expected one of {SEC_BINS}")
        if self.n_bins < 1:
            raise ValueError(f"sec.n_bins={self.n_bins}: must be >= 1")
        if self.pass_rate_samples < 1:
            raise ValueError(f"sec.pass_rate_samples={self.pass_rate_samples}: must be >= 1")
        if self.pass_rate_tasks < 0:
            raise ValueError(f"sec.pass_rate_tasks={self.pass_rate_tasks}: must be >= 0")


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
        if config.bins != "type_count":
            raise ValueError(
                f"sec.bins={config.bins!r}: GRPO + SEC supports 'type_count' only "
                "(pass-rate bins are HarnessRL's p_t <- SEC arm, harness.sec.bins)"
            )
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


__all__ = [
    "PASS_RATE_STREAM",
    "SEC_BINS",
    "UNMEASURED",
    "SECBandit",
    "SECConfig",
    "SECSampler",
    "arm_of",
    "measure_pass_rates",
    "pass_rate_bins",
]
