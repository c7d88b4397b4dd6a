"""Attention fast paths: causal key-block skipping and the `attention_impl` option."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_rl.models import PRESETS, Qwen3ForCausalLM, qwen3
from rubric_rl.models.qwen3 import attention, causal_blocks_for


def _reference(q, k, v, mask):
    """Plain numpy GQA attention (query head j reads KV head j // (H / KV))."""
    b, t, h, d = q.shape
    kv = k.shape[2]
    out = np.zeros((b, t, h, d))
    for i in range(b):
        for j in range(h):
            g = j // (h // kv)
            s = np.where(mask[i], q[i, :, j] @ k[i, :, g].T / np.sqrt(d), -np.inf)
            with np.errstate(invalid="ignore"):  # fully masked rows -> NaN, never compared
                p = np.exp(s - s.max(-1, keepdims=True))
            out[i, :, j] = (p / p.sum(-1, keepdims=True)) @ v[i, :, g]
    return out


def _causal_inputs(seed, b=3, t=8, h=4, kv=2, d=4):
    rs = np.random.RandomState(seed)
    q, k, v = rs.randn(b, t, h, d), rs.randn(b, t, kv, d), rs.randn(b, t, kv, d)
    valid = np.ones((b, t), bool)
    valid[0, :3] = False  # left padding: rows 0..2 of example 0 are fully masked
    valid[1, 6:] = False  # right padding
    mask = np.tril(np.ones((t, t), bool))[None] & valid[:, None, :]
    real = mask.any(-1)  # rows with at least one key
    return q, k, v, mask, real


@pytest.mark.parametrize("blocks", [1, 2, 4])
def test_causal_blocks_match_numpy_on_real_rows(blocks):
    q, k, v, mask, real = _causal_inputs(0)
    got = np.asarray(
        attention(*(jnp.asarray(a, jnp.float32) for a in (q, k, v)), mask, causal_blocks=blocks)
    )
    np.testing.assert_allclose(got[real], _reference(q, k, v, mask)[real], atol=1e-5)
    assert np.isfinite(got).all()  # fully masked rows: finite garbage


def test_causal_blocks_gradients_equal_unblocked():
    q, k, v, mask, real = _causal_inputs(1)
    ct = np.random.RandomState(2).randn(*q.shape) * real[:, :, None, None]  # loss on real rows

    def grads(blocks):
        def loss(q, k, v):
            return jnp.sum(attention(q, k, v, mask, causal_blocks=blocks) * ct)

        args = tuple(jnp.asarray(a, jnp.float32) for a in (q, k, v))
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*args)  # eager grads compile op by op

    ref, got = grads(1), grads(4)
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    assert max(float(jnp.abs(a).max()) for a in ref) > 1e-2  # gradients are not trivially 0


def test_causal_blocks_for_and_bad_block_count():
    assert [causal_blocks_for(t) for t in (256, 2048, 200, 128, 127, 64, 9)] == [
        4,
        4,
        2,
        2,
        1,
        1,
        1,
    ]
    q = jnp.zeros((1, 6, 2, 4))
    with pytest.raises(ValueError, match="causal_blocks=4"):
        attention(q, q[:, :, :1], q[:, :, :1], np.ones((1, 6, 6), bool), causal_blocks=4)


def test_model_with_blocked_attention_equals_unblocked(monkeypatch):
    """T = 128 runs 2 causal blocks in `hidden_states`; real positions match 1 block."""
    cfg = PRESETS["tiny"]
    model = Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0))
    rs = np.random.RandomState(3)
    ids = jnp.asarray(rs.randint(0, cfg.vocab_size, (2, 128)))
    am = np.ones((2, 128), np.int32)
    am[0, :40] = 0
    assert causal_blocks_for(128) == 2
    got = np.asarray(nnx.jit(lambda m, i, a: m(i, attention_mask=a))(model, ids, am))
    monkeypatch.setattr(qwen3, "causal_blocks_for", lambda t: 1)
    ref = np.asarray(nnx.jit(lambda m, i, a: m(i, attention_mask=a))(model, ids, am))
    np.testing.assert_allclose(got[am > 0], ref[am > 0], atol=1e-5, rtol=0)
    assert np.abs(ref[am > 0]).max() > 1e-2


