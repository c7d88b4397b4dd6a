"""The train step's loss and exact micro-batched gradient (used by ``core/train_step.py``).

Steps 1–3 of the train step (see ``train_step.py``): rollout correction once on the whole batch,
the denominators of every loss part summed over the micro-batches, then the micro-batches under
``lax.scan`` with loss_mb = Σ_part num_part,mb / D_part, so grad = Σ_mb ∇num_mb / Σ_mb den_mb
exactly (denominators depend on masks and weights, never on the parameters).

The self-distillation teacher is the student's own parameters under ``stop_gradient`` (the
default), or an *external* teacher: a separate frozen parameter set ``teacher = (teacher_params,
teacher_rest)`` of a model built from ``teacher_graphdef`` — possibly another architecture (a
larger preset of the same family) as long as it shares the vocabulary. It is run on the batch's
teacher rows and its own ``unembed()`` gives the teacher logits (OPCD / GKD baselines).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rubric_rl.core import aggregation, losses, sharding
from rubric_rl.core.batch_types import TrainBatch, TrainConfig, is_decoupled
from rubric_rl.core.frozen_layers import stop_frozen
from rubric_rl.core.logprobs import chunked_token_stats, shift_targets, teacher_hidden_aligned

Array = jax.Array


def split_micro_batches(x: Any, m: int) -> Any:
    """[B, ...] -> [m, B/m, ...], strided (row i goes to micro-batch i % m) so that each
    micro-batch keeps an even share of every device's rows (no resharding)."""
    if x is None:
        return None
    b = x.shape[0]
    return jnp.swapaxes(x.reshape((b // m, m) + x.shape[1:]), 0, 1)


def _per_token(x: Array, shape: tuple[int, int]) -> Array:
    return jnp.broadcast_to(x[:, None], shape) if x.ndim == 1 else x


def _safe_div(num: Array, den: Array) -> Array:
    return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)


Teacher = tuple[nnx.State, nnx.State]  # (teacher_params, teacher_rest)


def check_teacher(
    config: TrainConfig, teacher: Teacher | None, teacher_graphdef: nnx.GraphDef | None
) -> Teacher | None:
    """Validates an external teacher; returns it as a ``(params, rest)`` tuple (or None)."""
    if teacher is None:
        return None
    if teacher_graphdef is None:
        raise ValueError(
            "an external teacher (teacher=(teacher_params, teacher_rest)) needs its "
            "teacher_graphdef (make_train_step(..., teacher_graphdef=...))"
        )
    if not config.needs_teacher:
        raise ValueError(
            f"an external teacher was given but sd_estimator={config.sd_estimator!r} uses no "
            "teacher (no self-distillation term)"
        )
    if not isinstance(teacher, (tuple, list)) or len(teacher) != 2:
        raise ValueError(
            "teacher must be a (teacher_params, teacher_rest) pair of nnx.State, "
            f"got {type(teacher).__name__}"
        )
    return tuple(teacher)


def _check_batch(config: TrainConfig, batch: TrainBatch, has_ref_params: bool) -> None:
    b = batch.input_ids.shape[0]
    if b % config.num_micro_batches:
        raise ValueError(
            f"batch size {b} is not divisible by TrainConfig.num_micro_batches="
            f"{config.num_micro_batches}"
        )
    if config.needs_teacher:
        for f in ("teacher_input_ids", "teacher_offset", "sd_mask", "sd_coef"):
            if getattr(batch, f) is None:
                raise ValueError(
                    f"TrainBatch.{f} is required by sd_estimator={config.sd_estimator!r}"
                )
    if batch.sd_mask is not None and batch.sd_mask.shape not in ((b,), batch.loss_mask.shape):
        raise ValueError(
            f"TrainBatch.sd_mask must be [B]={(b,)} or [B, T]={batch.loss_mask.shape} (like "
            f"loss_mask); got {batch.sd_mask.shape}"
        )
    if config.needs_old_logps and batch.old_logps is None:
        raise ValueError(
            f"TrainBatch.old_logps is required by rollout_correction={config.rollout_correction!r}"
            " (compute it with compute_logps at step start)"
        )
    if config.kl_beta > 0 and batch.ref_logps is None and not has_ref_params:
        raise ValueError("kl_beta > 0 needs TrainBatch.ref_logps or ref_params")


def _policy_inputs(config: TrainConfig, batch: TrainBatch) -> tuple[Array, Array, Array, dict]:
    """Rollout correction on the whole batch: (old_logps for the ratio, is_weights, loss_mask,
    metrics). Bypass: ``old := rollout`` and the IS weights are all ones (DESIGN §9: no double
    correction); a given ``batch.old_logps`` then only feeds diagnostics and rejections."""
    rc = losses.ROLLOUT_CORRECTION_PRESETS.get(config.rollout_correction)
    is_weights, loss_mask, metrics = losses.rollout_correction(
        batch.old_logps, batch.rollout_logps, batch.loss_mask, config=rc
    )
    old = batch.old_logps if is_decoupled(rc) else batch.rollout_logps
    return old, is_weights, loss_mask, metrics


def _part_terms(
    config: TrainConfig,
    mb: dict[str, Any],
    logps: Array,
    kl_sd: Array | None,
    teacher_logps: Array | None,
    ref_logps: Array | None,
) -> tuple[dict[str, tuple[Array, Array]], dict[str, Array]]:
    """(num, den) of each loss part on one micro-batch + metrics (aggregation.py convention)."""
    shape = mb["loss_mask"].shape
    adv = _per_token(mb["advantages"], shape).astype(jnp.float32)
    metrics: dict[str, Array] = {}
    parts: dict[str, tuple[Array, Array]] = {}
    if config.sd_folds_into_advantage:
        # ARISE-RL code: A_t ← A_t − λ·min(lp_θ − sg lp_T, 10), held constant (a per-token
        # reward whose REINFORCE gradient is the reverse-KL gradient).
        # "old": lp_θ is π_old's (the authors' qqr), else the live forward under stop-gradient.
        student = mb["old_logps"] if config.sd_sampled_logps == "old" else logps
        adv = adv - jax.lax.stop_gradient(
            losses.sampled_sd_advantage(
                student, teacher_logps, mb["sd_coef"], mb["sd_mask"], clamp=config.sd_clamp
            )
        )
    num, den, m = losses.policy_loss(
        logps,
        mb["old_logps"],
        adv,
        mb["loss_mask"],
        is_weights=mb["is_weights"],
        seq_weights=mb["seq_weights"],
        agg_mode=config.agg_mode,
        agg_constant=config.agg_constant,
        clip_eps_low=config.clip_eps_low,
        clip_eps_high=config.clip_eps_high,
        dual_clip_c=config.dual_clip_c,
    )
    parts["policy"] = (num, den)
    metrics.update(m)
    if config.sd_per_token_kl:
        num, den, m = losses.sd_loss_from_kl(
            kl_sd,
            mb["loss_mask"],
            mb["sd_coef"],
            mb["sd_mask"],
            agg_mode=config.sd_agg_mode or config.agg_mode,
            agg_constant=config.agg_constant,
            seq_weights=mb["seq_weights"],
        )
        parts["sd"] = (num, den)
        metrics.update(m)
    if config.kl_beta > 0:
        num, den, m = losses.kl_penalty_loss(
            logps,
            ref_logps,
            mb["loss_mask"],
            kind=config.kl_kind,
            seq_weights=mb["seq_weights"],
            agg_mode=config.agg_mode,
            agg_constant=config.agg_constant,
        )
        parts["kl_ref"] = (config.kl_beta * num, den)
        metrics.update(m)
    return parts, metrics


def _micro_batch_loss(
    params: nnx.State,
    rest: nnx.State,
    graphdef: nnx.GraphDef,
    config: TrainConfig,
    mb: dict[str, Any],
    dens: dict[str, Array],
    ref_params: nnx.State | None,
    teacher: Teacher | None = None,
    teacher_graphdef: nnx.GraphDef | None = None,
) -> tuple[Array, tuple[dict[str, Array], dict[str, Array]]]:
    # Frozen layers (TrainConfig.trainable_layers) enter under stop_gradient: no backward for them.
    model = nnx.merge(graphdef, stop_frozen(params, config.trainable_layers), rest)
    ids = mb["input_ids"]
    hidden = model.hidden_states(ids, mb["positions"], mb["attention_mask"])
    targets = shift_targets(ids)
    teacher_hidden = teacher_unembed = None
    if config.needs_teacher:
        # stop_gradient on the parameters also drops the teacher's backward pass entirely.
        if teacher is None:
            # self-teacher: same parameters, no second copy
            teacher_model = nnx.merge(graphdef, jax.lax.stop_gradient(params), rest)
        else:
            # external frozen teacher (own architecture, own LM head, same vocabulary)
            teacher_params, teacher_rest = teacher
            teacher_model = nnx.merge(
                teacher_graphdef, jax.lax.stop_gradient(teacher_params), teacher_rest
            )
            teacher_unembed = teacher_model.unembed()
        teacher_hidden, valid = teacher_hidden_aligned(
            teacher_model,
            mb["teacher_input_ids"],
            mb["teacher_positions"],
            mb["teacher_attention_mask"],
            mb["teacher_offset"],
            ids.shape[1],
        )
    kl_est = config.sd_estimator if config.sd_per_token_kl else None
    stats = chunked_token_stats(
        hidden,
        model.unembed(),
        targets,
        teacher_hidden,
        temperature=config.temperature,
        chunk_size=config.chunk_size,
        with_entropy=True,
        kl_estimator=kl_est,
        k=config.sd_topk,
        jsd_beta=config.sd_jsd_beta,
        with_teacher_logps=config.sd_folds_into_advantage,
        teacher_unembed=teacher_unembed,
    )
    logps = stats["logps"]
    kl_sd = stats.get("kl")
    teacher_logps = stats.get("teacher_logps")
    if kl_sd is not None:
        kl_sd = jnp.where(valid, kl_sd, 0.0)
    if teacher_logps is not None:
        teacher_logps = jnp.where(valid, teacher_logps, jax.lax.stop_gradient(logps))
    ref_logps = mb.get("ref_logps")
    if config.kl_beta > 0 and ref_params is not None:
        ref_model = nnx.merge(graphdef, jax.lax.stop_gradient(ref_params), rest)
        ref_hidden = ref_model.hidden_states(ids, mb["positions"], mb["attention_mask"])
        ref_logps = chunked_token_stats(
            ref_hidden,
            ref_model.unembed(),
            targets,
            temperature=config.temperature,
            chunk_size=config.chunk_size,
        )["logps"]
    parts, metrics = _part_terms(config, mb, logps, kl_sd, teacher_logps, ref_logps)
    loss = sum(_safe_div(num, dens[name]) for name, (num, _) in parts.items())
    lm = mb["loss_mask"]
    metrics.update(aggregation.masked_mean_parts("entropy", stats["entropy"], lm))
    metrics.update(aggregation.masked_mean_parts("logp", logps, lm))
    if config.needs_teacher:
        sd_tokens = lm * _per_token(mb["sd_mask"], lm.shape)
        # A distilled token whose teacher position t + offset falls outside the teacher row gets
        # no SD term at all (masked above); count them instead of losing them silently.
        metrics.update(aggregation.masked_mean_parts("sd/out_of_range_frac", ~valid, sd_tokens))
        if teacher_logps is not None:
            metrics.update(
                aggregation.masked_mean_parts("sd/logp_gap", logps - teacher_logps, sd_tokens)
            )
    nums = {name: num for name, (num, _) in parts.items()}
    dens_mb = {name: den for name, (_, den) in parts.items()}
    return loss, (nums, dens_mb, jax.lax.stop_gradient(metrics))


def _micro_batch_dens(config: TrainConfig, mb: dict[str, Any]) -> dict[str, Array]:
    """Each part's denominator on one micro-batch, with parameter-free stand-ins for log-probs
    (a denominator depends only on masks, weights and constants)."""
    stand_in = mb["old_logps"]
    zeros = jnp.zeros_like(stand_in)
    parts, _ = _part_terms(
        dataclasses.replace(
            config, sd_estimator="none" if config.sd_folds_into_advantage else config.sd_estimator
        ),
        mb,
        stand_in,
        zeros,
        None,
        stand_in if config.kl_beta > 0 else None,
    )
    return {name: den for name, (_, den) in parts.items()}


_MICRO_BATCH_FIELDS = (
    "input_ids",
    "positions",
    "attention_mask",
    "advantages",
    "seq_weights",
    "teacher_input_ids",
    "teacher_positions",
    "teacher_attention_mask",
    "teacher_offset",
    "sd_mask",
    "sd_coef",
    "ref_logps",
)


def loss_and_grads(
    config: TrainConfig,
    graphdef: nnx.GraphDef,
    params: nnx.State,
    rest: nnx.State,
    batch: TrainBatch,
    ref_params: nnx.State | None = None,
    *,
    mesh: Mesh | None = None,
    teacher: Teacher | None = None,
    teacher_graphdef: nnx.GraphDef | None = None,
) -> tuple[Array, nnx.State, dict[str, Array]]:
    """Exact loss and gradient over the global batch, micro-batched (pure; jit it).

    ``teacher=(teacher_params, teacher_rest)`` with ``teacher_graphdef``: an external frozen
    teacher for the SD term (default: the student's own parameters under stop_gradient). No
    gradient flows into it; the returned gradient is the student's only."""
    teacher = check_teacher(config, teacher, teacher_graphdef)
    _check_batch(config, batch, ref_params is not None)
    old, is_weights, loss_mask, metrics = _policy_inputs(config, batch)
    fields = {f: getattr(batch, f) for f in _MICRO_BATCH_FIELDS if getattr(batch, f) is not None}
    fields.update(old_logps=old, loss_mask=loss_mask.astype(jnp.float32))
    if is_weights is not None:
        fields["is_weights"] = is_weights
    if fields.get("sd_mask") is not None:
        fields["sd_mask"] = fields["sd_mask"].astype(jnp.float32)
    m = config.num_micro_batches
    stacked = {k: split_micro_batches(v, m) for k, v in fields.items()}
    shards = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]
    if mesh is not None and (batch.input_ids.shape[0] // m) % shards == 0:
        # keep every micro-batch spread over all batch shards (the strided split allows it)
        spec = NamedSharding(mesh, P(None, sharding.BATCH_AXES))
        stacked = jax.lax.with_sharding_constraint(stacked, spec)

    def with_defaults(mb):
        mb = dict(mb)
        mb.setdefault("is_weights", None)
        for f in ("teacher_positions", "teacher_attention_mask", "ref_logps"):
            mb.setdefault(f, None)
        return mb

    per_mb_dens = jax.vmap(lambda mb: _micro_batch_dens(config, with_defaults(mb)))(stacked)
    dens = {k: jnp.sum(v) for k, v in per_mb_dens.items()}
    grad_fn = jax.value_and_grad(_micro_batch_loss, has_aux=True)

    def body(grads, mb):
        (loss, (nums, _, mb_metrics)), g = grad_fn(
            params,
            rest,
            graphdef,
            config,
            with_defaults(mb),
            dens,
            ref_params,
            teacher,
            teacher_graphdef,
        )
        grads = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g)
        return grads, (loss, nums, mb_metrics)

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    grads, (losses_mb, nums, mb_metrics) = jax.lax.scan(body, zeros, stacked)
    loss = jnp.sum(losses_mb)
    for key, v in mb_metrics.items():
        if key.endswith("/max"):
            metrics[key] = jnp.max(v)
        elif key.endswith("/min"):
            metrics[key] = jnp.min(v)
        else:
            metrics[key] = jnp.sum(v)
    out = aggregation.finalize_metrics(metrics)
    for name, num in nums.items():
        out[f"loss/{name}"] = _safe_div(jnp.sum(num), dens[name])
        out[f"loss/{name}_den"] = dens[name]
    out["loss"] = loss
    return loss, grads, out
