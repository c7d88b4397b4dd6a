"""Rubric rewards, registered by name: one response's verdicts -> a scalar reward.

Every reward has a scalar form (one response: criteria + verdicts -> ``RewardResult``) and a
vectorised form over packed verdicts (``ScoreMatrices`` [G, C, J] -> ``BatchRewards`` [G, J]);
tests check the two agree. Shared rules (DESIGN.md §5):

* A judge failure (``met=None``) is excluded from numerator AND denominator and counted.
* A reward with nothing to average (e.g. every verdict failed) is undefined: ``None`` in the
  scalar form, NaN in the vectorised one — never 0. The caller decides what to do with it.
* "met" on a pitfall (λ < 0) means the bad behaviour is present. Rewards that count *satisfied*
  criteria ("mean", "arise_rl_solver") treat a pitfall as satisfied when it is NOT met;
  "arise_rl_solver" with ``weighted=True`` counts each criterion by |λ|.

Registered names: "weighted", "healthbench", "healthbench_clipped", "arise_rl_solver",
"arise_rl_solver_weighted" (the same with ``weighted=True``: ARISE-RL's trained solver reward,
as ``loss.reward`` for a baseline on designed tasks), "mean".
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.rubrics.scores import ScoreMatrices, VerdictLike, verdict_met
from rubric_rl.rubrics.types import Criterion, Rubric
from rubric_rl.util.registry import Registry

POINTS_SCALE = 100.0  # HarnessRL §2.1: Λ = 100
ARISE_ALPHA = 0.8  # ARISE-RL eq. 8


@dataclasses.dataclass(frozen=True)
class RewardResult:
    """One response's reward.

    ``contributions`` pairs each criterion id with its additive share of ``value`` (None for a
    failed verdict). For "arise_rl_solver" they sum to ``α·s``; the all-met bonus is not
    attributed to any criterion.
    """

    value: float | None
    num_valid: int
    num_failed: int
    contributions: tuple[tuple[str, float | None], ...] = ()

    @property
    def defined(self) -> bool:
        return self.value is not None


@dataclasses.dataclass(frozen=True, eq=False)
class BatchRewards:
    """Vectorised rewards: ``values`` [G, J] (NaN = undefined), ``num_valid``, ``num_failed``."""

    values: np.ndarray
    num_valid: np.ndarray
    num_failed: np.ndarray

    @property
    def defined(self) -> np.ndarray:
        return ~np.isnan(self.values)

    @property
    def num_undefined(self) -> int:
        return int(np.isnan(self.values).sum())


ScalarFn = Callable[..., RewardResult]
BatchFn = Callable[..., BatchRewards]


@dataclasses.dataclass(frozen=True)
class RubricReward:
    """A named reward: ``scalar(criteria, verdicts, **opts)`` and ``batched(scores, **opts)``."""

    name: str
    scalar: ScalarFn
    batched: BatchFn

    def __call__(
        self,
        criteria: Sequence[Criterion] | Rubric,
        verdicts: Mapping[str, VerdictLike],
        **options: Any,
    ) -> RewardResult:
        return self.scalar(criteria, verdicts, **options)


REWARDS: Registry[RubricReward] = Registry("reward")


def _register(name: str, batched: BatchFn) -> Callable[[ScalarFn], ScalarFn]:
    def decorator(scalar: ScalarFn) -> ScalarFn:
        REWARDS.register(name)(RubricReward(name, scalar, batched))
        return scalar

    return decorator


def rubric_reward(
    name: str,
    criteria: Sequence[Criterion] | Rubric,
    verdicts: Mapping[str, VerdictLike],
    **options: Any,
) -> RewardResult:
    """The reward ``name`` of one response (see module docstring)."""
    return REWARDS.get(name).scalar(criteria, verdicts, **options)


def batch_rewards(name: str, scores: ScoreMatrices, **options: Any) -> BatchRewards:
    """The reward ``name`` of every response in a packed batch: [G, J], NaN where undefined."""
    return REWARDS.get(name).batched(scores, **options)


def to_points(reward: float | None, scale: float = POINTS_SCALE) -> float | None:
    """HarnessRL §2.1 points scale: Λ·r (Λ = 100). None stays None."""
    return None if reward is None else scale * reward


# --- scalar helpers ---------------------------------------------------------------------------


def _collect(
    criteria: Sequence[Criterion] | Rubric, verdicts: Mapping[str, VerdictLike]
) -> tuple[list[tuple[Criterion, bool | None]], int]:
    """Pairs each criterion with its ``met``; a missing verdict is an error (as in packing)."""
    crits = tuple(criteria)
    ids = {c.id for c in crits}
    unknown = sorted(set(verdicts) - ids)
    if unknown:
        raise ValueError(f"verdicts for criteria not in the rubric: {unknown}")
    pairs = []
    for c in crits:
        if c.id not in verdicts:
            raise ValueError(f"no verdict for criterion {c.id!r} (use met=None for a failure)")
        pairs.append((c, verdict_met(verdicts[c.id], f"criterion {c.id!r}")))
    num_failed = sum(m is None for _, m in pairs)
    return pairs, num_failed


def _satisfied(c: Criterion, met: bool) -> float:
    # A pitfall is satisfied when its bad behaviour is absent.
    return float(met) if c.weight > 0 else float(not met)


# --- "weighted" (HarnessRL) and "healthbench" -------------------------------------------------


def _weighted_scalar(criteria, verdicts, *, clip: bool = False) -> RewardResult:
    pairs, num_failed = _collect(criteria, verdicts)
    valid = [(c, m) for c, m in pairs if m is not None]
    denom = sum(max(c.weight, 0.0) for c, _ in valid)
    if denom <= 0.0:
        contribs = tuple((c.id, None) for c, _ in pairs)
        return RewardResult(None, len(valid), num_failed, contribs)
    contribs = tuple(
        (c.id, None if m is None else (c.weight / denom if m else 0.0)) for c, m in pairs
    )
    # Divide once (not Σ of shares) so an all-met response is exactly 1.0.
    value = sum(c.weight for c, m in valid if m) / denom
    if clip:
        value = min(max(value, 0.0), 1.0)
    return RewardResult(value, len(valid), num_failed, contribs)


def _weighted_batched(scores: ScoreMatrices, *, clip: bool = False) -> BatchRewards:
    w = scores.weights[:, :, None].astype(np.float64)
    met = np.where(scores.valid, scores.met, 0.0)
    num = (w * met).sum(axis=1)
    den = (np.maximum(w, 0.0) * scores.valid).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        values = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    if clip:
        values = np.clip(values, 0.0, 1.0)  # NaN stays NaN
    return BatchRewards(values, scores.num_valid, scores.num_failed)


@_register("weighted", _weighted_batched)
def weighted_reward(
    criteria: Sequence[Criterion] | Rubric, verdicts: Mapping[str, VerdictLike]
) -> RewardResult:
    """HarnessRL §2.1: r = Σ_m λ_m s_m / Σ_m max(λ_m, 0), over valid verdicts only.

    Not clipped: pitfalls can drive r below 0 (r ∈ [Σλ⁻/Σλ⁺, 1]), which keeps the penalty
    visible to the advantage. A response whose valid criteria carry no positive weight (all
    positive criteria failed, or a pitfall-only rubric) has an undefined reward: None.
    Use ``to_points`` for the Λ = 100 points scale.
    """
    return _weighted_scalar(criteria, verdicts)


@_register("healthbench", _weighted_batched)
def healthbench_reward(
    criteria: Sequence[Criterion] | Rubric, verdicts: Mapping[str, VerdictLike]
) -> RewardResult:
    """HealthBench per-example score: Σ met points / Σ positive points, NOT clipped.

    HealthBench clips only after averaging over examples; use ``healthbench_aggregate`` for the
    benchmark number. Per response this equals "weighted"; the name exists so configs can say
    which convention they follow. For a per-response value in [0, 1] use "healthbench_clipped".
    """
    return _weighted_scalar(criteria, verdicts)


def _weighted_clipped_batched(scores: ScoreMatrices) -> BatchRewards:
    return _weighted_batched(scores, clip=True)


@_register("healthbench_clipped", _weighted_clipped_batched)
def healthbench_clipped_reward(
    criteria: Sequence[Criterion] | Rubric, verdicts: Mapping[str, VerdictLike]
) -> RewardResult:
    """The HealthBench ratio clipped to [0, 1] per response (contributions stay unclipped)."""
    return _weighted_scalar(criteria, verdicts, clip=True)


def healthbench_aggregate(values: Iterable[float | None]) -> tuple[float | None, int]:
    """HealthBench overall score: mean of per-example (unclipped) scores, then clipped to [0, 1].

    Undefined per-example scores (None / NaN) are left out of the mean and counted. Returns
    ``(score, num_undefined)``; the score is None when nothing is defined.
    """
    vals = [np.nan if v is None else float(v) for v in values]
    arr = np.asarray(vals, dtype=np.float64)
    defined = arr[~np.isnan(arr)]
    num_undefined = int(arr.size - defined.size)
    if defined.size == 0:
        return None, num_undefined
    return float(np.clip(defined.mean(), 0.0, 1.0)), num_undefined


# --- "mean" and "arise_rl_solver" --------------------------------------------------------------


def _satisfied_matrix(scores: ScoreMatrices) -> np.ndarray:
    positive = (scores.weights > 0)[:, :, None]
    met = scores.met.astype(np.float64)
    return np.where(positive, met, 1.0 - met) * scores.valid


def _mean_scalar(criteria, verdicts, *, alpha: float = 1.0, weighted: bool = False) -> RewardResult:
    pairs, num_failed = _collect(criteria, verdicts)
    n = len(pairs) - num_failed
    # weighted: each criterion counts |λ| (a pitfall's weight is what breaking it costs).
    size = {c.id: abs(c.weight) if weighted else 1.0 for c, _ in pairs}
    den = sum(size[c.id] for c, m in pairs if m is not None)
    if n == 0 or den <= 0.0:
        return RewardResult(None, n, num_failed, tuple((c.id, None) for c, _ in pairs))
    contribs = tuple(
        (c.id, None if m is None else alpha * size[c.id] * _satisfied(c, m) / den) for c, m in pairs
    )
    s = sum(size[c.id] * _satisfied(c, m) for c, m in pairs if m is not None) / den
    return RewardResult(s, n, num_failed, contribs)


def _mean_batched(scores: ScoreMatrices, *, weighted: bool = False) -> BatchRewards:
    n = scores.num_valid
    if not weighted:
        total = _satisfied_matrix(scores).sum(axis=1)
        values = np.where(n > 0, total / np.maximum(n, 1), np.nan)
        return BatchRewards(values, n, scores.num_failed)
    size = np.abs(scores.weights.astype(np.float64))[:, :, None]
    total = (size * _satisfied_matrix(scores)).sum(axis=1)
    den = (size * scores.valid).sum(axis=1)
    values = np.where(den > 0, total / np.where(den > 0, den, 1.0), np.nan)
    return BatchRewards(values, n, scores.num_failed)


@_register("mean", _mean_batched)
def mean_reward(
    criteria: Sequence[Criterion] | Rubric, verdicts: Mapping[str, VerdictLike]
) -> RewardResult:
    """Fraction of valid criteria satisfied (a pitfall: when not met); weights ignored."""
    return _mean_scalar(criteria, verdicts)


def _arise_batched(
    scores: ScoreMatrices, *, alpha: float = ARISE_ALPHA, weighted: bool = False
) -> BatchRewards:
    mean = _mean_batched(scores, weighted=weighted)
    s = mean.values
    # 1[s = 1], exact: no valid criterion left unsatisfied (padding slots are never valid).
    unsatisfied = ((1.0 - _satisfied_matrix(scores)) * scores.valid).sum(axis=1)
    all_met = (unsatisfied == 0) & (mean.num_valid > 0)
    values = np.where(np.isnan(s), np.nan, alpha * s + (1.0 - alpha) * all_met)
    return BatchRewards(values, mean.num_valid, mean.num_failed)


@_register("arise_rl_solver", _arise_batched)
def arise_rl_solver_reward(
    criteria: Sequence[Criterion] | Rubric,
    verdicts: Mapping[str, VerdictLike],
    *,
    alpha: float = ARISE_ALPHA,
    weighted: bool = False,
) -> RewardResult:
    """ARISE-RL eq. 6–8: s = mean_j z_j over valid verdicts; r = α s + (1 − α)·1[s = 1], α = 0.8.

    z_j = 1 when criterion j is satisfied (a pitfall: when not met). All verdicts failed -> None.
    ``weighted=True`` weighs each z_j by |λ_j|: s = Σ|λ|z / Σ|λ|, still in [0, 1] with
    s = 1 iff every valid criterion is satisfied
    (``methods/arise_rl/arise_rl_rewards.solver_reward``).
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"arise_rl_solver: alpha must be in [0, 1], got {alpha}")
    base = _mean_scalar(criteria, verdicts, alpha=alpha, weighted=weighted)
    if base.value is None:
        return base
    all_met = all(_satisfied(c, m) for c, m in _collect(criteria, verdicts)[0] if m is not None)
    bonus = (1.0 - alpha) * float(all_met)
    return dataclasses.replace(base, value=alpha * base.value + bonus)


@_register("arise_rl_solver_weighted", functools.partial(_arise_batched, weighted=True))
def arise_rl_solver_weighted_reward(
    criteria: Sequence[Criterion] | Rubric,
    verdicts: Mapping[str, VerdictLike],
    *,
    alpha: float = ARISE_ALPHA,
) -> RewardResult:
    """ "arise_rl_solver" with ``weighted=True``: s = Σ|λ|z / Σ|λ|."""
    return arise_rl_solver_reward(criteria, verdicts, alpha=alpha, weighted=True)
