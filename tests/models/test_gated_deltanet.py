"""Gated DeltaNet (rubric_rl.models.gated_deltanet): chunked = recurrent = numpy = transformers."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_rl.models import gated_deltanet as gdn

# B, T, Hk, Hv, dk, dv: GQA 2:1 value heads per key head, dk != dv so a transposition shows.
B, T, HK, HV, DK, DV = 2, 11, 2, 4, 8, 6


def _inputs(seed, t=T, *, decay_scale=1.0, hk=HK, hv=HV):
    rs = np.random.RandomState(seed)
    q = rs.randn(B, t, hk, DK).astype(np.float32)
    k = rs.randn(B, t, hk, DK).astype(np.float32)
    v = rs.randn(B, t, hv, DV).astype(np.float32)
    g = (-decay_scale * rs.uniform(0.0, 1.0, (B, t, hv))).astype(np.float32)
    beta = rs.uniform(0.0, 1.0, (B, t, hv)).astype(np.float32)
    s0 = (0.5 * rs.randn(B, hv, DK, DV)).astype(np.float32)
    return q, k, v, g, beta, s0


def numpy_gated_delta_rule(q, k, v, g, beta, s0=None, *, l2norm=False):
    """The definition, float64, one token and one head at a time."""
    b, t, hk, dk = k.shape
    hv, dv = v.shape[2:]
    out = np.zeros((b, t, hv, dv))
    state = np.zeros((b, hv, dk, dv)) if s0 is None else np.array(s0, np.float64)
    for bi in range(b):
        for h in range(hv):
            s = state[bi, h]
            for i in range(t):
                qi = q[bi, i, h // (hv // hk)].astype(np.float64)
                ki = k[bi, i, h // (hv // hk)].astype(np.float64)
                if l2norm:
                    qi = qi / np.sqrt(qi @ qi + 1e-6)
                    ki = ki / np.sqrt(ki @ ki + 1e-6)
                qi = qi / np.sqrt(dk)
                s = s * np.exp(g[bi, i, h])
                s = s + np.outer(ki, beta[bi, i, h] * (v[bi, i, h] - s.T @ ki))
                out[bi, i, h] = s.T @ qi
            state[bi, h] = s
    return out, state


@functools.partial(jax.jit, static_argnames=("chunk_size", "use_qk_l2norm"))
def _chunk(q, k, v, g, beta, s0, chunk_size, use_qk_l2norm=False):
    return gdn.chunk_gated_delta_rule(
        q, k, v, g, beta, s0, chunk_size=chunk_size, use_qk_l2norm=use_qk_l2norm
    )


@functools.partial(jax.jit, static_argnames=("use_qk_l2norm",))
def _recurrent(q, k, v, g, beta, s0, use_qk_l2norm=False):
    return gdn.recurrent_gated_delta_rule(q, k, v, g, beta, s0, use_qk_l2norm=use_qk_l2norm)


# ----------------------------------------------------------------------------- the rule


@pytest.mark.parametrize("l2norm", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_recurrent_equals_numpy_reference(l2norm, with_state):
    q, k, v, g, beta, s0 = _inputs(0)
    s0 = s0 if with_state else None
    ref_o, ref_s = numpy_gated_delta_rule(q, k, v, g, beta, s0, l2norm=l2norm)
    o, s = _recurrent(q, k, v, g, beta, s0, use_qk_l2norm=l2norm)
    np.testing.assert_allclose(np.asarray(o), ref_o, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(s), ref_s, atol=2e-5, rtol=1e-5)


# chunk sizes: 1 (pure recurrence), 4 and 5 (do not divide T = 11), 11 (one chunk), 16 (> T).
@pytest.mark.parametrize("chunk_size", [1, 4, 5, 11, 16])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunked_equals_recurrent_and_numpy(chunk_size, with_state):
    q, k, v, g, beta, s0 = _inputs(1)
    s0 = s0 if with_state else None
    o, s = _chunk(q, k, v, g, beta, s0, chunk_size)
    ro, rs = _recurrent(q, k, v, g, beta, s0)
    np.testing.assert_allclose(np.asarray(o), np.asarray(ro), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(s), np.asarray(rs), atol=1e-5, rtol=1e-5)
    ref_o, ref_s = numpy_gated_delta_rule(q, k, v, g, beta, s0)
    np.testing.assert_allclose(np.asarray(o), ref_o, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(s), ref_s, atol=2e-5, rtol=1e-5)


def test_chunked_equal_heads_and_strong_decay_are_finite_and_exact():
    """Hk = Hv, and decays down to exp(-40) per token: the within-chunk exp(γ_i - γ_j) spans
    exp(-600); masking before the exp keeps everything finite (and gradients too)."""
    q, k, v, g, beta, s0 = _inputs(2, t=16, decay_scale=40.0, hk=HV, hv=HV)
    o, s = _chunk(q, k, v, g, beta, s0, 16)
    ro, rs = _recurrent(q, k, v, g, beta, s0)
    assert np.isfinite(np.asarray(o)).all() and np.isfinite(np.asarray(s)).all()
    np.testing.assert_allclose(np.asarray(o), np.asarray(ro), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(s), np.asarray(rs), atol=1e-5, rtol=1e-5)
    grads = jax.grad(lambda g_: jnp.sum(_chunk(q, k, v, g_, beta, s0, 16)[0]))(jnp.asarray(g))
    assert np.isfinite(np.asarray(grads)).all()


def test_step_by_step_decode_equals_recurrent():
    q, k, v, g, beta, s0 = _inputs(3)
    step = jax.jit(functools.partial(gdn.gated_delta_step, use_qk_l2norm=True))
    state, outs = jnp.asarray(s0), []
    for i in range(T):
        o, state = step(state, q[:, i], k[:, i], v[:, i], g[:, i], beta[:, i])
        outs.append(o)
    ro, rs = _recurrent(q, k, v, g, beta, s0, use_qk_l2norm=True)
    np.testing.assert_allclose(np.stack(outs, 1), np.asarray(ro), atol=1e-6)
    np.testing.assert_allclose(np.asarray(state), np.asarray(rs), atol=1e-6)


@pytest.mark.parametrize("with_state", [False, True])
def test_rules_match_transformers_torch(with_state):
    torch = pytest.importorskip("torch")
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    q, k, v, g, beta, s0 = _inputs(4)
    s0 = s0 if with_state else None
    tq, tk, tv, tg, tb = (torch.tensor(x) for x in (q, k, v, g, beta))
    ts0 = None if s0 is None else torch.tensor(s0)
    kw = dict(initial_state=ts0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    with torch.no_grad():
        hc_o, hc_s = hf.torch_chunk_gated_delta_rule(tq, tk, tv, tg, tb, chunk_size=4, **kw)
        hr_o, hr_s = hf.torch_recurrent_gated_delta_rule(tq, tk, tv, tg, tb, **kw)
    o, s = _chunk(q, k, v, g, beta, s0, 4, use_qk_l2norm=True)
    ro, rs = _recurrent(q, k, v, g, beta, s0, use_qk_l2norm=True)
    for ours, theirs in ((o, hc_o), (s, hc_s), (ro, hr_o), (rs, hr_s)):
        np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), atol=1e-5, rtol=1e-5)


def test_gradients_chunked_equal_recurrent():
    q, k, v, g, beta, s0 = _inputs(5)
    rs = np.random.RandomState(6)
    w_out = jnp.asarray(rs.randn(B, T, HV, DV).astype(np.float32))
    w_state = jnp.asarray(rs.randn(B, HV, DK, DV).astype(np.float32))

    def loss(fn, *args):
        o, s = fn(*args)
        return jnp.sum(o * w_out) + jnp.sum(s * w_state)

    args = tuple(jnp.asarray(x) for x in (q, k, v, g, beta, s0))
    argnums = tuple(range(6))
    g_chunk = jax.jit(
        jax.grad(
            lambda *a: loss(
                lambda *b: gdn.chunk_gated_delta_rule(*b, chunk_size=4, use_qk_l2norm=True),
                *a,
            ),
            argnums,
        )
    )(*args)
    g_rec = jax.jit(
        jax.grad(
            lambda *a: loss(lambda *b: gdn.recurrent_gated_delta_rule(*b, use_qk_l2norm=True), *a),
            argnums,
        )
    )(*args)
    for name, a, b in zip(("q", "k", "v", "g", "beta", "state"), g_chunk, g_rec, strict=True):
        scale = float(np.abs(np.asarray(b)).max())
        assert scale > 1e-3, name  # the gradient is not trivially zero
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5 * scale, err_msg=name)


def test_bf16_inputs_keep_float32_state_and_stay_close():
    """bf16 q/k/v/g/β: the rule runs in float32 internally, so the only error is the inputs'
    and outputs' bf16 rounding (≈ 2⁻⁸ relative). Tolerance: 3e-2 of the output scale."""
    q, k, v, g, beta, s0 = _inputs(7, t=40)
    o32, s32 = _chunk(q, k, v, g, beta, s0, 16, use_qk_l2norm=True)
    bf = tuple(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v, g, beta))
    o16, s16 = _chunk(*bf, jnp.asarray(s0), 16, use_qk_l2norm=True)
    assert o16.dtype == jnp.bfloat16 and s16.dtype == jnp.float32
    scale = float(np.abs(np.asarray(o32)).max())
    np.testing.assert_allclose(np.asarray(o16, np.float32), np.asarray(o32), atol=3e-2 * scale)
    np.testing.assert_allclose(
        np.asarray(s16), np.asarray(s32), atol=3e-2 * float(np.abs(np.asarray(s32)).max())
    )


