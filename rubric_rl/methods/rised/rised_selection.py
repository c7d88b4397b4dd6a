"""RISED's prompt-group selection and the reward-variance selectors it is compared with (pure
numpy; DESIGN §6, notes/baselines.md §8.2–8.3).

Each step RISED rolls out 2k candidate groups and trains k of them (seed §2.1). The candidates
are compared through rubric *profiles*: per group, the summed count vector of the rubric tags of
its rollouts over a vocabulary of V rubrics (seed §2.3: count vectors, cosine similarity).

``select_groups`` is the seed's greedy round-robin (§2.4), with the score that baselines.md §8.3
writes down as the implementable reading [INFERRED: the exact score is not in the seed summary]:

    P = Σ_{g ∈ candidates} p_g
    g* = argmax_{g ∈ cand_e \\ S} [ cos(p_g, P) − β · max_{s ∈ S} cos(p_g, p_s) ]

with S every group selected so far, across environments (so a pick in one environment changes
the redundancy scores in the others, as the seed says), the overlap term 0 while S is empty, and
environments visited round-robin while any has quota left. ``overlap="mean"`` replaces the max
by the mean over S (baselines.md: "another candidate"). β = 1 by default (baselines.md suggests
sweeping {0.5, 1, 2}).

Ours (not in the seed): environments are visited in sorted-name order; P sums the groups'
profiles scaled to unit norm (``batch="unit"``; ``"sum"`` the plain sum); an empty (all-zero)
profile has cosine 0 with anything (``cosine``) and is picked only after every tagged candidate
of its environment (``untagged``: ``UNTAGGED``); ties go to the lowest candidate index;
``env_quotas`` splits k equally (or by weights) with largest-remainder rounding, ties by name.

The variance selectors (seed §4.2: two selectors keep 64 of 128 groups by within-group reward
variance; their exact definitions are not in the seed, baselines.md §8.2):

- ``top_variance``: the k groups of largest within-group reward variance [INFERRED], ties at
  random (a seeded generator) or by index; optionally inside per-environment quotas.
- Var-Target (``var_target``, ``VARIANCE_TARGETS``): ours, k groups drawn with probability ∝
  their variance (``variance_proportional``). The seed reports that its selection reaches ≈ 2×
  the pool mean as a *result*; targeting 2× the pool mean (``variance_targeted`` with its default
  target, kept as ``"pool_multiple"``) prefers zero-variance groups whenever most candidates have
  none (27 all-fail groups, 3 at 1/8 and 2 at 2/8: it keeps none of the 5 with a signal). The
  closest to the maximal variance 0.25 (``"max"``) is Top-Var's ranking for rewards in [0, 1].
  Whenever at least half of the candidates have zero variance (62.9 % in the seed), keeping k of
  2k with either keeps every group with non-zero variance and reaches exactly 2× the pool mean.

Within-group variance is the population variance of the group's defined (non-NaN) rewards; a
group with fewer than two defined rewards has variance 0 (``sampling.group_variance``).
``selection_stats`` gives the seed's figures: the share of zero-variance candidates (62.9 %) and
selected groups, and the pool and selected mean variance (0.0507 vs 0.0557).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np

from rubric_rl.controllers.sampling import ZERO_VARIANCE, group_variance

OVERLAPS = ("max", "mean")
# The candidate batch's profile P: "unit" sums the groups' profiles each scaled to unit norm (ours:
# every group weighs the same in P, so a group with many tags does not set the batch's
# direction); "sum": the plain sum (the selection before normalised profiles).
BATCH_PROFILES = ("unit", "sum")
# An untagged candidate (all-zero profile: every tagging failed, or nothing was tagged) has no
# cosine with anything. "last" (ours): it is picked only once its environment has no tagged
# candidate left; "median": it scores the median of its environment's free tagged candidates at
# that pick; "score0": it scores 0 (the selection before: a tagged group whose overlap outweighs
# its alignment scores below 0, so the untagged group was preferred to it).
UNTAGGED = ("last", "median", "score0")
# Var-Target's target (the seed reports its selection reaches ≈ 2× the pool mean variance, as a
# result). "proportional" (ours): k groups drawn without replacement with probability ∝ their
# within-group variance (zero-variance groups only once no group with a signal is left);
# "max": the k closest to the maximal variance 0.25 of rewards in [0, 1] (success rate 0.5);
# for such rewards this is Top-Var's ranking, hence not the default; "pool_multiple":
# ``variance_multiple`` × the pool mean (the target before, which prefers zero-variance groups
# whenever most candidates have none).
VARIANCE_TARGETS = ("proportional", "max", "pool_multiple")
MAX_VARIANCE = 0.25


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """cos(a, b); 0.0 when either vector is all-zero (an empty profile scores 0)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"cosine: expected two vectors of one length, got {a.shape} and {b.shape}")
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(a @ b / (na * nb))


