"""Task specifications of the embedded constraint domain: constraint kinds, sampling, prompts.

A task is described by a JSON-able parameter dict (``params``: type, category, counts, marks…),
stored in ``Task.raw["params"]``; :func:`constraints_for` turns it into the task's stated (hard)
constraints, each with its checker, signed weight, criterion text and capability tag, and
:func:`build_prompt` into the prompt text. Splits and OOD rules are documented in
``rubric_rl.envs.constraint_domain``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.envs import constraint_checkers  # noqa: F401  (registers the cf_* checkers)
from rubric_rl.envs.constraint_lexicon import (
    CASES,
    CATEGORIES,
    CRITERION_TEMPLATES,
    FRAMING_WORDS,
    NUMBER_WORDS,
    PROMPT_TEMPLATES,
    PUNCTUATION,
    SEPARATORS,
    YES_NO,
    canonical,
    category_members,
    plural,
)
from rubric_rl.rubrics.checkers import CHECKERS

DOMAIN = "constraints"
SPLITS = ("train", "validation", "heldout", "ood")
TRAIN_TASK_TYPES = ("list", "format", "short_answer", "rewrite")
OOD_TASK_TYPES = ("filter",)
CAPABILITIES = ("counting", "ordering", "formatting", "lexical", "verification")
# Constraint-kind pairs that never co-occur in train / held-out tasks (rewrite's reverse / sort
# transforms count as "order").
OOD_PAIRS: tuple[tuple[str, str], ...] = (
    ("order", "case"),
    ("numbered", "include"),
    ("start", "end"),
)
HELDOUT_PERCENT = 20
# The validation split (hyperparameter and checkpoint choices; the held-out set never chooses
# anything: benchmarks/protocol.md) takes the next 10 hash buckets; training keeps the other 70.
VALIDATION_PERCENT = 10
TYPE_WEIGHTS = {"list": 0.3, "format": 0.25, "short_answer": 0.25, "rewrite": 0.2}
_CAPABILITY = {
    "count": "counting",
    "wcount": "counting",
    "one_word": "counting",
    "order": "ordering",
    "sep": "formatting",
    "numbered": "formatting",
    "case": "formatting",
    "end": "formatting",
    "start": "formatting",
    "category": "lexical",
    "include": "lexical",
    "exclude": "lexical",
}
_WEIGHT = {"answer": 3.0, "sequence": 3.0, "category": 3.0, "count": 2.0, "wcount": 2.0}
_WEIGHT_EXCLUDE = -2.0


@dataclasses.dataclass(frozen=True)
class Constraint:
    """A stated (hard) constraint of a task: the checker, its weight and texts."""

    kind: str
    checker: str
    args: tuple[tuple[str, Any], ...]
    weight: float  # negative: pitfall ("the forbidden word is used")
    text: str  # criterion text (for a pitfall: the bad behaviour)
    hint: str  # how guidance states it (``guidance_hint``)
    capability: str
    rare: bool = False  # "include <rare word>": blind for the warm-started policy

    def met(self, response: str) -> bool:
        """True when the response satisfies the constraint (for a pitfall: avoids it)."""
        hit = CHECKERS.get(self.checker)(response, **dict(self.args))
        return hit if self.weight > 0 else not hit


def pick(rng: np.random.Generator, seq: Sequence[Any]) -> Any:
    return seq[int(rng.integers(len(seq)))]


def other(rng: np.random.Generator, seq: Sequence[Any], current: Any) -> Any:
    return pick(rng, [x for x in seq if x != current])


def common_members(cat: str) -> tuple[str, ...]:
    return CATEGORIES[cat]["common"]


def intruder(rng: np.random.Generator, cat: str, avoid: Sequence[str] = ()) -> str:
    elsewhere = other(rng, list(CATEGORIES), cat)
    return pick(rng, [w for w in common_members(elsewhere) if w not in avoid])


def guidance_hint(text: str, weight: float) -> str:
    """How guidance states a criterion: its text, or for a pitfall (weight < 0) "avoid : text".

    Used by the warm-start corpus and by controllers alike, so mounted guidance matches the
    wording the policy was warm-started on.
    """
    return text if weight > 0 else f"avoid : {text}"


def _constraint(
    kind: str, checker: str, text_key: str, fmt: Mapping[str, Any], cap: str | None = None, **args
) -> Constraint:
    weight = _WEIGHT_EXCLUDE if kind == "exclude" else _WEIGHT.get(kind, 1.0)
    text = CRITERION_TEMPLATES[text_key].format(**fmt)
    return Constraint(
        kind=kind,
        checker=checker,
        args=tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in args.items())),
        weight=weight,
        text=text,
        hint=guidance_hint(text, weight),
        capability=cap or _CAPABILITY[kind],
    )


def _category(p: Mapping[str, Any]) -> Constraint:
    fmt = {"plural": plural(p["category"])}
    return _constraint("category", "cf_in_category", "category", fmt, category=p["category"])


def _memoized_on_params(fn):
    """`fn(p)` computed once per distinct task parameters: a task's constraints are a function of
    its parameters, asked for on every rollout it is judged or scripted on. The result is a tuple
    of frozen dataclasses, so sharing it is safe.

    The key is ``repr(p)``: the parameters are plain values (the domain's sampler writes str, int,
    bool, None and lists of them), whose repr tells apart values that compare equal but render
    differently in a criterion text (``1``, ``1.0`` and ``True``; a list and a tuple)."""
    memo: dict[str, Any] = {}

    @functools.wraps(fn)
    def wrapper(p: Mapping[str, Any]):
        key = repr(p)
        got = memo.get(key)
        if got is None:
            if len(memo) >= 1 << 16:  # bounded: a long run's tasks, not every task ever seen
                memo.clear()
            got = memo[key] = fn(p)
        return got

    return wrapper


@_memoized_on_params
def constraints_for(p: Mapping[str, Any]) -> tuple[Constraint, ...]:
    """The stated (hard) constraints of a task from its parameters."""
    t = p["type"]
    out: list[Constraint] = []
    if t == "list":
        out.append(_constraint("count", "cf_item_count", "count", p, n=p["n"]))
        out.append(_category(p))
    elif t == "format":
        n = p["n"]
        out.append(_constraint("wcount", "cf_word_count", "wcount", p, low=n, high=n))
        out.append(_category(p))
    elif t == "short_answer":
        fmt, choices = {"answer": p["answer"]}, tuple(p["choices"])
        out.append(
            _constraint(
                "answer",
                "cf_answer_is",
                "answer",
                fmt,
                p["capability"],
                answer=p["answer"],
                choices=choices,
            )
        )
        if p.get("one_word"):
            out.append(_constraint("one_word", "cf_word_count", "one_word", p, low=1, high=1))
    elif t in ("rewrite", "filter"):
        cap = "lexical" if t == "filter" or p["transform"] in ("drop", "replace") else "ordering"
        fmt = {"words": " ".join(p["expected"])}
        out.append(
            _constraint("sequence", "cf_sequence_is", "sequence", fmt, cap, words=p["expected"])
        )
    else:
        raise ValueError(f"constraints: unknown task type {t!r}")
    if p.get("numbered"):
        out.append(_constraint("numbered", "cf_numbered", "numbered", p))
    if p.get("sep"):
        out.append(_constraint("sep", "cf_separator", "sep", p, sep=p["sep"]))
    if p.get("order"):
        out.append(_constraint("order", "cf_sorted", f"order_{p['order']}", p, order=p["order"]))
    if p.get("case"):
        out.append(_constraint("case", "cf_case", f"case_{p['case']}", p, mode=p["case"]))
    if p.get("start"):
        out.append(
            _constraint("start", "cf_starts_with", "start", {"word": p["start"]}, word=p["start"])
        )
    if p.get("include"):
        c = _constraint(
            "include", "cf_includes_word", "include", {"word": p["include"]}, word=p["include"]
        )
        rare = p["include"] in CATEGORIES[p["category"]]["rare"]
        out.append(dataclasses.replace(c, rare=rare))
    if p.get("exclude"):
        out.append(
            _constraint(
                "exclude", "cf_includes_word", "exclude", {"word": p["exclude"]}, word=p["exclude"]
            )
        )
    if p.get("end"):
        out.append(_constraint("end", "cf_ends_with", "end", {"punct": p["end"]}, punct=p["end"]))
    return tuple(out)


# Implicit requirements (room for rubric evolution): what the task verifier checks
# although no prompt clause and no seed criterion states it, as a strict grader of a real task
# would: a list or a word task asks for different items ("list 3 fruits" is not "apple , apple ,
# pear"), and every answer is the answer alone (no praise opener, compliance claim or filler).
# A method that discovers criteria can gain over the seed rubric here; the seed rubric's count and
# category criteria accept repeats, and its spurious criteria reward praise and claims a little.
IMPLICIT_KINDS = ("distinct", "plain")
_IMPLICIT_CAPABILITY = {"distinct": "lexical", "plain": "formatting"}


def implicit_constraints(p: Mapping[str, Any]) -> tuple[Constraint, ...]:
    """The task's implicit requirements (unstated; checked by the task verifier)."""
    out: list[Constraint] = []
    if p["type"] in ("list", "format"):
        unit = "items" if p["type"] == "list" else "words"
        cap = _IMPLICIT_CAPABILITY["distinct"]
        out.append(_constraint("distinct", "cf_distinct", "distinct", {}, cap, unit=unit))
    out.append(_constraint("plain", "cf_plain", "plain", {}, _IMPLICIT_CAPABILITY["plain"]))
    return tuple(out)


