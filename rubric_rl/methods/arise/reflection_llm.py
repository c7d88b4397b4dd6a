"""ARISE LLM reflection: versioned prompts through the ``LLMClient``, strictly validated replies.

``LLMReflection`` shows the reflection model the window's failures and partial successes (with
their verdicts) and the current pool, and asks for new rubric–skill pairs (template
``arise_propose``) or for a rewritten skill of a failing pair (``arise_refine``). Replies are
validated like judge output (``rubrics/judges.py``): JSON (a fenced block is accepted) of exactly
the documented shape; a reply with any invalid field, an unknown capability or task type, too many
pairs, or a rubric duplicating one of the pool or of the reply itself is rejected WHOLE — nothing
of it is applied — and counted (``stats()``: calls / accepted / rejected).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence

from rubric_rl.methods.arise.reflection_base import (
    REFLECTIONS,
    PoolPair,
    Proposal,
    Reflection,
    RolloutRecord,
    failing_records,
)
from rubric_rl.rubrics.llm import (
    LLMClient,
    LLMError,
    PromptTemplate,
    SchemaCaller,
    strip_json_fence,
)
from rubric_rl.rubrics.prompts import FENCE_RULE, fence
from rubric_rl.util.registry import Registry

logger = logging.getLogger(__name__)


ReflectionTemplate = PromptTemplate  # the LLM roles' shared versioned prompt


REFLECTION_TEMPLATES: Registry[ReflectionTemplate] = Registry("reflection template")

_PROPOSE_SYSTEM_V1 = """\
You improve the training of an AI agent. You see recent rollouts of the agent — failures and \
partial successes, with the rubric verdicts they received — and the current pool of \
rubric–skill pairs. Find behavioural gaps that explain the failures and that no pair in the \
pool covers yet. For each gap write one pair:
- "rubric": one observable, checkable criterion a response either meets or not;
- "skill": one or two sentences of actionable guidance that helps meet the rubric;
- "capability": the capability the gap belongs to (one of the listed capabilities);
- "task_types": the task types it applies to (from the listed task types);
- "weight": optional non-zero number (negative = the rubric describes a behaviour to avoid).
Do not repeat a rubric of the pool. Reply with JSON only, exactly:
{"pairs": [{"rubric": "...", "skill": "...", "capability": "...", "task_types": ["..."]}]}
An empty list is a valid answer when no new gap is supported by the evidence."""

_PROPOSE_USER_V1 = """\
## Task types
{task_types}
## Capabilities
{capabilities}
## Current pool
{pool}
## Recent rollouts
{rollouts}

Propose at most {max_new} new pairs. Return the JSON object now."""

_REFINE_SYSTEM_V1 = """\
You improve the training of an AI agent. A rubric keeps failing although its skill (guidance) \
is shown to the agent. Rewrite the skill so that it is more specific and actionable, citing the \
failure you observe in the rollouts. Keep the rubric unchanged. Reply with JSON only, exactly:
{"skill": "..."}"""

_REFINE_USER_V1 = """\
## Rubric
{rubric}
## Current skill
{skill}
## Recent failing rollouts
{rollouts}