def _unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit norm; all-zero rows stay zero (so their cosines are 0)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def env_quotas(
    envs: Sequence[str], k: int, weights: Mapping[str, float] | None = None
) -> dict[str, int]:
    """Splits ``k`` over the distinct environments of ``envs`` (ours): ∝ ``weights`` (equal by
    default), floors first, then the largest remainders get one more each, ties by environment
    name. Exact rational arithmetic, so equal weights never lose a unit to rounding."""
    names = sorted(set(envs))
    if not names:
        raise ValueError("env_quotas: no environment")
    if k < 0:
        raise ValueError(f"env_quotas: k must be >= 0, got {k}")
    if weights is None:
        w = {e: Fraction(1) for e in names}
    else:
        missing = [e for e in names if e not in weights]
        extra = sorted(set(weights) - set(names))
        if missing or extra:
            raise ValueError(
                f"env_quotas: weights must name exactly the environments {names}; missing "
                f"{missing}, unknown {extra}"
            )
        w = {}
        for e in names:
            v = float(weights[e])
            if not np.isfinite(v) or v < 0:
                raise ValueError(f"env_quotas: weight of environment {e!r} must be >= 0, got {v}")
            w[e] = Fraction(v)
    total = sum(w.values())
    if total == 0:
        raise ValueError(f"env_quotas: the weights of {names} are all 0")
    exact = {e: k * w[e] / total for e in names}
    out = {e: int(exact[e]) for e in names}  # floor (non-negative)
    left = k - sum(out.values())
    by_remainder = sorted(names, key=lambda e: (-(exact[e] - out[e]), e))
    for e in by_remainder[:left]:
        out[e] += 1
    return out


