"""Transcripts of tool-env episodes, final-answer matching, and the shared trajectory checkers.

The response a judge scores for a tool-env episode is the environment's transcript (see
``rubric_rl.envs.base``): JSON written by the env, holding the raw assistant turns, every tool
call with its outcome and details, the final answer and the final state. Checkers
(``fn(response, *, task, **args)``) read it back with ``transcript_of``; a plain string is read as
a bare final answer with an empty trajectory.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rubric_rl.envs.tool_calls import CALL_OPEN, SYNTAX_ERROR_KINDS, strip_reasoning
from rubric_rl.rubrics import checkers
from rubric_rl.rubrics.types import Criterion, Task, Verdict, Verifier, verdict_failed

TRANSCRIPT_FORMAT = "rubric_rl.env_transcript/v1"


@dataclasses.dataclass(frozen=True)
class ToolRecord:
    """One executed (or rejected) tool call, as recorded in the transcript."""

    turn: int
    name: str | None
    arguments: Mapping[str, Any]
    ok: bool
    output: str
    error_kind: str | None = None
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Transcript:
    """An episode as the environment recorded it (see the module docstring)."""

    env: str
    task_id: str
    status: str
    turns: tuple[str, ...]
    tool_calls: tuple[ToolRecord, ...]
    final_answer: str | None
    state: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_response(self) -> str:
        payload = {
            "format": TRANSCRIPT_FORMAT,
            "env": self.env,
            "task_id": self.task_id,
            "status": self.status,
            "final_answer": self.final_answer,
            "turns": list(self.turns),
            "tool_calls": [r.to_dict() for r in self.tool_calls],
            "state": dict(self.state),
        }
        return json.dumps(payload, ensure_ascii=False)

    @classmethod
    def from_response(cls, response: str) -> Transcript:
        return _parse_response(response)

    def calls(self, name: str | None = None, *, ok: bool | None = None) -> list[ToolRecord]:
        return [
            r
            for r in self.tool_calls
            if (name is None or r.name == name) and (ok is None or r.ok == ok)
        ]


@functools.lru_cache(maxsize=256)
def _parse_response(response: str) -> Transcript:
    # Cached: every rule criterion of a task parses the same response.
    if not isinstance(response, str):
        raise TypeError(f"response must be a string, got {type(response).__name__}")
    stripped = response.lstrip()
    if stripped.startswith("{"):
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and obj.get("format") == TRANSCRIPT_FORMAT:
            try:
                return Transcript(
                    env=obj["env"],
                    task_id=obj["task_id"],
                    status=obj["status"],
                    turns=tuple(obj["turns"]),
                    tool_calls=tuple(ToolRecord(**r) for r in obj["tool_calls"]),
                    final_answer=obj["final_answer"],
                    state=obj.get("state", {}),
                )
            except (KeyError, TypeError) as e:
                raise ValueError(f"malformed {TRANSCRIPT_FORMAT} transcript: {e}") from None
    answer = strip_reasoning(response).strip()
    return Transcript("", "", "answered", (response,), (), answer, {})


def transcript_of(response: str, task: Task | None = None) -> Transcript:
    """The transcript a checker scores; raises when it belongs to a different task."""
    tr = _parse_response(response)
    if task is not None and tr.task_id and tr.task_id != task.id:
        raise ValueError(f"transcript is for task {tr.task_id!r}, but was judged for {task.id!r}")
    return tr


def score_rules(task: Task, response: str) -> dict[str, Verdict]:
    """Verdicts of the task's rule-verified criteria on ``response`` (LLM criteria are skipped).

    A convenience for tests and env-level evaluation; ``ProgrammaticJudge`` does the same job
    in training. A checker that raises yields a failed verdict (``met=None``), never "not met".
    """
    out: dict[str, Verdict] = {}
    for c in task.rubric.criteria:
        if c.verifier.kind != "rule":
            continue
        try:
            met = checkers.get(c.verifier.checker)(response, task=task, **c.verifier.kwargs)
        except Exception as e:  # noqa: BLE001 - recorded as a judge failure
            out[c.id] = verdict_failed(c.id, f"{type(e).__name__}: {e}", judge_model="rule")
            continue
        out[c.id] = Verdict(c.id, bool(met), judge_model="rule")
    return out


# --------------------------------------------------------------------------------------------
# Final answers: "Answer: <value>" or "Answer: v1, v2, v3"

_ANSWER_RE = re.compile(r"(?im)^[ \t>*_#-]*(?:final[ \t]+)?answer[ \t*_]*:[ \t*_]*")
_NUMBER_RE = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")
_BULLET_RE = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")
NUMERIC_TOLERANCE = 0.005  # answers are asked for rounded to 2 decimals


def format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if not value.is_integer() else str(int(value))
    return str(value)


def format_answer(values: Sequence[Any]) -> str:
    """The canonical final answer text for ``values`` (what reference solutions write)."""
    return "Answer: " + ", ".join(format_value(v) for v in values)


def answer_segment(final_answer: str | None) -> str | None:
    """Text after the last ``Answer:`` marker, or the whole answer when it has none."""
    if final_answer is None:
        return None
    matches = list(_ANSWER_RE.finditer(final_answer))
    text = final_answer[matches[-1].end() :] if matches else final_answer
    return text.strip()


def has_answer_line(final_answer: str | None) -> bool:
    return final_answer is not None and _ANSWER_RE.search(final_answer) is not None


def _norm_text(s: str) -> str:
    s = s.strip().strip("`'\"*_").strip()
    s = s.rstrip(".").strip().strip("`'\"*_")
    return " ".join(s.casefold().split())


def _numbers(s: str) -> list[float]:
    return [float(m.replace(",", "")) for m in _NUMBER_RE.findall(s.replace("$", ""))]


def value_matches(text: str, expected: Any) -> bool:
    """One answer item against one expected value.

    Numbers: the item must contain exactly one number, equal to the truth within
    ``NUMERIC_TOLERANCE`` (so "$23.97" and "23.970" match 23.97; "2 mugs for 23.97" does not).
    Strings: equal after case folding, whitespace collapsing and stripping quotes/final period.
    """
    if isinstance(expected, bool):
        expected = str(expected).lower()
    if isinstance(expected, int | float):
        nums = _numbers(text)
        tol = NUMERIC_TOLERANCE + 1e-9 * abs(float(expected))
        return len(nums) == 1 and math.isfinite(nums[0]) and abs(nums[0] - expected) <= tol
    return _norm_text(text) == _norm_text(str(expected))


def answer_items(segment: str, n_expected: int) -> list[str]:
    if n_expected <= 1:
        first = next((ln for ln in segment.splitlines() if ln.strip()), "")
        return [first]
    parts = re.split(r"[,;\n]", segment)
    items = [_BULLET_RE.sub("", p).strip() for p in parts]
    return [i for i in items if i]


def answer_matches(final_answer: str | None, expected: Sequence[Any], *, ordered: bool) -> bool:
    """True when the final answer's values equal ``expected`` (in order when ``ordered``)."""
    segment = answer_segment(final_answer)
    if segment is None or not expected:
        return False
    items = answer_items(segment, len(expected))
    if len(items) != len(expected):
        return False
    if ordered:
        return all(value_matches(i, e) for i, e in zip(items, expected))
    remaining = list(items)  # multiset match: each expected value consumes one item
    for e in expected:
        hit = next((k for k, i in enumerate(remaining) if value_matches(i, e)), None)
        if hit is None:
            return False
        remaining.pop(hit)
    return True