def test_attention_impl_option():
    cfg = PRESETS["tiny"]
    with pytest.raises(ValueError, match="attention_impl='flash'"):
        Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0), attention_impl="flash")
    ids = jnp.asarray(np.random.RandomState(4).randint(0, cfg.vocab_size, (2, 7)))
    xla = Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0))
    auto = Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0), attention_impl="auto")
    # On CPU "auto" is the hand-written path: identical logits.
    forward = nnx.jit(lambda m, i: m(i))
    np.testing.assert_array_equal(np.asarray(forward(auto, ids)), np.asarray(forward(xla, ids)))


@pytest.mark.parametrize(
    "impl, backend, dtype, head_dim, fused",
    [
        ("xla", "gpu", jnp.bfloat16, 128, False),
        ("cudnn", "cpu", jnp.float32, 16, True),  # explicit: always (cuDNN itself then decides)
        ("auto", "cpu", jnp.bfloat16, 128, False),
        ("auto", "gpu", jnp.bfloat16, 128, True),
        ("auto", "gpu", jnp.float16, 64, True),
        ("auto", "gpu", jnp.float32, 128, False),  # cuDNN takes no float32
        ("auto", "gpu", jnp.bfloat16, 256, False),  # above the head_dim we hand to cuDNN
        ("auto", "gpu", jnp.bfloat16, 36, False),  # not a multiple of 8
    ],
)
def test_auto_resolves_to_cudnn_only_where_it_applies(
    monkeypatch, impl, backend, dtype, head_dim, fused
):
    # "auto" is resolved by us: jax's implementation=None is its XLA path (jax 0.10-0.11).
    monkeypatch.setattr(qwen3.jax, "default_backend", lambda: backend)
    q = jnp.zeros((1, 4, 2, head_dim), dtype)
    assert qwen3._use_fused(impl, q) is fused


def test_fused_attention_takes_only_concrete_impls():
    q = jnp.zeros((1, 4, 2, 8))
    with pytest.raises(ValueError, match="impl='auto'"):
        qwen3.fused_attention(q, q[:, :, :1], q[:, :, :1], jnp.ones((1, 4, 4), bool), "auto")


def test_builder_passes_the_attention_impl_and_the_gpu_variant_sets_auto():
    from rubric_rl.config import builders
    from rubric_rl.config.defaults import get_base_config
    from rubric_rl.core import sharding

    config = get_base_config()
    tok = type("Tok", (), {"vocab_size": 100, "eos_id": 2})()
    config.model.name = "tiny"
    mesh = sharding.make_mesh(1, 1, 1, jax.devices()[:1])
    assert builders.build_model(config, tok, mesh).attention_impl == "xla"  # the default
    config.model.attention_impl = "auto"
    assert builders.build_model(config, tok, mesh).attention_impl == "auto"
    config.model.attention_impl = "flash"
    with pytest.raises(ValueError, match="config.model.attention_impl: 'flash'"):
        builders.build_model(config, tok, mesh)
    from configs import arise_rl, grpo

    for cfg in (grpo.get_config("gpu"), arise_rl.get_config("sql,gpu")):
        assert cfg.model.attention_impl == "auto"
    assert grpo.get_config("").model.attention_impl == "xla"


