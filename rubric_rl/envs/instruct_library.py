"""The instruction-following domain's checker library, read from the prompt text alone.

What a rubric-writing method may propose for a task (ARISE's ``arise.bank``, SkillRL's
candidates): one criterion per instruction the prompt states (the seed rubric's genuine
criterion: same checker, arguments, weight and text), then the implicit requirements every task
carries (on topic, no repeated sentence, no praise or compliance claim) that the verifier checks
and no seed criterion states. :func:`parse_prompt` reads the request (its topic) and every
instruction sentence back from the text, never ``Task.raw``; text it cannot read is an error
naming the task, never a silent partial bank.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from rubric_rl.envs.instruct_domain import DOMAIN, Requirement, requirements
from rubric_rl.envs.instruct_spec import REQUESTS, TOPICS, TYPES
from rubric_rl.rubrics.types import Criterion, Task, Verifier

__all__ = ["library_criteria", "library_requirements", "parse_prompt"]

_TOPIC_OF_PHRASE = {t.phrase: i for i, t in enumerate(TOPICS)}
_REQUEST_PATTERNS = tuple(
    re.compile("^" + re.escape(r).replace(re.escape("{topic}"), "(?P<topic>.+?)") + "(?= |$)")
    for r in REQUESTS
)
_TYPE_PATTERNS = tuple((t.id, t.regex(), t.parse) for t in TYPES)


def parse_prompt(text: str) -> dict[str, Any]:
    """The task parameters a prompt states (``topic``, ``request``, ``instructions`` as
    ``instruct_domain`` writes them), read from its text. Raises ``ValueError`` when any part of
    the text is not a known request or instruction sentence."""
    topic, request, insts = _parse(text)
    return {"topic": topic, "request": request, "instructions": [[t, dict(p)] for t, p in insts]}


@functools.lru_cache(maxsize=65536)
def _parse(text: str) -> tuple[int, int, tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]]:
    for ri, pattern in enumerate(_REQUEST_PATTERNS):
        m = pattern.match(text)
        if m is None or m.group("topic") not in _TOPIC_OF_PHRASE:
            continue
        topic, rest = _TOPIC_OF_PHRASE[m.group("topic")], text[m.end() :]
        found: list[tuple[int, str, dict[str, Any]]] = []
        for type_id, regex, parse in _TYPE_PATTERNS:
            for hit in regex.finditer(rest):
                found.append((hit.start(), type_id, parse(hit.groupdict())))
                rest = rest[: hit.start()] + " " * (hit.end() - hit.start()) + rest[hit.end() :]
        if rest.strip():
            raise ValueError(f"unparsed text {rest.strip()!r} in {text!r}")
        ids = [t for _, t, _ in found]
        if len(set(ids)) != len(ids):
            raise ValueError(f"an instruction is stated twice in {text!r}")
        insts = tuple((t, tuple(sorted(p.items()))) for _, t, p in sorted(found))
        return topic, ri, insts
    raise ValueError(f"no known request with a known topic at the start of {text[:80]!r}")


def _prompt_text(task: Task) -> str:
    users = [m.content for m in task.prompt if m.role == "user"]
    if not users:
        raise ValueError(f"task {task.id!r}: no user message to read instructions from")
    return users[-1]


def library_requirements(task: Task) -> tuple[Requirement, ...]:
    """The library's checks for ``task``, from its prompt text: each stated instruction, then
    the implicit requirements."""
    if task.domain != DOMAIN:
        raise ValueError(f"task {task.id!r} is not an {DOMAIN!r} task: the library cannot read it")
    try:
        params = parse_prompt(_prompt_text(task))
    except ValueError as e:
        raise ValueError(f"task {task.id!r}: {e}") from None
    return requirements(params)


def library_criteria(task: Task) -> tuple[Criterion, ...]:
    """:func:`library_requirements` as rule-verified criteria (id and title: the instruction
    type or implicit kind, as the seed rubric's ids), carrying their capability."""
    return tuple(
        Criterion(
            id=r.kind,
            text=r.text,
            weight=r.weight,
            title=r.kind,
            tags=(f"kind:{r.kind}", f"cap:{r.capability}"),
            verifier=Verifier.rule(r.checker, **dict(r.args)),
            capability=r.capability,
            origin="library",
        )
        for r in library_requirements(task)
    )
