"""HarnessRL's pair failure classes: where a rubric reward fails to rank a group like the oracle.

Analysis only (numpy; nothing here feeds the gradient). Each rollout has a trained reward on the
[0, 1] scale and a hidden oracle quality where higher is better (our embedded domain's oracle
score in [0, 1], or an LLM oracle's within-group win count). HarnessRL §3 ("Oracle judge") classes
every one of a group's J·(J−1)/2 rollout pairs:

* reward-tied (``|r_a − r_b| <= reward_tie_tol``): **blind** when the shared reward (their mean) is
  below ``blind_below_points`` = 50 points (Λ·r, Λ = ``POINTS_SCALE``), **saturated** otherwise;
* reward-separated: **agree** when the reward order matches the oracle order, **spurious**
  otherwise. "Otherwise" includes pairs the oracle ties (``|o_a − o_b| <= oracle_tie_tol``): the
  reward separates what the oracle cannot, so they are spurious, as the paper says, and are also
  counted apart (``oracle_tied``) so a reader can tell them from true order inversions.

A pair with a non-finite reward or oracle value (NaN: the judge or the oracle failed) is
``excluded``, never classed. Groups may have different sizes; a group of one has no pairs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from rubric_rl.rubrics.rewards import POINTS_SCALE

REWARD_TIE_TOL = 1e-6  # on the [0, 1] reward scale
ORACLE_TIE_TOL = 1e-6
BLIND_BELOW_POINTS = 50.0  # HarnessRL §3: blind when the shared reward is below 50 points
CLASSES = ("blind", "saturated", "spurious", "agree")


@dataclasses.dataclass(frozen=True)
class PairCounts:
    """Pair counts of one group or, summed with ``+``, of many.

    ``blind + saturated + spurious + agree == classified``; ``classified + excluded`` is every pair.
    ``oracle_tied`` counts reward-separated pairs the oracle ties (all of them inside ``spurious``);
    ``oracle_tied_reward_tied`` counts pairs both sides tie (inside ``blind`` / ``saturated``).
    """

    blind: int = 0
    saturated: int = 0
    spurious: int = 0
    agree: int = 0
    oracle_tied: int = 0
    oracle_tied_reward_tied: int = 0
    excluded: int = 0

    def __add__(self, other: PairCounts) -> PairCounts:
        if not isinstance(other, PairCounts):
            return NotImplemented
        return PairCounts(
            **{
                f.name: getattr(self, f.name) + getattr(other, f.name)
                for f in dataclasses.fields(self)
            }
        )

    @property
    def classified(self) -> int:
        return self.blind + self.saturated + self.spurious + self.agree

    @property
    def reward_separated(self) -> int:
        return self.spurious + self.agree


@dataclasses.dataclass(frozen=True)
class _PairMasks:
    """Boolean masks [G, P] over the upper-triangle pairs of G groups of one size J."""

    valid: np.ndarray
    reward_tied: np.ndarray  # valid pairs only
    oracle_tied: np.ndarray  # valid pairs only
    concordance: np.ndarray  # sign(Δr)·sign(Δo), 0 where either side ties or the pair is invalid
    blind: np.ndarray

    def counts(self) -> PairCounts:
        """Counts summed over all groups."""
        separated = self.valid & ~self.reward_tied
        agree = separated & (self.concordance > 0)
        return PairCounts(
            blind=int(self.blind.sum()),
            saturated=int((self.reward_tied & ~self.blind).sum()),
            spurious=int((separated & ~agree).sum()),
            agree=int(agree.sum()),
            oracle_tied=int((separated & self.oracle_tied).sum()),
            oracle_tied_reward_tied=int((self.reward_tied & self.oracle_tied).sum()),
            excluded=int((~self.valid).sum()),
        )

    def kendall_tau_b(self) -> np.ndarray:
        """[G] Kendall's τ_b per group, NaN where undefined (< 2 valid rollouts or a side all tied).

        τ_b = (C − D) / sqrt((n0 − n1)(n0 − n2)) over the group's valid pairs: n0 pairs, n1 tied in
        reward, n2 tied in oracle. Ties are the same tolerance ties as the pair classes, so
        C = agree and D = spurious − oracle_tied.
        """
        n0 = self.valid.sum(-1)
        n1 = self.reward_tied.sum(-1)
        n2 = self.oracle_tied.sum(-1)
        denom = np.sqrt(((n0 - n1) * (n0 - n2)).astype(np.float64))
        num = self.concordance.sum(-1).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(denom > 0, num / np.where(denom > 0, denom, 1.0), np.nan)


def _pair_masks(
    rewards: np.ndarray,
    oracle: np.ndarray,
    *,
    reward_tie_tol: float,
    oracle_tie_tol: float,
    blind_below_points: float,
) -> _PairMasks:
    """Masks for rewards, oracle [G, J] (float64)."""
    i, j = np.triu_indices(rewards.shape[-1], k=1)
    ra, rb, oa, ob = rewards[:, i], rewards[:, j], oracle[:, i], oracle[:, j]
    valid = np.isfinite(ra) & np.isfinite(rb) & np.isfinite(oa) & np.isfinite(ob)
    dr, do = ra - rb, oa - ob
    with np.errstate(invalid="ignore"):  # NaN comparisons are False; masked by ``valid``
        reward_tied = valid & (np.abs(dr) <= reward_tie_tol)
        oracle_tied = valid & (np.abs(do) <= oracle_tie_tol)
        shared_points = POINTS_SCALE * 0.5 * (ra + rb)
        blind = reward_tied & (shared_points < blind_below_points)
    concordance = np.where(
        valid & ~reward_tied & ~oracle_tied, np.sign(dr) * np.sign(do), 0.0
    ).astype(np.int8)
    return _PairMasks(valid, reward_tied, oracle_tied, concordance, blind)


def _as_group(rewards: np.ndarray, oracle: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    r = np.asarray(rewards, dtype=np.float64)
    o = np.asarray(oracle, dtype=np.float64)
    if r.ndim != 1 or r.shape != o.shape:
        raise ValueError(
            f"{where}: rewards and oracle must be 1-D arrays of one length (the group's "
            f"rollouts); got shapes {r.shape} and {o.shape}"
        )
    return r, o


def pair_classes(
    rewards: np.ndarray,
    oracle: np.ndarray,
    *,
    reward_tie_tol: float = REWARD_TIE_TOL,
    oracle_tie_tol: float = ORACLE_TIE_TOL,
    blind_below_points: float = BLIND_BELOW_POINTS,
) -> PairCounts:
    """Pair classes of one group: ``rewards`` [J] on the [0, 1] scale, ``oracle`` [J] quality."""
    r, o = _as_group(rewards, oracle, "pair_classes")
    return _pair_masks(
        r[None],
        o[None],
        reward_tie_tol=reward_tie_tol,
        oracle_tie_tol=oracle_tie_tol,
        blind_below_points=blind_below_points,
    ).counts()


def kendall_tau_b(
    rewards: np.ndarray,
    oracle: np.ndarray,
    *,
    reward_tie_tol: float = REWARD_TIE_TOL,
    oracle_tie_tol: float = ORACLE_TIE_TOL,
) -> float:
    """Kendall's τ_b between one group's rewards and oracle over its valid (finite) rollouts.

    Values within a tolerance tie (exact ties when both tolerances are 0). NaN when undefined:
    fewer than two valid rollouts, or every valid pair tied on either side.
    """
    r, o = _as_group(rewards, oracle, "kendall_tau_b")
    masks = _pair_masks(
        r[None],
        o[None],
        reward_tie_tol=reward_tie_tol,
        oracle_tie_tol=oracle_tie_tol,
        blind_below_points=BLIND_BELOW_POINTS,
    )
    return float(masks.kendall_tau_b()[0])


def failure_metrics(
    groups: Sequence[tuple[np.ndarray, np.ndarray]],
    *,
    prefix: str = "failure/",
    reward_tie_tol: float = REWARD_TIE_TOL,
    oracle_tie_tol: float = ORACLE_TIE_TOL,
    blind_below_points: float = BLIND_BELOW_POINTS,
) -> dict[str, float]:
    """Pair failure classes over all pairs of all ``groups`` (each a ``(rewards, oracle)`` pair).

    Keys (all prefixed with ``prefix``):

    * ``blind``, ``saturated``, ``spurious``, ``agree``: fractions of classified pairs (sum to 1).
      ``agree`` is what HarnessRL reports as "reward–oracle agreement": the share of ALL
      classified pairs, tied ones included.
    * ``agreement``: agree / (agree + spurious), the agreement conditional on the reward
      separating the pair. Omitted when no pair is reward-separated.
    * ``pairs``: number of classified pairs; ``excluded``: pairs with a NaN reward or oracle value.
    * ``oracle_tied_frac``: reward-separated pairs the oracle ties (all counted as spurious), as a
      fraction of classified pairs; ``spurious_oracle_untied``: spurious minus those, likewise —
      the pairs whose reward order contradicts a strict oracle order.
    * ``kendall_tau``: mean over groups of Kendall's τ_b (ties by the same tolerances), over groups
      where it is defined (≥ 2 valid rollouts, neither side all tied). Omitted if no group is.

    The fractions are omitted (never a fake 0) when no pair is classified; ``pairs`` and
    ``excluded`` are always present.
    """
    tols = dict(
        reward_tie_tol=reward_tie_tol,
        oracle_tie_tol=oracle_tie_tol,
        blind_below_points=blind_below_points,
    )
    by_size: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for g, (rewards, oracle) in enumerate(groups):
        r, o = _as_group(rewards, oracle, f"failure_metrics: group {g}")
        by_size.setdefault(r.shape[0], []).append((r, o))
    counts, taus = PairCounts(), []
    for size, members in by_size.items():
        if size < 2:  # no pairs, τ undefined
            continue
        # Groups of one size are stacked so each size is one vectorised pass: [G, J] -> [G, P].
        masks = _pair_masks(
            np.stack([r for r, _ in members]), np.stack([o for _, o in members]), **tols
        )
        counts += masks.counts()
        taus.append(masks.kendall_tau_b())
    n = counts.classified
    out = {f"{prefix}pairs": float(n), f"{prefix}excluded": float(counts.excluded)}
    if n:
        for name in CLASSES:
            out[prefix + name] = getattr(counts, name) / n
        out[f"{prefix}oracle_tied_frac"] = counts.oracle_tied / n
        out[f"{prefix}spurious_oracle_untied"] = (counts.spurious - counts.oracle_tied) / n
    if counts.reward_separated:
        out[f"{prefix}agreement"] = counts.agree / counts.reward_separated
    tau = np.concatenate(taus) if taus else np.zeros(0)
    tau = tau[~np.isnan(tau)]
    if tau.size:
        out[f"{prefix}kendall_tau"] = float(tau.mean())
    return out
