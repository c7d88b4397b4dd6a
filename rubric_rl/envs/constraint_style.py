"""The embedded constraint domain's ``Style``: method text in the warm-start corpus's own shape.

The policy is warm-started on prompts that ``constraint_corpus.decorate_prompt`` decorates, so
every method writes its text the same way and mounted text is a prompt shape the policy has
seen: ``<kind> … </kind>`` blocks (``constraint_corpus.render_guidance``: canonical units, several
texts joined by " ; ") after the prompt, in the order of ``GUIDANCE_KINDS``; a criterion stated
as ``guidance_hint`` ("avoid : text" for a pitfall); references, critiques and coach memory as
``format_reference`` / ``format_critique`` / ``format_coach`` write them. RISED's vocabulary
rubrics are stated with the task's own values (``embedded_description``).

``MixedStyle``: the domain with tool environments mixed in (``domain.tool_envs``): a tool
environment's task gets the generic style's prompts (its episodes start from that prompt) and its
environment's behaviour descriptions (``tool_behaviours.describe``), any other task this one's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rubric_rl.envs import tool_behaviours
from rubric_rl.envs.base import Style, is_tool_env
from rubric_rl.envs.constraint_corpus import (
    FLUFF_ANTI_PATTERNS,
    anti_pattern_text,
    decorate_prompt,
    format_coach,
    format_critique,
    format_reference,
    render_guidance,
)
from rubric_rl.envs.constraint_lexicon import CRITERION_TEMPLATES
from rubric_rl.envs.constraint_library import library_constraints
from rubric_rl.envs.constraint_spec import guidance_hint
from rubric_rl.rubrics.types import Task

__all__ = ["ConstraintStyle", "MixedStyle", "embedded_description"]


class ConstraintStyle(Style):
    """Method text as the embedded domain's warm-start corpus writes it (module docstring)."""

    def hint(self, text: str, weight: float) -> str:
        return guidance_hint(text, weight)

    def reference(self, good: str | None, bad: str | None) -> str:
        return format_reference(good, bad)

    def critique(self, missed: Sequence[str]) -> str:
        return format_critique(missed)

    def coach(self, notes: Sequence[str]) -> str:
        return format_coach(notes)

    def block(self, kind: str, text: str | Sequence[str]) -> str:
        return render_guidance(kind, text)

    def mount(self, task: Task, fields: Mapping[str, str | Sequence[str] | None]) -> list[dict]:
        return decorate_prompt(task, dict(fields))

    def show_and_avoid(
        self, task: Task, positives: Sequence[str], negatives: Sequence[str]
    ) -> list[dict]:
        return decorate_prompt(
            task, {"criterion": list(positives) or None, "anti_patterns": list(negatives) or None}
        )

    def describe(self, rubric_id: str, task: Task, description: str) -> str | None:
        return embedded_description(rubric_id, task)


class MixedStyle(ConstraintStyle):
    """The constraint domain with tool environments mixed in: a tool environment's task gets
    the generic style's prompts and its environment's behaviour descriptions, any other the
    constraint domain's."""

    _generic = Style()

    def _for(self, task: Task) -> Style:
        return self._generic if is_tool_env(task.env_name) else super()

    def mount(self, task, fields):
        return self._for(task).mount(task, fields)

    def add_block(self, task, messages, kind, text, *, placement="last_user"):
        return self._for(task).add_block(task, messages, kind, text, placement=placement)

    def show_and_avoid(self, task, positives, negatives):
        return self._for(task).show_and_avoid(task, positives, negatives)

    def describe(self, rubric_id, task, description):
        # a tool environment's behaviour stated in its own words (``tool_behaviours.describe``)
        if is_tool_env(task.env_name):
            return tool_behaviours.describe(rubric_id, task)
        return super().describe(rubric_id, task, description)


def embedded_description(rubric_id: str, task: Task) -> str | None:
    """A rubric of the embedded vocabulary (``constraint_behaviours.catalogue``) stated for
    ``task`` in the domain's own words (the wording the warm-start corpus teaches, every word in
    the policy's vocabulary): a
    followed check as its guidance hint with the task's values ("the response lists exactly 3
    items"), a violated one as an anti-pattern item ("breaking the rule : …"), fluff as the
    corpus's anti-pattern phrases. None: a stated check the task does not have (an environment's
    anti-pattern taken from another task)."""
    t = CRITERION_TEMPLATES
    fixed = {
        "distinct_items": t["distinct"],
        "repeated_item": anti_pattern_text(t["distinct"], 1.0),
        "answer_alone": t["plain"],
        "praise_opener": FLUFF_ANTI_PATTERNS["praise"],
        "compliance_claim": FLUFF_ANTI_PATTERNS["claim"],
        "filler": FLUFF_ANTI_PATTERNS["pad"],
        "overlong": anti_pattern_text(t["plain"], 1.0),
        "empty_answer": anti_pattern_text(t["non_empty"], 1.0),
        "task_solved": t["all_of"],
        "task_failed": anti_pattern_text(t["all_of"], 1.0),
    }
    if rubric_id in fixed:
        return fixed[rubric_id]
    kind, _, outcome = rubric_id.rpartition("_")
    if outcome not in ("followed", "violated") or not kind:
        raise ValueError(f"rised: {rubric_id!r} is not a rubric of the embedded vocabulary")
    c = next((c for c in library_constraints(task) if c.kind == kind), None)
    if c is None:
        return None
    return (
        guidance_hint(c.text, c.weight)
        if outcome == "followed"
        else anti_pattern_text(c.text, c.weight)
    )
