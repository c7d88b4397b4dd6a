"""Frozen value types for rubrics, tasks and judge verdicts.

These are the contract between loaders, judges, reward functions, environments and controllers.
A criterion's weight is signed and non-zero (HarnessRL §2.1: λ ≠ 0). For a pitfall (negative
weight) "met" means the undesirable behaviour is present. A verdict's ``met`` is ``None`` when the
judge failed: that is recorded, and excluded from rewards, never scored as 0.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any


class Polarity(enum.StrEnum):
    POSITIVE = "positive"
    PITFALL = "pitfall"


class CriterionStatus(enum.StrEnum):
    PROPOSED = "proposed"
    ACTIVE = "active"
    HIDDEN = "hidden"
    RETIRED = "retired"


class VerifierKind(enum.StrEnum):
    LLM = "llm"
    RULE = "rule"


def _freeze_mapping(value: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    if value is None:
        return ()
    if isinstance(value, tuple):
        return value
    return tuple(sorted(value.items()))


@dataclasses.dataclass(frozen=True)
class Verifier:
    """How a criterion is checked: by an LLM judge, or by a named programmatic checker.

    ``args`` is stored as a sorted tuple of (name, value) pairs so the type stays hashable;
    ``kwargs`` returns it as a dict.
    """

    kind: VerifierKind = VerifierKind.LLM
    checker: str | None = None
    args: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "kind", VerifierKind(self.kind))
        object.__setattr__(self, "args", _freeze_mapping(self.args))
        if self.kind == VerifierKind.RULE and not self.checker:
            raise ValueError("Verifier(kind='rule') needs a checker name")
        if self.kind == VerifierKind.LLM and self.checker is not None:
            raise ValueError(f"Verifier(kind='llm') takes no checker (got {self.checker!r})")

    @classmethod
    def rule(cls, checker: str, **args: Any) -> Verifier:
        return cls(kind=VerifierKind.RULE, checker=checker, args=_freeze_mapping(args))

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.args)


@dataclasses.dataclass(frozen=True)
class Criterion:
    """One natural-language criterion with a signed weight (HarnessRL: (q_m, λ_m)).

    Lifecycle fields (status, origin, created_step, parent_id, skill, capability, anchor) are
    what the rubric-evolving controllers (ARISE pool, HarnessRL rubric ops) read and write; a
    static seed criterion keeps the defaults.
    """

    id: str
    text: str
    weight: float = 1.0
    title: str = ""
    tags: tuple[str, ...] = ()
    verifier: Verifier = dataclasses.field(default_factory=Verifier)
    choices: tuple[str, ...] = ("no", "yes")
    status: CriterionStatus = CriterionStatus.ACTIVE
    origin: str = "seed"
    created_step: int = 0
    parent_id: str | None = None
    skill: str | None = None
    capability: str | None = None
    anchor: bool = False

    def __post_init__(self):
        if not self.id:
            raise ValueError("Criterion.id must be non-empty")
        if not isinstance(self.text, str) or not self.text.strip():
            raise ValueError(f"Criterion {self.id!r}: text must be a non-empty string")
        weight = float(self.weight)
        if weight == 0.0 or weight != weight:
            raise ValueError(
                f"Criterion {self.id!r}: weight must be non-zero (got {self.weight!r})"
            )
        object.__setattr__(self, "weight", weight)
        object.__setattr__(self, "tags", tuple(self.tags))
        object.__setattr__(self, "choices", tuple(self.choices))
        object.__setattr__(self, "status", CriterionStatus(self.status))
        if len(self.choices) < 2:
            raise ValueError(f"Criterion {self.id!r}: needs at least two answer choices")

    @property
    def polarity(self) -> Polarity:
        return Polarity.POSITIVE if self.weight > 0 else Polarity.PITFALL

    def replace(self, **changes: Any) -> Criterion:
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class Rubric:
    """An ordered set of criteria and the name of the reward that aggregates their verdicts."""

    criteria: tuple[Criterion, ...]
    aggregation: str = "weighted"

    def __post_init__(self):
        object.__setattr__(self, "criteria", tuple(self.criteria))
        ids = [c.id for c in self.criteria]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"Rubric has duplicate criterion ids: {dupes}")

    def __len__(self) -> int:
        return len(self.criteria)

    def __iter__(self):
        return iter(self.criteria)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.criteria)

    def by_id(self, criterion_id: str) -> Criterion:
        for c in self.criteria:
            if c.id == criterion_id:
                return c
        raise KeyError(f"no criterion {criterion_id!r} in rubric (ids: {list(self.ids)})")

    def evaluated(self) -> Rubric:
        """Criteria that are judged: active and hidden (a hidden skill's rubric is still scored)."""
        keep = (CriterionStatus.ACTIVE, CriterionStatus.HIDDEN)
        return Rubric(tuple(c for c in self.criteria if c.status in keep), self.aggregation)


@dataclasses.dataclass(frozen=True)
class Message:
    role: str
    content: str

    def __post_init__(self):
        if self.role not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"Message.role must be system/user/assistant/tool, got {self.role!r}")
        if not isinstance(self.content, str):
            raise ValueError(f"Message.content must be a string, got {type(self.content).__name__}")

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclasses.dataclass(frozen=True)
class Task:
    """A prompt with its rubric. ``raw`` keeps the source row for provenance (not compared)."""

    id: str
    prompt: tuple[Message, ...]
    rubric: Rubric
    reference_answer: str | None = None
    domain: str = ""
    task_type: str = ""
    capabilities: tuple[str, ...] = ()
    env_name: str | None = None
    raw: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False, hash=False)

    def __post_init__(self):
        if not self.id:
            raise ValueError("Task.id must be non-empty")
        prompt = tuple(m if isinstance(m, Message) else Message(**m) for m in self.prompt)
        if not prompt:
            raise ValueError(f"Task {self.id!r}: prompt has no messages")
        object.__setattr__(self, "prompt", prompt)
        object.__setattr__(self, "capabilities", tuple(self.capabilities))

    @property
    def messages(self) -> list[dict[str, str]]:
        return [m.to_dict() for m in self.prompt]

    @property
    def question(self) -> str:
        """The last user message's text (what a judge is shown as the task)."""
        for m in reversed(self.prompt):
            if m.role == "user":
                return m.content
        return self.prompt[-1].content


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A judge's decision on one criterion for one response. ``met=None`` = the judge failed."""

    criterion_id: str
    met: bool | None
    explanation: str = ""
    judge_model: str = ""
    prompt_hash: str = ""
    usage: tuple[tuple[str, int], ...] = ()
    error: str | None = None

    def __post_init__(self):
        if self.met is not None and not isinstance(self.met, bool):
            raise ValueError(f"Verdict.met must be bool or None, got {self.met!r}")
        object.__setattr__(self, "usage", _freeze_mapping(self.usage))

    @property
    def failed(self) -> bool:
        return self.met is None