@_memoized_on_params
def requirements(p: Mapping[str, Any]) -> tuple[Constraint, ...]:
    """Everything the task verifier checks: the stated constraints, then the implicit ones."""
    return constraints_for(p) + implicit_constraints(p)


def combo_kinds(p: Mapping[str, Any]) -> frozenset[str]:
    """The constraint kinds of a task, as used for the OOD-pair split."""
    kinds = {c.kind for c in constraints_for(p)}
    if p["type"] == "rewrite" and p["transform"] in ("reverse", "sort"):
        kinds.add("order")
    return frozenset(kinds)


def has_ood_pair(p: Mapping[str, Any]) -> bool:
    kinds = combo_kinds(p)
    return any(a in kinds and b in kinds for a, b in OOD_PAIRS)


# --- sampling task parameters --------------------------------------------------------------------


def _sample_list(rng: np.random.Generator) -> dict[str, Any]:
    cat = pick(rng, list(CATEGORIES))
    p: dict[str, Any] = {"type": "list", "category": cat, "n": int(rng.integers(2, 6))}
    r = rng.random()
    p["numbered"] = bool(r < 0.25)
    p["sep"] = pick(rng, SEPARATORS) if 0.25 <= r < 0.6 else None
    p["order"] = pick(rng, ("asc", "asc", "desc")) if rng.random() < 0.4 else None
    p["case"] = pick(rng, CASES) if rng.random() < 0.5 else None
    p["end"] = pick(rng, PUNCTUATION) if rng.random() < 0.5 else None
    p["include"] = None
    if rng.random() < 0.35:
        pool = CATEGORIES[cat]["rare"] if rng.random() < 0.5 else common_members(cat)
        p["include"] = pick(rng, pool)
    p["exclude"] = other(rng, common_members(cat), p["include"]) if rng.random() < 0.3 else None
    return p


