"""The per-pool reward-weighted policy gradient (core/pool_gradient.py): equal to a hand-written
log-prob sum's gradient, micro-batched = full batch, linear in the rewards (zero for zero
rewards), and minus B times the core loss's gradient at ratio 1 under dr-grpo aggregation."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.flatten_util import ravel_pytree

from rubric_rl.core import sharding
from rubric_rl.core import train_step as ts
from rubric_rl.core.pool_gradient import reward_weighted_logp_grad
from rubric_rl.models.qwen3 import PRESETS, Qwen3ForCausalLM

B, T, TEMP, CHUNK = 8, 12, 0.8, 5
# One decoder layer: the gradient's plumbing (chunked log-probs, micro-batches) is what is
# checked, not the depth.
CFG = dataclasses.replace(PRESETS["tiny"], num_hidden_layers=1)
FAST = {"xla_backend_optimization_level": 0}


@pytest.fixture(scope="module")
def tiny():
    mesh1 = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    model = sharding.init_sharded(lambda: Qwen3ForCausalLM(CFG, rngs=nnx.Rngs(0)), mesh1)
    graphdef, state = ts.init_train_state(model, ts.TrainConfig(), mesh1)
    return graphdef, state


def pool(seed=0):
    """Prompts left-padded to 4 tokens, completions right-padded (the trainer's packing)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32)
    attn = np.ones((B, T), np.int32)
    lm = np.zeros((B, T), np.float32)
    for b in range(B):
        start, end = b % 2, T - (b % 3)
        attn[b, :start] = 0
        attn[b, end:] = 0
        lm[b, 3 : end - 1] = 1  # completion tokens 4..end-1 in the prediction layout
    lm[2] = 0  # a row with no trained token
    pos = np.maximum(np.cumsum(attn, axis=1) - 1, 0).astype(np.int32)
    rewards = rng.normal(size=B).astype(np.float32)
    return ids, pos, attn, lm, rewards


def reference(graphdef, state, ids, pos, attn, lm, rewards):
    """jax.grad of mean_b r_b · Σ_t m log softmax(logits / T)[next token], written out."""

    def f(params):
        model = nnx.merge(graphdef, params, state.rest)
        logits = model(jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(attn)) / TEMP
        logp = jax.nn.log_softmax(logits, axis=-1)[:, :-1]
        tok = jnp.take_along_axis(logp, jnp.asarray(ids)[:, 1:, None], axis=-1)[..., 0]
        seq = jnp.sum(tok * jnp.asarray(lm)[:, :-1], axis=-1)
        return jnp.mean(jnp.asarray(rewards) * seq)

    grads = jax.jit(jax.grad(f), compiler_options=FAST)(state.params)
    return np.asarray(ravel_pytree(grads)[0], np.float32)


_OURS = {}


def ours(graphdef, state, ids, pos, attn, lm, rewards, m=1):
    if m not in _OURS:  # one compiled program per micro-batch count, shared by every call
        _OURS[m] = jax.jit(
            lambda p, r, *a: reward_weighted_logp_grad(
                graphdef, p, r, *a, temperature=TEMP, chunk_size=CHUNK, num_micro_batches=m
            ),
            compiler_options=FAST,
        )
    return np.asarray(_OURS[m](state.params, state.rest, ids, pos, attn, lm, rewards)) / B


def test_equals_the_hand_written_reference_and_micro_batching(tiny):
    graphdef, state = tiny
    batch = pool()
    want = reference(graphdef, state, *batch)
    got = ours(graphdef, state, *batch)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(want).max() > 1e-3  # not trivially zero
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(ours(graphdef, state, *batch, m=4), got, atol=1e-6, rtol=0)


def test_linear_in_the_rewards_and_zero_for_zero_rewards(tiny):
    graphdef, state = tiny
    ids, pos, attn, lm, r = pool(1)
    g = ours(graphdef, state, ids, pos, attn, lm, r)
    np.testing.assert_allclose(ours(graphdef, state, ids, pos, attn, lm, 3 * r), 3 * g, atol=1e-5)
    r2 = np.random.default_rng(7).normal(size=B).astype(np.float32)
    g2 = ours(graphdef, state, ids, pos, attn, lm, r2)
    np.testing.assert_allclose(ours(graphdef, state, ids, pos, attn, lm, r + r2), g + g2, atol=1e-5)
    zero = ours(graphdef, state, ids, pos, attn, lm, np.zeros(B, np.float32))
    assert np.all(zero == 0.0)


def test_is_minus_the_core_policy_loss_gradient_at_ratio_one(tiny):
    """The train step's loss (dr-grpo, constant 1, A = r, π_old = π_θ, no KL / SD) has gradient
    -mean_b r_b ∇ log π(y_b | x_b): what the trainer would step along."""
    graphdef, state = tiny
    ids, pos, attn, lm, r = pool(2)
    config = dataclasses.replace(
        ts.TrainConfig(), agg_mode="dr-grpo", agg_constant=1.0, temperature=TEMP,
        chunk_size=CHUNK, rollout_correction="bypass",
    )  # fmt: skip
    batch = ts.TrainBatch(
        input_ids=ids, positions=pos, attention_mask=attn, loss_mask=lm, advantages=r,
        rollout_logps=np.zeros((B, T), np.float32), seq_weights=np.ones(B, np.float32),
    )  # fmt: skip
    logps = ts.make_compute_logps(
        config,
        graphdef,
        sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1]),
        compiler_options=FAST,
    )(state, batch)
    batch = batch.replace(rollout_logps=logps, old_logps=logps)
    _, grads, _ = jax.jit(
        lambda p, b: ts.loss_and_grads(config, graphdef, p, state.rest, b), compiler_options=FAST
    )(state.params, batch)
    core = np.asarray(ravel_pytree(grads)[0], np.float32)
    np.testing.assert_allclose(-core, ours(graphdef, state, ids, pos, attn, lm, r), atol=1e-5)