def verdict_failed(criterion_id: str, error: str, **kwargs: Any) -> Verdict:
    return Verdict(criterion_id=criterion_id, met=None, error=error, **kwargs)


def append_to_last_user(
    messages: Sequence[Mapping[str, str]], text: str, *, what: str = "prompt"
) -> list[dict[str, str]]:
    """A copy of chat ``messages`` with ``text`` appended (after a space) to the last user message:
    how guidance blocks, ARISE skills and self-distillation contexts are mounted on a prompt."""
    out = [dict(m) for m in messages]
    users = [i for i, m in enumerate(out) if m["role"] == "user"]
    if not users:
        raise ValueError(f"{what} has no user message")
    out[users[-1]]["content"] = f"{out[users[-1]]['content']} {text}"
    return out


def append_to_system(messages: Sequence[Mapping[str, str]], text: str) -> list[dict[str, str]]:
    """A copy of chat ``messages`` with ``text`` appended to the system message (one is
    prepended when there is none): where a teacher's privileged context may sit instead."""
    out = [dict(m) for m in messages]
    if out and out[0]["role"] == "system":
        out[0]["content"] = f"{out[0]['content']} {text}".strip()
        return out
    return [{"role": "system", "content": text}, *out]


def messages_from(obj: Sequence[Mapping[str, str]] | str) -> tuple[Message, ...]:
    """A chat prompt from a list of {role, content} dicts, or a single user string."""
    if isinstance(obj, str):
        return (Message("user", obj),)
    return tuple(Message(role=m["role"], content=m["content"]) for m in obj)