def _sample_format(rng: np.random.Generator) -> dict[str, Any]:
    cat = pick(rng, list(CATEGORIES))
    p: dict[str, Any] = {"type": "format", "category": cat, "n": int(rng.integers(2, 7))}
    p["case"] = pick(rng, CASES) if rng.random() < 0.6 else None
    p["end"] = pick(rng, PUNCTUATION) if rng.random() < 0.6 else None
    p["start"] = pick(rng, common_members(cat)) if rng.random() < 0.5 else None
    p["exclude"] = other(rng, common_members(cat), p["start"]) if rng.random() < 0.25 else None
    return p


def _sample_short_answer(rng: np.random.Generator) -> dict[str, Any]:
    sub = pick(rng, ("add", "sub", "count", "member", "first"))
    p: dict[str, Any] = {"type": "short_answer", "subtype": sub}
    if sub in ("add", "sub"):
        a, b = int(rng.integers(0, 11)), int(rng.integers(0, 11))
        if sub == "sub" and a < b:
            a, b = b, a
        value = a + b if sub == "add" else a - b
        p.update(question=PROMPT_TEMPLATES[sub].format(a=a, b=b), answer=NUMBER_WORDS[value])
        p.update(choices=list(NUMBER_WORDS), capability="counting")
    elif sub == "count":
        k = int(rng.integers(1, 7))
        cat = pick(rng, list(CATEGORIES))
        ws = [str(w) for w in rng.permutation(list(common_members(cat)))[:k]]
        p.update(question=PROMPT_TEMPLATES["count"].format(words=" ".join(ws)))
        p.update(answer=NUMBER_WORDS[k], choices=list(NUMBER_WORDS), capability="counting")
    elif sub == "member":
        cat = pick(rng, list(CATEGORIES))
        yes = rng.random() < 0.5
        word = pick(rng, common_members(cat)) if yes else intruder(rng, cat)
        p.update(question=PROMPT_TEMPLATES["member"].format(word=word, category=cat))
        p.update(answer="yes" if yes else "no", choices=list(YES_NO), capability="verification")
    else:
        a, b = (
            str(w) for w in rng.permutation([w for c in CATEGORIES for w in common_members(c)])[:2]
        )
        p.update(question=PROMPT_TEMPLATES["first"].format(a=a, b=b), answer=min(a, b))
        p.update(choices=[a, b], capability="ordering")
    p["case"] = pick(rng, CASES) if rng.random() < 0.4 else None
    p["end"] = pick(rng, PUNCTUATION) if rng.random() < 0.5 else None
    r = rng.random()
    p["one_word"] = bool(r < 0.3)
    p["start"] = pick(rng, FRAMING_WORDS) if 0.3 <= r < 0.55 else None
    return p