@pytest.mark.parametrize("t", [1, 3])
def test_cache_layout_equals_token_major_and_numpy(t):
    """The KV cache's layout (`cache_layout`: k [B, KV, hd, S], v [B, KV, S, hd]) gives the
    token-major result bit for bit, for a decode step (t = 1) and a prefill chunk; both match
    numpy on real rows."""
    rs = np.random.RandomState(7)
    b, s, h, kv, d = 3, 9, 4, 2, 8
    q = rs.randn(b, t, h, d).astype(np.float32)
    k, v = (rs.randn(b, s, kv, d).astype(np.float32) for _ in range(2))
    mask = rs.rand(b, t, s) < 0.7
    mask[:, :, 0] = True  # every row has a key
    token_major = np.asarray(attention(q, k, v, mask))
    heads_major = np.asarray(
        attention(q, k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3), mask, cache_layout=True)
    )
    np.testing.assert_array_equal(heads_major, token_major)
    np.testing.assert_allclose(heads_major, _reference(q, k, v, mask), rtol=1e-5, atol=1e-5)


# Padding patterns of a causal self-attention batch (True = real token), T = 10.
_PAD = {
    "none": [[1] * 10, [1] * 10],  # two rows, as every pattern: one shape, one compile
    "left": [[0, 0, 0] + [1] * 7, [1] * 10],
    "right": [[1] * 6 + [0] * 4, [1] * 10],
    "both": [[0, 0] + [1] * 5 + [0] * 3, [0] * 4 + [1] * 6],
    "empty_row": [[0] * 10, [0] * 9 + [1]],
    "holes": [[0, 1, 1, 0, 1, 0, 0, 1, 1, 0], [1, 0, 1, 0, 1, 0, 1, 0, 1, 1]],
}


def _padded_inputs(pattern, seed=0, h=4, kv=2, d=8):
    valid = np.asarray(_PAD[pattern], bool)
    b, t = valid.shape
    rs = np.random.RandomState(seed)
    q = rs.randn(b, t, h, d).astype(np.float32)
    k, v = (rs.randn(b, t, kv, d).astype(np.float32) for _ in range(2))
    mask = np.tril(np.ones((t, t), bool))[None] & valid[:, None, :]
    return q, k, v, mask, valid


# Jitted once for every pattern (the masks are arguments; eager grads compile op by op).
@jax.jit
def _padded_causal(q, k, v, valid):
    return qwen3.causal_padded_attention(q, k, v, valid, "xla")


@jax.jit
def _masked(q, k, v, mask):
    return attention(q, k, v, mask)


@functools.cache
def _grads_of(fn):
    """jit(dq, dk, dv of sum(fn(q, k, v, mask) * ct))."""
    return jax.jit(jax.grad(lambda q, k, v, m, ct: jnp.sum(fn(q, k, v, m) * ct), (0, 1, 2)))


@pytest.mark.parametrize("pattern", sorted(_PAD))
def test_causal_padded_attention_equals_numpy_on_real_tokens(pattern):
    """The padding-causal path (rows rotated so their real tokens lead, `is_causal` with the rows'
    lengths; jax's XLA implementation here, cuDNN's kernel on a GPU): the mask formulation's
    values and gradients on every real token's row; finite everywhere."""
    q, k, v, mask, valid = _padded_inputs(pattern)
    ok, key_real = qwen3.padded_causal_rows(jnp.asarray(mask))
    assert bool(ok) and np.array_equal(np.asarray(key_real), valid)

    got = np.asarray(_padded_causal(q, k, v, valid))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got[valid], _reference(q, k, v, mask)[valid], atol=1e-5)
    ct = np.random.RandomState(1).randn(*q.shape) * valid[:, :, None, None]
    want = _grads_of(_masked)(q, k, v, mask, ct)
    for a, b in zip(_grads_of(_padded_causal)(q, k, v, valid, ct), want, strict=True):
        assert np.isfinite(np.asarray(a)).all()
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    if valid.any():
        assert max(float(jnp.abs(g).max()) for g in want) > 1e-2


