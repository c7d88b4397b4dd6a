"""The reward-weighted policy gradient of a pool of rollouts, for analysis (RISED C.1).

RISED's transfer analysis (seed §2.3, C.1) compares training and validation pools by the cosine
between their "average reward-weighted policy gradients". :func:`reward_weighted_logp_grad`
gives the numerator of that average on one packed batch:

    g = Σ_b w_b · Σ_t m[b, t] · ∇_θ log π_θ(input_ids[b, t + 1] | input_ids[b, ≤ t])

i.e. ``Σ_b w_b ∇ log π(y_b | x_b)`` with ``log π(y | x)`` the SUM of the completion tokens'
log-probs (``m`` = the loss mask in the prediction layout of ``core/logprobs.py``: the tokens the
trainer trains). The caller divides by its row count (convention: a loss returns its numerator
and the caller aggregates, so micro-batched and padded batches are exact; a padding row has
w = 0). The log-probs come from the train step's own path (``model.hidden_states`` then
``chunked_token_stats`` at the sampling temperature, chunked), so the gradient is the one the
trainer's policy term differentiates: at ratio 1 the PPO/GRPO loss ``-A · ratio`` has gradient
``-A ∇ log π`` per token, and under ``agg_mode="dr-grpo"`` with constant 1 the core loss's
gradient is exactly ``-g / B`` with ``A = w`` (tests/core/test_pool_gradient.py checks both).
The gradient is returned flattened (``jax.flatten_util.ravel_pytree`` order of ``params``) in
float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.flatten_util import ravel_pytree

from rubric_rl.core.logprobs import chunked_token_stats, shift_targets
from rubric_rl.core.step_loss import split_micro_batches

Array = jax.Array

__all__ = ["reward_weighted_logp_grad"]


def reward_weighted_logp_grad(
    graphdef: nnx.GraphDef,
    params: nnx.State,
    rest: nnx.State,
    input_ids: Array,
    positions: Array,
    attention_mask: Array,
    loss_mask: Array,
    weights: Array,
    *,
    temperature: float = 1.0,
    chunk_size: int = 128,
    num_micro_batches: int = 1,
) -> Array:
    """Flattened float32 ``Σ_b weights[b] · Σ_t loss_mask[b, t] · ∇ log π`` (module doc).

    ``input_ids`` / ``positions`` / ``attention_mask`` / ``loss_mask`` [B, T] as in a
    ``TrainBatch`` (prediction layout), ``weights`` [B] (the rewards). Micro-batched under
    ``lax.scan`` like the train step (B divisible by ``num_micro_batches``); pure, jit it."""
    b = input_ids.shape[0]
    if b % num_micro_batches:
        raise ValueError(
            f"reward_weighted_logp_grad: batch size {b} is not divisible by "
            f"num_micro_batches={num_micro_batches}"
        )
    fields = dict(
        input_ids=input_ids,
        positions=positions,
        attention_mask=attention_mask,
        loss_mask=loss_mask.astype(jnp.float32),
        weights=weights.astype(jnp.float32),
    )
    stacked = {k: split_micro_batches(v, num_micro_batches) for k, v in fields.items()}

    def objective(p: nnx.State, mb: dict[str, Array]) -> Array:
        model = nnx.merge(graphdef, p, rest)
        ids = mb["input_ids"]
        hidden = model.hidden_states(ids, mb["positions"], mb["attention_mask"])
        logps = chunked_token_stats(
            hidden,
            model.unembed(),
            shift_targets(ids),
            temperature=temperature,
            chunk_size=chunk_size,
        )["logps"]
        # where(): a masked slot's log-prob (padding, the last position) never enters, not even
        # as 0 · inf.
        seq_logp = jnp.sum(jnp.where(mb["loss_mask"] != 0, logps * mb["loss_mask"], 0.0), axis=-1)
        return jnp.sum(mb["weights"] * seq_logp)

    grad_fn = jax.grad(objective)

    def body(acc, mb):
        g = grad_fn(params, mb)
        return jax.tree.map(lambda a, x: a + x.astype(jnp.float32), acc, g), None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    grads, _ = jax.lax.scan(body, zeros, stacked)
    flat, _ = ravel_pytree(grads)
    return flat.astype(jnp.float32)