def test_rule_rejects_bad_input():
    q, k, v, g, beta, s0 = _inputs(8)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        gdn.chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=0)
    with pytest.raises(ValueError, match="multiple of key heads"):
        gdn.chunk_gated_delta_rule(q[:, :, :1].repeat(3, 2), k[:, :, :1].repeat(3, 2), v, g, beta)
    with pytest.raises(ValueError, match="beta"):
        gdn.recurrent_gated_delta_rule(q, k, v, g, beta[:, :-1])
    with pytest.raises(ValueError, match="initial_state"):
        gdn.chunk_gated_delta_rule(q, k, v, g, beta, s0[:, :, :, :-1])
    with pytest.raises(ValueError, match="one token per row"):
        gdn.gated_delta_step(s0, q, k, v, g, beta)


# ----------------------------------------------------------------------------- convolution


def numpy_causal_conv(x, kernel, mask=None):
    kk = kernel.shape[0]
    x = x if mask is None else x * mask[..., None]
    xp = np.concatenate([np.zeros((x.shape[0], kk - 1, x.shape[2])), x], 1)
    return sum(xp[:, j : j + x.shape[1]] * kernel[j] for j in range(kk))


def test_conv_full_sequence_and_steps_equal_numpy():
    rs = np.random.RandomState(9)
    x = rs.randn(2, 7, 5).astype(np.float32)
    kernel = rs.randn(4, 5).astype(np.float32)
    out, state = gdn.causal_conv1d(jnp.asarray(x), jnp.asarray(kernel))
    np.testing.assert_allclose(np.asarray(out), numpy_causal_conv(x, kernel), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(state), x[:, -3:])
    # Split at t = 2 (shorter than K-1: the state still holds a zero), then steps.
    o1, st = gdn.causal_conv1d(jnp.asarray(x[:, :2]), jnp.asarray(kernel))
    outs = [np.asarray(o1)]
    for i in range(2, 7):
        o, st = gdn.causal_conv1d_step(jnp.asarray(x[:, i]), st, jnp.asarray(kernel))
        outs.append(np.asarray(o)[:, None])
    np.testing.assert_allclose(np.concatenate(outs, 1), np.asarray(out), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(st), x[:, -3:])
    # A full-sequence call continuing from a conv state equals the unsplit call.
    o2, st2 = gdn.causal_conv1d(jnp.asarray(x[:, 3:]), jnp.asarray(kernel), state_at(x, kernel, 3))
    np.testing.assert_allclose(np.asarray(o2), np.asarray(out)[:, 3:], atol=1e-5)
    np.testing.assert_array_equal(np.asarray(st2), x[:, -3:])