@pytest.mark.parametrize("pattern", sorted(_PAD))
def test_fused_attention_takes_the_padded_causal_path(pattern, monkeypatch):
    q, k, v, mask, valid = _padded_inputs(pattern, seed=3)
    got = np.asarray(jax.jit(lambda *a: qwen3.fused_attention(*a, mask, "xla"))(q, k, v))
    masked = np.asarray(qwen3.masked_attention(q, k, v, mask, "xla"))
    np.testing.assert_allclose(got[valid], masked[valid], atol=1e-5)
    # The branch taken: with the padding-causal function replaced by a marker, the call
    # returns the marker (the masked path would not).
    monkeypatch.setattr(qwen3, "causal_padded_attention", lambda q, *_: jnp.full_like(q, 7.0))
    marked = np.asarray(jax.jit(lambda *a: qwen3.fused_attention(*a, mask, "xla"))(q, k, v))
    assert (marked == 7.0).all()
    monkeypatch.setattr(qwen3, "CUDNN_PADDING_CAUSAL", False)  # the switch: masked path only
    off = np.asarray(jax.jit(lambda *a: qwen3.fused_attention(*a, mask, "xla"))(q, k, v))
    np.testing.assert_allclose(off, masked, atol=1e-6, rtol=0)


def test_other_masks_take_the_masked_path(monkeypatch):
    """A non-causal mask, a mask that also drops a query's own key, cross-attention shapes:
    `padded_causal_rows` refuses the first two, and `fused_attention` gives `masked_attention`'s
    values (numpy on rows with a key). (A row with holes in its real tokens is causal & padding:
    the padding-causal path, `_PAD["holes"]`.)"""
    q, k, v, mask, valid = _padded_inputs("left", seed=4)
    t = mask.shape[-1]
    full = np.broadcast_to(valid[:, None, :], mask.shape).copy()  # bidirectional over real keys
    own = mask.copy()
    own[0, 5, 5] = False  # causal & padding, and one more key dropped
    for m in (full, own):
        ok, _ = qwen3.padded_causal_rows(jnp.asarray(m))
        assert not bool(ok)
        got = np.asarray(jax.jit(lambda *a, m=m: qwen3.fused_attention(*a, m, "xla"))(q, k, v))
        want = np.asarray(qwen3.masked_attention(q, k, v, m, "xla"))
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
        rows = m.any(-1)
        np.testing.assert_allclose(got[rows], _reference(q, k, v, m)[rows], atol=1e-5)
    monkeypatch.setattr(qwen3, "causal_padded_attention", lambda q, *_: jnp.full_like(q, 7.0))
    for m in (full, own):
        marked = np.asarray(qwen3.fused_attention(q, k, v, m, "xla"))
        assert not (marked == 7.0).any()  # the masked branch ran
    cross = np.ones((2, t, t + 3), bool)  # S != T: never the causal path
    k2, v2 = (np.concatenate([x, x[:, :3]], axis=1) for x in (k, v))
    got = np.asarray(qwen3.fused_attention(q, k2, v2, cross, "xla"))
    np.testing.assert_allclose(got, _reference(q, k2, v2, cross), atol=1e-5)


