"""Group-relative advantages, multi-signal normalisation and sampling importance weights.

A group is the J rollouts of one task (rows of a ``[G, J]`` reward matrix). Estimators are
registered by name in ``ADVANTAGE_ESTIMATORS`` with one signature:
``fn(rewards [G, J], *, eps, zero_variance_tol, valid) -> (advantages [G, J], zero_variance [G])``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from rubric_rl.util.registry import Registry

AdvantageEstimator = Callable[..., tuple[jnp.ndarray, jnp.ndarray]]
ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")


def _group_stats(rewards, valid, zero_variance_tol):
    """Mean, std (ddof = 1) and zero-variance flag over the valid members of each group."""
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [groups, J]; got shape {rewards.shape}")
    if valid is None:
        valid = jnp.ones(rewards.shape, bool)
    else:
        valid = jnp.asarray(valid).astype(bool)
        if valid.shape != rewards.shape:
            raise ValueError(f"valid must match rewards {rewards.shape}; got {valid.shape}")
    # Invalid members (reward could not be computed; may hold NaN) are replaced before any
    # arithmetic so they cannot leak into the statistics.
    r = jnp.where(valid, rewards, 0.0)
    n = jnp.sum(valid, axis=1).astype(jnp.float32)
    lowest = jnp.min(jnp.where(valid, r, jnp.inf), axis=1)
    lowest = jnp.where(n > 0, lowest, 0.0)
    # Shift by the group minimum first: r − min is exact in float32 for close rewards, so a tiny
    # real spread (just above the tolerance) is not swamped by rounding of a large mean.
    shifted = jnp.where(valid, r - lowest[:, None], 0.0)
    spread = jnp.max(shifted, axis=1)
    shifted_mean = jnp.sum(shifted, axis=1) / jnp.maximum(n, 1.0)
    mean = lowest + shifted_mean
    centred = jnp.where(valid, shifted - shifted_mean[:, None], 0.0)
    std = jnp.sqrt(jnp.sum(centred**2, axis=1) / jnp.maximum(n - 1.0, 1.0))
    # DESIGN §9: continuous rubric rewards are never exactly equal → spread below a tolerance,
    # not std == 0. A group with fewer than two valid members has no contrast either.
    # (a NaN reward with valid=None makes the spread NaN: not zero-variance, so the NaN reaches
    # the group's advantages instead of being silently zeroed)
    zero_variance = (n < 2) | (spread < zero_variance_tol)
    return r, valid, mean, std, centred, zero_variance


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantages(
    rewards: jnp.ndarray,
    *,
    eps: float = 1e-6,
    zero_variance_tol: float = 1e-6,
    valid: jnp.ndarray | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """GRPO: ``A_i = (r_i − mean_g r) / (std_g r + ε)``, std with ddof = 1 (DESIGN §5).

    Args:
      rewards: ``[G, J]`` rewards (rows are groups).
      eps: ε_A added to the std.
      zero_variance_tol: a group whose spread ``max − min`` over its valid members is below this
        is zero-variance; its advantages are exactly 0.
      valid: optional ``[G, J]`` bool; invalid members (e.g. a rollout whose reward could not be
        computed) get advantage 0 and are excluded from the group's mean/std/spread. ``None`` means
        all valid (a NaN reward then makes its group NaN, loudly).

    Returns:
      ``(advantages [G, J], zero_variance [G] bool)``; groups with < 2 valid members are
      zero-variance.
    """
    r, valid, mean, std, centred, zero_variance = _group_stats(rewards, valid, zero_variance_tol)
    adv = centred / (std[:, None] + eps)
    return jnp.where(valid & ~zero_variance[:, None], adv, 0.0), zero_variance


def mean_only_advantages(
    rewards: jnp.ndarray,
    *,
    eps: float = 1e-6,
    zero_variance_tol: float = 1e-6,
    valid: jnp.ndarray | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Dr.GRPO: ``A_i = r_i − mean_g r`` (no division by the std; ``eps`` is unused).

    Zero-variance and invalid-member handling are those of ``grpo_advantages``.
    """
    del eps
    r, valid, mean, std, centred, zero_variance = _group_stats(rewards, valid, zero_variance_tol)
    return jnp.where(valid & ~zero_variance[:, None], centred, 0.0), zero_variance