def _mixed_words(rng: np.random.Generator, k: int) -> list[str]:
    pool = [w for c in CATEGORIES for w in common_members(c)]
    return [str(w) for w in rng.permutation(pool)[:k]]


def _sample_rewrite(rng: np.random.Generator) -> dict[str, Any]:
    words = _mixed_words(rng, int(rng.integers(3, 6)))
    transform = pick(rng, ("reverse", "sort", "drop", "replace"))
    p: dict[str, Any] = {"type": "rewrite", "words": words, "transform": transform}
    if transform == "sort":
        while words == sorted(words):
            words = [str(w) for w in rng.permutation(words)]
        p.update(words=words, expected=sorted(words))
    elif transform == "reverse":
        p["expected"] = words[::-1]
    elif transform == "drop":
        p["target"] = pick(rng, words)
        p["expected"] = [w for w in words if w != p["target"]]
    else:
        p["target"] = pick(rng, words)
        p["other"] = pick(rng, [w for w in _mixed_words(rng, 8) if w not in words])
        p["expected"] = [p["other"] if w == p["target"] else w for w in words]
    p["case"] = pick(rng, CASES) if rng.random() < 0.5 else None
    p["end"] = pick(rng, PUNCTUATION) if rng.random() < 0.5 else None
    return p


def sample_filter(rng: np.random.Generator) -> dict[str, Any]:
    cat = pick(rng, list(CATEGORIES))
    keep = [str(w) for w in rng.permutation(list(common_members(cat)))[: int(rng.integers(2, 4))]]
    others = [w for w in _mixed_words(rng, 12) if w not in category_members(cat)]
    words = [str(w) for w in rng.permutation(keep + others[: int(rng.integers(2, 4))])]
    p: dict[str, Any] = {"type": "filter", "category": cat, "words": words}
    p["expected"] = [w for w in words if w in category_members(cat)]
    p["case"] = pick(rng, CASES) if rng.random() < 0.4 else None
    p["end"] = pick(rng, PUNCTUATION) if rng.random() < 0.4 else None
    return p


SAMPLERS = {
    "list": _sample_list,
    "format": _sample_format,
    "short_answer": _sample_short_answer,
    "rewrite": _sample_rewrite,
    "filter": sample_filter,
}


def build_prompt(p: Mapping[str, Any], rng: np.random.Generator) -> str:
    t = p["type"]
    if t in ("list", "format"):
        head = PROMPT_TEMPLATES[t].format(n=p["n"], plural=plural(p["category"]))
    elif t == "short_answer":
        head = p["question"]
    elif t == "rewrite":
        head = PROMPT_TEMPLATES["rewrite"].format(words=" ".join(p["words"]))
        tr = p["transform"]
        head += " " + PROMPT_TEMPLATES[f"t_{tr}"].format(word=p.get("target"), other=p.get("other"))
    else:
        fmt = {"words": " ".join(p["words"]), "plural": plural(p["category"])}
        head = PROMPT_TEMPLATES["filter"].format(**fmt)
    clauses = []
    if p.get("numbered"):
        clauses.append(PROMPT_TEMPLATES["numbered"])
    for key in ("sep", "include", "exclude", "start", "end"):
        if p.get(key):
            tmpl = PROMPT_TEMPLATES[key]
            clauses.append(tmpl.format(sep=p[key], word=p[key], punct=p[key]))
    if p.get("order"):
        clauses.append(PROMPT_TEMPLATES[f"order_{p['order']}"])
    if p.get("case"):
        clauses.append(PROMPT_TEMPLATES[f"case_{p['case']}"])
    if p.get("one_word"):
        clauses.append(PROMPT_TEMPLATES["one_word"])
    clauses = [clauses[i] for i in rng.permutation(len(clauses))]
    text = head
    for clause in clauses:
        text += (" " if text.endswith("?") else " . ") + clause
    return canonical(text)
