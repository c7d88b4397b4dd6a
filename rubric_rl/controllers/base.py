"""The controller interface (DESIGN §3, §6): the Python-side, stateful, checkpointable parts.

A training step calls, in order:
``sample_tasks(step, rng)`` -> ``TaskBatch`` (tasks + importance weights u);
``decorate(tasks, prompts)`` -> prompts (guidance fields, skills, anti-patterns appended);
``observe(evidence)`` after judging -> metrics (pool / harness / selection updates);
``teacher_context(task, evidence)`` -> privileged context for self-distillation, or None;
``sd_gate(evidence)`` -> per-group multipliers of the SD coefficient, or None.
Every controller is checkpointed through ``state_dict()`` / ``load_state_dict()`` (JSON-able).

Controllers never touch JAX internals; the core never knows which controller runs.
``ControllerSet`` composes one sampler with any number of other controllers.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.rubrics.scores import ScoreMatrices
from rubric_rl.rubrics.types import Task, Verdict

Messages = list[dict[str, str]]


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


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What a step produced, for the controllers to observe. Groups are indexed like ``tasks``;
    ``responses[g][j]`` is rollout j of task g; ``verdicts[g][j]`` its verdicts (a failed judge
    call is a Verdict with met=None); ``rewards[g, j]`` is NaN where undefined."""

    step: int
    tasks: tuple[Task, ...]
    prompts: tuple[Messages, ...]
    responses: tuple[tuple[str, ...], ...]
    verdicts: tuple[tuple[tuple[Verdict, ...], ...], ...]
    scores: ScoreMatrices
    rewards: np.ndarray  # [G, J]
    advantages: np.ndarray  # [G, J]


class Controller:
    """Base class: every hook is a no-op, so a controller overrides only what it changes."""

    name: str = "controller"

    def sample_tasks(self, step: int, rng: np.random.Generator) -> TaskBatch | None:
        """A sampler returns the step's tasks; other controllers return None."""
        return None

    def decorate(self, tasks: Sequence[Task], prompts: Sequence[Messages]) -> list[Messages]:
        """The prompts to roll out (default: unchanged)."""
        return [list(p) for p in prompts]

    def observe(self, evidence: Evidence) -> dict[str, float]:
        """Update from a step's evidence; returns metrics (logged under ``<name>/``)."""
        return {}

    def teacher_context(self, task: Task, evidence: Evidence) -> str | None:
        """Privileged context for the self-distillation teacher (None = no teacher).

        Called after ``observe`` for every task of the step when ``loss.sd_estimator`` is not
        "none". The text is appended (after a space) to the last user message of the task's
        decorated prompt; the teacher is the same parameters on that prompt followed by the
        student's own completion (DESIGN §4–5). Return it already rendered (e.g. a
        ``<coach> … </coach>`` block for the embedded domain)."""
        return None

    def sd_gate(self, evidence: Evidence) -> np.ndarray | None:
        """``[G]`` multipliers of ``loss.sd_coef`` per group (RG-SED's gate × schedule), or
        None = 1 for every group."""
        return None

    def advantages(
        self, tasks: Sequence[Task], responses: Sequence[Sequence[str]], scores: ScoreMatrices
    ) -> np.ndarray | None:
        """``[G, J]`` advantages when this controller shapes the reward itself (ARISE: task and
        rubric signals normalised separately); None = the trainer's GRPO over rubric rewards.
        NaN marks a rollout with no defined advantage (it is not trained on)."""
        return None

    def pop_events(self) -> list[dict[str, Any]]:
        """Lifecycle events since the last call, for ``<workdir>/controllers/<name>.jsonl``."""
        return []

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise ValueError(f"controller {self.name!r} has no state but got {sorted(state)}")


class ControllerSet:
    """One sampler plus further controllers, called in order; times each call so the loop can
    report controller overhead (issue 5: < 2 % of step time in the embedded default)."""

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

    def observe(self, evidence: Evidence) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for c in self.controllers:
            for k, v in (self._timed(c.observe, evidence) or {}).items():
                metrics[f"{c.name}/{k}"] = v
        return metrics

    def teacher_context(self, task: Task, evidence: Evidence) -> str | None:
        parts = [self._timed(c.teacher_context, task, evidence) for c in self.controllers]
        parts = [p for p in parts if p]
        return "\n".join(parts) if parts else None

    def sd_gate(self, evidence: Evidence) -> np.ndarray | None:
        """The product of the controllers' gates (None when no controller gates)."""
        out = None
        for c in self.controllers:
            g = self._timed(c.sd_gate, evidence)
            if g is None:
                continue
            g = np.asarray(g, dtype=np.float64)
            if g.shape != (len(evidence.tasks),) or not np.all(np.isfinite(g)) or np.any(g < 0):
                raise ValueError(
                    f"controller {c.name!r}: sd_gate must be [{len(evidence.tasks)}] finite and "
                    f">= 0, got shape {g.shape}"
                )
            out = g if out is None else out * g
        return out

    def advantages(
        self, tasks: Sequence[Task], responses: Sequence[Sequence[str]], scores: ScoreMatrices
    ) -> np.ndarray | None:
        """The first controller that shapes advantages decides; None if none does."""
        for c in self.controllers:
            adv = self._timed(c.advantages, tasks, responses, scores)
            if adv is not None:
                return np.asarray(adv, dtype=np.float64)
        return None

    def pop_events(self) -> dict[str, list[dict[str, Any]]]:
        return {c.name: list(c.pop_events() or []) for c in self.controllers}

    def state_dict(self) -> dict[str, Any]:
        return {c.name: c.state_dict() for c in self.controllers}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        missing = [c.name for c in self.controllers if c.name not in state]
        if missing:
            raise KeyError(f"checkpoint has no state for controller(s) {missing}")
        for c in self.controllers:
            c.load_state_dict(state[c.name])

    def pop_seconds(self) -> float:
        s, self.seconds = self.seconds, 0.0
        return s
