"""HarnessRL's memory cold start (§2.3, §3): what the seed policy's groups on training tasks set
before RL — the sampling levels γ₁ ≥ γ₂ ≥ γ₃ and the two acceptance bands. The estimators here
are pure; the run that produces their inputs goes through ``Services``.

- **Levels**: γ₁, γ₂, γ₃ = the medians of the task tertiles of discriminative mass (a task's
  mass: the mean over its cold-start groups), highest tertile first (§2.3). A level of 0 would
  starve a task for good (p = 0, u undefined), so each is at least ``MIN_LEVEL`` (ours).
- **Rollout lower bound**: the 95th percentile of null variation across independent groups of
  one task: |r̄_a − r̄_b| over pairs of the task's groups (same policy, no guidance), pooled
  over tasks (§3).
- **Rubric lower bound**: the 95th percentile of |r̄_a − r̄_b| over repeated gradings of one
  group (the judge's own noise, §3). A deterministic judge gives exactly 0, which would accept
  any change however small; the bound is then ``deterministic_floor`` (ours: the seed's
  calibrated 3.1 points, an LLM judge's noise, by default).
- **Upper bounds** (both bands): the median within-group reward range (max − min over the
  group's rollouts) (§3).
- **Band floor** (ours): a lower bound is at least ``band_floor`` and an upper bound at least
  its lower + ``band_floor``, so a band never collapses to a point (a policy whose groups all
  agree, or a median range of 0, would otherwise accept nothing, or any Δ ≥ 0).
- **Power at calibration** (ours): the rollout band's acceptance of a candidate whose true
  effect is d, under the null variation the cold start measured (Δ = d + δ, δ over the signed
  pair differences): reported for d = the band's lower bound (power) and d = 0 (false
  acceptance). The paper's unpaired rule puts the lower bound at the null's 95th percentile of
  |δ|, so its power at d = lower is about one half by construction.
- **Paired null** (ours, ``harness.measurement = "paired"``): per cold-start task, ``J'``
  unguided samples and ``J'`` samples with a placebo field (guidance-shaped text that names no
  criterion, ``PLACEBO_TEXT``) on the same seeds; δ = the placebo group's mean − the unguided
  group's (points), one per task. A placebo, not two unguided groups: on shared seeds those
  are identical, while a mounted field changes the prompt and so the samples as any candidate
  does. The decision threshold t is the null's 95th percentile of the signed δ (Δ > t accepts:
  5 % false acceptance, one-sided, since a rollout update must raise reward), and the band's
  lower bound is the smallest effect accepted with 80 % power, t − (the null's 20th
  percentile): Δ = d + δ > t for 80 % of δ when d ≥ that (``paired_band``). The proposer skips
  targets worth fewer points than it; the critic accepts from t.
All in points (Λ·r, Λ = 100).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rubric_rl.methods.harness_rl.critic import SEED_RUBRIC_BAND

MIN_LEVEL = 0.05
# The paired rule's error rates (ours): false acceptance at d = 0 and power at d = lower.
PAIRED_ALPHA = 0.05
PAIRED_POWER = 0.95
# The paired null's placebo field (ours): the shape of guidance, the content of the task alone.
PLACEBO_TEXT = "Answer the task exactly as it asks."
PAIRED_NULL_STREAM = "harness_paired_null"


def _mean_points(rewards: Sequence[float]) -> float:
    r = np.asarray(rewards, np.float64)
    r = r[~np.isnan(r)]
    return float(100.0 * r.mean()) if len(r) else float("nan")


def _pair_diffs(groups_of_groups: Mapping[str, Sequence[Sequence[float]]]) -> list[float]:
    """|r̄_a − r̄_b| (points) over the pairs within each entry's groups (undefined means out)."""
    diffs = []
    for groups in groups_of_groups.values():
        means = [x for x in (_mean_points(g) for g in groups) if np.isfinite(x)]
        diffs += [abs(a - b) for a, b in itertools.combinations(means, 2)]
    return diffs


def signed_pair_diffs(groups_by_task: Mapping[str, Sequence[Sequence[float]]]) -> list[float]:
    """r̄_a − r̄_b and r̄_b − r̄_a (points) over the pairs within each task's groups."""
    out = []
    for groups in groups_by_task.values():
        means = [x for x in (_mean_points(g) for g in groups) if np.isfinite(x)]
        for a, b in itertools.combinations(means, 2):
            out += [a - b, b - a]
    return out


def acceptance_at(
    null_diffs: Sequence[float],
    band: tuple[float, float],
    effect: float,
    threshold: float | None = None,
) -> float:
    """The share of Δ = effect + δ (δ over ``null_diffs``) within [lower, upper], or with
    ``threshold`` (the paired rule) within (threshold, upper]."""
    d = float(effect) + np.asarray(null_diffs, np.float64)
    if not len(d):
        return float("nan")
    above = d >= band[0] if threshold is None else d > float(threshold)
    return float(np.mean(above & (d <= band[1])))


