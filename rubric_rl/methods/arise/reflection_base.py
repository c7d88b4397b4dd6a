"""What the ARISE pool and its reflections share: value types, ``Reflection``, the registry.

``arise_pool.py`` (the pool), ``reflection.py`` (the programmatic miner) and ``reflection_llm.py``
(the LLM reflection) all import this module and none of them imports another for these names:
rollout evidence reaches a reflection as ``RolloutRecord`` values, proposals come back as
``Proposal`` values, and a reflection reads pool entries only through ``PoolPair`` (which
``arise_pool.PoolEntry`` satisfies).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from rubric_rl.rubrics.types import Criterion, Task
from rubric_rl.util.registry import Registry

__all__ = [
    "CRITERION_SLOT",
    "CriteriaBank",
    "MISSED_PREFIX",
    "REFLECTIONS",
    "REMEMBER_PREFIX",
    "PoolPair",
    "Proposal",
    "Reflection",
    "RolloutRecord",
    "failing_records",
    "fill_skill",
    "guidance_hint",
    "satisfied",
    "seed_rubric_bank",
]


class PoolPair(Protocol):
    """What a reflection reads of a pool entry (a rubric–skill pair; ``arise_pool.PoolEntry``)."""

    id: str
    key: str
    text: str
    weight: float
    capability: str
    skill: str
    refinements: int


# Where the checkable criteria of a task come from, for a programmatic reflection's candidates
# and for instantiating a pool entry bound to one of them on each task: the task's own (seed)
# rubric, or a domain's checker library read from the prompt (envs/constraint_library.py).
CriteriaBank = Callable[[Task], Sequence[Criterion]]


def seed_rubric_bank(task: Task) -> Sequence[Criterion]:
    """The task's own rubric criteria: the earlier default bank, kept as the ablation
    ``arise.bank="seed_rubric"``."""
    return task.rubric.criteria


CRITERION_SLOT = "{criterion}"  # filled per task with the entry's criterion as guidance states it
MISSED_PREFIX = "the last answers missed :"  # the domain's critique wording (constraint_corpus)
REMEMBER_PREFIX = "remember :"


@dataclasses.dataclass(frozen=True)
class RolloutRecord:
    """One rollout of the recent window: its task (with the task's own rubric), the response,
    the task outcome (None = verifier failed) and the pool criteria's verdicts (None = failed)."""

    step: int
    task: Task
    response: str
    success: bool | None
    verdicts: Mapping[str, bool | None] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Proposal:
    """A new rubric–skill pair. ``source_id`` binds the rubric to the task's own criterion of that
    id (instantiated per task); without it the rubric is ``text``, judged by the LLM judge."""

    key: str
    text: str
    skill: str
    capability: str
    task_types: tuple[str, ...]
    weight: float = 1.0
    source_id: str | None = None
    evidence: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "task_types", tuple(self.task_types))
        for name in ("key", "text", "skill", "capability"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"Proposal.{name} must be a non-empty string, got {value!r}")
        w = float(self.weight)
        if w == 0.0 or not math.isfinite(w):
            raise ValueError(f"Proposal {self.key!r}: weight must be finite and non-zero")
        object.__setattr__(self, "weight", w)


def satisfied(met: bool, weight: float) -> bool:
    """A verdict as progress: a requirement met, or a pitfall (weight < 0) absent."""
    return met if weight > 0 else not met


def guidance_hint(text: str, weight: float) -> str:
    """How guidance states a criterion (same wording as ``constraint_spec.guidance_hint``)."""
    return text if weight > 0 else f"avoid : {text}"


def fill_skill(skill: str, criterion: Criterion | None) -> str:
    """The skill as injected for one task: ``{criterion}`` becomes that task's criterion hint."""
    if CRITERION_SLOT not in skill:
        return skill
    hint = guidance_hint(criterion.text, criterion.weight) if criterion is not None else ""
    return " ".join(skill.replace(CRITERION_SLOT, hint).split())


def failing_records(records: Sequence[RolloutRecord], entry: PoolPair) -> list[RolloutRecord]:
    """Rollouts of the window on which the entry's own rubric was judged and not satisfied."""
    return [
        r
        for r in records
        if r.verdicts.get(entry.id) is not None
        and not satisfied(bool(r.verdicts[entry.id]), entry.weight)
    ]


class Reflection(abc.ABC):
    """Proposes new pairs from the recent window, and rewrites the skill of a failing pair."""

    name = "reflection"

    @abc.abstractmethod
    def propose(
        self,
        records: Sequence[RolloutRecord],
        pool: Sequence[PoolPair],
        *,
        max_new: int,
        step: int,
        exclude_keys: frozenset[str] = frozenset(),
    ) -> list[Proposal]:
        """Up to ``max_new`` proposals, best first; none whose key is in the pool or excluded."""

    @abc.abstractmethod
    def refine(self, entry: PoolPair, records: Sequence[RolloutRecord], *, step: int) -> str | None:
        """A rewritten, more specific skill for ``entry`` (None = no refinement possible)."""

    def stats(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        del state


REFLECTIONS: Registry[type] = Registry("reflection")