def state_at(x, kernel, t):
    return gdn.causal_conv1d(jnp.asarray(x[:, :t]), jnp.asarray(kernel))[1]


def test_conv_padding_does_not_leak_and_state_ends_at_last_real_token():
    rs = np.random.RandomState(10)
    x = rs.randn(3, 6, 5).astype(np.float32)
    kernel = rs.randn(3, 5).astype(np.float32)
    mask = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]], np.int32)
    out, state = gdn.causal_conv1d(jnp.asarray(x), jnp.asarray(kernel), mask=jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(out), numpy_causal_conv(x, kernel, mask), atol=1e-5)
    # Changing the padded inputs changes nothing.
    x2 = np.where(mask[..., None] > 0, x, 100.0).astype(np.float32)
    out2, state2 = gdn.causal_conv1d(jnp.asarray(x2), jnp.asarray(kernel), mask=jnp.asarray(mask))
    np.testing.assert_array_equal(np.asarray(out2), np.asarray(out))
    np.testing.assert_array_equal(np.asarray(state2), np.asarray(state))
    # Left-padded row: its last 2 inputs; right-padded row: the 2 inputs ending at position 2;
    # an all-padding row: the (zero) initial state.
    np.testing.assert_array_equal(np.asarray(state)[0], x[0, 4:6])
    np.testing.assert_array_equal(np.asarray(state)[1], x[1, 1:3])
    np.testing.assert_array_equal(np.asarray(state)[2], np.zeros((2, 5)))


