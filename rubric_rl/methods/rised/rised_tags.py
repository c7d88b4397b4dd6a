"""RISED rollout tags and rubric profiles (RISED §2.2-2.3, C.2; DESIGN.md §6).

A tagger labels each rollout with vocabulary ids and occurrence counts (:class:`Tags`); a rollout's
profile is its count vector over the vocabulary, a group's profile the sum over its rollouts
(profiles are compared by cosine). A tagging that failed is recorded as failed, with its error,
never as an empty profile: :func:`profile` gives zeros for it and :func:`group_profile` leaves it
out, so callers check ``Tags.failed`` to tell "no behaviour seen" from "not tagged".
"""

from __future__ import annotations

import abc
import collections
import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from rubric_rl.rubrics.vocabulary import Vocabulary

__all__ = [
    "PROFILE_COUNTS",
    "DetectingTagger",
    "RolloutTagger",
    "Tags",
    "batch_rewards",
    "condition_on_outcome",
    "group_profile",
    "profile",
    "reliability",
    "top_any",
    "top_negative",
    "top_positive",
]


def _checked_counts(counts: Mapping[str, int], what: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, count in dict(counts).items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"Tags.{what}: names must be non-empty strings, got {name!r}")
        if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 1:
            raise ValueError(f"Tags.{what}[{name!r}] must be an integer >= 1, got {count!r}")
        out[name] = int(count)
    return out


@dataclasses.dataclass(frozen=True)
class Tags:
    """One rollout's tags: vocabulary id -> count (>= 1), discovered (unknown, normalised)
    names -> count, or a failure (``failed=True`` with its ``error``, and no tags).

    ``withheld``: vocabulary ids an outcome-conditioned tagger detected but did not attribute
    (a failure's positive behaviours, a success's negative ones). They are in no profile, no
    selection and no anti-pattern; the teacher's ranking reads them to tell how often a behaviour
    also appears in the group's failures (its contrast). A tagger that does not detect them (the
    LLM tagger: its prompt asks for conditioned tags only) leaves it empty."""

    counts: Mapping[str, int] = dataclasses.field(hash=False)
    discovered: Mapping[str, int] = dataclasses.field(default_factory=dict, hash=False)
    failed: bool = False
    error: str | None = None
    withheld: Mapping[str, int] = dataclasses.field(default_factory=dict, hash=False)

    def __post_init__(self):
        object.__setattr__(self, "counts", _checked_counts(self.counts, "counts"))
        object.__setattr__(self, "discovered", _checked_counts(self.discovered, "discovered"))
        object.__setattr__(self, "withheld", _checked_counts(self.withheld, "withheld"))
        if set(self.counts) & set(self.withheld):
            raise ValueError("Tags: an id is either attributed (counts) or withheld, not both")
        if self.failed and (self.counts or self.discovered or self.withheld or not self.error):
            raise ValueError("Tags: a failed tagging has an error and no tags")
        if not self.failed and self.error is not None:
            raise ValueError(f"Tags: error {self.error!r} given but failed=False")

    @classmethod
    def failure(cls, error: str) -> Tags:
        return cls({}, failed=True, error=str(error) or "unknown error")

    @property
    def ids(self) -> frozenset[str]:
        return frozenset(self.counts)


def batch_rewards(
    tasks: Sequence[object], responses: Sequence[str], rewards: Sequence[float | None] | None
) -> list[float | None]:
    """A tagger batch's rewards (None each when not given), after checking the lengths."""
    out = [None] * len(tasks) if rewards is None else list(rewards)
    if not len(tasks) == len(responses) == len(out):
        raise ValueError(
            f"tag_batch: {len(tasks)} tasks, {len(responses)} responses, {len(out)} rewards"
        )
    return out


class RolloutTagger(abc.ABC):
    """What RISED's controller calls: ``tag_batch(tasks, responses, rewards, step=None)`` ->
    one :class:`Tags` per rollout, in order (rewards: None = not given)."""

    def tag_batch(
        self,
        tasks: Sequence[object],
        responses: Sequence[str],
        rewards: Sequence[float | None] | None = None,
        *,
        step: int | None = None,
    ) -> list[Tags]:
        rewards = batch_rewards(tasks, responses, rewards)
        return self._tag_rollouts(list(tasks), list(responses), rewards, step)

    def retag_batch(
        self,
        tasks: Sequence[object],
        responses: Sequence[str],
        rewards: Sequence[float | None] | None = None,
        *,
        seed: int = 0,
    ) -> list[Tags]:
        """An independent second tagging of the same rollouts for the reliability probe (RISED
        C.2: ``reliability`` against the first): the same prompts under another ``seed``,
        leaving the tagger's own state (counts, retry list) as it was. A deterministic tagger
        returns what it returned the first time."""
        rewards = batch_rewards(tasks, responses, rewards)
        return self._retag_rollouts(list(tasks), list(responses), rewards, int(seed))

    def _retag_rollouts(self, tasks, responses, rewards, seed: int) -> list[Tags]:
        return self._tag_rollouts(tasks, responses, rewards, None)

    @abc.abstractmethod
    def _tag_rollouts(
        self,
        tasks: list,
        responses: list[str],
        rewards: list[float | None],
        step: int | None,
    ) -> list[Tags]: ...


