"""Rubric rewards against hand-computed values, and vectorised == scalar on random inputs."""

import math

import numpy as np
import pytest

from rubric_rl.rubrics import rewards
from rubric_rl.rubrics.rewards import (
    REWARDS,
    batch_rewards,
    healthbench_aggregate,
    rubric_reward,
    to_points,
)
from rubric_rl.rubrics.scores import pack_verdicts
from rubric_rl.rubrics.types import Criterion, Verdict

# λ = (3, 2, -4, 1); the denominator over all valid criteria is Σ max(λ, 0) = 6.
CRITS = [
    Criterion("c0", "a", weight=3.0),
    Criterion("c1", "b", weight=2.0),
    Criterion("c2", "pitfall", weight=-4.0),
    Criterion("c3", "d", weight=1.0),
]


def _v(*mets):
    return {c.id: Verdict(c.id, m) for c, m in zip(CRITS, mets)}


def test_registered_names():
    assert REWARDS.names() == [
        "arise_rl_solver",
        "arise_rl_solver_weighted",
        "healthbench",
        "healthbench_clipped",
        "mean",
        "weighted",
    ]


def test_weighted_hand_computed_with_pitfall():
    r = rubric_reward("weighted", CRITS, _v(True, False, True, True))
    # (3 + 0 - 4 + 1) / 6 = 0: the pitfall cancels the gains.
    assert r.value == pytest.approx(0.0)
    assert (r.num_valid, r.num_failed) == (4, 0)
    assert dict(r.contributions) == pytest.approx({"c0": 0.5, "c1": 0.0, "c2": -4 / 6, "c3": 1 / 6})
    r = rubric_reward("weighted", CRITS, _v(False, False, True, False))
    assert r.value == pytest.approx(-4 / 6)  # not clipped
    assert to_points(r.value) == pytest.approx(-400 / 6)
    assert rubric_reward("weighted", CRITS, _v(True, True, False, True)).value == 1.0


def test_failed_verdicts_leave_numerator_and_denominator():
    # c0 failed: r = (2 - 4 + 0) / (2 + 1) = -2/3; scoring it 0 instead would give -2/6.
    r = rubric_reward("weighted", CRITS, _v(None, True, True, False))
    assert r.value == pytest.approx(-2 / 3)
    assert (r.num_valid, r.num_failed) == (3, 1)
    assert dict(r.contributions)["c0"] is None
    # A failed pitfall leaves only the positive criteria: (3 + 2) / 6.
    r = rubric_reward("weighted", CRITS, _v(True, True, None, False))
    assert r.value == pytest.approx(5 / 6)


def test_undefined_rewards_are_none_not_zero():
    for name in REWARDS:
        r = rubric_reward(name, CRITS, _v(None, None, None, None))
        assert r.value is None and r.num_failed == 4 and r.num_valid == 0, name
    # Only the pitfall is valid: no positive weight left -> weighted undefined, mean defined.
    only_pitfall = _v(None, None, False, None)
    assert rubric_reward("weighted", CRITS, only_pitfall).value is None
    assert rubric_reward("mean", CRITS, only_pitfall).value == 1.0
    assert rubric_reward("weighted", [], {}).value is None
    assert to_points(None) is None


def test_healthbench_unclipped_per_response_and_clipped_aggregate():
    neg = _v(False, False, True, False)
    assert rubric_reward("healthbench", CRITS, neg).value == pytest.approx(-4 / 6)
    assert rubric_reward("healthbench_clipped", CRITS, neg).value == 0.0
    # mean(-4/6, 1, 1) = 4/9, inside [0, 1]: unchanged; clipping per response would give 2/3.
    score, undefined = healthbench_aggregate([-4 / 6, 1.0, 1.0, None, float("nan")])
    assert score == pytest.approx(4 / 9) and undefined == 2
    assert healthbench_aggregate([-0.5, -0.1])[0] == 0.0
    assert healthbench_aggregate([None]) == (None, 1)