ADVANTAGE_ESTIMATORS.register("mean_only")(mean_only_advantages)
ADVANTAGE_ESTIMATORS.register("dr-grpo")(mean_only_advantages)


def multi_signal_advantages(
    signals: Mapping[str, jnp.ndarray],
    weights: Mapping[str, float],
    *,
    estimator: str = "grpo",
    eps: float = 1e-6,
    zero_variance_tol: float = 1e-6,
    valid: jnp.ndarray | Mapping[str, jnp.ndarray] | None = None,
) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    """Normalise each reward signal within its group, then take the weighted sum.

    ARISE: ``A = norm_g(r_task) + w_rubric · norm_g(r_rubric)``; with an empty rubric pool pass only
    the task signal. ``estimator`` names the per-signal normaliser (``ADVANTAGE_ESTIMATORS``);
    ``valid`` is one ``[G, J]`` mask for all signals or a dict with one per signal (a signal missing
    for a group: mark it invalid there and that signal contributes 0 to the group).

    Returns ``(advantages [G, J], {signal: zero_variance [G]})``.
    """
    if not signals:
        raise ValueError("multi_signal_advantages: no reward signals given")
    if set(signals) != set(weights):
        raise ValueError(
            f"multi_signal_advantages: signals {sorted(signals)} and weights {sorted(weights)} "
            f"must name the same rewards"
        )
    normalise = ADVANTAGE_ESTIMATORS.get(estimator)
    total = None
    zero_variance = {}
    for name in sorted(signals):
        signal_valid = valid.get(name) if isinstance(valid, Mapping) else valid
        adv, zero_variance[name] = normalise(
            signals[name], eps=eps, zero_variance_tol=zero_variance_tol, valid=signal_valid
        )
        term = float(weights[name]) * adv
        total = term if total is None else total + term
    return total, zero_variance


def importance_weights(probs: jnp.ndarray, drawn_ids: jnp.ndarray) -> jnp.ndarray:
    """Sampling correction ``u = 1 / (N p_i)`` for each draw (HarnessRL §2.1, after PER).

    Args:
      probs: ``[N]`` the sampling distribution ``p_i = w_i / Σ w`` over the N tasks.
      drawn_ids: ``[B]`` the task index of each draw.

    With concrete inputs, a draw of a task with ``p = 0``, an id out of range, negative
    probabilities or probabilities not summing to 1 raise ``ValueError`` naming the draw/task.
    Under ``jit`` no check is possible: a ``p = 0`` draw yields ``inf``.
    """
    probs = jnp.asarray(probs, jnp.float32)
    drawn_ids = jnp.asarray(drawn_ids)
    if probs.ndim != 1 or drawn_ids.ndim != 1:
        raise ValueError(
            f"importance_weights: probs must be [N] and drawn_ids [B]; got {probs.shape} and "
            f"{drawn_ids.shape}"
        )
    num_tasks = probs.shape[0]
    try:
        p, ids = np.asarray(probs), np.asarray(drawn_ids)
    except jax.errors.TracerArrayConversionError:
        p = ids = None  # traced: values unknown here
    if p is not None:
        if (p < 0).any() or abs(float(p.sum()) - 1.0) > 1e-4:
            raise ValueError(
                f"importance_weights: probs must be a distribution (non-negative, summing to 1); "
                f"got min {p.min():.3g}, sum {p.sum():.6g}"
            )
        bad = np.flatnonzero((ids < 0) | (ids >= num_tasks))
        if bad.size:
            raise ValueError(
                f"importance_weights: draw {bad[0]} has task id {ids[bad[0]]}, outside [0, "
                f"{num_tasks})"
            )
        zero = np.flatnonzero(p[ids] <= 0)
        if zero.size:
            raise ValueError(
                f"importance_weights: draw {zero[0]} picked task {ids[zero[0]]} whose sampling "
                f"probability is 0, so u = 1/(N p) is undefined (a task with weight 0 cannot be "
                f"drawn)"
            )
    return 1.0 / (num_tasks * probs[drawn_ids])
