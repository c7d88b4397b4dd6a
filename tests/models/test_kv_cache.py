"""KV-cache decoding: prefill + one-token steps equal the full forward (left-padded prompts), for
the Qwen3 and the Qwen2 family (q/k/v biases, no q/k norm)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_rl.models import PRESETS, Qwen3ForCausalLM, default_positions

CFG = PRESETS["tiny"]
B, P, N = 3, 6, 5  # batch, prompt length (padded), new tokens
assert PRESETS["qwen2_tiny"].__dict__ | {"model_type": "qwen3"} == CFG.__dict__  # same shapes


@pytest.fixture(scope="module", params=["tiny", "qwen2_tiny"])
def model(request):
    m = Qwen3ForCausalLM(PRESETS[request.param], rngs=nnx.Rngs(1))
    if m.config.attention_bias:  # zero-initialised: make them matter
        for i, layer in enumerate(m.layers):
            for proj in (layer.attn.q_proj, layer.attn.k_proj, layer.attn.v_proj):
                key = jax.random.key(i * 3 + proj.bias.shape[0])
                proj.bias[...] = 0.1 * jax.random.normal(key, proj.bias.shape)
    return m


@pytest.fixture(scope="module")
def prompts(helpers):
    return helpers.padded_batch(CFG.vocab_size, [6, 3, 1], P, "left", seed=2)


def _greedy(model, prompt, pmask, n_new):
    """Greedy decode with the cache: one prefill, then `n_new - 1` steps in a lax.while_loop."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, prompt, pmask):
        m = nnx.merge(graphdef, state)
        max_len = P + n_new
        cache = m.init_cache(B, max_len)
        cmask = jnp.zeros((B, max_len), jnp.int32).at[:, :P].set(pmask)
        pos = default_positions(prompt, pmask)
        logits, cache = m.decode(prompt, pos, cache, 0, cmask, last_only=True)
        tok = jnp.argmax(logits[:, -1], -1).astype(jnp.int32)
        out = jnp.zeros((B, n_new), jnp.int32).at[:, 0].set(tok)

        def body(carry):
            s, out, cache, cmask, last_pos = carry
            idx = P + s - 1  # slot of the token generated at step s - 1
            cmask = cmask.at[:, idx].set(1)
            tok_in = jax.lax.dynamic_slice_in_dim(out, s - 1, 1, axis=1)
            lg, cache = m.decode(tok_in, last_pos[:, None] + 1, cache, idx, cmask)
            nxt = jnp.argmax(lg[:, -1], -1).astype(jnp.int32)
            out = jax.lax.dynamic_update_slice(out, nxt[:, None], (0, s))
            return s + 1, out, cache, cmask, last_pos + 1

        carry = (jnp.int32(1), out, cache, cmask, pos[:, -1])
        _, out, *_ = jax.lax.while_loop(lambda c: c[0] < n_new, body, carry)
        return out

    return np.asarray(run(state, jnp.asarray(prompt), jnp.asarray(pmask)))


def test_prefill_and_steps_equal_full_forward(model, prompts, helpers):
    ids, pmask = prompts
    cont = np.random.RandomState(4).randint(0, CFG.vocab_size, (B, N)).astype(np.int32)
    full_ids = np.concatenate([ids, cont], 1)
    full_mask = np.concatenate([pmask, np.ones((B, N), np.int32)], 1)
    ref = helpers.forward(model, full_ids, full_mask)

    decode = nnx.jit(lambda m, i, p, c, k, cm: m.decode(i, p, c, k, cm))
    cache = model.init_cache(B, P + N)
    assert len(cache) == CFG.num_hidden_layers
    # Heads-major, keys slot-last: decode attention reads it without transposing it.
    assert cache[0]["k"].shape == (B, CFG.num_key_value_heads, CFG.head_dim, P + N)
    assert cache[0]["v"].shape == (B, CFG.num_key_value_heads, P + N, CFG.head_dim)
    cmask = np.zeros((B, P + N), np.int32)
    cmask[:, :P] = pmask
    pos = np.maximum(np.cumsum(pmask, 1) - 1, 0)
    logits, cache = decode(model, ids, pos, cache, jnp.int32(0), cmask)
    real = pmask > 0
    np.testing.assert_allclose(np.asarray(logits)[real], ref[:, :P][real], atol=1e-5, rtol=0)
    last = pos[:, -1]
    for s in range(N):
        cmask[:, P + s] = 1
        last = last + 1
        logits, cache = decode(
            model, cont[:, s : s + 1], last[:, None], cache, jnp.int32(P + s), cmask
        )
        np.testing.assert_allclose(np.asarray(logits)[:, 0], ref[:, P + s], atol=1e-5, rtol=0)
    # the cache really holds the continuation: zeroing it changes the next logits
    zeroed = [{"k": c["k"] * 0, "v": c["v"] * 0} for c in cache]
    lg_z, _ = decode(model, cont[:, -1:], last[:, None], zeroed, jnp.int32(P + N - 1), cmask)
    assert np.abs(np.asarray(lg_z)[:, 0] - ref[:, -1]).max() > 1e-3


def test_greedy_decode_equals_stepwise_argmax_of_full_forward(model, prompts, helpers):
    ids, pmask = prompts
    got = _greedy(model, ids, pmask, N)
    # Reference: full forwards over a fixed length (one compile); slots not generated yet are
    # masked padding on the right, which causal attention never sees from earlier positions.
    seq = np.concatenate([ids, np.zeros((B, N), np.int32)], 1)
    mask = np.concatenate([pmask, np.zeros((B, N), np.int32)], 1)
    expected = []
    for s in range(N):
        logits = helpers.forward(model, seq, mask)
        nxt = logits[:, P + s - 1].argmax(-1).astype(np.int32)
        expected.append(nxt)
        seq[:, P + s], mask[:, P + s] = nxt, 1
    np.testing.assert_array_equal(got, np.stack(expected, 1))
    assert len(set(got.reshape(-1).tolist())) > 1  # not a degenerate constant output


def test_bf16_cache_dtype(model):
    cache = model.init_cache(2, 4, dtype=jnp.bfloat16)
    assert all(c["k"].dtype == jnp.bfloat16 and c["v"].dtype == jnp.bfloat16 for c in cache)