def test_conv_rejects_bad_input():
    x = jnp.zeros((2, 4, 5))
    with pytest.raises(ValueError, match="kernel must be"):
        gdn.causal_conv1d(x, jnp.zeros((5, 3)))
    with pytest.raises(ValueError, match="conv_state"):
        gdn.causal_conv1d(x, jnp.zeros((3, 5)), jnp.zeros((2, 3, 5)))
    with pytest.raises(ValueError, match="mask"):
        gdn.causal_conv1d(x, jnp.zeros((3, 5)), mask=jnp.ones((2, 3)))


# ----------------------------------------------------------------------------- layer

# Tiny Qwen3.5 linear-attention shapes: GQA 2:1 with dk != dv, and equal heads with K = 3.
LAYER_CONFIGS = {
    "gqa2": dict(
        hidden_size=24,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=6,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
    ),
    "mha_k3": dict(
        hidden_size=16,
        linear_num_key_heads=3,
        linear_num_value_heads=3,
        linear_key_head_dim=4,
        linear_value_head_dim=4,
        linear_conv_kernel_dim=3,
        rms_norm_eps=1e-5,
    ),
}


def _hf_layer(fields, seed):
    import torch
    import transformers
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    cfg = transformers.Qwen3_5TextConfig(
        vocab_size=32,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        intermediate_size=32,
        **fields,
    )
    torch.manual_seed(seed)
    layer = hf.Qwen3_5GatedDeltaNet(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name in ("in_proj_qkv.weight", "in_proj_z.weight", "out_proj.weight"):
                p.copy_(0.3 * torch.randn_like(p))
            elif name in ("in_proj_a.weight", "in_proj_b.weight"):
                p.copy_(torch.randn_like(p))
            elif name in ("dt_bias", "norm.weight"):  # HF inits both to 1: would hide a mix-up
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    return cfg, layer


def _our_layer(hf_cfg, hf_layer, *, dtype=jnp.float32, chunk_size=4):
    cfg = gdn.GatedDeltaNetConfig.from_hf(hf_cfg)
    layer = gdn.GatedDeltaNet(cfg, rngs=nnx.Rngs(0), dtype=dtype, chunk_size=chunk_size)
    gdn.load_hf_weights(layer, dict(hf_layer.named_parameters()))
    return layer


def _torch_forward(hf_layer, x, mask=None):
    import torch

    with torch.no_grad():
        m = None if mask is None else torch.tensor(mask)
        return hf_layer(torch.tensor(x), attention_mask=m).numpy()


_forward = nnx.jit(lambda layer, x, mask: layer(x, mask))


@pytest.mark.parametrize("name", list(LAYER_CONFIGS))
def test_layer_matches_transformers(name):
    """Same weights, same input → same output within 1e-4 (float32), unpadded and padded.

    Left and right padding: only real positions are compared. At padded positions transformers
    outputs out_proj(norm(o)·silu(0)) = 0 and so do we, but that is garbage for callers either way;
    right-pad steps also change transformers' final state (not ours), which no output shows."""
    pytest.importorskip("torch")
    hf_cfg, hf_layer = _hf_layer(LAYER_CONFIGS[name], seed=11)
    layer = _our_layer(hf_cfg, hf_layer)
    rs = np.random.RandomState(12)
    x = rs.randn(3, 9, hf_cfg.hidden_size).astype(np.float32)
    full = np.ones((3, 9), np.int32)
    np.testing.assert_allclose(
        np.asarray(_forward(layer, x, full)), _torch_forward(hf_layer, x), atol=1e-4, rtol=1e-4
    )
    lengths = [9, 5, 2]
    for side in ("left", "right"):
        mask = np.zeros((3, 9), np.int32)
        for i, n in enumerate(lengths):
            if side == "left":
                mask[i, 9 - n :] = 1
            else:
                mask[i, :n] = 1
        ours = np.asarray(_forward(layer, x, mask))
        theirs = _torch_forward(hf_layer, x, mask)
        real = mask > 0
        np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4, rtol=1e-4, err_msg=side)
        # The real tokens of a padded row give what they give unpadded (left) / as a prefix.
        for i, n in enumerate(lengths):
            alone = np.asarray(_forward(layer, x[i : i + 1, real[i]], np.ones((1, n), np.int32)))
            np.testing.assert_allclose(ours[i, real[i]], alone[0], atol=1e-5, err_msg=side)


