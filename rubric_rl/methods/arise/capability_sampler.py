"""ARISE capability-based adaptive sampling (seed 000, "Select & learn"; DESIGN §6).

"Rubric judgments estimate capability performance within each task type … Coverage-guided
discovery explores less-evaluated tasks. Adaptive selection prioritizes task-type–capability pairs
with informative success probabilities, balancing learning potential against repeated failure. As
rubrics evolve, unchanged evidence is retained and obsolete contributions are discarded."

What this module computes:

- Cells: (task type × capability); a task belongs to one cell per capability it declares
  (``"general"`` if it declares none).
- Estimates: a Beta posterior per cell, ``Beta(α0 + Σ s, β0 + Σ f)``, where s / f are the satisfied
  / unsatisfied rubric verdicts (a pitfall is satisfied when absent) whose criterion carries that
  capability, on tasks of that type. Evidence is stored per rubric id, so ``forget(ids)`` drops a
  retired rubric's contribution exactly while the others keep theirs. With ``decay < 1`` every
  ``observe`` multiplies old counts by ``decay`` first (the policy moves; old verdicts fade).
- Priority (registered in ``PRIORITIES``): ``"variance"`` = ``p(1 − p)`` with ``p`` the posterior
  mean — highest at p = ½, low both where the policy always fails (repeated failure, little to
  learn from) and where it always succeeds (nothing left to learn); plus a floor
  ``min_priority`` so no scored cell starves. Cell probabilities ``P(c) = w_c / Σ w`` over the
  *scored* cells — those with at least ``min_cell_evidence`` verdicts; ARISE: "Blank cells indicate
  limited coverage or absent active rubrics; discovery sampling continues to explore these
  tasks" — and uniform over tasks while no cell is scored (empty pool). A cell's draw picks one of
  its tasks uniformly. ``probabilities()`` returns these (excluding discovery; unscored cells
  absent), for the task-type × capability heatmaps.
- Discovery: ``n_d = round(discovery_share · B)`` of each batch are the least-evaluated tasks
  (fewest observed groups; ties broken at random), distinct; the other ``B − n_d`` are drawn
  adaptively, with replacement.
- Importance weights (``importance_weights=True`` only): ``u = 1 / (N p_i)`` (HarnessRL §2.1)
  with ``p_i`` the per-draw mixture
  ``(1 − n_d/B)·q_i + (n_d/B)·d_i``: ``q_i = Σ_{c ∋ i} P(c) / |c|`` the adaptive marginal and
  ``d_i`` uniform over the tasks whose evaluation count is at most the largest one discovery
  picked (exact when those counts tie, which is the common case: unseen tasks all have 0).
  ARISE "prioritizes" tasks: it trains on what it draws, every draw with u = 1, so the default is
  ``importance_weights=False``. With the correction the objective returns to uniform in
  expectation (the prioritisation cancels), and u ranged 0.16–51 on the embedded default; the
  scripted-policy check (``benchmarks/arise_controller_check.py``) measured the effective batch
  (Σu)² / Σu² at 0.65 of the groups. It is kept as a flag for HarnessRL-style corrected
  sampling and as an ablation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.controllers.base import Controller, TaskBatch
from rubric_rl.controllers.sampling import SAMPLERS
from rubric_rl.rollout.batch import Rollouts
from rubric_rl.rubrics.types import Task
from rubric_rl.util.registry import Registry

GENERAL = "general"
Cell = tuple[str, str]

PRIORITIES: Registry[Callable[[np.ndarray], np.ndarray]] = Registry("capability priority")


@PRIORITIES.register("variance")
def variance_priority(p: np.ndarray) -> np.ndarray:
    """``p(1 − p)``: informative success probabilities (ARISE: learning potential vs repeated
    failure), maximal at p = ½."""
    return p * (1.0 - p)


@PRIORITIES.register("uniform")
def uniform_priority(p: np.ndarray) -> np.ndarray:
    """Every cell alike (an ablation: cell-balanced sampling without adaptation)."""
    return np.ones_like(p)


@dataclasses.dataclass(frozen=True)
class CapabilitySamplerConfig:
    batch_size: int
    discovery_share: float = 0.25
    prior_alpha: float = 1.0
    prior_beta: float = 1.0
    decay: float = 1.0
    priority: str = "variance"
    min_priority: float = 1e-3
    min_cell_evidence: float = 1.0
    importance_weights: bool = False  # u = 1/(N p_i) on each draw (HarnessRL §2.1); ARISE: off
    seed: int = 0

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"CapabilitySamplerConfig.batch_size must be >= 1: {self.batch_size}")
        if not 0.0 <= self.discovery_share <= 1.0:
            raise ValueError(
                f"CapabilitySamplerConfig.discovery_share must be in [0, 1]: {self.discovery_share}"
            )
        if self.prior_alpha <= 0 or self.prior_beta <= 0:
            raise ValueError("CapabilitySamplerConfig.prior_alpha / prior_beta must be > 0")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"CapabilitySamplerConfig.decay must be in (0, 1]: {self.decay}")
        if self.min_cell_evidence < 0:
            raise ValueError("CapabilitySamplerConfig.min_cell_evidence must be >= 0")
        if self.min_priority < 0:
            raise ValueError("CapabilitySamplerConfig.min_priority must be >= 0")
        PRIORITIES.get(self.priority)  # unknown name -> clear error now, not at step 1

    @property
    def num_discovery(self) -> int:
        return int(round(self.discovery_share * self.batch_size))


def cell_key(cell: Cell) -> str:
    return f"{cell[0]}|{cell[1]}"


def task_cells(task: Task) -> list[Cell]:
    return [(task.task_type, c) for c in (task.capabilities or (GENERAL,))]


@SAMPLERS.register("capability")
class CapabilitySampler(Controller):
    """Capability-based adaptive sampler with discovery share (see module docstring)."""

    name = "sampler"

    def __init__(
        self,
        tasks: Sequence[Task],
        batch_size: int | CapabilitySamplerConfig,
        *,
        seed: int = 0,
        **options: Any,
    ):
        """``CapabilitySampler(tasks, batch_size, seed=..., **options)`` like the other samplers
        (options: the fields of ``CapabilitySamplerConfig``), or ``(tasks, config)``."""
        if isinstance(batch_size, CapabilitySamplerConfig):
            if options:
                raise ValueError("CapabilitySampler: pass a config or options, not both")
            config = batch_size
        else:
            config = CapabilitySamplerConfig(batch_size=int(batch_size), seed=seed, **options)
        if not tasks:
            raise ValueError("CapabilitySampler: empty task list")
        ids = [t.id for t in tasks]
        if len(set(ids)) != len(ids):
            raise ValueError("CapabilitySampler: task ids must be unique")
        self.tasks = tuple(tasks)
        self.config = config
        self.index = {t.id: i for i, t in enumerate(self.tasks)}
        members: dict[Cell, list[int]] = {}
        for i, t in enumerate(self.tasks):
            for cell in task_cells(t):
                members.setdefault(cell, []).append(i)
        self.cells: tuple[Cell, ...] = tuple(sorted(members))
        self.members = {c: np.asarray(members[c]) for c in self.cells}
        # rubric id -> cell key -> [satisfied, unsatisfied] (decayed counts)
        self.evidence: dict[str, dict[str, list[float]]] = {}
        self.evaluations = np.zeros(len(self.tasks), dtype=np.int64)

    # --- estimates and probabilities ----------------------------------------------------------

    def counts(self) -> dict[Cell, tuple[float, float]]:
        """(satisfied, unsatisfied) per cell, summed over the rubrics still held."""
        out = {c: [0.0, 0.0] for c in self.cells}
        by_key = {cell_key(c): c for c in self.cells}
        for per_cell in self.evidence.values():
            for key, (s, f) in per_cell.items():
                if key in by_key:
                    acc = out[by_key[key]]
                    acc[0] += s
                    acc[1] += f
        return {c: (v[0], v[1]) for c, v in out.items()}

    def estimates(self) -> dict[Cell, tuple[float, float, float]]:
        """Per cell: the Beta posterior (α, β) and its mean."""
        cfg = self.config
        out = {}
        for c, (s, f) in self.counts().items():
            a, b = cfg.prior_alpha + s, cfg.prior_beta + f
            out[c] = (a, b, a / (a + b))
        return out

    def scored_cells(self) -> list[Cell]:
        """Cells with at least ``min_cell_evidence`` (decayed) verdicts: the adaptive support."""
        counts = self.counts()
        return [c for c in self.cells if sum(counts[c]) >= self.config.min_cell_evidence]

    def probabilities(self) -> dict[Cell, float]:
        """Adaptive cell probabilities P(c) over the scored cells (discovery excluded), for
        logging and heatmaps; a cell without enough evidence is absent (a blank heatmap cell)."""
        cells = self.scored_cells()
        if not cells:
            return {}
        est = self.estimates()
        p = np.array([est[c][2] for c in cells])
        w = PRIORITIES.get(self.config.priority)(p) + self.config.min_priority
        if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise ValueError(f"capability priority {self.config.priority!r} gave weights {w}")
        w = w / w.sum()
        return {c: float(x) for c, x in zip(cells, w)}

    def task_probabilities(self) -> np.ndarray:
        """The adaptive marginal q_i = Σ_{c ∋ i} P(c) / |c| over tasks; uniform while no cell is
        scored (the empty pool at the start of training)."""
        probs = self.probabilities()
        if not probs:
            return np.full(len(self.tasks), 1.0 / len(self.tasks))
        q = np.zeros(len(self.tasks))
        for c, pc in probs.items():
            idx = self.members[c]
            q[idx] += pc / len(idx)
        return q

    # --- sampling -----------------------------------------------------------------------------

    def _discovery(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(the n least-evaluated task indices, the discovery distribution d)."""
        d = np.zeros(len(self.tasks))
        if n == 0:
            return np.zeros(0, dtype=np.int64), d
        tiebreak = rng.random(len(self.tasks))
        order = np.lexsort((tiebreak, self.evaluations))
        picked = order[: min(n, len(self.tasks))]
        pool = np.flatnonzero(self.evaluations <= self.evaluations[picked].max())
        d[pool] = 1.0 / len(pool)
        return picked, d

    def sample_tasks(self, step: int, rng: np.random.Generator | None) -> TaskBatch:
        cfg = self.config
        if rng is None:
            rng = np.random.default_rng([cfg.seed, step])
        n_disc = min(cfg.num_discovery, len(self.tasks))
        discovered, d = self._discovery(n_disc, rng)
        n_adapt = cfg.batch_size - len(discovered)
        probs = self.probabilities()
        if probs:
            cells = list(probs)
            pc = np.array([probs[c] for c in cells])
            drawn_cells = rng.choice(len(cells), size=n_adapt, p=pc / pc.sum())
            adaptive = [int(rng.choice(self.members[cells[k]])) for k in drawn_cells]
        else:
            adaptive = [int(i) for i in rng.choice(len(self.tasks), size=n_adapt)]
        idx = np.concatenate([discovered, np.asarray(adaptive, dtype=np.int64)]).astype(np.int64)
        tasks = tuple(self.tasks[i] for i in idx)
        if not cfg.importance_weights:
            return TaskBatch(tasks, np.ones(len(idx)))
        share = len(discovered) / cfg.batch_size
        p = (1.0 - share) * self.task_probabilities() + share * d
        weights = 1.0 / (len(self.tasks) * p[idx])  # HarnessRL §2.1: u = 1 / (N p_i)
        return TaskBatch(tasks, weights)

    # --- evidence ----------------------------------------------------------------------------

    def observe_verdicts(
        self, task: Task, verdicts: Sequence[Sequence[Any]], *, count_evaluation: bool = True
    ) -> None:
        """Adds one group's verdicts (``verdicts[j]`` = rollout j's Verdicts) for ``task``, whose
        rubric names each verdict's criterion (and so its capability)."""
        crits = {c.id: c for c in task.rubric.criteria}
        for rollout in verdicts:
            for v in rollout:
                if v.met is None:
                    continue  # a judge failure is no evidence
                crit = crits.get(v.criterion_id)
                if crit is None:
                    raise ValueError(
                        f"CapabilitySampler: verdict for {v.criterion_id!r} but task {task.id!r} "
                        f"has no such criterion"
                    )
                cell = (task.task_type, crit.capability or GENERAL)
                acc = self.evidence.setdefault(crit.id, {}).setdefault(cell_key(cell), [0.0, 0.0])
                ok = v.met if crit.weight > 0 else not v.met
                acc[0 if ok else 1] += 1.0
        if count_evaluation and task.id in self.index:
            self.evaluations[self.index[task.id]] += 1

    def decay(self) -> None:
        if self.config.decay < 1.0:
            for per_cell in self.evidence.values():
                for acc in per_cell.values():
                    acc[0] *= self.config.decay
                    acc[1] *= self.config.decay

    def observe(self, evidence: Rollouts) -> dict[str, float]:
        self.decay()
        for task, verdicts in zip(evidence.tasks, evidence.verdicts):
            self.observe_verdicts(task, verdicts)
        return self.metrics()

    def forget(self, rubric_ids: Sequence[str]) -> None:
        """Drops the evidence of these rubrics (retired): they no longer move any estimate."""
        for rid in rubric_ids:
            self.evidence.pop(rid, None)

    def metrics(self) -> dict[str, float]:
        probs = self.probabilities()
        est = self.estimates()
        out = {f"p/{t}/{c}": v for (t, c), v in probs.items()}
        out.update({f"success/{t}/{c}": est[(t, c)][2] for t, c in probs})
        out["scored_cells"] = float(len(probs))
        out["coverage"] = float(np.mean(self.evaluations > 0))
        return out

    # --- checkpoint ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "num_tasks": len(self.tasks),
            "evidence": {
                r: {k: list(v) for k, v in cells.items()} for r, cells in self.evidence.items()
            },
            "evaluations": {t.id: int(n) for t, n in zip(self.tasks, self.evaluations)},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state["num_tasks"]) != len(self.tasks):
            raise ValueError(
                f"capability sampler state is for {state['num_tasks']} tasks, this run has "
                f"{len(self.tasks)}"
            )
        unknown = sorted(set(state["evaluations"]) - set(self.index))
        if unknown:
            raise ValueError(f"capability sampler state names unknown tasks {unknown[:5]}")
        self.evidence = {
            str(r): {str(k): [float(v[0]), float(v[1])] for k, v in cells.items()}
            for r, cells in state["evidence"].items()
        }
        self.evaluations = np.zeros(len(self.tasks), dtype=np.int64)
        for tid, n in state["evaluations"].items():
            self.evaluations[self.index[tid]] = int(n)