class DetectingTagger(RolloutTagger):
    """A tagger by code: ``detect(task, response, reward)`` gives every name it finds with its
    count (ValueError: a rollout it cannot read, recorded as a failed tagging); the names go
    through ``vocab`` (unknown ones kept as discovered) unless ``discovery`` (the warm-up: every
    name kept). Deterministic and stateless, so a retagging returns the first tagging.

    ``outcome_conditioned`` (RISED §2.2, A.4: successes are traced back to the behaviours that
    made them succeed, failures searched for their errors): with a reward, a rollout at or above
    ``solved_threshold`` keeps its positive rubrics only and one below it its negative ones
    only; the others go to ``Tags.withheld``. Without a reward nothing can be conditioned and
    every rubric is kept (ours). False: every detected rubric whatever the outcome (the tagging
    before outcome conditioning, kept for earlier archives)."""

    vocab: Vocabulary | None
    discovery: bool
    solved_threshold: float | None = None
    outcome_conditioned: bool = False

    @abc.abstractmethod
    def detect(self, task: object, response: str, reward: float | None) -> dict[str, int]: ...

    def tag(self, task: object, response: str, reward: float | None = None) -> Tags:
        try:
            names = self.detect(task, response, reward)
        except ValueError as e:
            return Tags.failure(f"task {getattr(task, 'id', '?')!r}: {e}")
        if self.discovery:
            return Tags(names)
        counts: collections.Counter[str] = collections.Counter()
        discovered: collections.Counter[str] = collections.Counter()
        for name, count in names.items():
            rid = self.vocab.lookup(name)
            (counts if rid is not None else discovered)[rid or name] += count
        tags = Tags(dict(counts), dict(discovered))
        if not self.outcome_conditioned:
            return tags
        return condition_on_outcome(tags, reward, self.solved_threshold, self.vocab)

    def _tag_rollouts(self, tasks, responses, rewards, step) -> list[Tags]:
        del step  # no state that changes with the step
        return [self.tag(t, r, w) for t, r, w in zip(tasks, responses, rewards, strict=True)]


# How a rollout's tag counts enter its profile. "presence" (1 per tagged rubric) is ours: the
# judge's counts are on different scales per rubric (filler words counted one by one, a met check
# once), so raw counts let a wordy negative outweigh every positive in a profile and in the
# anti-pattern trigger. "log": 1 + ln(count). "raw": the counts as tagged (the seed's count
# vectors; the profiles before presence counts).
PROFILE_COUNTS = ("presence", "log", "raw")


def _scaled(count: int, counts: str) -> float:
    if counts == "raw":
        return float(count)
    if counts == "presence":
        return 1.0
    if counts == "log":
        return 1.0 + float(np.log(count))
    raise ValueError(f"profile: counts must be one of {PROFILE_COUNTS}, got {counts!r}")


def condition_on_outcome(
    tags: Tags, reward: float | None, threshold: float | None, vocab: Vocabulary
) -> Tags:
    """``tags`` attributed by outcome (RISED §2.2, A.4): a rollout whose reward reaches
    ``threshold`` keeps its positive rubrics, one below it its negative ones; the rest move to
    ``withheld``. Unchanged without a reward or a threshold (nothing to condition on), or for a
    failed tagging."""
    if tags.failed or reward is None or threshold is None:
        return tags
    keep = "positive" if float(reward) >= threshold else "negative"
    both = {**tags.counts, **tags.withheld}
    kept = {r: n for r, n in both.items() if vocab.entry(r).polarity == keep}
    withheld = {r: n for r, n in both.items() if r not in kept}
    return Tags(kept, dict(tags.discovered), withheld=withheld)