def test_mean_and_arise_solver_hand_computed():
    # Satisfied: c0 yes, c1 no, c2 (pitfall) present -> no, c3 yes: s = 2/4.
    v = _v(True, False, True, True)
    assert rubric_reward("mean", CRITS, v).value == pytest.approx(0.5)
    r = rubric_reward("arise_rl_solver", CRITS, v)
    assert r.value == pytest.approx(0.8 * 0.5)
    assert sum(x for _, x in r.contributions) == pytest.approx(0.8 * 0.5)
    # All valid satisfied (c1 failed): s = 1 -> r = 0.8 + 0.2 = 1.
    all_met = _v(True, None, False, True)
    assert rubric_reward("arise_rl_solver", CRITS, all_met).value == pytest.approx(1.0)
    assert rubric_reward("arise_rl_solver", CRITS, all_met, alpha=0.5).value == 1.0
    assert rubric_reward("arise_rl_solver", CRITS, v, alpha=0.5).value == pytest.approx(0.25)
    with pytest.raises(ValueError, match="alpha"):
        rubric_reward("arise_rl_solver", CRITS, v, alpha=1.5)


def test_scalar_rejects_missing_or_unknown_verdicts():
    with pytest.raises(ValueError, match="no verdict for criterion 'c3'"):
        rubric_reward("weighted", CRITS, {c.id: True for c in CRITS[:3]})
    with pytest.raises(ValueError, match="not in the rubric"):
        rubric_reward("mean", CRITS[:1], {"c0": True, "x": False})
    with pytest.raises(KeyError, match="unknown reward 'nope'"):
        rubric_reward("nope", CRITS, _v(True, True, True, True))


def _numpy_reference(name, weights, mets):
    """Plain per-response reference (loops, no shared helpers)."""
    valid = [(w, m) for w, m in zip(weights, mets) if m is not None]
    if name in ("weighted", "healthbench", "healthbench_clipped"):
        den = sum(max(w, 0.0) for w, _ in valid)
        if den == 0:
            return math.nan
        r = sum(w * m for w, m in valid) / den
        return min(max(r, 0.0), 1.0) if name == "healthbench_clipped" else r
    if not valid:
        return math.nan
    s = np.mean([m if w > 0 else 1 - m for w, m in valid])
    return s if name == "mean" else 0.8 * s + 0.2 * (s == 1.0)


@pytest.mark.parametrize(
    "name", ["weighted", "healthbench", "healthbench_clipped", "mean", "arise_rl_solver"]
)
def test_vectorised_equals_scalar_and_reference(name):
    rng = np.random.default_rng(hash(name) % 2**32)
    groups, crits = [], []
    for g in range(7):
        n = int(rng.integers(0, 6))  # includes empty rubrics
        ws = rng.choice([-5.0, -1.0, 0.5, 1.0, 3.0], size=n)
        cs = [Criterion(f"t{g}/c{i}", "x", weight=w) for i, w in enumerate(ws)]
        fail_p = [0.0, 0.3, 1.0][g % 3]  # no failures, some, all failed
        groups.append(
            [
                {c.id: None if rng.random() < fail_p else bool(rng.random() < 0.5) for c in cs}
                for _ in range(5)
            ]
        )
        crits.append(cs)
    scores = pack_verdicts(groups, crits)
    batch = batch_rewards(name, scores)
    assert batch.values.shape == (7, 5)
    for g in range(7):
        for j in range(5):
            r = rubric_reward(name, crits[g], groups[g][j])
            ref = _numpy_reference(
                name, [c.weight for c in crits[g]], [groups[g][j][c.id] for c in crits[g]]
            )
            if r.value is None:
                assert np.isnan(batch.values[g, j]) and np.isnan(ref)
            else:
                assert batch.values[g, j] == pytest.approx(r.value, abs=1e-12)
                assert ref == pytest.approx(r.value, abs=1e-12)
            assert batch.num_failed[g, j] == r.num_failed
            assert batch.num_valid[g, j] == r.num_valid
    assert batch.num_undefined == int(np.isnan(batch.values).sum()) > 0


def test_arise_alpha_passes_through_batched():
    scores = pack_verdicts([[{"c0": True, "c1": False}]], [CRITS[:2]])
    out = batch_rewards("arise_rl_solver", scores, alpha=0.6)
    assert out.values[0, 0] == pytest.approx(0.6 * 0.5)
    assert rewards.ARISE_ALPHA == 0.8 and rewards.POINTS_SCALE == 100.0
