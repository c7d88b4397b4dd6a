"""The controller interface (DESIGN §3, §6): the Python-side, stateful, checkpointable parts.

The default stages of a step (``rubric_rl/step.py``) call, in order:
``sample_tasks(step, rng)`` -> ``TaskBatch`` (tasks + importance weights u);
``decorate(tasks, prompts)`` -> prompts (guidance fields, skills, anti-patterns appended);
``sample_prompts(step, tasks, prompts, n)`` -> per-sample behaviour prompts (RuscaRL's scaffold;
the decorated prompt is still the one trained);
``reward_signals(rollouts)`` -> extra named reward signals ``[G, J]``;
``signal_weights()`` -> the trained mix of signals (None: ``loss.reward``);
``shape_advantages(rollouts, adv)`` -> reshaped advantages (None: unchanged);
``observe(rollouts)`` after judging -> metrics (pool / harness / selection updates);
``select(rollouts)`` -> which groups are trained ``[G]`` bool (None: all);
``teacher_context(task, rollouts)`` -> privileged context for self-distillation, or None;
``sd_gate(rollouts)`` -> per-group multipliers of the SD coefficient, or None.
The evidence a controller reads is the step's ``Rollouts`` record (``rollout/batch.py``).
Before the first step each controller is ``bind``-ed to its ``Services`` (generate on the
current policy, judge under candidate rubrics: ``rubric_rl/services/``) and its own directory
``<workdir>/controllers/<name>/``; files there follow the step-watermark convention of
``rubric_rl/runs/run_files.py`` so that a resume rolls back what was written after the checkpoint.
Every controller is checkpointed through ``state_dict()`` / ``load_state_dict()`` (JSON-able).

Controllers never touch JAX internals; the core never knows which controller runs.
``ControllerSet`` composes one sampler with any number of other controllers, in the documented
order of ``rubric_rl/step.py``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.rollout.batch import Messages, Rollouts
from rubric_rl.rubrics.types import Task


@dataclasses.dataclass(frozen=True)
class TaskBatch:
    """Tasks drawn for one step and their importance weights u (HarnessRL §2.1: u = 1/(N p_i);
    all ones for uniform sampling)."""

    tasks: tuple[Task, ...]
    weights: np.ndarray  # [len(tasks)] float

    def __post_init__(self):
        object.__setattr__(self, "tasks", tuple(self.tasks))
        w = np.asarray(self.weights, dtype=np.float64)
        if w.shape != (len(self.tasks),):
            raise ValueError(f"TaskBatch.weights must be [{len(self.tasks)}], got {w.shape}")
        if not np.all(np.isfinite(w)) or np.any(w < 0):
            raise ValueError("TaskBatch.weights must be finite and >= 0")
        object.__setattr__(self, "weights", w)

    def __len__(self) -> int:
        return len(self.tasks)


class Controller:
    """Base class: every hook is a no-op, so a controller overrides only what it changes."""

    name: str = "controller"
    services: Any = None  # set by ``bind`` (rubric_rl.services.Services, this controller's view)
    run_dir: str | None = None  # <workdir>/controllers/<name>/

    def bind(self, services: Any, run_dir: str | None) -> None:
        """Called once before training: the step's services and this controller's directory."""
        self.services = services
        self.run_dir = run_dir

    def sample_tasks(self, step: int, rng: np.random.Generator) -> TaskBatch | None:
        """A sampler returns the step's tasks; other controllers return None."""
        return None

    def decorate(self, tasks: Sequence[Task], prompts: Sequence[Messages]) -> list[Messages]:
        """The prompts to roll out (default: unchanged)."""
        return [list(p) for p in prompts]

    def sample_prompts(
        self, step: int, tasks: Sequence[Task], prompts: Sequence[Messages], n: int
    ) -> list[list[Messages] | None] | None:
        """Per-sample behaviour prompts (RuscaRL's scaffold): for each group, ``n`` prompts its
        rollouts are sampled from, or None (all from the group's prompt); None = no group.

        The group's own (decorated) prompt stays the one that is trained: the loss sees
        π(y | prompt) for a y sampled under its behaviour prompt, with no importance correction
        (RuscaRL; ``loss.rollout_correction="off"`` recomputes π_old on the trained prompt)."""
        return None

    def reward_signals(self, rollouts: Rollouts) -> dict[str, np.ndarray]:
        """Extra named reward signals ``{name: [G, J]}`` (NaN = undefined) for the trained mix."""
        return {}

    def signal_weights(self) -> dict[str, float] | None:
        """The trained mix ``{signal: weight}`` (ARISE: task verifier 1, rubric w_rubric);
        A = Σ w · norm_g(signal). None: the trainer's ``loss.reward``."""
        return None

    def shape_advantages(self, rollouts: Rollouts, advantages: np.ndarray) -> np.ndarray | None:
        """``[G, J]`` advantages after this controller's shaping; None = unchanged."""
        return None

    def observe(self, rollouts: Rollouts) -> dict[str, float]:
        """Update from a step's rollouts; returns metrics (logged under ``<name>/``)."""
        return {}

    def select(self, rollouts: Rollouts) -> np.ndarray | None:
        """``[G]`` bool: the groups to train (RISED keeps k of 2k); None = all."""
        return None

    def teacher_context(self, task: Task, rollouts: Rollouts) -> str | None:
        """Privileged context for the self-distillation teacher (None = no teacher).

        Called after ``observe`` for every task of the step when ``loss.sd_estimator`` is not
        "none". The text is appended (after a space) to the last user message of the task's
        decorated prompt; the teacher is the same parameters on that prompt followed by the
        student's own completion (DESIGN §4–5). Return it already rendered (e.g. a
        ``<coach> … </coach>`` block for the embedded domain)."""
        return None

    def sd_gate(self, rollouts: Rollouts) -> np.ndarray | None:
        """``[G]`` multipliers of ``loss.sd_coef`` per group (RG-SED's gate × schedule), or
        None = 1 for every group."""
        return None

    def pop_events(self) -> list[dict[str, Any]]:
        """Lifecycle events since the last call, for ``<workdir>/controllers/<name>.jsonl``."""
        return []

    def rollback(self, step: int) -> None:
        """On (re)start, after ``load_state_dict``: undo what this controller stored outside its
        state after ``step`` (the restored checkpoint's step; 0 when no checkpoint), beyond the
        run directory's step-stamped files (``run_files.rollback``) — e.g. the harness memory's
        records. Called on the primary host only."""

    def disk_records(self) -> dict[str, int]:
        """Record counts of stores under ``run_dir`` whose files alone do not show what they hold
        (a database: an emptied one still has its files), e.g. ``{"time_records": 257}``.
        Written into each checkpoint's manifest (``run_files.manifest``); a resume that finds
        fewer is refused. Default: none."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise ValueError(f"controller {self.name!r} has no state but got {sorted(state)}")


class ControllerSet:
    """One sampler plus further controllers, called in order; times each call so the loop can
    report controller overhead (under 2 % of step time in the embedded default)."""

    def __init__(self, sampler: Controller, others: Sequence[Controller] = ()):
        self.controllers = [sampler, *others]
        names = [c.name for c in self.controllers]
        if len(set(names)) != len(names):
            raise ValueError(f"controller names must be unique, got {names}")
        self.sampler = sampler
        self.seconds = 0.0

    def _timed(self, fn, *args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds += time.perf_counter() - t0

    def sample_tasks(self, step: int, rng: np.random.Generator) -> TaskBatch:
        batch = self._timed(self.sampler.sample_tasks, step, rng)
        if batch is None:
            raise ValueError(f"controller {self.sampler.name!r} is not a sampler")
        return batch

    def decorate(self, tasks: Sequence[Task], prompts: Sequence[Messages]) -> list[Messages]:
        out = [list(p) for p in prompts]
        for c in self.controllers:
            out = self._timed(c.decorate, tasks, out)
        return out

    def sample_prompts(
        self, step: int, tasks: Sequence[Task], prompts: Sequence[Messages], n: int
    ) -> list[list[Messages] | None]:
        """Per group, the behaviour prompts of the one controller that scaffolds it, or None."""
        out: list[list[Messages] | None] = [None] * len(tasks)
        owner: list[str | None] = [None] * len(tasks)
        for c in self.controllers:
            got = self._timed(c.sample_prompts, step, tasks, prompts, n)
            if got is None:
                continue
            if len(got) != len(tasks):
                raise ValueError(
                    f"controller {c.name!r}: sample_prompts returned {len(got)} entries for "
                    f"{len(tasks)} groups"
                )
            for g, per in enumerate(got):
                if per is None:
                    continue
                if len(per) != n:
                    raise ValueError(
                        f"controller {c.name!r}: {len(per)} behaviour prompts for task "
                        f"{tasks[g].id!r}, expected {n}"
                    )
                if owner[g] is not None:
                    raise ValueError(
                        f"task {tasks[g].id!r}: behaviour prompts from both {owner[g]!r} and "
                        f"{c.name!r}"
                    )
                out[g], owner[g] = [list(m) for m in per], c.name
        return out

    def bind(self, services: Any, controllers_dir: str | None) -> None:
        import os

        for c in self.controllers:
            d = None if controllers_dir is None else os.path.join(controllers_dir, c.name)
            c.bind(services.for_caller(c.name) if services is not None else None, d)

    def reward_signals(self, rollouts: Rollouts) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for c in self.controllers:
            for k, v in (self._timed(c.reward_signals, rollouts) or {}).items():
                if k in out:
                    raise ValueError(f"controller {c.name!r}: reward signal {k!r} given twice")
                out[k] = v
        return out

    def signal_weights(self) -> dict[str, float] | None:
        out: dict[str, float] = {}
        for c in self.controllers:
            for k, w in (self._timed(c.signal_weights) or {}).items():
                if k in out:
                    raise ValueError(f"controller {c.name!r}: signal {k!r} weighted twice")
                out[k] = float(w)
        return out or None

    def shape_advantages(
        self, rollouts: Rollouts, advantages: np.ndarray, adv_trainable: np.ndarray | None = None
    ) -> np.ndarray:
        """Each controller's shaping in turn (controller order)."""
        adv = np.asarray(advantages, np.float64)
        for c in self.controllers:
            shaped = self._timed(c.shape_advantages, rollouts, adv)
            if shaped is not None:
                shaped = np.asarray(shaped, np.float64)
                if shaped.shape != adv.shape:
                    raise ValueError(
                        f"controller {c.name!r}: shape_advantages returned {shaped.shape}, "
                        f"expected {adv.shape}"
                    )
                adv = shaped
        return adv

    def observe(self, rollouts: Rollouts) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for c in self.controllers:
            for k, v in (self._timed(c.observe, rollouts) or {}).items():
                metrics[f"{c.name}/{k}"] = v
        return metrics

    def select(self, rollouts: Rollouts) -> np.ndarray | None:
        """A group is trained iff every controller that selects keeps it (None: nobody selects)."""
        out = None
        for c in self.controllers:
            keep = self._timed(c.select, rollouts)
            if keep is None:
                continue
            keep = np.asarray(keep)
            if keep.shape != (len(rollouts),) or keep.dtype != bool:
                raise ValueError(
                    f"controller {c.name!r}: select must return [{len(rollouts)}] bool, got "
                    f"{keep.dtype} {keep.shape}"
                )
            out = keep if out is None else out & keep
        return out

    def teacher_context(self, task: Task, rollouts: Rollouts) -> str | None:
        parts = [self._timed(c.teacher_context, task, rollouts) for c in self.controllers]
        parts = [p for p in parts if p]
        return "\n".join(parts) if parts else None

    def sd_gate(self, rollouts: Rollouts) -> np.ndarray | None:
        """The product of the controllers' gates (None when no controller gates)."""
        out = None
        n = len(rollouts)
        for c in self.controllers:
            g = self._timed(c.sd_gate, rollouts)
            if g is None:
                continue
            g = np.asarray(g, dtype=np.float64)
            if g.shape != (n,) or not np.all(np.isfinite(g)) or np.any(g < 0):
                raise ValueError(
                    f"controller {c.name!r}: sd_gate must be [{n}] finite and >= 0, got shape "
                    f"{g.shape}"
                )
            out = g if out is None else out * g
        return out

    def pop_events(self) -> dict[str, list[dict[str, Any]]]:
        return {c.name: list(c.pop_events() or []) for c in self.controllers}

    def rollback(self, step: int) -> None:
        for c in self.controllers:
            c.rollback(int(step))

    def state_dict(self) -> dict[str, Any]:
        return {c.name: c.state_dict() for c in self.controllers}

    def disk_records(self) -> dict[str, dict[str, int]]:
        """``{controller: its disk_records()}`` for the controllers that report any."""
        return {c.name: r for c in self.controllers if (r := c.disk_records())}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        missing = [c.name for c in self.controllers if c.name not in state]
        if missing:
            raise KeyError(f"checkpoint has no state for controller(s) {missing}")
        for c in self.controllers:
            c.load_state_dict(state[c.name])

    def pop_seconds(self) -> float:
        s, self.seconds = self.seconds, 0.0
        return s