# --------------------------------------------------------------------------------------------
# Trajectory checkers shared by every env (registered in CHECKERS)


@checkers.register("env_answer_matches")
def check_answer_matches(
    response: str, *, task: Task | None = None, expected: Sequence[Any] = (), ordered: bool = True
) -> bool:
    tr = transcript_of(response, task)
    return tr.status == "answered" and answer_matches(tr.final_answer, expected, ordered=ordered)


@checkers.register("env_answer_line")
def check_answer_line(response: str, *, task: Task | None = None) -> bool:
    tr = transcript_of(response, task)
    return tr.status == "answered" and has_answer_line(tr.final_answer)


@checkers.register("env_tool_call_after_answer")
def check_tool_call_after_answer(response: str, *, task: Task | None = None) -> bool:
    """Pitfall: a turn states an ``Answer:`` and then calls a tool anyway."""
    tr = transcript_of(response, task)
    for text in tr.turns:
        content = strip_reasoning(text)
        m = _ANSWER_RE.search(content)
        if m is not None and CALL_OPEN in content[m.end() :]:
            return True
    return False


@checkers.register("env_malformed_tool_call")
def check_malformed_tool_call(response: str, *, task: Task | None = None) -> bool:
    """Pitfall: some tool call was unusable as written (bad JSON, unknown tool, bad args...)."""
    tr = transcript_of(response, task)
    return any(r.error_kind in SYNTAX_ERROR_KINDS for r in tr.tool_calls)


@checkers.register("env_tool_used")
def check_tool_used(
    response: str, *, task: Task | None = None, tools: Sequence[str] = (), min_calls: int = 1
) -> bool:
    """At least ``min_calls`` successful calls among ``tools`` (any tool when empty)."""
    tr = transcript_of(response, task)
    hits = [r for r in tr.tool_calls if r.ok and (not tools or r.name in tools)]
    return len(hits) >= min_calls


@checkers.register("env_too_many_tool_calls")
def check_too_many_tool_calls(response: str, *, task: Task | None = None, limit: int = 10) -> bool:
    """Pitfall: more than ``limit`` tool calls in the episode."""
    return len(transcript_of(response, task).tool_calls) > limit


def answer_criterion(
    expected: Sequence[Any], *, ordered: bool, weight: float, capability: str, text: str
) -> Criterion:
    return Criterion(
        id="answer_correct",
        title="Correct final answer",
        text=text,
        weight=weight,
        verifier=Verifier.rule("env_answer_matches", expected=tuple(expected), ordered=ordered),
        capability=capability,
        tags=("final_answer",),
    )


def common_criteria() -> tuple[Criterion, ...]:
    """Format and tool-hygiene criteria every tool env's rubric carries."""
    return (
        Criterion(
            id="answer_format",
            title="Answer line",
            text="The final message states the result on an 'Answer:' line.",
            weight=1.0,
            verifier=Verifier.rule("env_answer_line"),
            capability="formatting",
            tags=("final_answer",),
        ),
        Criterion(
            id="malformed_tool_call",
            title="Malformed tool call",
            text="Made a tool call that could not be executed as written (invalid JSON, "
            "unknown tool, or wrong arguments).",
            weight=-1.0,
            verifier=Verifier.rule("env_malformed_tool_call"),
            capability="tool_use",
            tags=("trajectory",),
        ),
        Criterion(
            id="tool_call_after_answer",
            title="Tool call after answering",
            text="Stated an answer and then kept calling tools in the same turn.",
            weight=-1.0,
            verifier=Verifier.rule("env_tool_call_after_answer"),
            capability="tool_use",
            tags=("trajectory",),
        ),
    )
