"""The JIT critic's acceptance at the band edges (drop included) and the cold-start estimators
against plain references."""

import itertools

import numpy as np
import pytest

from rubric_rl.methods.harness_rl.cold_start import (
    MIN_LEVEL,
    null_variation_bound,
    range_upper_bound,
    regrade_bound,
    tertile_levels,
)
from rubric_rl.methods.harness_rl.critic import Band, rollout_verdict, rubric_verdict

ROLL = Band(10.2, 28.0)
RUB = Band(3.1, 28.0)


def test_rollout_band_edges():
    assert rollout_verdict(10.2, ROLL).accepted  # at the lower bound
    assert rollout_verdict(28.0, ROLL).accepted  # at the upper bound
    assert not rollout_verdict(np.nextafter(10.2, 0), ROLL).accepted
    assert not rollout_verdict(np.nextafter(28.0, 99), ROLL).accepted
    assert not rollout_verdict(-15.0, ROLL).accepted
    v = rollout_verdict(5.0, ROLL)
    assert not v.accepted and "below" in v.reason and v.delta == 5.0


def test_a_drop_is_accepted_when_reward_stays_within_the_lower_bound():
    assert rollout_verdict(-10.2, ROLL, drop_only=True).accepted  # exactly −lower
    assert not rollout_verdict(np.nextafter(-10.2, -99), ROLL, drop_only=True).accepted
    assert rollout_verdict(40.0, ROLL, drop_only=True).accepted  # no upper bound on a drop
    assert rollout_verdict(0.0, ROLL, drop_only=True).accepted


def test_rubric_band_is_on_the_absolute_change():
    for d in (3.1, -3.1, 28.0, -28.0, 10.0, -10.0):
        assert rubric_verdict(d, RUB).accepted, d
    for d in (3.0, -3.0, 0.0, 28.01, -28.01):
        assert not rubric_verdict(d, RUB).accepted, d


def test_no_measurement_rejects():
    for d in (None, float("nan"), float("inf")):
        assert not rollout_verdict(d, ROLL).accepted
        assert not rollout_verdict(d, ROLL, drop_only=True).accepted
        v = rubric_verdict(d, RUB)
        assert not v.accepted and v.reason == "no measurement" and v.delta is None


def test_bands_are_checked():
    for lo, hi in ((-1, 2), (5, 4), (float("nan"), 3)):
        with pytest.raises(ValueError, match="acceptance band"):
            Band(lo, hi)


def test_tertile_levels_are_tertile_medians_highest_first():
    rng = np.random.default_rng(0)
    mass = {f"t{i}": float(x) for i, x in enumerate(rng.uniform(0.1, 0.9, 30))}
    v = np.sort(np.array(list(mass.values())))[::-1]
    want = [np.median(v[:10]), np.median(v[10:20]), np.median(v[20:])]
    assert tertile_levels(mass) == pytest.approx((1.0, *want))
    zeros = {f"t{i}": 0.0 for i in range(6)} | {"a": 0.8, "b": 0.7, "c": 0.9}
    assert tertile_levels(zeros)[3] == MIN_LEVEL  # a zero level would starve its tasks
    with pytest.raises(ValueError, match="at least 3"):
        tertile_levels({"a": 0.5, "b": float("nan")})


def test_null_variation_regrade_and_range_against_references():
    rng = np.random.default_rng(1)
    groups = {f"t{i}": [rng.random(8).tolist() for _ in range(4)] for i in range(5)}
    diffs = [
        abs(100 * np.mean(a) - 100 * np.mean(b))
        for gs in groups.values()
        for a, b in itertools.combinations(gs, 2)
    ]
    assert null_variation_bound(groups) == pytest.approx(np.percentile(diffs, 95))
    # NaN rewards (undefined) are excluded from a group's mean.
    with_nan = {"t": [[1.0, float("nan")], [0.5, 0.5]]}
    assert null_variation_bound(with_nan) == pytest.approx(50.0)
    # A deterministic judge: identical gradings -> the stated floor.
    same = {"g": [[0.5, 1.0], [0.5, 1.0], [0.5, 1.0]]}
    assert regrade_bound(same) == (3.1, True)
    assert regrade_bound(same, deterministic_floor=1.0) == (1.0, True)
    noisy = {"g": [[0.5, 1.0], [0.5, 0.5]]}
    assert regrade_bound(noisy) == (pytest.approx(25.0), False)
    all_groups = [g for gs in groups.values() for g in gs]
    want = np.median([100 * (max(g) - min(g)) for g in all_groups])
    assert range_upper_bound(all_groups) == pytest.approx(want)
    with pytest.raises(ValueError, match="two groups"):
        null_variation_bound({"t": [[0.5]]})


