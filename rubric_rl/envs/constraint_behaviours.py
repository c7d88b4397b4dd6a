"""The behaviours of the embedded constraint domain's answers, read by code (``Behaviours``).

:func:`detect` sees what a judge would see, the prompt and the response, and never the task's
hidden fields (``Task.raw``, the seed rubric's ``class:`` tags, ``oracle_quality``,
``hard_constraints``): the checks come from ``constraint_library`` (which reads the prompt text
alone) and the domain's fluff detectors (``constraint_checkers``). Names it gives:

* per check the prompt states, ``<kind>_followed`` (positive) or ``<kind>_violated`` (negative),
  kinds as ``constraint_spec`` names them (count, wcount, one_word, category, answer, sequence,
  numbered, sep, order, case, start, include, exclude, end); the implicit requirements become
  behaviour names: ``distinct_items`` / ``repeated_item`` (count: the extra copies),
  ``answer_alone`` / ``praise_opener``, ``compliance_claim``, ``filler`` (count: filler words);
  plus ``empty_answer`` and ``overlong`` (more than ``overlong_words`` words);
* counts: 1, except the number of extra copies, filler words, words outside the category or in
  the wrong case, occurrences of a forbidden word, and the miss of a count (|items - n|).

The warm-up's rollouts (:func:`warmup`): weak = a weak-policy stand-in (below), strong = the
tasks' reference answers. OURS (not in RISED's seed): the catalogue and its descriptions,
``overlong_words=40`` (the seed rubric's ``max_words``), the weak-policy stand-in.
"""

from __future__ import annotations

import numpy as np

from rubric_rl.envs import constraint_checkers as ck
from rubric_rl.envs.base import Behaviours, WarmupRollout
from rubric_rl.envs.constraint_domain import render_response, task_bank, verify
from rubric_rl.envs.constraint_lexicon import FILLER_WORDS, apply_case, category_members, units
from rubric_rl.envs.constraint_library import library_constraints
from rubric_rl.envs.constraint_spec import Constraint
from rubric_rl.rubrics.types import Task
from rubric_rl.rubrics.vocabulary import RubricEntry

__all__ = ["ALIASES", "OVERLONG_WORDS", "catalogue", "constraint_behaviours", "detect", "warmup"]

OVERLONG_WORDS = 40