def paired_null_diffs(pairs: Sequence[tuple[Sequence[float], Sequence[float]]]) -> list[float]:
    """δ = mean(placebo) − mean(unguided) (points) per (unguided, placebo) pair of groups on
    shared seeds; pairs with an undefined mean are left out."""
    out = []
    for control, placebo in pairs:
        a, b = _mean_points(control), _mean_points(placebo)
        if np.isfinite(a) and np.isfinite(b):
            out.append(b - a)
    return out


def paired_band(
    null_diffs: Sequence[float],
    upper: float,
    floor: float,
    *,
    alpha: float = PAIRED_ALPHA,
    power: float = PAIRED_POWER,
) -> tuple[float, tuple[float, float]]:
    """(threshold t, (lower, upper)) of the paired rule: t = the (1 − alpha) quantile of the
    signed null δ; lower = t − the (1 − power) quantile of δ, the smallest effect d with
    P(d + δ > t) ≥ power under the null's spread; then the band floor."""
    d = np.asarray(null_diffs, np.float64)
    if not len(d):
        raise ValueError("cold start: no task gave a paired null difference")
    t = float(np.quantile(d, 1.0 - alpha))
    lower = t - float(np.quantile(d, 1.0 - power))
    return t, floored_band(lower, upper, floor)


def floored_band(lower: float, upper: float, floor: float) -> tuple[float, float]:
    """(max(lower, floor), max(upper, that + floor)): never a point, never below the floor."""
    lo = max(float(lower), float(floor))
    return lo, max(float(upper), lo + float(floor))


def tertile_levels(mass_by_task: Mapping[str, float]) -> tuple[float, float, float, float]:
    """(1, γ₁, γ₂, γ₃): medians of the tasks' discriminative-mass tertiles, highest first."""
    m = np.sort(np.asarray([v for v in mass_by_task.values() if np.isfinite(v)], np.float64))
    if len(m) < 3:
        raise ValueError(f"cold start: {len(m)} tasks with a discriminative mass; need at least 3")
    thirds = np.array_split(m[::-1], 3)
    g = [max(MIN_LEVEL, min(1.0, float(np.median(t)))) for t in thirds]
    return (1.0, g[0], g[1], g[2])


def null_variation_bound(groups_by_task: Mapping[str, Sequence[Sequence[float]]]) -> float:
    """95th percentile of |r̄_a − r̄_b| (points) over pairs of independent groups of one task."""
    diffs = _pair_diffs(groups_by_task)
    if not diffs:
        raise ValueError("cold start: no task has two groups with a defined mean reward")
    return float(np.percentile(diffs, 95))


def regrade_bound(
    gradings_by_group: Mapping[str, Sequence[Sequence[float]]],
    deterministic_floor: float = SEED_RUBRIC_BAND[0],
) -> tuple[float, bool]:
    """95th percentile of |r̄_a − r̄_b| (points) over repeated gradings of one group, and whether
    the floor replaced it (every grading identical: a deterministic judge)."""
    diffs = _pair_diffs(gradings_by_group)
    if not diffs:
        raise ValueError("cold start: no group was graded twice with a defined mean reward")
    p95 = float(np.percentile(diffs, 95))
    if max(diffs) == 0.0:
        return float(deterministic_floor), True
    return p95, False


def range_upper_bound(groups: Sequence[Sequence[float]]) -> float:
    """The median within-group reward range (points)."""
    ranges = []
    for g in groups:
        r = np.asarray(g, np.float64)
        r = r[~np.isnan(r)]
        if len(r) >= 2:
            ranges.append(100.0 * float(r.max() - r.min()))
    if not ranges:
        raise ValueError("cold start: no group with two defined rewards")
    return float(np.median(ranges))


COLD_START_STREAM = "harness_cold_start"


