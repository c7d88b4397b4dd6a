"""RISED's rollout taggers (RISED §2.2, A.1, A.4; DESIGN.md §6) and the embedded vocabulary.

- :class:`ProgrammaticTagger`: the tagger of the embedded constraint domain (``envs/constraint_*``).
  It sees what a judge would see, the prompt and the response (and the reward), and never the
  task's hidden fields (``Task.raw``, the seed rubric's ``class:`` tags, ``oracle_quality``,
  ``hard_constraints``): the checks come from ``constraint_library`` (which reads the prompt text
  alone) and the domain's fluff detectors (``constraint_checkers``). Names it emits:

  * per check the prompt states, ``<kind>_followed`` (positive) or ``<kind>_violated`` (negative),
    kinds as ``constraint_spec`` names them (count, wcount, one_word, category, answer, sequence,
    numbered, sep, order, case, start, include, exclude, end); the implicit requirements become
    behaviour tags: ``distinct_items`` / ``repeated_item`` (count: the extra copies),
    ``answer_alone`` / ``praise_opener``, ``compliance_claim``, ``filler`` (count: filler words);
    plus ``empty_answer`` and ``overlong`` (more than ``overlong_words`` words);
  * counts: 1, except the number of extra copies, filler words, words outside the category or in
    the wrong case, occurrences of a forbidden word, and the miss of a count (|items - n|);
  * reward-informed (RISED E.4): ``task_solved`` (positive) when reward >= ``solved_threshold``,
    ``task_failed`` (negative) below it, nothing without a reward.

  ``discovery=True`` emits every name it detects (the warm-up); otherwise names go through the
  vocabulary (:meth:`Vocabulary.lookup`), and unknown ones are kept as discovered.
- :class:`~rubric_rl.methods.rised.rised_llm_tagger.LLMTagger` (re-exported): one judge call per
  rollout for real environments.

:func:`embedded_vocabulary` runs the warm-up on the embedded domain and caches the result (a
file path given by the caller); nothing generated is committed. OURS (not in the seed): the
catalogue and its descriptions, ``solved_threshold=0.5``, ``overlong_words=40`` (the seed rubric's
``max_words``), the weak-policy stand-in (below) and the warm-up's size.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from rubric_rl.envs import constraint_checkers as ck
from rubric_rl.envs.constraint_lexicon import FILLER_WORDS, apply_case, category_members, units
from rubric_rl.envs.constraint_library import library_constraints
from rubric_rl.envs.constraint_spec import Constraint
from rubric_rl.methods.rised.rised_llm_tagger import LLMTagger, parse_tags
from rubric_rl.methods.rised.rised_tags import (
    DetectingTagger,
    RolloutTagger,
    Tags,
    group_profile,
    profile,
    reliability,
    top_negative,
    top_positive,
)
from rubric_rl.rubrics.types import Task
from rubric_rl.rubrics.vocabulary import RubricEntry, Vocabulary, build_vocabulary

__all__ = [
    "LLMTagger",
    "ProgrammaticTagger",
    "RolloutTagger",
    "Tags",
    "constraint_aliases",
    "constraint_catalogue",
    "embedded_vocabulary",
    "group_profile",
    "parse_tags",
    "profile",
    "reliability",
    "top_negative",
    "top_positive",
]

# Stated checks: kind -> (skill, instruction when followed, behaviour when violated). Positive
# descriptions are instructions for the teacher context; negative ones name the behaviour to
# avoid (the anti-patterns block).
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
# Behaviour tags: id -> (skill, polarity, description).
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
    "task_solved": (
        "outcome",
        "positive",
        "Meet every requirement of the task, stated or implied.",
    ),
    "task_failed": ("outcome", "negative", "Missing a requirement of the task."),
}


def constraint_catalogue() -> dict[str, RubricEntry]:
    """Every rubric the programmatic tagger can emit, by id (no environments: the warm-up sets
    them). 14 stated kinds x 2 + 10 behaviour tags = 38 rubrics over 10 skills."""
    out: dict[str, RubricEntry] = {}
    for kind, (skill, good, bad) in _STATED.items():
        out[f"{kind}_followed"] = RubricEntry(f"{kind}_followed", skill, "positive", good)
        out[f"{kind}_violated"] = RubricEntry(f"{kind}_violated", skill, "negative", bad)
    for rid, (skill, polarity, text) in _BEHAVIOURS.items():
        out[rid] = RubricEntry(rid, skill, polarity, text)
    return out


def constraint_aliases() -> dict[str, str]:
    """Names a judge may use for the catalogue's rubrics (normalised alias -> id)."""
    return {
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


class ProgrammaticTagger(DetectingTagger):
    """Tags embedded-domain rollouts by code (module docstring); deterministic and free.

    ``vocab``: the vocabulary names are mapped through (required unless ``discovery``);
    ``solved_threshold``: the reward at or above which a rollout is ``task_solved`` (None: the
    reward is not used); ``overlong_words``: the whole response's word count above which it is
    ``overlong``; ``outcome_conditioned``: positives from successes only, negatives from
    failures only (``DetectingTagger``; False: the unconditioned tagging). The warm-up
    (``discovery``) keeps every name: the vocabulary lists what can be tagged at all.
    """

    def __init__(
        self,
        vocab: Vocabulary | None = None,
        *,
        discovery: bool = False,
        solved_threshold: float | None = 0.5,
        overlong_words: int = 40,
        outcome_conditioned: bool = True,
    ):
        if vocab is None and not discovery:
            raise ValueError("ProgrammaticTagger: a vocabulary is needed unless discovery=True")
        self.vocab = vocab
        self.discovery = bool(discovery)
        self.solved_threshold = None if solved_threshold is None else float(solved_threshold)
        self.overlong_words = int(overlong_words)
        self.outcome_conditioned = bool(outcome_conditioned)

    def detect(self, task: Task, response: str, reward: float | None) -> dict[str, int]:
        """Every name this tagger detects, with its count (ValueError for a task whose prompt
        the library cannot read)."""
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
        if len(ck.words_of(units(response))) > self.overlong_words:
            out["overlong"] = 1
        if reward is not None and self.solved_threshold is not None:
            solved = float(reward) >= self.solved_threshold
            out["task_solved" if solved else "task_failed"] = 1
        return out


# --- the warm-up on the embedded domain ----------------------------------------------------------

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
    # response), not the tagger: the tagger sees the text only.
    from rubric_rl.envs.constraint_domain import render_response

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


def embedded_vocabulary(
    domain_seed: int = 0,
    n: int = 200,
    *,
    weak_per_task: int = 2,
    min_count: int = 1,
    cache_path: str | os.PathLike | None = None,
    tool_envs: Sequence[str] = (),
) -> Vocabulary:
    """The RISED vocabulary of the embedded domain, by the warm-up (RISED A.1).

    Over the first ``n`` train tasks of ``ConstraintDomain(domain_seed)``: weak side =
    ``weak_per_task`` weak-policy stand-in rollouts per task (module constants), strong side =
    the tasks' reference answers, each tagged by a discovery-mode :class:`ProgrammaticTagger`
    with the task verifier's reward (the environment's reward, as a rollout would have it).
    With ``cache_path``, a file built with the same settings is loaded, else the result is
    written there. Reproduce: ``embedded_vocabulary(0, 200, cache_path="rised_vocabulary.json")``.
    ``tool_envs`` (the domain's ``tool_envs``): those environments' warm-up joins
    (``rised_tool_tagger.tool_warmup`` over their first ``n`` training tasks each) with their
    catalogue.
    """
    from rubric_rl.envs.constraint_domain import task_bank, verify

    settings = {
        "builder": "rised_tagger.embedded_vocabulary",
        "domain_seed": int(domain_seed),
        "n": int(n),
        "weak_per_task": int(weak_per_task),
        "min_count": int(min_count),
    }
    if tool_envs:
        settings["tool_envs"] = list(tool_envs)
    if cache_path is not None and os.path.exists(cache_path):
        cached = Vocabulary.load(cache_path)
        if cached.provenance == settings:
            return cached
    tagger = ProgrammaticTagger(discovery=True)
    weak: list[tuple[str, list[str]]] = []
    strong: list[tuple[str, list[str]]] = []
    for i, task in enumerate(task_bank("train", n, seed=domain_seed)):
        env = task.env_name or task.task_type
        rng = np.random.default_rng([int(domain_seed), i])
        for _ in range(weak_per_task):
            text = _weak_response(task, rng, tagger.overlong_words)
            weak.append((env, list(tagger.tag(task, text, float(verify(task, text))).counts)))
        ref = task.reference_answer or ""
        strong.append((env, list(tagger.tag(task, ref, float(verify(task, ref))).counts)))
    catalogue = constraint_catalogue()
    if tool_envs:
        from rubric_rl.methods.rised.rised_tool_tagger import tool_catalogue, tool_warmup

        tool_weak, tool_strong = tool_warmup(tool_envs, domain_seed, n, weak_per_task)
        weak, strong = weak + tool_weak, strong + tool_strong
        catalogue = {**catalogue, **tool_catalogue(tool_envs)}
    vocab = build_vocabulary(
        weak,
        strong,
        catalogue,
        min_count,
        aliases=constraint_aliases(),
        provenance=settings,
    )
    if cache_path is not None:
        vocab.save(cache_path)
    return vocab
