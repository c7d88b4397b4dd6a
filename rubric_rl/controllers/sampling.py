"""Task samplers (DESIGN §6). All share the Controller interface: ``sample_tasks(step, rng)``.

``UniformSampler`` walks a shuffled epoch order with a data cursor. Epoch e's order is a
permutation drawn from ``default_rng([seed, e])``, so the order never depends on how the run was
interrupted: the state is just (epoch, position) and a resumed run draws exactly the same tasks.

``RewardVarianceSampler`` ("reward_variance"; ARISE's "alternative sampling" ablation, DESIGN §6
"reward-variance selector") prefers tasks whose rollout groups recently disagreed — a group with
zero reward variance gives GRPO no signal:

- Estimate: per task, an EMA of the population variance ``v = mean_j (r_j − r̄)²`` of each observed
  group's rewards (NaN rewards excluded; a group with fewer than ``min_group`` defined rewards is
  no observation). The first observation sets the estimate, later ones
  ``ṽ ← (1 − ema)·ṽ + ema·v``; a task is *seen* once it has an estimate.
- Adaptive draws: with replacement, ``q_i = (ṽ_i + floor) / Σ_{j seen} (ṽ_j + floor)`` over the seen
  tasks (``floor > 0``: a solved or hopeless task is rarer, never starved).
- Exploration: ``n_e = min(round(explore_share · B), #unseen)`` of each batch are distinct unseen
  tasks, uniformly; while no task is seen the whole batch explores (``n_e = min(B, N)``, the rest
  uniform). Unseen tasks are reached only through this share.
- Importance weights ``u = 1 / (N p_i)`` (HarnessRL §2.1) with the per-draw mixture
  ``p_i = (1 − n_e/B)·q_i + (n_e/B)·e_i``, ``e`` uniform over the unseen tasks.
- Rewards (``GROUP_REWARDS``): ``"evidence"`` = ``Rollouts.rewards`` (the trained reward);
  ``"task_verifier"`` = the domain's task verifier (pass = 1), the outcome reward (ARISE trains
  a mix whose first signal is the verifier; its pool rubric reward is undefined while the pool
  is empty).
- Logged (``observe``): ``p/<task type>/<capability>`` = the adaptive q summed per cell (a task
  with k capabilities gives q_i/k to each; exploration excluded, as ARISE's heatmaps; cells
  without a seen task absent), ``seen`` (share of tasks with an estimate), ``variance/mean``
  (mean estimate over seen tasks), ``zero_variance_groups`` (share of this step's observed groups
  with v = 0).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.controllers.base import Controller, TaskBatch
from rubric_rl.rollout.batch import Rollouts
from rubric_rl.rubrics.types import Task
from rubric_rl.util.registry import Registry

SAMPLERS: Registry[type] = Registry("task sampler")


@SAMPLERS.register("uniform")
class UniformSampler(Controller):
    """Each task once per epoch, in a seeded shuffled order; importance weights u = 1."""

    name = "sampler"

    def __init__(self, tasks: Sequence[Task], batch_size: int, *, seed: int = 0):
        if not tasks:
            raise ValueError("UniformSampler: empty task list")
        if batch_size < 1:
            raise ValueError(f"UniformSampler: batch_size must be >= 1, got {batch_size}")
        self.tasks = tuple(tasks)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.epoch = 0
        self.position = 0
        self._order_epoch = -1
        self._order: np.ndarray | None = None

    def epoch_order(self, epoch: int) -> np.ndarray:
        if self._order_epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._order = rng.permutation(len(self.tasks))
            self._order_epoch = epoch
        return self._order

    def next_indices(self) -> list[int]:
        out: list[int] = []
        while len(out) < self.batch_size:
            order = self.epoch_order(self.epoch)
            take = min(self.batch_size - len(out), len(order) - self.position)
            out.extend(int(i) for i in order[self.position : self.position + take])
            self.position += take
            if self.position == len(order):
                self.epoch, self.position = self.epoch + 1, 0
        return out

    def sample_tasks(self, step: int, rng: np.random.Generator) -> TaskBatch:
        idx = self.next_indices()
        return TaskBatch(tuple(self.tasks[i] for i in idx), np.ones(len(idx)))

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "num_tasks": len(self.tasks),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state["num_tasks"]) != len(self.tasks) or int(state["seed"]) != self.seed:
            raise ValueError(
                f"sampler state is for {state['num_tasks']} tasks / seed {state['seed']}, "
                f"this run has {len(self.tasks)} tasks / seed {self.seed}"
            )
        if not 0 <= int(state["position"]) < len(self.tasks):
            raise ValueError(f"sampler state position {state['position']} out of range")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])


# --- reward-variance selection -------------------------------------------------------------------

GROUP_REWARDS: Registry[Callable[[Rollouts], np.ndarray]] = Registry("group reward source")
GENERAL = "general"  # the capability of a task that declares none (as the capability sampler)
ZERO_VARIANCE = 1e-12  # a group variance at or below this counts as zero (metric only)


@GROUP_REWARDS.register("evidence")
def evidence_rewards(evidence: Rollouts) -> np.ndarray:
    """``Rollouts.rewards`` [G, J]: the trained reward (``config.loss.reward``); NaN: undefined
    (e.g. no criterion judged)."""
    return np.asarray(evidence.rewards, dtype=np.float64)


@GROUP_REWARDS.register("task_verifier")
def task_verifier_rewards(
    evidence: Rollouts, verify: Callable[[Any, str], Any] | None = None
) -> np.ndarray:
    """[G, J] outcome rewards: 1.0 where the domain's verifier passes the response, else 0.0;
    NaN where the verifier raises (undefined, never 0) or the group is shorter. Read from the
    step's ``task_verifier`` signal, which the reward stage computes from the domain's verifier
    (``Domain.verify``) whenever the domain has one; ``verify`` computes it for evidence without
    that signal."""
    if any("task_verifier" in t.signals for g in evidence.groups for t in g.trajectories):
        return evidence.signal("task_verifier")
    if verify is None:
        domains = sorted({t.domain for t in evidence.tasks})
        raise ValueError(
            f"reward_variance sampler: reward='task_verifier' has no verifier for domain "
            f"{', '.join(map(repr, domains))}: the step computes the task_verifier signal only "
            "for a domain with a verifier (Domain.verify); use reward='evidence'"
        )
    width = max((len(r) for r in evidence.responses), default=0)
    out = np.full((len(evidence.tasks), width), np.nan)
    for g, (task, group) in enumerate(zip(evidence.tasks, evidence.responses)):
        for j, response in enumerate(group):
            try:
                r = verify(task, response)
            except Exception as e:  # noqa: BLE001 - a verifier failure is no evidence
                logging.warning("reward_variance: verifier failed on task %r: %r", task.id, e)
                continue
            if r is not None:
                out[g, j] = float(r)
    return out


def group_variance(rewards: np.ndarray, min_group: int = 2) -> float | None:
    """Population variance of one group's defined rewards; None with fewer than ``min_group``."""
    r = np.asarray(rewards, dtype=np.float64)
    r = r[~np.isnan(r)]
    if len(r) < max(min_group, 1):
        return None
    if r.max() == r.min():
        return 0.0  # exactly: the mean of equal floats may round, leaving ~1e-32
    return float(np.mean((r - r.mean()) ** 2))


