"""How method text reaches the policy's prompt in the instruction-following domain: plain English.

The policy here is a pretrained chat model, not one warm-started on ``<criterion> … </criterion>``
blocks, so every kind of guidance (HarnessRL's criterion / reference / critique fields, ARISE's
skills, RISED's anti-patterns, ARISE-RL's coach memory) is written as a short titled list after a
blank line at the end of the last user message::

    Tell me about how rain forms. Do not use any commas.

    Tips:
    - Without commas, write short sentences and join ideas with 'and' or a period instead.

Blocks come in the fixed order of ``FIELD_TITLES`` whatever the order given; empty fields are
skipped and no field gives the task's own messages unchanged. Ours (labelled): the titles and the
list layout; the prompt-format alternatives tried in the premise measurement are in
``benchmarks/protocol_smollm2.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rubric_rl.envs.base import Style
from rubric_rl.envs.instruct_spec import TYPE_BY_ID
from rubric_rl.rubrics.types import Task, append_to_system

__all__ = [
    "FIELD_TITLES",
    "InstructStyle",
    "criterion_guidance",
    "format_critique",
    "format_reference",
    "hint",
    "mount",
    "render_blocks",
    "skill_guidance",
    "skill_text",
    "skill_texts",
]

FIELD_TITLES: dict[str, str] = {
    "criterion": "Make sure that",
    "reference": "Examples",
    "critique": "Earlier answers missed",
    "skills": "Tips",
    "anti_patterns": "Avoid",
    "coach": "Remember",
}


def _items(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    texts = [value] if isinstance(value, str) else list(value)
    return [t.strip() for t in texts if t and t.strip()]


def render_blocks(fields: Mapping[str, str | Sequence[str] | None]) -> str:
    """The titled lists of ``fields`` in ``FIELD_TITLES`` order, blank-line separated ("" when
    every field is empty). An unknown field is an error naming it."""
    unknown = sorted(set(fields) - set(FIELD_TITLES))
    if unknown:
        known = list(FIELD_TITLES)
        raise ValueError(f"instruct guidance: unknown fields {unknown}; known: {known}")
    blocks = []
    for field, title in FIELD_TITLES.items():
        items = _items(fields.get(field))
        if items:
            blocks.append(f"{title}:\n" + "\n".join(f"- {t}" for t in items))
    return "\n\n".join(blocks)


def mount(task: Task, fields: Mapping[str, str | Sequence[str] | None]) -> list[dict]:
    """The task's messages with ``fields`` (a text or several per field) appended to the last
    user message as titled lists (:func:`render_blocks`) after a blank line."""
    text = render_blocks(fields)
    msgs = [dict(m) for m in task.messages]
    if not text:
        return msgs
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    if not users:
        raise ValueError(f"task {task.id!r} has no user message to mount guidance on")
    msgs[users[-1]]["content"] += "\n\n" + text
    return msgs


def hint(text: str, weight: float) -> str:
    """A criterion as guidance: its text, or "Do not: <text>" for a pitfall (negative weight)."""
    return text if weight > 0 else f"Do not: {text}"


def format_reference(good: str | None = None, bad: str | None = None) -> str:
    parts = ([f"A good answer: {good}"] if good else []) + (
        [f"A poor answer: {bad}"] if bad else []
    )
    if not parts:
        raise ValueError("format_reference: needs a good or a bad response")
    return "\n".join(parts)


def format_critique(missed: Sequence[str]) -> str:
    return "; ".join(missed)


def skill_text(type_id: str) -> str:
    """The skill text of an instruction type (what ARISE's pool starts from and calibration's
    guided arm shows)."""
    return TYPE_BY_ID[type_id].skill


def skill_guidance(task: Task) -> list[dict]:
    """The task's prompt with the skill texts of its instruction types (its capabilities) as
    ``Tips``: calibration's guided arm (``Domain.guidance``)."""
    texts = [skill_text(c) for c in task.capabilities if c in TYPE_BY_ID]
    return mount(task, {"skills": texts})


def criterion_guidance(task: Task, criteria_texts: Sequence[str]) -> list[dict]:
    """The task's prompt with criterion texts (e.g. the ones an earlier answer missed) under
    ``Make sure that``: what HarnessRL's criterion field and a critique show."""
    return mount(task, {"criterion": list(criteria_texts)})


def skill_texts() -> dict[str, str]:
    """Instruction type -> its skill text (``Domain.skill_texts``)."""
    return {type_id: skill_text(type_id) for type_id in TYPE_BY_ID}


_NOTE = "\n- "  # between the coach's notes: each is one item of the "Remember" list


class InstructStyle(Style):
    """The domain's ``Style``: every kind of method text as a titled plain-English list
    (module docstring); RISED's behaviours under "Make sure that" and its anti-patterns under
    "Avoid"; ARISE's skills under "Tips"; ARISE-RL's coach notes under "Remember"."""

    def hint(self, text: str, weight: float) -> str:
        return hint(text, weight)

    def reference(self, good: str | None, bad: str | None) -> str:
        return format_reference(good, bad)

    def critique(self, missed: Sequence[str]) -> str:
        return format_critique(missed)

    def coach(self, notes: Sequence[str]) -> str:
        return _NOTE.join(notes)

    def coach_notes(self, memory: str) -> list[str]:
        return memory.split(_NOTE)

    def block(self, kind: str, text: str | Sequence[str]) -> str:
        if kind == "coach" and isinstance(text, str):
            text = self.coach_notes(text)
        return render_blocks({kind: text})

    def mount(self, task: Task, fields: Mapping[str, str | Sequence[str] | None]) -> list[dict]:
        if isinstance(fields.get("coach"), str):
            fields = {**fields, "coach": self.coach_notes(fields["coach"])}
        return mount(task, fields)

    def add_block(self, task, messages, kind, text, *, placement="last_user") -> list[dict]:
        block = self.block(kind, text)
        if placement == "system":
            return append_to_system(messages, block)
        if placement != "last_user":
            raise ValueError(f"add_block: placement must be last_user or system, got {placement!r}")
        msgs = [dict(m) for m in messages]
        users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
        if not users:
            raise ValueError(f"task {task.id!r} has no user message to mount guidance on")
        msgs[users[-1]]["content"] += "\n\n" + block
        return msgs

    def show_and_avoid(
        self, task: Task, positives: Sequence[str], negatives: Sequence[str]
    ) -> list[dict]:
        return mount(task, {"criterion": list(positives), "anti_patterns": list(negatives)})