def test_prefill_then_decode_steps_equal_full_forward():
    """Left-padded prompts: prefill P tokens with the mask, then N one-token decode steps; every
    output equals the full forward over P + N tokens at the same positions."""
    pytest.importorskip("torch")
    hf_cfg, hf_layer = _hf_layer(LAYER_CONFIGS["gqa2"], seed=13)
    layer = _our_layer(hf_cfg, hf_layer, chunk_size=3)
    p, n = 7, 5
    rs = np.random.RandomState(14)
    x = rs.randn(3, p + n, hf_cfg.hidden_size).astype(np.float32)
    mask = np.ones((3, p + n), np.int32)
    mask[1, :4] = 0
    mask[2, :6] = 0  # one real prompt token: the conv state still holds prefix zeros
    full = np.asarray(_forward(layer, x, mask))
    prefill = nnx.jit(lambda m, x_, k_: m.prefill(x_, k_))
    step = nnx.jit(lambda m, x_, c: m.decode_step(x_, c))
    y, cache = prefill(layer, x[:, :p], mask[:, :p])
    assert cache.recurrent_state.dtype == jnp.float32
    outs = [np.asarray(y)]
    for i in range(p, p + n):
        y, cache = step(layer, x[:, i : i + 1], cache)
        outs.append(np.asarray(y))
    got = np.concatenate(outs, 1)
    real = mask > 0
    np.testing.assert_allclose(got[real], full[real], atol=1e-5, rtol=1e-5)
    # And equals transformers on the real positions.
    np.testing.assert_allclose(
        got[real], _torch_forward(hf_layer, x, mask)[real], atol=1e-4, rtol=1e-4
    )


def test_right_padded_prefill_cache_equals_unpadded_and_step_mask_freezes_rows():
    pytest.importorskip("torch")
    hf_cfg, hf_layer = _hf_layer(LAYER_CONFIGS["gqa2"], seed=15)
    layer = _our_layer(hf_cfg, hf_layer)
    rs = np.random.RandomState(16)
    x = rs.randn(2, 6, hf_cfg.hidden_size).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], np.int32)
    prefill = nnx.jit(lambda m, x_, k_: m.prefill(x_, k_))
    _, cache = prefill(layer, jnp.asarray(x), jnp.asarray(mask))
    _, alone = prefill(layer, jnp.asarray(x[1:, :3]), jnp.ones((1, 3), jnp.int32))
    np.testing.assert_allclose(np.asarray(cache.conv_state[1]), np.asarray(alone.conv_state[0]))
    np.testing.assert_allclose(
        np.asarray(cache.recurrent_state[1]), np.asarray(alone.recurrent_state[0]), atol=1e-6
    )
    tok = jnp.asarray(rs.randn(2, 1, hf_cfg.hidden_size).astype(np.float32))
    step = nnx.jit(lambda m, x_, c, k_: m.decode_step(x_, c, step_mask=k_))
    _, stepped = step(layer, tok, cache, jnp.asarray([1, 0]))
    for leaf_new, leaf_old in zip(jax.tree.leaves(stepped), jax.tree.leaves(cache), strict=True):
        np.testing.assert_array_equal(np.asarray(leaf_new[1]), np.asarray(leaf_old[1]))
        assert not np.allclose(np.asarray(leaf_new[0]), np.asarray(leaf_old[0]))