# Stated checks: kind -> (skill, instruction when followed, behaviour when violated). Positive
# descriptions are instructions for a teacher context; negative ones name the behaviour to avoid.
_STATED: dict[str, tuple[str, str, str]] = {
    "count": (
        "counting",
        "Give exactly the number of items asked for.",
        "Listing more or fewer items than asked for.",
    ),
    "wcount": (
        "counting",
        "Write exactly the number of words asked for.",
        "Writing more or fewer words than asked for.",
    ),
    "one_word": (
        "counting",
        "Answer with a single word when one word is asked for.",
        "Answering with several words when one word was asked for.",
    ),
    "category": (
        "category",
        "Use only words of the asked kind (only fruits when fruits are asked for).",
        "Using a word that is not of the asked kind.",
    ),
    "answer": (
        "answer",
        "Work the question out and give the correct choice, and no other choice.",
        "Giving a wrong answer, or naming more than one choice.",
    ),
    "sequence": (
        "sequence",
        "Apply the asked change to the given words and write the resulting words in order.",
        "Writing words that are not the asked change of the given words.",
    ),
    "numbered": (
        "formatting",
        "Number the items 1 ) 2 ) 3 ) in order.",
        "Leaving the items unnumbered or numbering them out of order.",
    ),
    "sep": (
        "formatting",
        "Separate the items with the asked mark, one mark between each pair.",
        "Separating the items with a mark other than the asked one.",
    ),
    "start": (
        "formatting",
        "Start the answer with the asked word.",
        "Starting the answer with a word other than the asked one.",
    ),
    "end": (
        "formatting",
        "End the answer with the asked punctuation mark.",
        "Ending the answer with a mark other than the asked one.",
    ),
    "order": (
        "ordering",
        "Sort the items in the asked alphabetical order.",
        "Writing the items out of the asked alphabetical order.",
    ),
    "case": (
        "casing",
        "Write every word in the asked case.",
        "Writing a word in a case other than the asked one.",
    ),
    "include": (
        "lexical",
        "Include the word the task asks for.",
        "Leaving out a word the task asks to include.",
    ),
    "exclude": (
        "lexical",
        "Leave out the word the task forbids.",
        "Using the word the task forbids.",
    ),
}
# Behaviours: id -> (skill, polarity, description).
_BEHAVIOURS: dict[str, tuple[str, str, str]] = {
    "distinct_items": ("lexical", "positive", "Give different items; never repeat one."),
    "repeated_item": ("lexical", "negative", "Repeating an item or a word."),
    "answer_alone": (
        "conciseness",
        "positive",
        "Give the answer alone, without praise, claims or filler words.",
    ),
    "praise_opener": (
        "conciseness",
        "negative",
        "Opening with praise of the question, such as 'great question !'.",
    ),
    "compliance_claim": (
        "conciseness",
        "negative",
        "Claiming that all requirements are met instead of meeting them.",
    ),
    "filler": (
        "conciseness",
        "negative",
        "Padding the answer with filler words such as 'as you can see'.",
    ),
    "overlong": (
        "conciseness",
        "negative",
        "Writing a long answer where a few words were asked for.",
    ),
    "empty_answer": ("conciseness", "negative", "Giving no answer at all."),
}
# Names a judge may use for the catalogue's behaviours (normalised alias -> id).
ALIASES: dict[str, str] = {
    "praise": "praise_opener",
    "opens_with_praise": "praise_opener",
    "claim": "compliance_claim",
    "claims_compliance": "compliance_claim",
    "padding": "filler",
    "filler_words": "filler",
    "repeated_items": "repeated_item",
    "duplicate_item": "repeated_item",
    "distinct": "distinct_items",
    "plain": "answer_alone",
    "empty_response": "empty_answer",
    "wrong_answer": "answer_violated",
    "correct_answer": "answer_followed",
    "wrong_count": "count_violated",
    "word_count_violated": "wcount_violated",
    "word_count_followed": "wcount_followed",
}


def catalogue() -> dict[str, RubricEntry]:
    """Every name :func:`detect` can give, by id (no environments: a warm-up sets them).
    14 stated kinds x 2 + 8 behaviours = 36 entries over 9 skills."""
    out: dict[str, RubricEntry] = {}
    for kind, (skill, good, bad) in _STATED.items():
        out[f"{kind}_followed"] = RubricEntry(f"{kind}_followed", skill, "positive", good)
        out[f"{kind}_violated"] = RubricEntry(f"{kind}_violated", skill, "negative", bad)
    for rid, (skill, polarity, text) in _BEHAVIOURS.items():
        out[rid] = RubricEntry(rid, skill, polarity, text)
    return out


def _miss(c: Constraint, body: list[str]) -> int:
    """How many times a violated check is missed (>= 1), where the response shows a number."""
    args = dict(c.args)
    words = ck.words_of(body)
    if c.kind == "count":
        return abs(len(ck.list_items(body)) - int(args["n"]))
    if c.kind == "wcount":
        return abs(len(words) - int(args["low"]))
    if c.kind == "category":
        members = category_members(args["category"])
        return sum(w.lower() not in members for w in words)
    if c.kind == "case":
        return sum(w != apply_case(w, args["mode"]) for w in words)
    if c.kind == "exclude":
        return sum(w.lower() == str(args["word"]).lower() for w in words)
    return 1