Return the JSON object now."""

# v2: each rollout's task and response fenced (``fence``), the rule in the instructions.
_RULE = "\n" + FENCE_RULE.format(label="response")
PROPOSE_V1 = REFLECTION_TEMPLATES.register("arise_propose")(
    ReflectionTemplate("arise_propose", 2, _PROPOSE_SYSTEM_V1 + _RULE, _PROPOSE_USER_V1)
)
REFINE_V1 = REFLECTION_TEMPLATES.register("arise_refine")(
    ReflectionTemplate("arise_refine", 2, _REFINE_SYSTEM_V1 + _RULE, _REFINE_USER_V1)
)

PROPOSE_SCHEMA = {
    "type": "object",
    "properties": {
        "pairs": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "rubric": {"type": "string"},
                    "skill": {"type": "string"},
                    "capability": {"type": "string"},
                    "task_types": {"type": "array", "items": {"type": "string"}},
                    "weight": {"type": "number"},
                },
                "required": ["rubric", "skill", "capability", "task_types"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["pairs"],
    "additionalProperties": False,
}
REFINE_SCHEMA = {
    "type": "object",
    "properties": {"skill": {"type": "string"}},
    "required": ["skill"],
    "additionalProperties": False,
}
_PAIR_KEYS = {"rubric", "skill", "capability", "task_types", "weight"}


def normalise_text(text: str) -> str:
    """Key for duplicate detection: case- and whitespace-insensitive."""
    return " ".join(text.lower().split())


def parse_proposals(
    text: str,
    *,
    task_types: Sequence[str],
    capabilities: Sequence[str],
    existing: Sequence[str],
    max_new: int,
) -> tuple[list[Proposal], str | None]:
    """Validates a reflection reply. Returns (proposals, None), or ([], error) when ANY part is
    invalid: the reply is applied whole or not at all."""
    try:
        payload = json.loads(strip_json_fence(text))
    except json.JSONDecodeError as e:
        return [], f"reply is not valid JSON ({e.msg} at char {e.pos}): {text[:120]!r}"
    if not isinstance(payload, Mapping) or not isinstance(payload.get("pairs"), list):
        return [], f"reply must be an object with a 'pairs' list, got {text[:120]!r}"
    if set(payload) != {"pairs"}:
        return [], f"reply has unexpected keys {sorted(set(payload) - {'pairs'})}"
    pairs = payload["pairs"]
    if len(pairs) > max_new:
        return [], f"reply has {len(pairs)} pairs, at most {max_new} were asked for"
    seen = {normalise_text(t) for t in existing}
    out: list[Proposal] = []
    for n, p in enumerate(pairs):
        where = f"pairs[{n}]"
        if not isinstance(p, Mapping):
            return [], f"{where} is not an object: {p!r}"
        extra = sorted(set(p) - _PAIR_KEYS)
        missing = sorted({"rubric", "skill", "capability", "task_types"} - set(p))
        if extra or missing:
            return [], f"{where}: unexpected keys {extra}, missing keys {missing}"
        for field in ("rubric", "skill", "capability"):
            if not isinstance(p[field], str) or not p[field].strip():
                return [], f"{where}.{field} must be a non-empty string, got {p[field]!r}"
        if capabilities and p["capability"] not in capabilities:
            return [], f"{where}.capability {p['capability']!r} not in {list(capabilities)}"
        types = p["task_types"]
        if (
            not isinstance(types, list)
            or not types
            or not all(isinstance(t, str) and t in task_types for t in types)
        ):
            return [], f"{where}.task_types must be a non-empty subset of {list(task_types)}"
        weight = p.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            return [], f"{where}.weight must be a number, got {weight!r}"
        if weight == 0 or not math.isfinite(weight):
            return [], f"{where}.weight must be finite and non-zero, got {weight!r}"
        norm = normalise_text(p["rubric"])
        if norm in seen:
            return [], f"{where}.rubric duplicates a rubric of the pool or reply: {p['rubric']!r}"
        seen.add(norm)
        out.append(
            Proposal(
                key=f"llm/{norm}",
                text=p["rubric"].strip(),
                skill=p["skill"].strip(),
                capability=p["capability"],
                task_types=tuple(dict.fromkeys(types)),
                weight=float(weight),
            )
        )
    return out, None


def parse_refinement(text: str, current_skill: str) -> tuple[str | None, str | None]:
    """(new skill, None) or (None, error) for a refinement reply."""
    try:
        payload = json.loads(strip_json_fence(text))
    except json.JSONDecodeError as e:
        return None, f"reply is not valid JSON ({e.msg} at char {e.pos}): {text[:120]!r}"
    if not isinstance(payload, Mapping) or set(payload) != {"skill"}:
        return None, f"reply must be exactly {{'skill': ...}}, got {text[:120]!r}"
    skill = payload["skill"]
    if not isinstance(skill, str) or not skill.strip():
        return None, f"skill must be a non-empty string, got {skill!r}"
    if normalise_text(skill) == normalise_text(current_skill):
        return None, "refined skill is identical to the current one"
    return skill.strip(), None


def _render_record(rec: RolloutRecord, max_chars: int) -> str:
    outcome = {True: "success", False: "failure", None: "unknown"}[rec.success]
    verdicts = ", ".join(
        f"{cid}={'?' if v is None else ('yes' if v else 'no')}" for cid, v in rec.verdicts.items()
    )
    return (
        f"- task type {rec.task.task_type or '-'} | outcome {outcome}"
        f"{' | verdicts ' + verdicts if verdicts else ''}\n"
        f"  task: {rec.task.question[:max_chars]}\n  response:\n{fence(rec.response[:max_chars])}"
    )


@REFLECTIONS.register("llm")
class LLMReflection(SchemaCaller, Reflection):
    """Reflection by an LLM through ``LLMClient`` (templates ``arise_propose`` / ``arise_refine``).

    The rollouts shown are the window's failures first, then partial successes (a success with a
    failed pool verdict), at most ``max_examples``. A reply that fails validation, or a client
    error, adds nothing and is counted in ``stats()``.
    """

    name = "llm"
    role = "ARISE LLM reflection"

    def __init__(
        self,
        client: LLMClient,
        *,
        propose_template: str = "arise_propose",
        refine_template: str = "arise_refine",
        max_examples: int = 12,
        max_chars: int = 600,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        max_failure_rate: float = 0.5,
    ):
        SchemaCaller.__init__(
            self, client, temperature=temperature, max_tokens=max_tokens,
            max_failure_rate=max_failure_rate,
        )  # fmt: skip
        self.propose_template = REFLECTION_TEMPLATES.get(propose_template)
        self.refine_template = REFLECTION_TEMPLATES.get(refine_template)
        self.max_examples = int(max_examples)
        self.max_chars = int(max_chars)

    def _examples(self, records: Sequence[RolloutRecord]) -> list[RolloutRecord]:
        failures = [r for r in records if r.success is False]
        partial = [r for r in records if r.success and any(v is False for v in r.verdicts.values())]
        return (failures + partial)[: self.max_examples]

    def _call(self, template: ReflectionTemplate, user: str, schema, step: int) -> str | None:
        try:
            return self.ask(template, user, schema, step)
        except LLMError as e:
            self._reject(str(e))
            return None

    def _reject(self, error: str) -> None:
        self.reject(error)
        logger.warning("ARISE reflection rejected: %s", error)

    def propose(
        self,
        records: Sequence[RolloutRecord],
        pool: Sequence[PoolPair],
        *,
        max_new: int,
        step: int,
        exclude_keys: frozenset[str] = frozenset(),
    ) -> list[Proposal]:
        examples = self._examples(records)
        if max_new <= 0 or not examples:
            return []
        task_types = sorted({r.task.task_type for r in records if r.task.task_type})
        capabilities = sorted({c for r in records for c in r.task.capabilities})
        pool_lines = [f"- [{e.capability}] {e.text} (skill: {e.skill})" for e in pool]
        user = self.propose_template.user.format(
            task_types=", ".join(task_types) or "-",
            capabilities=", ".join(capabilities) or "(any short name)",
            pool="\n".join(pool_lines) or "(empty)",
            rollouts="\n".join(_render_record(r, self.max_chars) for r in examples),
            max_new=max_new,
        )
        text = self._call(self.propose_template, user, PROPOSE_SCHEMA, step)
        if text is None:
            return []
        existing = [e.text for e in pool] + [k.removeprefix("llm/") for k in exclude_keys]
        proposals, error = parse_proposals(
            text,
            task_types=task_types,
            capabilities=capabilities,
            existing=existing,
            max_new=max_new,
        )
        if error is not None:
            self._reject(f"{self.propose_template.key}: {error}")
            return []
        self.accept(len(proposals))
        return proposals

    def refine(self, entry: PoolPair, records: Sequence[RolloutRecord], *, step: int) -> str | None:
        failing = failing_records(records, entry)[: self.max_examples]
        if not failing:
            return None
        user = self.refine_template.user.format(
            rubric=entry.text,
            skill=entry.skill,
            rollouts="\n".join(_render_record(r, self.max_chars) for r in failing),
        )
        text = self._call(self.refine_template, user, REFINE_SCHEMA, step)
        if text is None:
            return None
        skill, error = parse_refinement(text, entry.skill)
        if error is not None:
            self._reject(f"{self.refine_template.key}: {error}")
            return None
        self.accept(0)  # a usable reply: counted for the failure rate, not as a new pair
        return skill

    def stats(self) -> dict[str, float]:
        return {f"reflection/{k}": float(v) for k, v in self.counts.items()}