@dataclasses.dataclass(frozen=True)
class RewardVarianceConfig:
    batch_size: int
    explore_share: float = 0.25
    ema: float = 0.5
    floor: float = 0.01
    reward: str = "evidence"
    min_group: int = 2
    seed: int = 0

    def __post_init__(self):
        name = "RewardVarianceConfig"
        if self.batch_size < 1:
            raise ValueError(f"{name}.batch_size must be >= 1: {self.batch_size}")
        if not 0.0 <= self.explore_share <= 1.0:
            raise ValueError(f"{name}.explore_share must be in [0, 1]: {self.explore_share}")
        if not 0.0 < self.ema <= 1.0:
            raise ValueError(f"{name}.ema must be in (0, 1]: {self.ema}")
        if not self.floor > 0.0:
            raise ValueError(f"{name}.floor must be > 0 (no task may starve): {self.floor}")
        if self.min_group < 2:
            raise ValueError(f"{name}.min_group must be >= 2 (a variance needs two): "
                             f"{self.min_group}")  # fmt: skip
        GROUP_REWARDS.get(self.reward)  # unknown name -> clear error now, not at step 1


@SAMPLERS.register("reward_variance")
class RewardVarianceSampler(Controller):
    """Tasks drawn ∝ recent group-reward variance + floor, with an exploration share for unseen
    tasks and importance weights u = 1/(N p) (see the module docstring)."""

    name = "sampler"

    def __init__(
        self,
        tasks: Sequence[Task],
        batch_size: int | RewardVarianceConfig,
        *,
        seed: int = 0,
        **options: Any,
    ):
        """``RewardVarianceSampler(tasks, batch_size, seed=..., **options)`` like the other
        samplers (options: the fields of ``RewardVarianceConfig``), or ``(tasks, config)``."""
        if isinstance(batch_size, RewardVarianceConfig):
            if options:
                raise ValueError("RewardVarianceSampler: pass a config or options, not both")
            config = batch_size
        else:
            config = RewardVarianceConfig(batch_size=int(batch_size), seed=seed, **options)
        if not tasks:
            raise ValueError("RewardVarianceSampler: empty task list")
        ids = [t.id for t in tasks]
        if len(set(ids)) != len(ids):
            raise ValueError("RewardVarianceSampler: task ids must be unique")
        self.tasks = tuple(tasks)
        self.config = config
        self.index = {t.id: i for i, t in enumerate(self.tasks)}
        self.estimates = np.full(len(self.tasks), np.nan)  # NaN = unseen
        self.groups = np.zeros(len(self.tasks), dtype=np.int64)  # groups folded into estimates

    # --- probabilities ------------------------------------------------------------------------

    def seen(self) -> np.ndarray:
        return ~np.isnan(self.estimates)

    def adaptive_probabilities(self) -> np.ndarray:
        """q over tasks: ∝ (ṽ_i + floor) on the seen tasks, 0 elsewhere; uniform while none is
        seen."""
        seen = self.seen()
        if not seen.any():
            return np.full(len(self.tasks), 1.0 / len(self.tasks))
        w = np.where(seen, np.nan_to_num(self.estimates) + self.config.floor, 0.0)
        return w / w.sum()

    def num_explore(self) -> int:
        """n_e: draws given to distinct unseen tasks this batch."""
        seen = self.seen()
        unseen = int((~seen).sum())
        if not seen.any():
            return min(self.config.batch_size, len(self.tasks))
        return min(int(round(self.config.explore_share * self.config.batch_size)), unseen)

    def task_probabilities(self) -> np.ndarray:
        """The per-draw mixture p = (1 − n_e/B)·q + (n_e/B)·e (sums to 1)."""
        share = self.num_explore() / self.config.batch_size
        unseen = ~self.seen()
        e = np.where(unseen, 1.0 / max(int(unseen.sum()), 1), 0.0)
        return (1.0 - share) * self.adaptive_probabilities() + share * e

    def cell_probabilities(self) -> dict[tuple[str, str], float]:
        """The adaptive q summed per (task type, capability) cell over the seen tasks
        (exploration excluded); a cell without a seen task is absent (a blank heatmap cell)."""
        seen = self.seen()
        if not seen.any():
            return {}
        out: dict[tuple[str, str], float] = {}
        for task, qi, s in zip(self.tasks, self.adaptive_probabilities(), seen):
            if not s:
                continue
            caps = task.capabilities or (GENERAL,)
            for c in caps:
                key = (task.task_type, c)
                out[key] = out.get(key, 0.0) + float(qi) / len(caps)
        return dict(sorted(out.items()))

    # --- sampling -----------------------------------------------------------------------------

    def sample_tasks(self, step: int, rng: np.random.Generator | None) -> TaskBatch:
        cfg = self.config
        if rng is None:
            rng = np.random.default_rng([cfg.seed, step])
        n_explore = self.num_explore()
        unseen = np.flatnonzero(~self.seen())
        explored = rng.choice(unseen, size=n_explore, replace=False) if n_explore else []
        q = self.adaptive_probabilities()
        adaptive = rng.choice(len(self.tasks), size=cfg.batch_size - n_explore, p=q)
        idx = np.concatenate([np.asarray(explored, np.int64), adaptive.astype(np.int64)])
        p = self.task_probabilities()
        weights = 1.0 / (len(self.tasks) * p[idx])  # HarnessRL §2.1: u = 1 / (N p_i)
        return TaskBatch(tuple(self.tasks[i] for i in idx), weights)

    # --- evidence -----------------------------------------------------------------------------

    def observe_group(self, task_id: str, rewards: Sequence[float]) -> float | None:
        """Folds one group's rewards into the task's estimate; returns the group variance (None
        when the group has too few defined rewards, or the task is not this sampler's)."""
        v = group_variance(np.asarray(rewards, np.float64), self.config.min_group)
        i = self.index.get(task_id)
        if v is None or i is None:
            return v
        old = self.estimates[i]
        a = self.config.ema
        self.estimates[i] = v if np.isnan(old) else (1.0 - a) * old + a * v
        self.groups[i] += 1
        return v

    def observe(self, evidence: Rollouts) -> dict[str, float]:
        rewards = GROUP_REWARDS.get(self.config.reward)(evidence)
        observed = [self.observe_group(t.id, rewards[g]) for g, t in enumerate(evidence.tasks)]
        observed = [v for v in observed if v is not None]
        metrics = {f"p/{t}/{c}": v for (t, c), v in self.cell_probabilities().items()}
        seen = self.seen()
        metrics["seen"] = float(seen.mean())
        if seen.any():
            metrics["variance/mean"] = float(self.estimates[seen].mean())
        if observed:
            metrics["zero_variance_groups"] = float(np.mean(np.asarray(observed) <= ZERO_VARIANCE))
        return metrics

    # --- checkpoint ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        seen = self.seen()
        return {
            "num_tasks": len(self.tasks),
            "seed": self.config.seed,
            # Python floats: JSON round-trips them exactly (repr); unseen tasks are absent.
            "estimates": {t.id: float(v) for t, v, s in zip(self.tasks, self.estimates, seen) if s},
            "groups": {t.id: int(n) for t, n in zip(self.tasks, self.groups) if n},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state["num_tasks"]) != len(self.tasks) or int(state["seed"]) != self.config.seed:
            raise ValueError(
                f"reward_variance sampler state is for {state['num_tasks']} tasks / seed "
                f"{state['seed']}, this run has {len(self.tasks)} tasks / seed {self.config.seed}"
            )
        unknown = sorted((set(state["estimates"]) | set(state["groups"])) - set(self.index))
        if unknown:
            raise ValueError(f"reward_variance sampler state names unknown tasks {unknown[:5]}")
        estimates = np.full(len(self.tasks), np.nan)
        for tid, v in state["estimates"].items():
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"reward_variance sampler state: estimate of {tid!r} is {v!r}")
            estimates[self.index[tid]] = float(v)
        groups = np.zeros(len(self.tasks), dtype=np.int64)
        for tid, n in state["groups"].items():
            groups[self.index[tid]] = int(n)
        self.estimates, self.groups = estimates, groups