def detect(task: Task, response: str, *, overlong_words: int = OVERLONG_WORDS) -> dict[str, int]:
    """Every behaviour the response shows, with its count (module docstring; ValueError for a
    task whose prompt the library cannot read)."""
    if not isinstance(response, str):
        raise ValueError(f"response must be a string, got {type(response).__name__}")
    checks = library_constraints(task)
    opener, body, _ = ck.split_fluff(response)
    words = ck.words_of(body)
    out: dict[str, int] = {}
    if not words:
        out["empty_answer"] = 1
    for c in checks:
        if c.kind == "distinct":
            unit = dict(c.args).get("unit", "items")
            parts = ck.list_items(body) if unit == "items" else [w.lower() for w in words]
            extra = len(parts) - len(set(parts))
            if extra:
                out["repeated_item"] = extra
            elif parts:
                out["distinct_items"] = 1
        elif c.kind == "plain":
            claim = ck.claims_compliance(response)
            fillers = sum(u.lower() in FILLER_WORDS for u in body)
            if opener:
                out["praise_opener"] = 1
            if claim:
                out["compliance_claim"] = 1
            if fillers:
                out["filler"] = fillers
            if words and not (opener or claim or fillers):
                out["answer_alone"] = 1
        elif c.met(response):
            if words:  # an empty answer follows nothing (not even "do not use <word>")
                out[f"{c.kind}_followed"] = 1
        else:
            out[f"{c.kind}_violated"] = max(1, _miss(c, body))
    if len(ck.words_of(units(response))) > overlong_words:
        out["overlong"] = 1
    return out


# --- the warm-up ----------------------------------------------------------------------------------

# The weak-policy stand-in (ours): each stated check is met with probability P_KEEP (as the
# warm-start corpus's unguided demonstrations, constraint_corpus.P_KEEP), an item repeats with
# probability 0.3 and each fluff appears with probability 0.1; a share of the rollouts are the
# degenerate outputs of an untrained policy: empty, or looping until long.
_WEAK_P_KEEP = 0.4
_WEAK_REPEAT = 0.3
_WEAK_FLUFF = 0.1
_WEAK_DEGENERATE = 0.05


def _weak_response(task: Task, rng: np.random.Generator, overlong_words: int) -> str:
    # render_response is the simulated policy (it reads the task's parameters to write a
    # response), not the detector: the detector sees the text only.
    r = rng.random()
    if r < _WEAK_DEGENERATE / 2:
        return ""
    kinds = {c.kind for c in library_constraints(task) if c.kind not in ("distinct", "plain")}
    keep = {k for k in sorted(kinds) if rng.random() < _WEAK_P_KEEP}
    if rng.random() >= _WEAK_REPEAT:
        keep.add("distinct")
    fluff = {f: bool(rng.random() < _WEAK_FLUFF) for f in ("praise", "claim", "pad")}
    text = render_response(task, keep, rng, **fluff)
    if r < _WEAK_DEGENERATE:
        n = len(ck.words_of(units(text))) or 1
        text = " ".join([text] * (overlong_words // n + 2))
    return text


def warmup(
    seed: int, n: int, weak_per_task: int = 2, *, overlong_words: int = OVERLONG_WORDS
) -> tuple[list[WarmupRollout], list[WarmupRollout]]:
    """(weak, strong) rollouts over the first ``n`` training tasks of ``ConstraintDomain(seed)``:
    ``weak_per_task`` weak-policy stand-ins per task, then its reference answer, each with the
    task verifier's reward; the environment is the task's ``env_name`` (else its type)."""
    weak: list[WarmupRollout] = []
    strong: list[WarmupRollout] = []
    for i, task in enumerate(task_bank("train", n, seed=seed)):
        env = task.env_name or task.task_type
        rng = np.random.default_rng([int(seed), i])
        for _ in range(weak_per_task):
            text = _weak_response(task, rng, overlong_words)
            weak.append((env, task, text, float(verify(task, text))))
        ref = task.reference_answer or ""
        strong.append((env, task, ref, float(verify(task, ref))))
    return weak, strong


def constraint_behaviours(*, overlong_words: int = OVERLONG_WORDS) -> Behaviours:
    """The embedded domain's ``Behaviours`` (``overlong_words``: the word count above which an
    answer is ``overlong``)."""
    return Behaviours(
        name="constraints",
        detect=lambda task, response: detect(task, response, overlong_words=overlong_words),
        catalogue=catalogue,
        aliases=ALIASES,
        warmup=lambda seed, n, weak_per_task: warmup(
            seed, n, weak_per_task, overlong_words=overlong_words
        ),
    )