def run_cold_start(
    services: Any,
    tasks: Sequence[Any],
    *,
    seed: int,
    n_tasks: int,
    groups: int,
    regradings: int,
    samples_per_task: int,
    deterministic_floor: float,
    band_floor: float = 0.0,
    paired_samples: int = 0,
    placebo: Any = None,
) -> dict[str, Any]:
    """The cold start through ``Services``: ``groups`` independent groups of the current
    (warm-started) policy on ``n_tasks`` training tasks under their seed rubrics, and
    ``regradings`` fresh gradings (no verdict cache) of one group per task. Returns the levels,
    the two bands (points) and what produced them. ``paired_samples`` > 0 (with ``placebo``:
    task -> its prompt with the placebo field) calibrates the rollout band for the paired rule
    instead (module docstring); the unpaired band is reported beside it."""
    from rubric_rl.methods.harness_rl.attributor import discriminative_mass, satisfied
    from rubric_rl.methods.harness_rl.state import met_matrix, row_reward

    t0 = time.perf_counter()
    rng = np.random.default_rng([int(seed), 7])
    n = min(int(n_tasks), len(tasks))
    pick = [tasks[i] for i in sorted(rng.choice(len(tasks), n, replace=False))]
    drawn = [t for t in pick for _ in range(int(groups))]
    _, trajs = services.generate(
        [t.messages for t in drawn], int(samples_per_task), stream=COLD_START_STREAM,
        names=[t.id for t in drawn],
    )  # fmt: skip
    responses = [[x.response for x in ts] for ts in trajs]
    verdicts = services.judge(drawn, responses)
    by_task: dict[str, list[list[float]]] = {}
    mass: dict[str, list[float]] = {}
    all_groups = []
    for t, vs in zip(drawn, verdicts, strict=True):
        crits = t.rubric.evaluated().criteria
        rewards = [row_reward(crits, row) for row in vs]
        by_task.setdefault(t.id, []).append(rewards)
        all_groups.append(rewards)
        sat = satisfied(met_matrix(crits, vs), [c.weight for c in crits])
        mass.setdefault(t.id, []).append(discriminative_mass(sat))
    first: dict[str, tuple[Any, list[str]]] = {}
    for t, r in zip(drawn, responses, strict=True):
        first.setdefault(t.id, (t, r))
    gradings: dict[str, list[list[float]]] = {}
    for _ in range(int(regradings)):
        ts = [v[0] for v in first.values()]
        vs = services.judge(ts, [v[1] for v in first.values()], fresh=True)
        for t, rows in zip(ts, vs, strict=True):
            crits = t.rubric.evaluated().criteria
            gradings.setdefault(t.id, []).append([row_reward(crits, row) for row in rows])
    levels = tertile_levels({k: float(np.mean(v)) for k, v in mass.items()})
    roll_lo = null_variation_bound(by_task)
    rub_lo, floored = regrade_bound(gradings, deterministic_floor)
    upper = range_upper_bound(all_groups)
    # An upper bound below its lower bound would accept nothing: it is raised (band_floor).
    roll = floored_band(roll_lo, upper, band_floor)
    null = signed_pair_diffs(by_task)
    unpaired_power = {
        "at_lower": acceptance_at(null, roll, roll[0]),
        "at_zero": acceptance_at(null, roll, 0.0),
        "null_sd": float(np.std(null)) if null else float("nan"),
        "pairs": len(null) // 2,
    }
    out = {
        "source": "cold_start",
        "measurement": "unpaired",
        "tasks": n,
        "groups": int(groups),
        "levels": list(levels),
        "rollout_band": list(roll),
        "rubric_band": list(floored_band(rub_lo, upper, band_floor)),
        "rubric_lower_floored": floored,
        "rollout_null_p95": roll_lo,
        "median_range": upper,
        "rollout_power": unpaired_power,
    }
    if int(paired_samples) > 0:
        out.update(_paired(services, pick, int(paired_samples), placebo, upper, band_floor))
        out["unpaired"] = {"rollout_band": list(roll), "rollout_power": unpaired_power}
    out["seconds"] = time.perf_counter() - t0
    return out


def _paired(services, tasks, n_samples: int, placebo, upper: float, floor: float) -> dict:
    """The paired rule's threshold, band and power from unguided vs placebo groups of each
    task on shared seeds (tasks whose placebo prompt is too long are left out)."""
    from rubric_rl.methods.harness_rl.state import row_reward
    from rubric_rl.services import stream_base

    fit, prompts = [], []
    for t in tasks:
        try:
            m = placebo(t)
            services.encode_prompt(m, f"task {t.id}")
        except ValueError:
            continue
        fit.append(t)
        prompts.append(m)
    seeds = [stream_base(PAIRED_NULL_STREAM) + i for i in range(len(fit))] * 2
    _, trajs = services.generate(
        [t.messages for t in fit] + prompts, n_samples, stream=PAIRED_NULL_STREAM,
        names=[t.id for t in fit] * 2, seed_indices=seeds,
    )  # fmt: skip
    both = fit + fit
    verdicts = services.judge(both, [[x.response for x in ts] for ts in trajs])
    rewards = [
        [row_reward(t.rubric.evaluated().criteria, row) for row in vs]
        for t, vs in zip(both, verdicts, strict=True)
    ]
    null = paired_null_diffs(list(zip(rewards[: len(fit)], rewards[len(fit) :], strict=True)))
    t, band = paired_band(null, upper, floor)
    return {
        "measurement": "paired",
        "paired_samples": n_samples,
        "rollout_band": list(band),
        "rollout_threshold": t,
        "rollout_power": {
            "at_lower": acceptance_at(null, band, band[0], threshold=t),
            "at_zero": acceptance_at(null, band, 0.0, threshold=t),
            "null_sd": float(np.std(null)),
            "pairs": len(null),
        },
    }


__all__ = [
    "COLD_START_STREAM",
    "PAIRED_ALPHA",
    "PAIRED_POWER",
    "PLACEBO_TEXT",
    "acceptance_at",
    "floored_band",
    "paired_band",
    "paired_null_diffs",
    "signed_pair_diffs",
    "run_cold_start",
    "MIN_LEVEL",
    "null_variation_bound",
    "range_upper_bound",
    "regrade_bound",
    "tertile_levels",
]