def test_band_floor_and_power_at_calibration_against_references():
    from rubric_rl.methods.harness_rl.cold_start import (
        acceptance_at,
        floored_band,
        signed_pair_diffs,
    )

    # Never a point, never below the floor; a wide band is kept.
    assert floored_band(0.0, 0.0, 3.1) == (3.1, 6.2)
    assert floored_band(0.34, 0.34, 3.1) == (3.1, 6.2)
    assert floored_band(12.0, 30.0, 3.1) == (12.0, 30.0)
    assert floored_band(12.0, 13.0, 3.1) == (12.0, 15.1)
    rng = np.random.default_rng(2)
    groups = {f"t{i}": [rng.random(8).tolist() for _ in range(3)] for i in range(20)}
    null = signed_pair_diffs(groups)
    ref = []
    for gs in groups.values():
        for a, b in itertools.combinations(gs, 2):
            ref += [100 * np.mean(a) - 100 * np.mean(b), 100 * np.mean(b) - 100 * np.mean(a)]
    assert sorted(null) == pytest.approx(sorted(ref))
    band = (null_variation_bound(groups), 60.0)
    ref = np.asarray(ref)
    for d in (0.0, band[0], 2 * band[0]):
        want = np.mean((d + ref >= band[0]) & (d + ref <= band[1]))
        assert acceptance_at(null, band, d) == pytest.approx(want)
    # The paper's unpaired rule: lower = the 95th percentile of |δ|, so about half of the
    # candidates whose true effect equals it are accepted, and ~2.5 % of null candidates.
    assert 0.4 <= acceptance_at(null, band, band[0]) <= 0.6
    assert acceptance_at(null, band, 0.0) <= 0.05


def test_paired_band_and_verdict_against_references():
    from rubric_rl.methods.harness_rl.cold_start import (
        acceptance_at,
        paired_band,
        paired_null_diffs,
    )

    rng = np.random.default_rng(5)
    pairs = [(rng.random(16).tolist(), rng.random(16).tolist()) for _ in range(300)]
    pairs.append(([float("nan")] * 16, rng.random(16).tolist()))  # undefined: left out
    null = paired_null_diffs(pairs)
    ref = np.array([100 * np.mean(b) - 100 * np.mean(a) for a, b in pairs[:-1]])
    assert null == pytest.approx(ref.tolist())
    t, (lo, hi) = paired_band(null, 60.0, 3.1, alpha=0.05, power=0.8)
    assert t == pytest.approx(np.quantile(ref, 0.95))
    assert lo == pytest.approx(t - np.quantile(ref, 0.2))
    assert hi == 60.0
    # Under the null's spread: 5 % false acceptance (strictly above t), 80 % power at d = lo.
    assert acceptance_at(null, (lo, hi), 0.0, threshold=t) == pytest.approx(
        np.mean((ref > t) & (ref <= hi))
    )
    assert acceptance_at(null, (lo, hi), 0.0, threshold=t) <= 0.05
    assert acceptance_at(null, (lo, hi), lo, threshold=t) >= 0.8
    # A null with no spread (seed-shared samples, no effect) floors the band; Δ = 0 rejects.
    t0, band0 = paired_band([0.0] * 50, 40.0, 3.1)
    assert t0 == 0.0 and band0 == (3.1, 40.0)
    with pytest.raises(ValueError, match="paired null"):
        paired_band([], 40.0, 3.1)
    band = Band(12.0, 40.0)
    assert not rollout_verdict(0.0, Band(*band0), threshold=t0).accepted
    assert rollout_verdict(5.0, band, threshold=4.9).accepted  # above t, though below lower
    assert not rollout_verdict(4.9, band, threshold=4.9).accepted
    assert not rollout_verdict(40.5, band, threshold=4.9).accepted
    assert rollout_verdict(40.0, band, threshold=4.9).accepted
    v = rollout_verdict(-20.0, band, drop_only=True, threshold=4.9)
    assert not v.accepted and v.reason.startswith("drop")  # a drop keeps its tolerance rule
