"""Policy loss (PPO clip + dual clip), KL to a reference, and self-distillation terms.

Every loss returns ``(numerator_sum, denominator, metrics)``: the caller sums numerators and
denominators over micro-batches and divides once (``core/aggregation.py``); metrics are scalars
keyed ``name/sum``, ``name/count``, ``name/max`` and combine with
``aggregation.combine_metrics`` / ``finalize_metrics``.

Rollout correction (engine vs trainer log-probs) lives in ``core/rollout_correction.py`` and is
re-exported here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from rubric_rl.core.aggregation import aggregate, masked_max_part, masked_mean_parts
from rubric_rl.core.rollout_correction import (  # noqa: F401  (re-exported API)
    REJECTION_STATISTICS,
    ROLLOUT_CORRECTION_PRESETS,
    RolloutCorrection,
    rollout_correction,
)
from rubric_rl.util.registry import Registry

KL_ESTIMATORS: Registry[Callable] = Registry("KL estimator")

# DESIGN §5: ρ = exp(clip(lp_θ − lp_old, ±20)) keeps exp finite for wildly off-policy tokens.
LOG_RATIO_CLAMP = 20.0


def _per_token_advantages(advantages: jnp.ndarray, shape: tuple[int, ...]) -> jnp.ndarray:
    if advantages.shape == shape[:1]:
        return advantages[:, None]
    if advantages.shape == shape:
        return advantages
    raise ValueError(
        f"advantages must be [B]={shape[:1]} or [B, T]={shape}; got {advantages.shape}"
    )


def _check_same_shape(**arrays) -> None:
    shapes = {name: a.shape for name, a in arrays.items() if a is not None}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"expected equal [B, T] shapes; got {shapes}")


# ----------------------------------------------------------------------------- PPO


def ppo_per_token(
    logps: jnp.ndarray,
    old_logps: jnp.ndarray,
    advantages: jnp.ndarray,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    dual_clip_c: float | None = 3.0,
) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    """PPO clipped surrogate per token (DESIGN §5), with asymmetric ε and the dual clip.

    ``ρ = exp(clip(lp − lp_old, ±20))``; ``L = max(−A ρ, −A clip(ρ, 1 − ε_lo, 1 + ε_hi))``; for
    ``A < 0`` also ``L = min(L, −c A)`` (dual clip, c > 1; ``None`` disables it).

    Returns ``(loss [B, T], parts)`` where ``parts`` holds per-token arrays for metrics:
    ``ratio``, ``clipped_low`` (A < 0 and ρ < 1 − ε_lo: the clipped branch is taken, zero gradient),
    ``clipped_high`` (A > 0 and ρ > 1 + ε_hi), ``dual_clipped`` (A < 0 and −cA < L) and
    ``approx_kl`` (k3 estimate of KL(π_old ‖ π_θ): ``ρ − 1 − log ρ``).
    """
    if dual_clip_c is not None and not dual_clip_c > 1.0:
        raise ValueError(f"dual_clip_c must be > 1 (or None to disable); got {dual_clip_c}")
    if not (0.0 <= clip_eps_low < 1.0 and clip_eps_high >= 0.0):
        raise ValueError(
            f"need 0 ≤ clip_eps_low < 1 and clip_eps_high ≥ 0; got {clip_eps_low}, {clip_eps_high}"
        )
    _check_same_shape(logps=logps, old_logps=old_logps)
    adv = _per_token_advantages(advantages, logps.shape).astype(jnp.float32)
    log_ratio = logps.astype(jnp.float32) - old_logps.astype(jnp.float32)
    log_ratio = jnp.clip(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    loss = jnp.maximum(unclipped, clipped)
    parts = {
        "ratio": ratio,
        "clipped_low": (adv < 0) & (clipped > unclipped),
        "clipped_high": (adv > 0) & (clipped > unclipped),
        "approx_kl": ratio - 1.0 - log_ratio,
    }
    if dual_clip_c is not None:
        dual = -dual_clip_c * adv
        dual_clipped = (adv < 0) & (dual < loss)
        parts["dual_clipped"] = dual_clipped
        # where, not minimum: at a tie the gradient is the unclipped one, matching the flag
        loss = jnp.where(dual_clipped, dual, loss)
    else:
        parts["dual_clipped"] = jnp.zeros(loss.shape, bool)
    return loss, parts


def policy_loss(
    logps: jnp.ndarray,
    old_logps: jnp.ndarray,
    advantages: jnp.ndarray,
    loss_mask: jnp.ndarray,
    *,
    is_weights: jnp.ndarray | None = None,
    seq_weights: jnp.ndarray | None = None,
    agg_mode: str = "token-mean",
    agg_constant: float | None = None,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    dual_clip_c: float | None = 3.0,
) -> tuple[jnp.ndarray, jnp.ndarray, dict[str, jnp.ndarray]]:
    """PPO/GRPO policy loss ``(num, den, metrics)``.

    Per token ``is_w · L_ppo`` (``is_weights`` from ``rollout_correction``, held constant here),
    aggregated over ``loss_mask`` under ``agg_mode`` with ``seq_weights`` (importance weights u).
    Metrics (token means over the mask, see module docstring): ``clip_frac_low``,
    ``clip_frac_high``, ``dual_clip_frac``, ``approx_kl_old``, ``ratio`` and ``ratio/max``.
    """
    loss, parts = ppo_per_token(
        logps,
        old_logps,
        advantages,
        clip_eps_low=clip_eps_low,
        clip_eps_high=clip_eps_high,
        dual_clip_c=dual_clip_c,
    )
    _check_same_shape(logps=logps, loss_mask=loss_mask, is_weights=is_weights)
    if is_weights is not None:
        loss = loss * jax.lax.stop_gradient(is_weights)
    num, den = aggregate(
        loss, loss_mask, mode=agg_mode, seq_weights=seq_weights, constant=agg_constant
    )
    metrics = {}
    for name, part in (
        ("clip_frac_low", parts["clipped_low"]),
        ("clip_frac_high", parts["clipped_high"]),
        ("dual_clip_frac", parts["dual_clipped"]),
        ("approx_kl_old", parts["approx_kl"]),
        ("ratio", parts["ratio"]),
    ):
        metrics |= masked_mean_parts(f"actor/{name}", jax.lax.stop_gradient(part), loss_mask)
    metrics |= masked_max_part("actor/ratio", jax.lax.stop_gradient(parts["ratio"]), loss_mask)
    return num, den, metrics


# ----------------------------------------------------------------------------- KL to reference


@KL_ESTIMATORS.register("k1")
def _k1(log_ratio: jnp.ndarray) -> jnp.ndarray:
    return log_ratio


@KL_ESTIMATORS.register("k2")
def _k2(log_ratio: jnp.ndarray) -> jnp.ndarray:
    return 0.5 * jnp.square(log_ratio)


@KL_ESTIMATORS.register("k3")
def _k3(log_ratio: jnp.ndarray) -> jnp.ndarray:
    return jnp.exp(-log_ratio) + log_ratio - 1.0


def kl_per_token(
    logps: jnp.ndarray, ref_logps: jnp.ndarray, *, kind: str = "k3", clamp: float = 10.0
) -> jnp.ndarray:
    """Per-token estimate of KL(π_θ ‖ π_ref) on tokens sampled from π_θ, ``d = lp − lp_ref``.

    ``k1 = d``, ``k2 = ½ d²``, ``k3 = exp(−d) + d − 1`` (Schulman's low-variance estimator). ``d``
    is clamped to ``±clamp`` first (zero gradient beyond it) so ``exp`` cannot overflow.

    Gradients when used as a loss on on-policy samples (sample held fixed, as here):
    k1 gives ``∇lp`` whose expectation is 0 — no regularisation at all (Tunix's default pitfall);
    k2 gives ``d ∇lp``, the exact gradient of the reverse KL(π_θ ‖ π_ref);
    k3 gives ``(1 − π_ref/π_θ) ∇lp``, the gradient of the forward KL(π_ref ‖ π_θ).
    """
    _check_same_shape(logps=logps, ref_logps=ref_logps)
    log_ratio = logps.astype(jnp.float32) - jax.lax.stop_gradient(ref_logps).astype(jnp.float32)
    log_ratio = jnp.clip(log_ratio, -clamp, clamp)
    return KL_ESTIMATORS.get(kind)(log_ratio)


def kl_penalty_loss(
    logps: jnp.ndarray,
    ref_logps: jnp.ndarray,
    loss_mask: jnp.ndarray,
    *,
    kind: str = "k3",
    clamp: float = 10.0,
    seq_weights: jnp.ndarray | None = None,
    agg_mode: str = "token-mean",
    agg_constant: float | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray, dict[str, jnp.ndarray]]:
    """KL-to-reference term ``(num, den, metrics)``; the step adds ``β · num / den``."""
    kl = kl_per_token(logps, ref_logps, kind=kind, clamp=clamp)
    num, den = aggregate(
        kl, loss_mask, mode=agg_mode, seq_weights=seq_weights, constant=agg_constant
    )
    return num, den, masked_mean_parts(f"kl_ref/{kind}", jax.lax.stop_gradient(kl), loss_mask)


# ----------------------------------------------------------------------------- self-distillation
# RG-SED eq. 13 / RISED §3: L_SD = Σ_t KL(π_θ(·|h_t, p) ‖ sg[π_θ(·|h_t, p ⊕ m)]) on the
# student's own trajectories; the teacher is the same parameters with privileged context m.


def _softmax_logps(logits: jnp.ndarray, temperature: float) -> jnp.ndarray:
    return jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)


def _kl_terms(log_p: jnp.ndarray, log_q: jnp.ndarray) -> jnp.ndarray:
    """``p (log p − log q)`` elementwise, 0 where p = 0 (with a finite gradient there)."""
    p_zero = jnp.isneginf(log_p)
    safe_p = jnp.where(p_zero, 0.0, log_p)
    safe_q = jnp.where(p_zero, 0.0, log_q)
    return jnp.where(p_zero, 0.0, jnp.exp(safe_p) * (safe_p - safe_q))


def reverse_kl_from_logits(
    student_logits: jnp.ndarray, teacher_logits: jnp.ndarray, temperature: float = 1.0
) -> jnp.ndarray:
    """``full`` estimator: exact ``KL(p_s ‖ sg p_t)`` over the vocabulary, ``[..., V] → [...]``.

    Both distributions are ``softmax(logits / temperature)`` in float32; the teacher is under
    ``stop_gradient``. Identical logits give exactly 0 (empty teacher context, RISED E.6).
    """
    log_s = _softmax_logps(student_logits, temperature)
    log_t = jax.lax.stop_gradient(_softmax_logps(teacher_logits, temperature))
    return jnp.sum(_kl_terms(log_s, log_t), axis=-1)


def topk_tail_reverse_kl(
    student_logits: jnp.ndarray,
    teacher_logits: jnp.ndarray,
    k: int,
    temperature: float = 1.0,
) -> jnp.ndarray:
    """``topk`` estimator: reverse KL over ``k + 1`` buckets, ``[..., V] → [...]``.

    Buckets: the k tokens the STUDENT rates most probable, plus one tail bucket holding the rest
    of each distribution's mass (``1 − Σ top-k``, computed as a log-sum-exp over the complement so
    it stays accurate when the tail is tiny). Teacher under ``stop_gradient``. Requires
    ``1 ≤ k < V``.
    """
    vocab = student_logits.shape[-1]
    if not 1 <= k < vocab:
        raise ValueError(f"topk_tail_reverse_kl: need 1 ≤ k < V={vocab}; got k={k}")
    log_s = _softmax_logps(student_logits, temperature)
    log_t = jax.lax.stop_gradient(_softmax_logps(teacher_logits, temperature))
    _, top_idx = jax.lax.top_k(jax.lax.stop_gradient(log_s), k)
    top_s = jnp.take_along_axis(log_s, top_idx, axis=-1)
    top_t = jnp.take_along_axis(log_t, top_idx, axis=-1)
    in_top = jnp.put_along_axis(jnp.zeros(log_s.shape, bool), top_idx, True, axis=-1, inplace=False)
    tail_s = jax.nn.logsumexp(jnp.where(in_top, -jnp.inf, log_s), axis=-1)
    tail_t = jax.nn.logsumexp(jnp.where(in_top, -jnp.inf, log_t), axis=-1)
    buckets_s = jnp.concatenate([top_s, tail_s[..., None]], axis=-1)
    buckets_t = jnp.concatenate([top_t, tail_t[..., None]], axis=-1)
    return jnp.sum(_kl_terms(buckets_s, buckets_t), axis=-1)


def generalized_jsd_from_logits(
    student_logits: jnp.ndarray,
    teacher_logits: jnp.ndarray,
    beta: float = 0.5,
    temperature: float = 1.0,
) -> jnp.ndarray:
    """``jsd`` estimator: generalised Jensen–Shannon divergence ``JSD_β``, ``[..., V] → [...]``.

    GKD (Agarwal et al., arXiv 2306.13649), in the convention of TRL's ``GKDTrainer``
    (notes/baselines.md §7.2)::

        M     = β·p_T + (1 − β)·p_S
        JSD_β = β·KL(p_T ‖ M) + (1 − β)·KL(p_S ‖ M)

    with β the weight of the TEACHER in the mixture. ``log M`` is formed in log space as
    ``logaddexp(log β + log p_T, log(1 − β) + log p_S)`` (a two-term log-sum-exp), never by
    exponentiating. As TRL does, the endpoints are special-cased: β = 0 is the forward KL
    ``KL(p_T ‖ p_S)`` and β = 1 the reverse KL ``KL(p_S ‖ p_T)`` (the ``full`` estimator). These
    are the limits of ``JSD_β / β`` (β → 0) and ``JSD_β / (1 − β)`` (β → 1), not of ``JSD_β``
    itself, which goes to 0 at both ends; so the value jumps at the endpoints, as in TRL.
    Symmetry: ``JSD_β(s, t) = JSD_{1−β}(t, s)`` (values; the gradient only reaches the student).

    Both distributions are ``softmax(logits / temperature)`` in float32; the teacher is under
    ``stop_gradient``. ``beta`` is a static Python number in ``[0, 1]`` (ValueError otherwise).
    Identical logits give exactly 0: a vocabulary entry with ``p_S = p_T`` has ``M = p_S``, so
    its term is set to 0 outright (its true gradient there is 0 too, so this costs nothing).
    """
    beta = float(beta)
    if not 0.0 <= beta <= 1.0:  # also rejects NaN
        raise ValueError(f"generalized_jsd_from_logits: need 0 ≤ beta ≤ 1; got beta={beta}")
    log_s = _softmax_logps(student_logits, temperature)
    log_t = jax.lax.stop_gradient(_softmax_logps(teacher_logits, temperature))
    if beta == 0.0:  # TRL: forward KL(p_T ‖ p_S)
        return jnp.sum(_kl_terms(log_t, log_s), axis=-1)
    if beta == 1.0:  # TRL: reverse KL(p_S ‖ p_T)
        return jnp.sum(_kl_terms(log_s, log_t), axis=-1)
    # An entry with p_S = p_T = 0 would give logaddexp(−inf, −inf), whose gradient is NaN; its
    # terms are 0 whatever M is, so feed it finite stand-ins.
    both_zero = jnp.isneginf(log_s) & jnp.isneginf(log_t)
    log_m = jnp.logaddexp(
        math.log(beta) + jnp.where(both_zero, 0.0, log_t),
        math.log1p(-beta) + jnp.where(both_zero, 0.0, log_s),
    )
    terms = beta * _kl_terms(log_t, log_m) + (1.0 - beta) * _kl_terms(log_s, log_m)
    # p_S = p_T at an entry ⇒ M = p_S there and both of its terms vanish; log-sum-exp rounding
    # would leave ~1 ulp, so make it exact (the per-entry derivative there is exactly 0 as well).
    terms = jnp.where(log_s == log_t, 0.0, terms)
    return jnp.sum(terms, axis=-1)


def _sd_gate(
    sd_coef: jnp.ndarray, sd_mask: jnp.ndarray, shape: tuple[int, ...]
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``(active, coef)``: ``active`` is ``[B, 1]`` for a ``[B]`` mask (broadcasts over tokens,
    exactly as before per-token masks existed) or ``[B, T]`` for a per-token mask (e.g. only the
    final turn of a multi-turn rollout is distilled); ``coef`` is ``[B, 1]`` float32."""
    if sd_coef.shape != shape[:1] or sd_mask.shape not in (shape[:1], shape):
        raise ValueError(
            f"sd_coef must be [B]={shape[:1]} and sd_mask [B]={shape[:1]} or [B, T]={shape}; "
            f"got {sd_coef.shape}, {sd_mask.shape}"
        )
    active = sd_mask != 0
    if active.ndim == 1:
        active = active[:, None]
    return active, jnp.asarray(sd_coef, jnp.float32)[:, None]


def sd_loss_from_kl(
    kl_per_token: jnp.ndarray,
    loss_mask: jnp.ndarray,
    sd_coef: jnp.ndarray,
    sd_mask: jnp.ndarray,
    *,
    seq_weights: jnp.ndarray | None = None,
    agg_mode: str = "token-mean",
    agg_constant: float | None = None,
) -> tuple[jnp.ndarray, jnp.ndarray, dict[str, jnp.ndarray]]:
    """Self-distillation loss for the per-logit estimators (``full`` / ``topk`` / ``jsd``):
    ``(num, den, metrics)``.

    Per token ``λ_b · KL_bt`` where ``sd_mask`` is on, exactly 0 elsewhere; ``sd_mask`` is ``[B]``
    (whole sequences) or ``[B, T]`` (per token, prediction layout like ``loss_mask``). ``λ_b`` =
    ``sd_coef`` (gates and schedules are computed outside). The denominator is that of the policy
    loss (all of ``loss_mask``), so ``λ`` keeps its meaning as a ratio to L_RL and a batch with few
    gated-on groups gets proportionally less distillation; pass ``loss_mask`` times the SD mask
    to average over distilled tokens only. Metrics: ``sd/kl`` (mean over distilled tokens),
    ``sd/active_frac`` (share of the sequences with loss tokens that have ≥ 1 distilled token),
    ``sd/coef`` (mean λ over those).
    """
    _check_same_shape(kl_per_token=kl_per_token, loss_mask=loss_mask)
    active, coef = _sd_gate(sd_coef, sd_mask, kl_per_token.shape)
    per_token = jnp.where(active, coef * kl_per_token, 0.0)
    num, den = aggregate(
        per_token, loss_mask, mode=agg_mode, seq_weights=seq_weights, constant=agg_constant
    )
    distilled = active & (loss_mask != 0)
    metrics = masked_mean_parts("sd/kl", jax.lax.stop_gradient(kl_per_token), distilled)
    has_tokens = jnp.any(loss_mask != 0, axis=-1)
    seq_active = jnp.any(distilled, axis=-1)  # for a [B] mask: sd_mask on, where has_tokens
    metrics |= masked_mean_parts("sd/active_frac", seq_active, has_tokens)
    metrics |= masked_mean_parts("sd/coef", coef[:, 0], seq_active)
    return num, den, metrics


def sampled_sd_advantage(
    logps: jnp.ndarray,
    teacher_logps: jnp.ndarray,
    sd_coef: jnp.ndarray,
    sd_mask: jnp.ndarray,
    *,
    clamp: float = 10.0,
) -> jnp.ndarray:
    """``sampled`` estimator: per-token ``λ_b · min(lp_θ(y_t) − sg lp_T(y_t), clamp)``, ``[B, T]``.

    SUBTRACT it from the per-token advantages (ARISE-RL authors' code:
    ``A_t ← A_t − λ (s_lp − t_lp)`` with the log-ratio clamped above at 10); it is then a per-token
    reward whose REINFORCE gradient is the reverse-KL gradient, so the caller must hold the
    adjusted advantages constant (the authors take ``lp_θ`` from the no-grad π_old pass). Exactly 0
    where ``sd_mask = 0`` (``[B]`` per sequence or ``[B, T]`` per token) and where the teacher's
    context is empty (identical log-probs).
    """
    _check_same_shape(logps=logps, teacher_logps=teacher_logps)
    active, coef = _sd_gate(sd_coef, sd_mask, logps.shape)
    log_ratio = logps.astype(jnp.float32) - jax.lax.stop_gradient(teacher_logps).astype(jnp.float32)
    log_ratio = jnp.minimum(log_ratio, clamp)
    return jnp.where(active, coef * log_ratio, 0.0)


@dataclasses.dataclass(frozen=True)
class SDEstimator:
    """How a self-distillation estimator enters the step.

    ``per_token_kl(student_logits, teacher_logits, temperature=..., **options) -> [...]`` is
    evaluated by ``logprobs.py`` inside its sequence chunks and fed to ``sd_loss_from_kl`` (for
    ``jsd`` the "KL" is the divergence ``JSD_β``). ``logprobs._kl_fn`` binds the options by
    parameter name: ``k`` ← ``TrainConfig.sd_topk``, ``beta`` ← ``TrainConfig.sd_jsd_beta``. An
    estimator that ``folds_into_advantage`` instead needs only the two sampled-token log-probs
    and ``sampled_sd_advantage``.
    """

    name: str
    folds_into_advantage: bool
    per_token_kl: Callable[..., jnp.ndarray] | None = None


# The one definition of the SD estimators: TrainConfig and the config validation read it through
# ``sd_estimator_names``.
SD_ESTIMATORS: Registry[SDEstimator] = Registry("self-distillation estimator")
SD_ESTIMATORS.register("full")(SDEstimator("full", False, reverse_kl_from_logits))
SD_ESTIMATORS.register("topk")(SDEstimator("topk", False, topk_tail_reverse_kl))
SD_ESTIMATORS.register("jsd")(SDEstimator("jsd", False, generalized_jsd_from_logits))
SD_ESTIMATORS.register("sampled")(SDEstimator("sampled", True, None))


def sd_estimator_names() -> tuple[str, ...]:
    """The valid values of an ``sd_estimator`` option: ``"none"`` (no distillation) and every
    registered estimator."""
    return ("none", *SD_ESTIMATORS.names())


def rejects(preset_name: str) -> bool:
    """Whether rollout-correction preset ``preset_name`` filters anything (a rejection band, token
    or sequence level, or the token veto), so its statistics need the trainer's step-start
    log-probs even in bypass mode (``RolloutCorrection.rejects``)."""
    return ROLLOUT_CORRECTION_PRESETS.get(preset_name).rejects