@pytest.mark.parametrize("remat", ["none", "dots"])
def test_model_through_the_fused_path_equals_the_xla_path(monkeypatch, remat):
    """The model's full-sequence forward routed through `fused_attention` (as "cudnn" / "auto" on
    a GPU do; jax's XLA implementation stands in for cuDNN's kernel here): left- and right-padded
    rows take the padding-causal path, and logits and gradients on real tokens equal the
    hand-written attention's, rematerialised or not."""
    cfg = PRESETS["tiny"]
    model = Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0), remat=remat)
    rs = np.random.RandomState(5)
    ids = jnp.asarray(rs.randint(0, cfg.vocab_size, (3, 24)))
    am = np.ones((3, 24), np.int32)
    am[0, :7] = 0  # left padding
    am[1, 18:] = 0  # right padding
    am[2, :3], am[2, 20:] = 0, 0  # both
    real = am > 0
    weights = jnp.asarray(rs.randn(3, 24, cfg.vocab_size) * real[..., None], jnp.float32)

    def run():
        def loss(m):
            logits = m(ids, attention_mask=am)
            return jnp.sum(logits * weights), logits

        (_, logits), grads = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(model)
        return np.asarray(logits), jax.tree.leaves(nnx.state(grads))

    want_logits, want_grads = run()
    calls = []
    original = qwen3.fused_attention

    def fused(q, k, v, mask, impl, **kw):
        calls.append((impl, kw))
        return original(q, k, v, mask, "xla", **kw)

    monkeypatch.setattr(qwen3, "_use_fused", lambda impl, q: True)
    monkeypatch.setattr(qwen3, "fused_attention", fused)
    got_logits, got_grads = run()
    # the fused path was traced, once per layer, stating the model's causal & padding mask
    assert calls and all(c == ("cudnn", {"causal_padding": True}) for c in calls)
    np.testing.assert_allclose(got_logits[real], want_logits[real], atol=2e-5, rtol=0)
    for a, b in zip(got_grads, want_grads, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)
    assert np.isfinite(got_logits).all()
    if remat == "none":  # sharded over the 8 forced devices: rows, parameters and heads split
        from rubric_rl.core import sharding

        mesh = sharding.make_mesh(2, 2, 2)
        sharded = Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0))
        sharding.shard_model(sharded, mesh)
        ids4 = np.concatenate([np.asarray(ids), np.asarray(ids)[:1]])  # 4 rows: data axis 2
        am4 = np.concatenate([am, am[:1]])
        batch = sharding.shard_batch({"ids": ids4, "am": am4}, mesh)
        out = nnx.jit(lambda m, i, a: m(i, attention_mask=a))(sharded, batch["ids"], batch["am"])
        np.testing.assert_allclose(np.asarray(out)[:3][real], want_logits[real], atol=2e-5, rtol=0)


def test_padded_causal_path_selects_away_kernel_garbage(monkeypatch):
    """A kernel that leaves NaN in the rows past the lengths — in its output and in dQ (undefined
    for such rows in some fused kernels) — changes nothing: those rows are zeroed going in and
    coming out by selects, so the outputs are finite (zeros on padding rows) and the gradients
    those of the clean kernel."""
    q, k, v, mask, valid = _padded_inputs("both", seed=6)
    clean_fn = jax.nn.dot_product_attention

    @jax.custom_vjp
    def poison(out, q, dead):
        return jnp.where(dead, jnp.nan, out)

    def poison_fwd(out, q, dead):
        return poison(out, q, dead), dead

    def poison_bwd(dead, g):  # out's cotangent passes; q's gets NaN on the dead rows
        return g, jnp.where(dead, jnp.nan, 0.0).astype(g.dtype), None

    poison.defvjp(poison_fwd, poison_bwd)

    def garbage_kernel(q, k, v, *, query_seq_lengths, **kw):
        out = clean_fn(q, k, v, query_seq_lengths=query_seq_lengths, **kw)
        dead = jnp.arange(q.shape[1])[None, :, None, None] >= query_seq_lengths[:, None, None, None]
        return poison(out, q, jnp.broadcast_to(dead, q.shape))

    ct = np.random.RandomState(7).randn(*q.shape) * valid[:, :, None, None]

    def run():
        def f(q, k, v):
            return qwen3.causal_padded_attention(q, k, v, jnp.asarray(valid), "xla")

        # A new jit per run: traced with the kernel in place at the call (eager grads compile
        # op by op).
        out, grads = jax.jit(
            lambda *a: (f(*a), jax.grad(lambda *b: jnp.sum(f(*b) * ct), argnums=(0, 1, 2))(*a))
        )(q, k, v)
        return np.asarray(out), [np.asarray(g) for g in grads]

    want_out, want_grads = run()
    monkeypatch.setattr(jax.nn, "dot_product_attention", garbage_kernel)
    got_out, got_grads = run()
    assert np.isfinite(got_out).all() and (got_out[~valid] == 0).all()
    np.testing.assert_array_equal(got_out, want_out)
    for a, b in zip(got_grads, want_grads, strict=True):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
