"""RISED's rollout taggers (RISED §2.2, A.1, A.4; DESIGN.md §6) and the warm-up vocabulary.

- :class:`ProgrammaticTagger`: tags by code with a domain's ``Behaviours``
  (``rubric_rl/envs/base.py``: ``Domain.behaviours``; the embedded constraint domain's,
  ``envs/constraint_behaviours.py``, with tool environments mixed in
  ``envs/tool_behaviours.py``). The domain's detector names what the response shows (it sees
  what a judge would see, never the task's hidden fields); the tagger adds the reward-informed
  names (RISED E.4): ``task_solved`` (positive) when reward >= ``solved_threshold``,
  ``task_failed`` (negative) below it, nothing without a reward. ``discovery=True`` keeps every
  name it detects (the warm-up); otherwise names go through the vocabulary
  (:meth:`Vocabulary.lookup`), and unknown ones are kept as discovered.
- :class:`~rubric_rl.methods.rised.rised_llm_tagger.LLMTagger` (re-exported): one judge call per
  rollout for real environments.

:func:`warmup_vocabulary` runs the warm-up on a domain's ``Behaviours`` and caches the result (a
file path given by the caller); nothing generated is committed. OURS (not in the seed):
``solved_threshold=0.5``, the outcome names' descriptions and the warm-up's size (the domain's
catalogue and weak-policy stand-in are the domain's own "ours").
"""

from __future__ import annotations

import os

from rubric_rl.envs.base import Behaviours
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
    "OUTCOMES",
    "LLMTagger",
    "ProgrammaticTagger",
    "RolloutTagger",
    "Tags",
    "outcome_catalogue",
    "tagger_catalogue",
    "warmup_vocabulary",
    "group_profile",
    "parse_tags",
    "profile",
    "reliability",
    "top_negative",
    "top_positive",
]

# The reward-informed names the tagger adds to a domain's: id -> (skill, polarity, description).
OUTCOMES: dict[str, tuple[str, str, str]] = {
    "task_solved": (
        "outcome",
        "positive",
        "Meet every requirement of the task, stated or implied.",
    ),
    "task_failed": ("outcome", "negative", "Missing a requirement of the task."),
}


def outcome_catalogue() -> dict[str, RubricEntry]:
    """The reward-informed names' rubrics (``OUTCOMES``), by id."""
    return {rid: RubricEntry(rid, *entry) for rid, entry in OUTCOMES.items()}


def tagger_catalogue(behaviours: Behaviours) -> dict[str, RubricEntry]:
    """Every rubric a :class:`ProgrammaticTagger` over ``behaviours`` can emit, by id: the
    domain's catalogue and the reward-informed names (the embedded domain's: 36 + 2 = 38
    rubrics over 10 skills)."""
    return {**behaviours.catalogue(), **outcome_catalogue()}


class ProgrammaticTagger(DetectingTagger):
    """Tags rollouts by code with a domain's ``behaviours`` (module docstring); deterministic
    and free.

    ``vocab``: the vocabulary names are mapped through (required unless ``discovery``);
    ``solved_threshold``: the reward at or above which a rollout is ``task_solved`` (None: the
    reward is not used); ``outcome_conditioned``: positives from successes only, negatives from
    failures only (``DetectingTagger``; False: the unconditioned tagging). The warm-up
    (``discovery``) keeps every name: the vocabulary lists what can be tagged at all.
    """

    def __init__(
        self,
        behaviours: Behaviours,
        vocab: Vocabulary | None = None,
        *,
        discovery: bool = False,
        solved_threshold: float | None = 0.5,
        outcome_conditioned: bool = True,
    ):
        if not isinstance(behaviours, Behaviours):
            raise TypeError(
                f"ProgrammaticTagger: behaviours must be a domain's Behaviours, got "
                f"{type(behaviours).__name__}"
            )
        if vocab is None and not discovery:
            raise ValueError("ProgrammaticTagger: a vocabulary is needed unless discovery=True")
        self.behaviours = behaviours
        self.vocab = vocab
        self.discovery = bool(discovery)
        self.solved_threshold = None if solved_threshold is None else float(solved_threshold)
        self.outcome_conditioned = bool(outcome_conditioned)

    def detect(self, task: Task, response: str, reward: float | None) -> dict[str, int]:
        """Every name detected, with its count: the domain's, then the outcome name
        (ValueError for a rollout the domain cannot read)."""
        out = dict(self.behaviours.detect(task, response))
        if reward is not None and self.solved_threshold is not None:
            solved = float(reward) >= self.solved_threshold
            out["task_solved" if solved else "task_failed"] = 1
        return out


def warmup_vocabulary(
    behaviours: Behaviours,
    domain_seed: int = 0,
    n: int = 200,
    *,
    weak_per_task: int = 2,
    min_count: int = 1,
    cache_path: str | os.PathLike | None = None,
) -> Vocabulary:
    """The RISED vocabulary of a domain, by the warm-up (RISED A.1).

    The domain's warm-up rollouts (``behaviours.warmup(domain_seed, n, weak_per_task)``: weak-
    policy stand-ins and reference solutions over its first ``n`` training tasks, each with the
    task verifier's reward, the environment's reward as a rollout would have it), each tagged
    by a discovery-mode :class:`ProgrammaticTagger`; kept: the catalogue's rubrics
    (:func:`tagger_catalogue`) seen at least ``min_count`` times. With ``cache_path``, a file
    built with the same settings is loaded, else the result is written there. Reproduce:
    ``warmup_vocabulary(constraint_behaviours(), 0, 200, cache_path="rised_vocabulary.json")``.
    """
    if behaviours.warmup is None:
        raise ValueError(
            f"rised: the {behaviours.name!r} behaviours have no warm-up; give a vocabulary file"
        )
    settings = {
        "builder": "rised_tagger.warmup_vocabulary",
        "behaviours": behaviours.name,
        "domain_seed": int(domain_seed),
        "n": int(n),
        "weak_per_task": int(weak_per_task),
        "min_count": int(min_count),
    }
    if cache_path is not None and os.path.exists(cache_path):
        cached = Vocabulary.load(cache_path)
        if cached.provenance == settings:
            return cached
    tagger = ProgrammaticTagger(behaviours, discovery=True)
    weak_rollouts, strong_rollouts = behaviours.warmup(int(domain_seed), int(n), int(weak_per_task))
    weak = [
        (env, list(tagger.tag(t, text, reward).counts)) for env, t, text, reward in weak_rollouts
    ]
    strong = [
        (env, list(tagger.tag(t, text, reward).counts)) for env, t, text, reward in strong_rollouts
    ]
    vocab = build_vocabulary(
        weak,
        strong,
        tagger_catalogue(behaviours),
        min_count,
        aliases=behaviours.aliases,
        provenance=settings,
    )
    if cache_path is not None:
        vocab.save(cache_path)
    return vocab