def profile(tags: Tags, vocab: Vocabulary, counts: str = "raw") -> np.ndarray:
    """The rollout's count vector, float64 [V] (zeros for a failed tagging: check ``failed``),
    each count scaled as ``counts`` says (``PROFILE_COUNTS``)."""
    out = np.zeros(len(vocab), dtype=np.float64)
    if tags.failed:
        return out
    for rid, count in tags.counts.items():
        if rid not in vocab:
            raise ValueError(f"profile: tag {rid!r} is not a rubric id of the vocabulary")
        out[vocab.index(rid)] += _scaled(count, counts)
    return out


def group_profile(tags: Sequence[Tags], vocab: Vocabulary, counts: str = "raw") -> np.ndarray:
    """Sum of the profiles of the group's rollouts whose tagging did not fail, float64 [V]."""
    out = np.zeros(len(vocab), dtype=np.float64)
    for t in tags:
        if not t.failed:
            out += profile(t, vocab, counts)
    return out


def _count_vector(tags_or_counts: Tags | Mapping[str, int] | np.ndarray, vocab: Vocabulary):
    if isinstance(tags_or_counts, Tags):
        return profile(tags_or_counts, vocab)
    if isinstance(tags_or_counts, Mapping):
        vec = np.zeros(len(vocab), dtype=np.float64)
        for rid, count in tags_or_counts.items():
            vec[vocab.index(rid)] += float(count)
        return vec
    vec = np.asarray(tags_or_counts, dtype=np.float64)
    if vec.shape != (len(vocab),):
        raise ValueError(f"expected a profile of shape ({len(vocab)},), got {vec.shape}")
    return vec


def _top(
    tags_or_counts: Tags | Mapping[str, int] | np.ndarray, vocab: Vocabulary, k: int, mask
) -> list[str]:
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    vec = _count_vector(tags_or_counts, vocab)
    idx = list(np.flatnonzero(mask & (vec > 0)))
    # Count descending, ties by vocabulary index (a stable order for the teacher context).
    idx.sort(key=lambda i: (-vec[i], i))
    return [vocab.ids[i] for i in idx[:k]]


def top_positive(
    tags_or_counts: Tags | Mapping[str, int] | np.ndarray, vocab: Vocabulary, k: int = 3
) -> list[str]:
    """The ``k`` most frequent positive rubric ids (count desc, ties by vocabulary index) of a
    rollout's tags, a counts mapping or a profile vector (e.g. a group profile). RISED §3: the
    teacher context is a rollout's top 3 positive rubrics with its group's top 3."""
    return _top(tags_or_counts, vocab, k, vocab.positive_mask)


def top_any(
    tags_or_counts: Tags | Mapping[str, int] | np.ndarray, vocab: Vocabulary, k: int = 3
) -> list[str]:
    """As :func:`top_positive`, over rubrics of both signs (All-Rubric SD's teacher context)."""
    return _top(tags_or_counts, vocab, k, np.ones(len(vocab.ids), bool))


def top_negative(
    tags_or_counts: Tags | Mapping[str, int] | np.ndarray, vocab: Vocabulary, k: int = 3
) -> list[str]:
    """As :func:`top_positive`, for negative rubrics (the anti-patterns block)."""
    return _top(tags_or_counts, vocab, k, vocab.negative_mask)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(a @ b / (na * nb))


def reliability(a: Sequence[Tags], b: Sequence[Tags], vocab: Vocabulary) -> dict[str, float]:
    """Agreement of two taggings of the same rollouts (RISED C.2), over pairs where neither
    failed: ``identical`` (share with the same id set), ``jaccard_mean`` / ``jaccard_median``
    (of the id sets; both empty = 1), ``cosine_mean`` (of the profiles; both zero = 1, one
    zero = 0) and ``compared`` (the number of pairs). NaN figures when nothing is compared."""
    if len(a) != len(b):
        raise ValueError(f"reliability: {len(a)} taggings against {len(b)}")
    jaccard, cosine, same = [], [], 0
    for x, y in zip(a, b, strict=True):
        if x.failed or y.failed:
            continue
        sx, sy = x.ids, y.ids
        union = sx | sy
        jaccard.append(len(sx & sy) / len(union) if union else 1.0)
        cosine.append(_cosine(profile(x, vocab), profile(y, vocab)))
        same += sx == sy
    n = len(jaccard)
    nan = float("nan")
    return {
        "identical": same / n if n else nan,
        "jaccard_mean": float(np.mean(jaccard)) if n else nan,
        "jaccard_median": float(np.median(jaccard)) if n else nan,
        "cosine_mean": float(np.mean(cosine)) if n else nan,
        "compared": float(n),
    }
