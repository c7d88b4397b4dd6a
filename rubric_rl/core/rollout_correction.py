"""Rollout correction: importance-ratio filtering between the engine's and the trainer's log-probs.

DESIGN §5 "Importance-ratio filtering" (after verl's rollout-correction design). The engine that
sampled a token (``lp_roll``) and the trainer scoring it (``lp_old``, step-start weights) disagree
numerically; ``log w_t = lp_old − lp_roll`` measures by how much, per loss token.

Modes:
- ``bypass``: no extra forward; the caller uses ``lp_old := lp_roll`` in the PPO ratio, which then
  already corrects for the engine, so NO IS weights are applied here (multiplying them as well
  would correct twice — DESIGN §9). ``old_logps`` may be None; if given (e.g. the trainer's
  step-start log-probs) it is used for the diagnostics and for any rejection/veto only.
- ``decoupled``: PPO ratio against the recomputed ``lp_old``, times a correction: truncated IS
  ``w ← sg(min(w, C))`` per token (``tis="token"``) or per sequence (``tis="sequence"``,
  ``w_b = min(exp(Σ_t log w_t), C)``), and/or rejection.

Rejection: each ``(statistic, low, high)`` band zeroes the loss mask where the statistic leaves
``[low, high]`` (edges accepted; ``None`` = unbounded). Token-level statistics drop tokens,
sequence-level ones whole sequences. All bands, the veto and the sequence TIS weight are computed on
the ORIGINAL loss mask, so the chain does not depend on its order. Statistics (``m`` = loss mask):
- ``token_ratio`` (token): ``w_t = exp(log w_t)``; bounds are ratios.
- ``seq_geo_mean`` (sequence): ``exp(Σ_t m log w_t / Σ_t m)``, the geometric-mean ratio; bounds are
  ratios.
- ``seq_sum`` (sequence): ``exp(Σ_t m log w_t) = Π_t w_t``, the sequence-level IS ratio; bounds are
  ratios (compared in log space, so long sequences cannot overflow).
- ``seq_mean_k1`` / ``k2`` / ``k3`` (sequence): token means of ``−log w``, ``½ (log w)²`` and
  ``w − 1 − log w`` — estimates of KL(π_roll ‖ π_old) on the engine's samples.
- token veto: drop the whole sequence if any loss token has ``w_t < token_veto`` (e.g. 1e-4).

Diagnostics are always returned (metric convention of ``core/aggregation.py``), under
``rollout_corr/``: ``abs_dlogp`` mean and max, ``k1``/``k2``/``k3`` token means,
``masked_token_frac``, ``dropped_seq_frac``, ``veto_seq_frac``, ``reject/<statistic>`` and
``is_weight`` mean and max over the tokens kept. Ship presets off and log the mismatch first.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from rubric_rl.core.aggregation import masked_max_part, masked_mean_parts
from rubric_rl.util.registry import Registry

_LOG_W_CLAMP = 20.0  # exp(±20) stays finite in float32


@dataclasses.dataclass(frozen=True)
class RejectionStatistic:
    """``fn(log_w [B,T], on [B,T] bool) ->`` the statistic (its log when ``ratio_scale``)."""

    level: str  # "token" | "sequence"
    ratio_scale: bool  # bounds are ratios, compared in log space
    fn: Callable[[jnp.ndarray, jnp.ndarray], jnp.ndarray]


def _seq_sum(values, on):
    return jnp.sum(jnp.where(on, values, 0.0), axis=-1)


def _seq_mean(values, on):
    count = jnp.sum(on, axis=-1)
    return _seq_sum(values, on) / jnp.maximum(count, 1)


def _k1(log_w):
    return -log_w


def _k2(log_w):
    return 0.5 * jnp.square(log_w)


def _k3(log_w):
    clamped = jnp.clip(log_w, -_LOG_W_CLAMP, _LOG_W_CLAMP)
    return jnp.exp(clamped) - 1.0 - clamped


REJECTION_STATISTICS: Registry[RejectionStatistic] = Registry("rejection statistic")
REJECTION_STATISTICS.register("token_ratio")(RejectionStatistic("token", True, lambda lw, on: lw))
REJECTION_STATISTICS.register("seq_geo_mean")(RejectionStatistic("sequence", True, _seq_mean))
REJECTION_STATISTICS.register("seq_sum")(RejectionStatistic("sequence", True, _seq_sum))
for _name, _k in (("seq_mean_k1", _k1), ("seq_mean_k2", _k2), ("seq_mean_k3", _k3)):
    REJECTION_STATISTICS.register(_name)(
        RejectionStatistic("sequence", False, lambda lw, on, _k=_k: _seq_mean(_k(lw), on))
    )


@dataclasses.dataclass(frozen=True)
class RolloutCorrection:
    """Static rollout-correction config (hashable, so it can be a static jit argument).

    Attributes:
      mode: ``"bypass"`` or ``"decoupled"`` (module docstring).
      tis: truncated IS level, ``None``, ``"token"`` or ``"sequence"`` (decoupled mode only).
      tis_cap: the truncation C (> 0).
      rejections: ``((statistic, low, high), ...)``; one band per statistic.
      token_veto: drop a sequence if any token ratio is below this (in (0, 1)); None = off.
    """

    mode: str = "decoupled"
    tis: str | None = None
    tis_cap: float = 2.0
    rejections: tuple[tuple[str, float | None, float | None], ...] = ()
    token_veto: float | None = None

    def __post_init__(self):
        where = "rollout correction"
        if self.mode not in ("bypass", "decoupled"):
            raise ValueError(f"{where}: mode must be 'bypass' or 'decoupled'; got {self.mode!r}")
        if self.tis not in (None, "token", "sequence"):
            raise ValueError(f"{where}: tis must be None, 'token' or 'sequence'; got {self.tis!r}")
        if self.mode == "bypass" and self.tis is not None:
            raise ValueError(
                f"{where}: bypass mode already uses π_roll as π_old; adding tis={self.tis!r} "
                f"would correct twice (use mode='decoupled')"
            )
        if not self.tis_cap > 0:
            raise ValueError(f"{where}: tis_cap must be > 0; got {self.tis_cap}")
        if self.token_veto is not None and not 0 < self.token_veto < 1:
            raise ValueError(f"{where}: token_veto must be in (0, 1); got {self.token_veto}")
        names = [r[0] for r in self.rejections]
        if len(set(names)) != len(names):
            raise ValueError(f"{where}: one band per statistic; got {names}")
        for band in self.rejections:
            if len(band) != 3:
                raise ValueError(f"{where}: a rejection is (statistic, low, high); got {band!r}")
            name, low, high = band
            stat = REJECTION_STATISTICS.get(name)
            if low is not None and high is not None and low > high:
                raise ValueError(f"{where}: band for {name!r} has low {low} > high {high}")
            if stat.ratio_scale and any(b is not None and b <= 0 for b in (low, high)):
                raise ValueError(f"{where}: {name!r} bounds are ratios and must be > 0; {band}")

    @property
    def rejects(self) -> bool:
        """Whether this correction filters anything (a token or sequence band, or the veto).

        Its statistics are computed on ``log w = lp_old − lp_roll``; in bypass mode with
        ``old_logps := rollout_logps`` they are identically 0 and nothing is ever rejected, so a
        caller must pass the trainer's step-start log-probs as ``old_logps`` whenever this is
        true (decoupled mode computes them anyway)."""
        return bool(self.rejections) or self.token_veto is not None


ROLLOUT_CORRECTION_PRESETS: Registry[RolloutCorrection] = Registry("rollout-correction preset")
_PRESETS = {
    # standard PPO against the recomputed π_old; the mismatch is only logged
    "off": RolloutCorrection(mode="decoupled"),
    "bypass": RolloutCorrection(mode="bypass"),
    "decoupled_token_tis": RolloutCorrection(tis="token", tis_cap=2.0),
    "decoupled_seq_tis": RolloutCorrection(tis="sequence", tis_cap=2.0),
    "geo_mask": RolloutCorrection(rejections=(("seq_geo_mean", 0.999, 1.001),)),
    # Ours: ten times geo_mask's band, for a bf16 server whose per-token mismatch would drop
    # most short sequences from the narrow one (docs/gpu.md works the figures out).
    "geo_mask_wide": RolloutCorrection(rejections=(("seq_geo_mean", 0.99, 1.01),)),
    "seq_sum_mask_tis": RolloutCorrection(
        tis="sequence", tis_cap=2.0, rejections=(("seq_sum", 0.5, 2.0),)
    ),
    "seq_mean_k3": RolloutCorrection(rejections=(("seq_mean_k3", None, 0.01),)),
}
for _name, _preset in _PRESETS.items():
    ROLLOUT_CORRECTION_PRESETS.register(_name)(_preset)
    # every preset also comes with verl's token veto at 1e-4: "<name>_veto"
    ROLLOUT_CORRECTION_PRESETS.register(f"{_name}_veto")(
        dataclasses.replace(_preset, token_veto=1e-4)
    )


def _in_band(value, low, high, log_space):
    accept = jnp.ones(value.shape, bool)
    if low is not None:
        accept &= value >= (math.log(low) if log_space else low)
    if high is not None:
        accept &= value <= (math.log(high) if log_space else high)
    return accept


def rollout_correction(
    old_logps: jnp.ndarray | None,
    rollout_logps: jnp.ndarray,
    loss_mask: jnp.ndarray,
    *,
    config: RolloutCorrection,
) -> tuple[jnp.ndarray, jnp.ndarray, dict[str, jnp.ndarray]]:
    """Apply ``config`` to one (micro-)batch.

    Args:
      old_logps: ``[B, T]`` trainer log-probs at step start (π_old); required in decoupled mode,
        optional in bypass mode (diagnostics and rejections only).
      rollout_logps: ``[B, T]`` the engine's behaviour log-probs.
      loss_mask: ``[B, T]`` tokens that count.

    Returns:
      ``(is_weights [B, T], loss_mask [B, T], metrics)``: IS weights under stop-gradient, already
      truncated, 1 where not applied (all ones in bypass mode or with ``tis=None``); the loss mask
      with rejected tokens/sequences zeroed (same dtype); diagnostics (module docstring).
    """
    if old_logps is None:
        if config.mode == "decoupled":
            raise ValueError("rollout correction: decoupled mode needs old_logps (π_old forward)")
        old_logps = rollout_logps
    if not old_logps.shape == rollout_logps.shape == loss_mask.shape:
        raise ValueError(
            f"rollout correction: old_logps {old_logps.shape}, rollout_logps "
            f"{rollout_logps.shape} and loss_mask {loss_mask.shape} must all be [B, T]"
        )
    on = loss_mask != 0
    has_tokens = jnp.any(on, axis=-1)
    log_w = jax.lax.stop_gradient(
        jnp.where(on, old_logps.astype(jnp.float32) - rollout_logps.astype(jnp.float32), 0.0)
    )
    metrics = masked_mean_parts("rollout_corr/abs_dlogp", jnp.abs(log_w), on)
    metrics |= masked_max_part("rollout_corr/abs_dlogp", jnp.abs(log_w), on)
    for name, k in (("k1", _k1), ("k2", _k2), ("k3", _k3)):
        metrics |= masked_mean_parts(f"rollout_corr/{name}", k(log_w), on)

    keep = on
    for name, low, high in config.rejections:
        stat = REJECTION_STATISTICS.get(name)
        accept = _in_band(stat.fn(log_w, on), low, high, stat.ratio_scale)
        if stat.level == "token":
            metrics |= masked_mean_parts(f"rollout_corr/reject/{name}", ~accept, on)
            keep &= accept
        else:
            metrics |= masked_mean_parts(f"rollout_corr/reject/{name}", ~accept, has_tokens)
            keep &= accept[:, None]
    if config.token_veto is not None:
        vetoed = jnp.any(on & (log_w < math.log(config.token_veto)), axis=-1)
        metrics |= masked_mean_parts("rollout_corr/veto_seq_frac", vetoed, has_tokens)
        keep &= ~vetoed[:, None]
    new_mask = jnp.where(keep, loss_mask, jnp.zeros_like(loss_mask))
    metrics |= masked_mean_parts("rollout_corr/masked_token_frac", on & ~keep, on)
    dropped = has_tokens & ~jnp.any(keep, axis=-1)
    metrics |= masked_mean_parts("rollout_corr/dropped_seq_frac", dropped, has_tokens)

    log_cap = math.log(config.tis_cap)
    if config.mode == "bypass" or config.tis is None:
        is_weights = jnp.ones(log_w.shape, jnp.float32)
    elif config.tis == "token":
        is_weights = jnp.exp(jnp.minimum(log_w, log_cap))
    else:
        seq_log_w = jnp.minimum(_seq_sum(log_w, on), log_cap)
        is_weights = jnp.broadcast_to(jnp.exp(seq_log_w)[:, None], log_w.shape)
    is_weights = jax.lax.stop_gradient(jnp.where(keep, is_weights, 1.0))
    metrics |= masked_mean_parts("rollout_corr/is_weight", is_weights, keep)
    metrics |= masked_max_part("rollout_corr/is_weight", is_weights, keep)
    return is_weights, new_mask, metrics
