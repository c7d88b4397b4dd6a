"""RG-SED's LLM coach (seed 002 §3.2, App. E figs. 17 and 21): a model reads one group's
attempts and their feedback and writes the group's role-specific memory m.

One call per group, for EVERY group of a role in ``rgsed_roles``, through an ``LLMClient``
(``SchemaCaller``: counted calls / accepted / rejected, a failure-rate stop naming the role):

* solver (template ``arise_rl_coach_solver``): the task, its rubric criteria (name, kind,
  text) and each attempt with its reward and the criteria it left unmet (a requirement not met,
  a pitfall present, or no verdict); asked for short advice a next attempt can act on;
* generator (``arise_rl_coach_generator``): the authoring request and each authored task with
  its outcome (parse error, tool grounding, how many of the K solver attempts solved it, R_G);
  asked for advice that moves the next task toward the solver's frontier.

Every policy-written text (responses, the task's question, generated criteria) is quoted by
``rubrics.prompts.fence``, the rule stated in the instructions, so a response cannot close its
quote and add instructions or criteria of its own.

The reply is JSON ``{"notes": [...]}``: 1 to ``max_notes`` non-empty notes of at most
``note_chars`` characters each (whitespace collapsed). Ours: an over-long note rejects the reply
rather than being cut mid-sentence, and so does a note holding markup ("<", ">": it could close
the coach block) or one the domain's ``Style`` cannot carry (``style.coach_notes(style.coach(
notes)) != notes``, e.g. one holding the style's separator).
An accepted reply becomes m as ``style.coach(notes)``: the same text and the same prompt path
(``style.add_block`` with kind "coach") as the rule-based coach's memory, and the placebo arm
re-deals its notes the same way. A rejected reply or a client error gives the group no memory
and counts as one failed call (``stats``; ``FailureRateStop`` over ``llm_roles.
max_failure_rate``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from rubric_rl.envs.base import GENERIC_STYLE, Style
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

COACHES = ("rule", "llm")
FENCE_LABEL = "quote"


CoachTemplate = PromptTemplate  # the LLM roles' shared versioned prompt


COACH_TEMPLATES: Registry[CoachTemplate] = Registry("coach template")

_REPLY = """\
Reply with JSON only, exactly {"notes": ["...", "..."]}: as many notes as the request allows, \
each one short sentence within the request's character limit, without semicolons."""

_SOLVER_SYSTEM = (
    """\
You coach an agent that answers tasks graded by a rubric. You see one task, its rubric \
criteria and several attempts the agent made at it, each with its reward and the criteria it \
left unmet (a requirement it did not meet, or a pitfall it fell into). Write advice for the \
agent's next attempt at this same task: the criteria it most often missed and what to do about \
them, constraints it overlooked, and what the best attempt did that the next one should keep. \
Each note must be something the agent can act on directly; do not quote an answer to copy.
"""
    + _REPLY
)

_SOLVER_USER = """\
## Task
{task}
## Rubric criteria
{criteria}
## Attempts
{attempts}

Write the advice now, as the JSON object: at most {max_notes} notes of at most {note_chars} \
characters each."""

_GENERATOR_SYSTEM = (
    """\
You coach an agent that writes tasks for a solver to practise on. A good task is well formed, \
grounded in what the agent looked up with its tools, and at the solver's frontier: some of the \
solver's attempts solve it and some do not. You see the authoring request and several tasks \
the agent wrote for it, each with its outcome: whether it could be parsed, whether it was \
grounded in a tool call, how many solver attempts solved it, and its reward. Write advice for \
the agent's next task: which failures to avoid (malformed, ungrounded, too easy, too hard) and \
what the best task did that the next one should keep.
"""
    + _REPLY
)

_GENERATOR_USER = """\
## Authoring request
{task}
## Tasks written
{attempts}

Write the advice now, as the JSON object: at most {max_notes} notes of at most {note_chars} \
characters each."""

_RULE = "\n" + FENCE_RULE.format(label=FENCE_LABEL)
SOLVER_TEMPLATE = COACH_TEMPLATES.register("arise_rl_coach_solver")(
    CoachTemplate("arise_rl_coach_solver", 1, _SOLVER_SYSTEM + _RULE, _SOLVER_USER)
)
GENERATOR_TEMPLATE = COACH_TEMPLATES.register("arise_rl_coach_generator")(
    CoachTemplate("arise_rl_coach_generator", 1, _GENERATOR_SYSTEM + _RULE, _GENERATOR_USER)
)