def test_sharded_layer_equals_unsharded():
    """Parameters placed by rubric_rl.core.sharding on an (fsdp=2, tensor=4) mesh of the 8 host
    CPU devices: heads and projection columns over 'tensor', D over 'fsdp'; same outputs, same
    cache as one device."""
    pytest.importorskip("torch")
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from rubric_rl.core import sharding as S

    hf_cfg, hf_layer = _hf_layer(LAYER_CONFIGS["gqa2"], seed=21)
    layer = _our_layer(hf_cfg, hf_layer)
    x = np.random.RandomState(22).randn(4, 9, hf_cfg.hidden_size).astype(np.float32)
    mask = np.ones((4, 9), np.int32)
    mask[1, :3] = 0
    prefill = nnx.jit(lambda m, x_, k_: m.prefill(x_, k_))
    want_y, want_cache = prefill(layer, jnp.asarray(x), jnp.asarray(mask))
    mesh = S.make_mesh(data=1, fsdp=2, tensor=4)
    sharded = S.shard_model(_our_layer(hf_cfg, hf_layer), mesh)
    assert sharded.in_proj_qkv.kernel[...].sharding == NamedSharding(mesh, P("fsdp", "tensor"))
    assert sharded.out_proj.kernel[...].sharding == NamedSharding(mesh, P("tensor", "fsdp"))
    assert sharded.A_log[...].sharding == NamedSharding(mesh, P("tensor"))
    assert sharded.conv1d.kernel[...].sharding == NamedSharding(mesh, P(None, "tensor"))
    y, cache = prefill(sharded, *S.shard_batch((x, mask), mesh))
    # The sharded program sums the fsdp-split contractions in another order: float32 rounding
    # through the recurrence reached 1.6e-5 on 5 of 864 outputs on one CPU type (1e-5 held on
    # another), so the bound is the parity bound against transformers, 1e-4. A wrong placement or a
    # missing collective is off by O(0.1).
    np.testing.assert_allclose(np.asarray(y), np.asarray(want_y), atol=1e-4, rtol=1e-4)
    for got, want in zip(jax.tree.leaves(cache), jax.tree.leaves(want_cache), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4, rtol=1e-4)


def test_layer_bf16_stays_close_to_float32():
    """bf16 compute (float32 params cast per matmul, float32 recurrent state): relative error
    ‖y_bf16 − y_f32‖ / ‖y_f32‖ under 2.5e-2, and no worse than transformers' own bf16 layer
    against its float32 output (measured here: 1.4e-2 ours vs 1.6e-2 theirs). Not an elementwise
    max: a head whose delta-rule output nearly cancels (RMS 100× below the others) is blown up by
    the gated RMSNorm, and bf16 rounding of q/k/v shows there at ~10% in both implementations."""
    torch = pytest.importorskip("torch")
    hf_cfg, hf_layer = _hf_layer(LAYER_CONFIGS["gqa2"], seed=17)
    l32 = _our_layer(hf_cfg, hf_layer)
    l16 = _our_layer(hf_cfg, hf_layer, dtype=jnp.bfloat16)
    x = np.random.RandomState(18).randn(2, 40, hf_cfg.hidden_size).astype(np.float32)
    mask = np.ones((2, 40), np.int32)
    y32 = np.asarray(_forward(l32, x, mask))
    y16, cache = nnx.jit(lambda m, x_, k_: m.prefill(x_, k_))(l16, jnp.asarray(x), mask)
    assert y16.dtype == jnp.bfloat16 and cache.recurrent_state.dtype == jnp.float32
    ours = np.linalg.norm(np.asarray(y16, np.float32) - y32) / np.linalg.norm(y32)
    with torch.no_grad():
        t32 = _torch_forward(hf_layer, x)
        t16 = hf_layer.to(torch.bfloat16)(torch.tensor(x, dtype=torch.bfloat16)).float().numpy()
    theirs = np.linalg.norm(t16 - t32) / np.linalg.norm(t32)
    assert ours < 2.5e-2 and ours <= 1.1 * theirs, (ours, theirs)