def _check_quotas(envs: Sequence[str], quotas: Mapping[str, int], what: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in envs:
        counts[e] = counts.get(e, 0) + 1
    for e in sorted(quotas):
        q = int(quotas[e])
        if q < 0:
            raise ValueError(f"{what}: quota of environment {e!r} must be >= 0, got {q}")
        if e not in counts:
            raise ValueError(f"{what}: environment {e!r} has a quota of {q} but no candidate group")
        if q > counts[e]:
            raise ValueError(
                f"{what}: environment {e!r} has a quota of {q} but only {counts[e]} candidate "
                "groups"
            )
    return {e: int(quotas[e]) for e in sorted(quotas)}


@dataclasses.dataclass(frozen=True)
class GreedyPicks:
    """The greedy round-robin's picks, in pick order, with each pick's terms at the time it was
    made: ``score = alignment − beta · overlap``."""

    order: tuple[int, ...]
    envs: tuple[str, ...]
    score: tuple[float, ...]
    alignment: tuple[float, ...]  # cos(p_g, P)
    overlap: tuple[float, ...]  # max (or mean) cos(p_g, p_s) over the picks before it; 0 first
    untagged_candidates: int = 0  # candidates with an all-zero profile
    untagged_picked: int = 0  # of those, picked


def greedy_picks(
    profiles: np.ndarray,
    envs: Sequence[str],
    quotas: Mapping[str, int],
    beta: float = 1.0,
    overlap: str = "max",
    *,
    batch: str = "sum",
    untagged: str = "score0",
) -> GreedyPicks:
    """RISED's greedy round-robin selection with every pick's score (module docstring);
    ``batch`` (``BATCH_PROFILES``) and ``untagged`` (``UNTAGGED``) as described there."""
    p = np.asarray(profiles, np.float64)
    if p.ndim != 2 or p.shape[0] != len(envs):
        raise ValueError(
            f"select_groups: profiles must be [G, V] with G = len(envs) = {len(envs)}, got "
            f"{p.shape}"
        )
    if not np.all(np.isfinite(p)):
        raise ValueError("select_groups: profiles must be finite")
    if overlap not in OVERLAPS:
        raise ValueError(f"select_groups: overlap must be one of {OVERLAPS}, got {overlap!r}")
    if batch not in BATCH_PROFILES:
        raise ValueError(f"select_groups: batch must be one of {BATCH_PROFILES}, got {batch!r}")
    if untagged not in UNTAGGED:
        raise ValueError(f"select_groups: untagged must be one of {UNTAGGED}, got {untagged!r}")
    remaining = _check_quotas(envs, quotas, "select_groups")
    env_arr = np.asarray(envs, dtype=object)
    units = _unit_rows(p)
    zero = ~np.any(p != 0, axis=1)
    total = (units if batch == "unit" else p).sum(axis=0)  # P: the candidate batch's profile
    norm = float(np.linalg.norm(total))
    alignment = units @ total / norm if norm > 0 else np.zeros(len(p))
    over_max = np.full(len(p), -np.inf)
    over_sum = np.zeros(len(p))
    free = np.ones(len(p), bool)
    order: list[int] = []
    picked_env: list[str] = []
    scores: list[float] = []
    aligns: list[float] = []
    overs: list[float] = []
    while any(remaining.values()):
        for e in remaining:  # sorted names (ours)
            if not remaining[e]:
                continue
            if order:
                over = over_max if overlap == "max" else over_sum / len(order)
            else:
                over = np.zeros(len(p))
            score = alignment - beta * over
            cand = np.flatnonzero(free & (env_arr == e))
            tagged = cand[~zero[cand]]
            if untagged != "score0" and len(tagged) < len(cand):
                score = score.copy()
                if untagged == "last" or not len(tagged):
                    score[cand[zero[cand]]] = -np.inf if len(tagged) else 0.0
                else:
                    score[cand[zero[cand]]] = float(np.median(score[tagged]))
            g = int(cand[np.argmax(score[cand])])  # argmax: the first (lowest index) of ties
            order.append(g)
            picked_env.append(e)
            scores.append(float(score[g]))
            aligns.append(float(alignment[g]))
            overs.append(float(over[g]))
            free[g] = False
            remaining[e] -= 1
            sim = units @ units[g]
            over_max = np.maximum(over_max, sim)
            over_sum += sim
    return GreedyPicks(
        tuple(order), tuple(picked_env), tuple(scores), tuple(aligns), tuple(overs),
        untagged_candidates=int(zero.sum()), untagged_picked=int(zero[order].sum()),
    )  # fmt: skip


def select_groups(
    profiles: np.ndarray,
    envs: Sequence[str],
    quotas: Mapping[str, int],
    beta: float = 1.0,
    overlap: str = "max",
    *,
    batch: str = "sum",
    untagged: str = "score0",
) -> list[int]:
    """The candidate indices RISED keeps, in pick order (``greedy_picks`` has their scores)."""
    picks = greedy_picks(profiles, envs, quotas, beta, overlap, batch=batch, untagged=untagged)
    return list(picks.order)


def random_keep(
    envs: Sequence[str], quotas: Mapping[str, int] | None, k: int, rng: np.random.Generator
) -> list[int]:
    """ "w/o selection" (RISED §5's ablation, ours as the reading): a uniformly random k of the
    same candidates (inside the environments' quotas when given, as RISED's own selection),
    so the arm changes the choice and nothing else. Returns the kept indices, ascending."""
    return _ranked_keep(np.zeros(len(envs)), envs, quotas, k, rng, "random_keep")


# ------------------------------------------------------------------------------ reward variance


def group_variances(rewards: np.ndarray) -> np.ndarray:
    """``[G]`` population variance of each group's defined rewards; 0 with fewer than two."""
    r = np.asarray(rewards, np.float64)
    if r.ndim != 2:
        raise ValueError(f"rewards must be [G, J], got {r.shape}")
    out = [group_variance(row) for row in r]
    return np.array([0.0 if v is None else v for v in out], np.float64)


def _ranked_keep(
    key: np.ndarray,
    envs: Sequence[str],
    quotas: Mapping[str, int] | None,
    k: int,
    rng: np.random.Generator | None,
    what: str,
) -> list[int]:
    """The k indices of smallest ``key`` (inside each environment's quota when given); ties by a
    random permutation drawn from ``rng``, or by index when None. Sorted ascending."""
    n = len(key)
    if len(envs) != n:
        raise ValueError(f"{what}: {n} groups but {len(envs)} environments")
    if not 0 <= k <= n:
        raise ValueError(f"{what}: k must be in [0, {n}] (the candidate groups), got {k}")
    tiebreak = np.arange(n) if rng is None else rng.permutation(n)
    rank = np.lexsort((tiebreak, key))  # by key, then tiebreak
    if quotas is None:
        return sorted(int(i) for i in rank[:k])
    q = _check_quotas(envs, quotas, what)
    if sum(q.values()) != k:
        raise ValueError(f"{what}: the quotas {q} sum to {sum(q.values())}, not k = {k}")
    keep: list[int] = []
    for e, n_e in q.items():
        keep.extend([int(i) for i in rank if envs[i] == e][:n_e])
    return sorted(keep)


def top_variance(
    rewards: np.ndarray,
    envs: Sequence[str],
    quotas: Mapping[str, int] | None,
    k: int,
    rng: np.random.Generator | None = None,
) -> list[int]:
    """Top-Var [INFERRED, baselines.md §8.2]: the k groups of largest within-group reward
    variance (per environment when ``quotas`` is given); ties at random (``rng``) or by index.
    Returns the kept indices, ascending."""
    v = group_variances(rewards)
    return _ranked_keep(-v, envs, quotas, k, rng, "top_variance")


def variance_target(rewards: np.ndarray, multiple: float = 2.0) -> float:
    """Ours: ``multiple`` × the candidate pool's mean within-group variance (module docstring)."""
    return float(multiple * group_variances(rewards).mean())


def variance_targeted(
    rewards: np.ndarray,
    envs: Sequence[str],
    quotas: Mapping[str, int] | None,
    k: int,
    target: float | None = None,
    rng: np.random.Generator | None = None,
    multiple: float = 2.0,
) -> list[int]:
    """The k groups whose within-group variance is closest to ``target`` (default
    ``variance_target(rewards, multiple)``: 2× the pool mean, ours); per environment when
    ``quotas`` is given; ties at random (``rng``) or by index. Returns the kept indices,
    ascending."""
    v = group_variances(rewards)
    t = variance_target(rewards, multiple) if target is None else float(target)
    return _ranked_keep(np.abs(v - t), envs, quotas, k, rng, "variance_targeted")


def variance_proportional(
    rewards: np.ndarray,
    envs: Sequence[str],
    quotas: Mapping[str, int] | None,
    k: int,
    rng: np.random.Generator,
) -> list[int]:
    """Var-Target as sampling ∝ variance (``VARIANCE_TARGETS``, ours): per environment (or over
    all groups without ``quotas``), groups drawn one at a time without replacement with
    probability ∝ their within-group variance; once no group with variance > 0 is left, the
    rest of the quota is a uniform draw among the others. Returns the kept indices, ascending."""
    v = group_variances(rewards)
    n = len(v)
    if len(envs) != n:
        raise ValueError(f"variance_proportional: {n} groups but {len(envs)} environments")
    if not 0 <= k <= n:
        raise ValueError(f"variance_proportional: k must be in [0, {n}], got {k}")
    if quotas is None:
        parts = {None: (np.arange(n), k)}
    else:
        q = _check_quotas(envs, quotas, "variance_proportional")
        if sum(q.values()) != k:
            raise ValueError(f"variance_proportional: the quotas {q} sum to {sum(q.values())}")
        env_arr = np.asarray(envs, dtype=object)
        parts = {e: (np.flatnonzero(env_arr == e), m) for e, m in q.items()}
    keep: list[int] = []
    for idx, m in parts.values():
        signal = idx[v[idx] > ZERO_VARIANCE]
        take = min(m, len(signal))
        if take:
            p = v[signal] / v[signal].sum()
            keep.extend(int(i) for i in rng.choice(signal, size=take, replace=False, p=p))
        rest = idx[v[idx] <= ZERO_VARIANCE]
        if m > take:
            keep.extend(int(i) for i in rng.choice(rest, size=m - take, replace=False))
    return sorted(keep)


def var_target(
    rewards: np.ndarray,
    envs: Sequence[str],
    quotas: Mapping[str, int] | None,
    k: int,
    rng: np.random.Generator,
    targeting: str = "proportional",
    multiple: float = 2.0,
) -> list[int]:
    """The Var-Target baseline under ``targeting`` (``VARIANCE_TARGETS``)."""
    if targeting == "proportional":
        return variance_proportional(rewards, envs, quotas, k, rng)
    if targeting == "max":
        return variance_targeted(rewards, envs, quotas, k, MAX_VARIANCE, rng)
    if targeting == "pool_multiple":
        return variance_targeted(rewards, envs, quotas, k, None, rng, multiple=multiple)
    raise ValueError(f"var_target: targeting must be one of {VARIANCE_TARGETS}, got {targeting!r}")


def selection_stats(rewards: np.ndarray, keep_mask: np.ndarray) -> dict[str, float]:
    """The seed's selection figures (§2.4): share of zero-variance groups and mean within-group
    variance among the candidates and among the kept groups (``selected/*`` only when some group
    is kept), and their ratio when the pool's mean is positive."""
    v = group_variances(rewards)
    keep = np.asarray(keep_mask)
    if keep.shape != v.shape or keep.dtype != bool:
        raise ValueError(f"selection_stats: keep_mask must be [{len(v)}] bool, got {keep.shape}")
    zero = v <= ZERO_VARIANCE
    out = {
        "candidates/zero_variance_frac": float(zero.mean()) if len(v) else 0.0,
        "candidates/variance_mean": float(v.mean()) if len(v) else 0.0,
    }
    if keep.any():
        out["selected/zero_variance_frac"] = float(zero[keep].mean())
        out["selected/variance_mean"] = float(v[keep].mean())
        if out["candidates/variance_mean"] > 0:
            out["selected/variance_ratio"] = (
                out["selected/variance_mean"] / out["candidates/variance_mean"]
            )
    return out
