"""GRPO / mean-only / multi-signal advantages and importance weights vs the numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rubric_rl.core.advantages import (
    ADVANTAGE_ESTIMATORS,
    grpo_advantages,
    importance_weights,
    mean_only_advantages,
    multi_signal_advantages,
)
from tests.core import reference as ref


def _rewards(seed, groups=6, j=8):
    rng = np.random.default_rng(seed)
    rewards = rng.uniform(0, 1, size=(groups, j)).astype(np.float32)
    rewards[1] = 0.75  # zero variance
    rewards[2] = rng.integers(0, 2, size=j)  # binary
    valid = rng.uniform(size=(groups, j)) > 0.2
    valid[3] = False
    valid[3, 0] = True  # one valid member only
    return rewards, valid


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("use_valid", [False, True])
@pytest.mark.parametrize("mean_only", [False, True])
def test_group_advantages_match_reference(seed, use_valid, mean_only):
    rewards, valid = _rewards(seed)
    valid = valid if use_valid else None
    fn = mean_only_advantages if mean_only else grpo_advantages
    adv, zero_variance = fn(
        jnp.asarray(rewards), valid=None if valid is None else jnp.asarray(valid)
    )
    want_adv, want_zv = ref.group_advantages(rewards, valid=valid, mean_only=mean_only)
    np.testing.assert_allclose(np.asarray(adv), want_adv, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(zero_variance), want_zv)
    assert bool(zero_variance[1])  # the constant group


def test_hand_computed_grpo():
    adv, zv = grpo_advantages(jnp.array([[1.0, 0.0, 0.0, 1.0]]), eps=0.0)
    # mean 0.5, std (ddof 1) = sqrt(4 · 0.25 / 3) = 0.57735
    np.testing.assert_allclose(np.asarray(adv[0]), [0.8660254, -0.8660254, -0.8660254, 0.8660254])
    assert not bool(zv[0])


def test_zero_variance_uses_the_tolerance():
    base = 0.6
    rewards = jnp.array(
        [
            [base] * 4,  # exactly constant
            [base, base + 5e-7, base, base - 2e-7],  # spread 7e-7 < tol: zero variance
            [base, base + 2e-6, base, base],  # spread 2e-6 ≥ tol: a real (tiny) contrast
        ],
        jnp.float32,
    )
    adv, zv = grpo_advantages(rewards, zero_variance_tol=1e-6)
    np.testing.assert_array_equal(np.asarray(zv), [True, True, False])
    assert np.all(np.asarray(adv[:2]) == 0.0)  # exactly zero, not 1e-7 / (std + eps)
    want, _ = ref.group_advantages(np.asarray(rewards), tol=1e-6)
    np.testing.assert_allclose(np.asarray(adv[2]), want[2], rtol=1e-4)
    assert float(adv[2, 1]) > 0.4 and float(adv[2, 0]) < 0


def test_invalid_members_are_excluded_and_zero():
    rewards = jnp.array([[1.0, jnp.nan, 0.0, 0.5], [jnp.nan, 0.3, jnp.nan, jnp.nan]])
    valid = ~jnp.isnan(rewards)
    adv, zv = grpo_advantages(rewards, valid=valid)
    assert np.all(np.isfinite(np.asarray(adv)))
    assert float(adv[0, 1]) == 0.0 and np.all(np.asarray(adv[1]) == 0.0)
    np.testing.assert_array_equal(np.asarray(zv), [False, True])  # < 2 valid members
    want, _ = ref.group_advantages(np.array([[1.0, 0.0, 0.5]]))
    np.testing.assert_allclose(np.asarray(adv[0])[[0, 2, 3]], want[0], rtol=1e-5)
    # without `valid`, a NaN reward is not silently zeroed: its group's advantages are NaN
    loud, _ = grpo_advantages(jnp.array([[1.0, jnp.nan, 0.0], [1.0, 0.0, 0.5]]))
    assert np.all(np.isnan(np.asarray(loud[0]))) and np.all(np.isfinite(np.asarray(loud[1])))


def test_multi_signal_is_weighted_sum_of_group_normalised_signals():
    rng = np.random.default_rng(3)
    task = rng.integers(0, 2, size=(4, 6)).astype(np.float32)
    rubric = rng.uniform(size=(4, 6)).astype(np.float32)
    task[0] = 1.0  # task signal zero-variance; the rubric signal still separates this group
    valid_rubric = np.ones((4, 6), bool)
    valid_rubric[2] = False  # no rubric feedback for group 2
    adv, zv = multi_signal_advantages(
        {"task": jnp.asarray(task), "rubric": jnp.asarray(rubric)},
        {"task": 1.0, "rubric": 0.5},
        valid={"task": jnp.ones((4, 6), bool), "rubric": jnp.asarray(valid_rubric)},
    )
    want_task, want_zv_task = ref.group_advantages(task)
    want_rubric, _ = ref.group_advantages(rubric, valid=valid_rubric)
    np.testing.assert_allclose(np.asarray(adv), want_task + 0.5 * want_rubric, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(zv["task"]), want_zv_task)
    assert bool(zv["rubric"][2]) and np.all(np.asarray(adv[0]) != 0)
    with pytest.raises(ValueError, match="same rewards"):
        multi_signal_advantages({"task": jnp.asarray(task)}, {"rubric": 1.0})


def test_registry_and_jit():
    assert ADVANTAGE_ESTIMATORS.get("grpo") is grpo_advantages
    assert ADVANTAGE_ESTIMATORS.get("dr-grpo") is mean_only_advantages
    assert ADVANTAGE_ESTIMATORS.get("mean_only") is mean_only_advantages
    rewards, valid = _rewards(4)
    jitted = jax.jit(lambda r, v: grpo_advantages(r, valid=v, zero_variance_tol=1e-6))
    got = jitted(jnp.asarray(rewards), jnp.asarray(valid))
    want, want_zv = ref.group_advantages(rewards, valid=valid)
    np.testing.assert_allclose(np.asarray(got[0]), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(got[1]), want_zv)


def test_importance_weights():
    w = np.array([1.0, 0.61, 0.38, 0.17])  # HarnessRL levels
    probs = w / w.sum()
    drawn = np.array([0, 3, 3, 1, 2])
    u = importance_weights(jnp.asarray(probs, jnp.float32), jnp.asarray(drawn))
    np.testing.assert_allclose(np.asarray(u), ref.importance_weights(probs, drawn), rtol=1e-6)
    np.testing.assert_allclose(float(u[1]), w.sum() / (4 * 0.17), rtol=1e-6)
    # unbiasedness: E_{i~p}[u_i f_i] equals the uniform mean of f
    f = np.array([0.3, 1.0, -2.0, 5.0])
    all_u = np.asarray(importance_weights(jnp.asarray(probs, jnp.float32), jnp.arange(4)))
    np.testing.assert_allclose((probs * all_u * f).sum(), f.mean(), rtol=1e-6)
    zero = np.array([0.5, 0.0, 0.5])
    with pytest.raises(ValueError, match="draw 1 picked task 1 whose sampling probability is 0"):
        importance_weights(jnp.asarray(zero), jnp.array([0, 1]))
    with pytest.raises(ValueError, match="draw 0 has task id 5"):
        importance_weights(jnp.asarray(zero), jnp.array([5]))
    with pytest.raises(ValueError, match="summing to 1"):
        importance_weights(jnp.asarray(w), jnp.array([0]))
    jitted = jax.jit(importance_weights)(jnp.asarray(probs, jnp.float32), jnp.asarray(drawn))
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(u), rtol=1e-6)