def test_layer_rejects_bad_input_and_config():
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match="multiple of linear_num_key_heads"):
        gdn.GatedDeltaNetConfig(16, linear_num_key_heads=3, linear_num_value_heads=4)
    with pytest.raises(ValueError, match="hidden_size"):
        gdn.GatedDeltaNetConfig(0)
    with pytest.raises(ValueError, match="rms_norm_eps"):
        gdn.GatedDeltaNetConfig(16, rms_norm_eps=0.0)
    with pytest.raises(ValueError, match="hidden_act: only 'silu'"):
        gdn.GatedDeltaNetConfig(16, hidden_act="gelu")
    hf_cfg, hf_layer = _hf_layer(LAYER_CONFIGS["mha_k3"], seed=19)
    layer = _our_layer(hf_cfg, hf_layer)
    with pytest.raises(ValueError, match="hidden_size=16"):
        layer(jnp.zeros((1, 3, 8)))
    with pytest.raises(ValueError, match="mask"):
        layer(jnp.zeros((1, 3, 16)), jnp.ones((1, 4)))
    with pytest.raises(ValueError, match=r"\[B, 1, hidden_size"):
        layer.decode_step(jnp.zeros((1, 2, 16)), layer.init_cache(1))
    weights = dict(hf_layer.named_parameters())
    weights.pop("A_log")
    with pytest.raises(ValueError, match="missing \\['A_log'\\]"):
        gdn.load_hf_weights(layer, weights)


def _solve_inputs(seed, lead=(2, 3), c=16, d=5):
    rs = np.random.RandomState(seed)
    # Entries of the size the rule produces (β k·k D with unit-norm keys: |·| < 1).
    strict = np.tril(rs.uniform(-0.5, 0.5, (*lead, c, c)), -1).astype(np.float32)
    # The upper triangle and diagonal carry noise: the solve must ignore them (and give them a
    # zero gradient).
    strict += np.triu(rs.randn(*lead, c, c)).astype(np.float32)
    rhs = rs.randn(*lead, c, d).astype(np.float32)
    w = rs.randn(*lead, c, d).astype(np.float32)
    return strict, rhs, w


def test_solve_unit_lower_values_and_gradients_equal_dense_solve_and_the_plain_loop():
    """The custom VJP against (a) numpy's dense solve for the values, (b) autodiff through
    jnp.linalg.solve of the dense I + strict_lower, (c) autodiff through the plain fori_loop
    (the backward the custom one replaces)."""
    strict, rhs, w = _solve_inputs(0)
    c = strict.shape[-1]
    a = np.eye(c, dtype=np.float64) + np.tril(strict.astype(np.float64), -1)
    want = np.linalg.solve(a, rhs.astype(np.float64))
    got = gdn.solve_unit_lower(jnp.asarray(strict), jnp.asarray(rhs))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)

    def loss(fn):
        return lambda s, r: jnp.sum(fn(s, r) * w)

    def dense(s, r):
        return jnp.linalg.solve(jnp.eye(c) + jnp.tril(s, -1), r)

    args = (jnp.asarray(strict), jnp.asarray(rhs))
    ours = jax.jit(jax.grad(loss(gdn.solve_unit_lower), (0, 1)))(*args)
    ref = jax.jit(jax.grad(loss(dense), (0, 1)))(*args)
    loop = jax.jit(jax.grad(loss(gdn._forward_substitution), (0, 1)))(*args)
    for name, o, r, lp in zip(("strict", "rhs"), ours, ref, loop, strict=True):
        scale = float(np.abs(np.asarray(r)).max())
        assert scale > 1e-2, name
        np.testing.assert_allclose(np.asarray(o), np.asarray(r), atol=2e-5 * scale, err_msg=name)
        np.testing.assert_allclose(np.asarray(o), np.asarray(lp), atol=2e-5 * scale, err_msg=name)
    # Only the strict lower triangle is read, so only it has a gradient.
    d_strict = np.asarray(ours[0])
    assert np.all(np.triu(d_strict) == 0) and np.abs(np.tril(d_strict, -1)).max() > 1e-2


def test_solve_unit_lower_backward_keeps_the_solution_not_every_loop_step():
    """What the backward keeps (jax's saved residuals): the custom VJP the inputs and X (about
    2 x rhs + strict); autodiff of the loop the carry at each of its C steps (C x rhs)."""
    from jax._src.ad_checkpoint import saved_residuals

    strict, rhs, w = _solve_inputs(1, lead=(2,), c=32, d=8)

    def kept(fn):
        res = saved_residuals(lambda s, r: jnp.sum(fn(s, r) * w), strict, rhs)
        return sum(int(np.prod(a.shape)) * a.dtype.itemsize for a, _ in res)

    rhs_bytes = rhs.nbytes
    ours, loop = kept(gdn.solve_unit_lower), kept(gdn._forward_substitution)
    assert ours <= 2 * rhs_bytes + strict.nbytes, (ours, rhs_bytes)
    assert loop >= 32 * rhs_bytes, (loop, rhs_bytes)
