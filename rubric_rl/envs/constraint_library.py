"""The embedded domain's checker library, parameterised from the prompt text.

What a rubric-writing method may propose for a task: every check the domain's checkers
(``constraint_checkers``) can make whose arguments the *prompt text* determines. The library
parses a task's prompt (its last user message, as the policy sees it before any guidance) back
into the clauses it states, and returns

- one criterion per stated clause (``count``, ``category``, ``case``, ``sequence``, …: the same
  checker, arguments, weight and text as the seed rubric's genuine criterion for it, derived here
  from the words of the prompt — a short answer's expected word is computed from the question);
- the implicit requirements any such task carries (``distinct`` items for list and word tasks,
  ``plain``: the answer alone), which the task verifier checks and no seed criterion states.

It never reads ``Task.raw`` (the generator's hidden parameters), the seed rubric's ``class:`` tags
or the hidden oracle: :func:`parse_prompt` sees text only, and a prompt it cannot read entirely is
an error naming the task, never a silent partial bank. ARISE's programmatic reflection draws its
candidate rubric–skill pairs from here (``arise.bank="library"``, or ``"auto"``: the default), so
the pool can hold criteria the seed rubric lacks; ``bank="seed_rubric"`` (the task's own rule
criteria) is kept as an ablation. The tests check that the library reproduces every task's stated
constraints and implicit requirements from its prompt alone.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Any

from rubric_rl.envs.constraint_lexicon import (
    CATEGORIES,
    NUMBER_WORDS,
    PUNCTUATION,
    SEPARATORS,
    YES_NO,
    category_members,
    plural,
)
from rubric_rl.envs.constraint_spec import DOMAIN, Constraint, requirements
from rubric_rl.rubrics.types import Criterion, Task, Verifier

__all__ = ["library_constraints", "library_criteria", "parse_prompt"]

_W = r"[A-Za-z]+"
_CATEGORY_OF_PLURAL = {plural(c): c for c in CATEGORIES}
_PUNCT = "|".join(re.escape(p) for p in PUNCTUATION)
_SEPS = "|".join(re.escape(s) for s in SEPARATORS)

# Task heads, anchored at the start of the prompt (constraint_lexicon.PROMPT_TEMPLATES).
_HEADS = (
    ("list", re.compile(rf"^list (\d+) ({_W})")),
    ("format", re.compile(rf"^write (\d+) words about ({_W})")),
    ("arith", re.compile(r"^what is (\d+) (plus|minus) (\d+) \?")),
    ("count", re.compile(rf"^how many words are in : ((?:{_W} )+)\?")),
    ("member", re.compile(rf"^is ({_W}) a ({_W}) \? answer yes or no")),
    ("first", re.compile(rf"^which comes first alphabetically : ({_W}) or ({_W}) \?")),
    (
        "rewrite",
        re.compile(
            rf"^rewrite : ((?:{_W} )+?)"
            rf"(in reverse order|sorted alphabetically|without ({_W})|replace ({_W}) with ({_W}))"
        ),
    ),
    ("filter", re.compile(rf"^from : ((?:{_W} )+), keep only the ({_W})")),
)
# Clauses after the head, in any order, each separated by " . " (or following a "?").
_CLAUSES = (
    ("numbered", re.compile(r"number the items"), lambda m: True),
    ("sep", re.compile(rf"separate them with ({_SEPS})"), lambda m: m.group(1)),
    ("order", re.compile(r"sort them alphabetically"), lambda m: "asc"),
    ("order", re.compile(r"sort them in reverse alphabetical order"), lambda m: "desc"),
    ("case", re.compile(r"use lowercase"), lambda m: "lower"),
    ("case", re.compile(r"use uppercase"), lambda m: "upper"),
    ("case", re.compile(r"capitalize each word"), lambda m: "capitalized"),
    ("end", re.compile(rf"end with ({_PUNCT})"), lambda m: m.group(1)),
    ("include", re.compile(rf"include ({_W})"), lambda m: m.group(1)),
    ("exclude", re.compile(rf"do not use ({_W})"), lambda m: m.group(1)),
    ("start", re.compile(rf"start with ({_W})"), lambda m: m.group(1)),
    ("one_word", re.compile(r"answer in one word"), lambda m: True),
)
_LEFTOVER = re.compile(r"^[\s.]*$")


def _category(word: str, what: str) -> str:
    if word in _CATEGORY_OF_PLURAL:
        return _CATEGORY_OF_PLURAL[word]
    if word in CATEGORIES:
        return word
    raise ValueError(f"{what}: {word!r} is not a category of the domain")


def _number(value: int, what: str) -> str:
    if not 0 <= value < len(NUMBER_WORDS):
        raise ValueError(f"{what}: {value} has no number word")
    return NUMBER_WORDS[value]


def _head(text: str) -> tuple[dict[str, Any], int]:
    """(parameters stated by the task's head, where the head ends)."""
    for kind, pattern in _HEADS:
        m = pattern.match(text)
        if m is None:
            continue
        if kind in ("list", "format"):
            cat = _category(m.group(2), f"head {m.group(0)!r}")
            return {"type": kind, "category": cat, "n": int(m.group(1))}, m.end()
        if kind == "arith":
            a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
            answer = _number(a + b if op == "plus" else a - b, f"question {m.group(0)!r}")
            p = {"type": "short_answer", "subtype": "add" if op == "plus" else "sub"}
            p.update(answer=answer, choices=list(NUMBER_WORDS), capability="counting")
            return p, m.end()
        if kind == "count":
            words = m.group(1).split()
            p = {"type": "short_answer", "subtype": "count", "choices": list(NUMBER_WORDS)}
            p.update(answer=_number(len(words), m.group(0)), capability="counting")
            return p, m.end()
        if kind == "member":
            word, cat = m.group(1), _category(m.group(2), f"question {m.group(0)!r}")
            answer = "yes" if word.lower() in category_members(cat) else "no"
            p = {"type": "short_answer", "subtype": "member", "choices": list(YES_NO)}
            p.update(answer=answer, capability="verification")
            return p, m.end()
        if kind == "first":
            a, b = m.group(1), m.group(2)
            p = {"type": "short_answer", "subtype": "first", "choices": [a, b]}
            p.update(answer=min(a, b), capability="ordering")
            return p, m.end()
        if kind == "rewrite":
            words = m.group(1).split()
            how = m.group(2)
            if how == "in reverse order":
                p = {"transform": "reverse", "expected": words[::-1]}
            elif how == "sorted alphabetically":
                p = {"transform": "sort", "expected": sorted(words)}
            elif how.startswith("without"):
                target = m.group(3)
                p = {"transform": "drop", "target": target}
                p["expected"] = [w for w in words if w != target]
            else:
                target, new = m.group(4), m.group(5)
                p = {"transform": "replace", "target": target, "other": new}
                p["expected"] = [new if w == target else w for w in words]
            return {"type": "rewrite", "words": words, **p}, m.end()
        words = m.group(1).split()
        cat = _category(m.group(2), f"head {m.group(0)!r}")
        expected = [w for w in words if w in category_members(cat)]
        return {"type": "filter", "category": cat, "words": words, "expected": expected}, m.end()
    raise ValueError(f"no known task head at the start of {text[:60]!r}")


def _mask(text: str, start: int, end: int) -> str:
    return text[:start] + " " * (end - start) + text[end:]


def parse_prompt(text: str) -> dict[str, Any]:
    """The task parameters a prompt states, read from its text alone (``constraint_spec``'s
    parameter names; a clause the prompt does not state is absent). Raises ``ValueError`` when
    any part of the text is not a known head or clause."""
    return copy.deepcopy(_parse(text))


@functools.lru_cache(maxsize=65536)
def _parse(text: str) -> dict[str, Any]:
    params, end = _head(text)
    rest = " " + text[end:] + " "
    for key, pattern, value in _CLAUSES:
        # A clause starts the remainder or follows a separator (" . " / "? "), never inside a word.
        for m in re.finditer(rf"(?<=[\s.?])(?:{pattern.pattern})(?=\s)", rest):
            if key in params:
                raise ValueError(f"clause {key!r} is stated twice in {text!r}")
            params[key] = value(m)
            rest = _mask(rest, m.start(), m.end())
    if not _LEFTOVER.match(rest):
        raise ValueError(f"unparsed text {rest.strip()!r} in {text!r}")
    return params


def _prompt_text(task: Task) -> str:
    users = [m.content for m in task.prompt if m.role == "user"]
    if not users:
        raise ValueError(f"task {task.id!r}: no user message to read constraints from")
    return users[-1]


def library_constraints(task: Task) -> tuple[Constraint, ...]:
    """The library's checks for ``task``, from its prompt text: each stated clause, then the
    implicit requirements (``constraint_spec.requirements`` of the parsed parameters)."""
    if task.domain != DOMAIN:
        raise ValueError(f"task {task.id!r} is not a {DOMAIN!r} task: the library cannot read it")
    try:
        params = _parse(_prompt_text(task))
    except ValueError as e:
        raise ValueError(f"task {task.id!r}: {e}") from None
    return requirements(params)


# A format option is its own rubric ("every word is in uppercase" is not "… in lowercase"): the
# criterion id carries it, so a pool entry bound to "case:upper" applies to the tasks that ask
# for uppercase only. Other kinds keep one id whatever their argument (a count, a word).
VARIANT_ARGS = {"case": "mode", "end": "punct", "sep": "sep", "order": "order"}


def criterion_id(c: Constraint) -> str:
    """The library's id of a check: its kind, with the format option for VARIANT_ARGS kinds."""
    arg = VARIANT_ARGS.get(c.kind)
    return f"{c.kind}:{dict(c.args)[arg]}" if arg else c.kind


def library_criteria(task: Task) -> tuple[Criterion, ...]:
    """:func:`library_constraints` as rule-verified criteria (id: :func:`criterion_id`; title:
    the constraint kind, as the seed rubric's ids), carrying their capability: the candidate
    bank of ARISE's programmatic reflection (``controllers/reflection.py``)."""
    return tuple(_criterion(c) for c in library_constraints(task))


def _criterion(c: Constraint) -> Criterion:
    return Criterion(
        id=criterion_id(c),
        text=c.text,
        weight=c.weight,
        title=c.kind,
        tags=(f"kind:{c.kind}", f"cap:{c.capability}"),
        verifier=Verifier.rule(c.checker, **dict(c.args)),
        capability=c.capability,
        origin="library",
    )