@dataclasses.dataclass(frozen=True)
class CoachLLMConfig:
    """``config.arise_rl.coach_llm``: the LLM coach's client and prompt limits (each field's
    comment; all ours)."""

    # The coach model's client, as judge.llm's fields; an empty one takes judge.llm's.
    backend: str = ""
    model: str = ""
    base_url: str = ""
    api_key_env: str = ""
    solver_template: str = "arise_rl_coach_solver"  # COACH_TEMPLATES names
    generator_template: str = "arise_rl_coach_generator"
    temperature: float = 0.0
    max_tokens: int = 512
    max_attempts: int = 8  # attempts of a group shown (the first ones)
    max_chars: int = 800  # characters of each quoted text (response, question, criterion)
    max_notes: int = 2  # notes per memory (the rule coach's MAX_HINTS)
    note_chars: int = 200  # the longest note; a longer one rejects the reply (a failed call)

    def __post_init__(self):
        where = "config.arise_rl.coach_llm"
        for name in ("backend", "model", "base_url", "api_key_env"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{where}.{name} must be a string, got {getattr(self, name)!r}")
        for name in ("solver_template", "generator_template"):
            if getattr(self, name) not in COACH_TEMPLATES:
                raise ValueError(
                    f"{where}.{name} must be one of {sorted(COACH_TEMPLATES.names())}, "
                    f"got {getattr(self, name)!r}"
                )
        for name in ("max_tokens", "max_attempts", "max_chars", "max_notes", "note_chars"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{where}.{name} must be an integer >= 1, got {v!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0.0 <= t <= 2.0:
            raise ValueError(f"{where}.temperature must be a number in [0, 2], got {t!r}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> CoachLLMConfig:
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"config.arise_rl.coach_llm: unknown keys {unknown}")
        return cls(**dict(values))


def notes_schema(max_notes: int, note_chars: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "notes": {
                "type": "array",
                "items": {"type": "string", "maxLength": note_chars},
                "minItems": 1,
                "maxItems": max_notes,
            }
        },
        "required": ["notes"],
        "additionalProperties": False,
    }


def parse_notes(
    text: str, *, max_notes: int, note_chars: int, style: Style = GENERIC_STYLE
) -> tuple[list[str] | None, str | None]:
    """(notes, None) from a coach reply, or (None, why) when any part is invalid: the reply is
    used whole or not at all (module docstring)."""
    try:
        payload = json.loads(strip_json_fence(text))
    except json.JSONDecodeError as e:
        return None, f"reply is not valid JSON ({e.msg} at char {e.pos}): {text[:120]!r}"
    if not isinstance(payload, Mapping) or set(payload) != {"notes"}:
        return None, f"reply must be exactly {{'notes': [...]}}, got {text[:120]!r}"
    raw = payload["notes"]
    if not isinstance(raw, list) or not 1 <= len(raw) <= max_notes:
        return None, f"'notes' must be a list of 1 to {max_notes} strings, got {raw!r:.120}"
    notes = []
    for i, n in enumerate(raw):
        if not isinstance(n, str) or not n.strip():
            return None, f"notes[{i}] must be a non-empty string, got {n!r:.120}"
        n = " ".join(n.split())
        if len(n) > note_chars:
            return None, f"notes[{i}] has {len(n)} characters, more than note_chars={note_chars}"
        if "<" in n or ">" in n:  # could close or open a block of the prompt it is mounted in
            return None, f"notes[{i}] holds markup ('<' or '>'): {n!r:.120}"
        notes.append(n)
    if style.coach_notes(style.coach(notes)) != notes:
        return None, f"the notes do not survive the domain's coach format: {notes!r:.160}"
    return notes, None


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One attempt of a group as the coach sees it: the policy's text (quoted) and its feedback
    lines (ours, not quoted: reward, unmet criteria, authoring outcome)."""

    response: str
    feedback: tuple[str, ...]


def solver_attempts(
    task: Any, responses: Sequence[str], verdict_rows: Sequence[Any], rewards: Sequence[float]
) -> list[Attempt]:
    """Each solver attempt with its reward and the criteria it left unmet (by name; a pitfall
    whose bad behaviour is present is unmet, a missing or failed verdict is "unknown")."""
    if not len(responses) == len(verdict_rows) == len(rewards):
        raise ValueError(
            f"solver_attempts: task {task.id!r} has {len(responses)} responses, "
            f"{len(verdict_rows)} verdict rows and {len(rewards)} rewards"
        )
    crits = tuple(task.rubric)
    out = []
    for response, row, reward in zip(responses, verdict_rows, rewards, strict=True):
        met = (
            dict(row.items()) if isinstance(row, Mapping) else {v.criterion_id: v.met for v in row}
        )
        unmet, unknown = [], []
        for c in crits:
            m = met.get(c.id)
            if m is None:
                unknown.append(c.id)
            elif bool(m) != (c.weight > 0):
                unmet.append(c.id)
        lines = [f"reward: {reward:.3f}", f"unmet criteria: {', '.join(unmet) or 'none'}"]
        if unknown:
            lines.append(f"criteria without a verdict: {', '.join(unknown)}")
        out.append(Attempt(response, tuple(lines)))
    return out


def generator_attempt(response: str, score: Any, k: int) -> Attempt:
    """One generator episode (``arise_rl.GeneratorScore``) with its authoring outcome."""
    solved = "not run" if score.c is None else f"{score.c} of {k}"
    return Attempt(
        response,
        (
            f"parsed: {'yes' if score.fmt_reason is None else 'no (' + score.fmt_reason + ')'}",
            f"grounded in a tool call: {'yes' if score.tool else 'no'}",
            f"solver attempts that solved it: {solved}",
            f"reward: {score.reward:.3f}",
        ),
    )


class LLMCoach(SchemaCaller):
    """The LLM coach (module docstring). ``memory(role, task, attempts, seed=...)`` is one call:
    the group's memory text, or None when the call failed (counted)."""

    role = "ARISE-RL LLM coach"

    def __init__(
        self,
        client: LLMClient,
        cfg: CoachLLMConfig = CoachLLMConfig(),
        *,
        style: Style = GENERIC_STYLE,
        max_failure_rate: float = 0.5,
    ):
        SchemaCaller.__init__(
            self, client, temperature=cfg.temperature, max_tokens=cfg.max_tokens,
            max_failure_rate=max_failure_rate,
        )  # fmt: skip
        self.cfg = cfg
        self.style = style
        self.templates = {
            "solver": COACH_TEMPLATES.get(cfg.solver_template),
            "generator": COACH_TEMPLATES.get(cfg.generator_template),
        }
        self.schema = notes_schema(cfg.max_notes, cfg.note_chars)

    def _quote(self, text: str) -> str:
        return fence(text[: self.cfg.max_chars], FENCE_LABEL)

    def prompt(self, role: str, task: Any, attempts: Sequence[Attempt]) -> str:
        """The user message for one group (``role``: "solver" or "generator")."""
        if role not in self.templates:
            raise ValueError(
                f"LLMCoach: role must be one of {sorted(self.templates)}, got {role!r}"
            )
        shown = list(attempts)[: self.cfg.max_attempts]
        blocks = []
        for j, a in enumerate(shown):
            blocks.append(
                f"### Attempt {j + 1}\n" + "\n".join(f"- {x}" for x in a.feedback)
                + "\n" + self._quote(a.response)
            )  # fmt: skip
        fields = {
            "task": self._quote(task.question),
            "attempts": "\n".join(blocks),
            "max_notes": self.cfg.max_notes,
            "note_chars": self.cfg.note_chars,
        }
        if role == "solver":
            fields["criteria"] = "\n".join(
                f"- {c.id} ({'requirement' if c.weight > 0 else 'pitfall'}, weight {c.weight:g}):"
                f"\n{self._quote(c.text)}"
                for c in task.rubric
            )
        return self.templates[role].user.format(**fields)

    def memory(self, role: str, task: Any, attempts: Sequence[Attempt], *, seed: int) -> str | None:
        template = self.templates[role]
        user = self.prompt(role, task, attempts)
        try:
            text = self.ask(template, user, self.schema, seed)
        except LLMError as e:
            self._reject(f"{template.key}: {e}")
            return None
        notes, error = parse_notes(
            text, max_notes=self.cfg.max_notes, note_chars=self.cfg.note_chars, style=self.style
        )
        if error is not None:
            self._reject(f"{template.key}: task {task.id!r}: {error}")
            return None
        self.accept(1)
        return self.style.coach(notes)

    def _reject(self, error: str) -> None:
        logger.warning("ARISE-RL coach reply rejected: %s", error)
        self.reject(error)
