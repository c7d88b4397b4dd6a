"""Qwen3Config, presets, and model invariants (numpy references for the building blocks)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_rl.models import PRESETS, Qwen3Config, Qwen3ForCausalLM
from rubric_rl.models.qwen3 import RMSNorm, attention, rope, rope_tables

CFG = PRESETS["tiny"]


@pytest.fixture(scope="module")
def model():
    return Qwen3ForCausalLM(CFG, rngs=nnx.Rngs(0))


def test_hf_dict_round_trip_and_rope_layouts():
    cfg = PRESETS["qwen3_8b"]
    d = cfg.to_hf_dict(dtype="bfloat16")
    assert d["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e6}
    assert d["architectures"] == ["Qwen3ForCausalLM"] and d["torch_dtype"] == "bfloat16"
    assert Qwen3Config.from_hf_dict(d) == cfg
    v5 = {k: v for k, v in d.items() if k != "rope_theta"}
    v5["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    assert Qwen3Config.from_hf_dict(v5).rope_theta == 5e5
    legacy = {k: v for k, v in d.items() if k != "rope_parameters"}
    legacy["rope_theta"] = 2e4
    assert Qwen3Config.from_hf_dict(legacy).rope_theta == 2e4
    with pytest.raises(NotImplementedError, match="yarn"):
        Qwen3Config.from_hf_dict({**legacy, "rope_scaling": {"rope_type": "yarn", "factor": 4}})
    with pytest.raises(KeyError, match="intermediate_size"):
        Qwen3Config.from_hf_dict({k: v for k, v in d.items() if k != "intermediate_size"})
    with pytest.raises(ValueError, match="model_type"):
        Qwen3Config.from_hf_dict({**d, "model_type": "mistral"})
    with pytest.raises(ValueError, match="num_key_value_heads"):
        Qwen3Config(64, 32, 64, 1, 4, 3, 8)


# Published sizes of the Qwen3 dense models (total parameters, embeddings included).
@pytest.mark.parametrize(
    "name,billions",
    [("qwen3_0_6b", 0.596), ("qwen3_1_7b", 1.721), ("qwen3_4b", 4.022), ("qwen3_8b", 8.191)],
)
def test_real_preset_sizes(name, billions):
    cfg = PRESETS[name]
    assert abs(cfg.num_params() / 1e9 - billions) < 0.002
    # num_params() counts what the model builds (2 layers: the count is linear in layers).
    short = dataclasses.replace(cfg, num_hidden_layers=2)
    abstract = nnx.eval_shape(lambda: Qwen3ForCausalLM(short, rngs=nnx.Rngs(0)))
    n = sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    assert n == short.num_params()


@pytest.mark.parametrize("name,millions", [("1m", 1), ("5m", 5), ("20m", 20)])
def test_small_presets(name, millions):
    cfg = PRESETS[name]
    assert 0.9 * millions <= cfg.num_params() / 1e6 <= 1.1 * millions
    assert 512 <= cfg.vocab_size <= 8192


def test_tiny_param_count(model):
    assert sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) == CFG.num_params()


def test_rmsnorm_and_rope_against_numpy():
    rs = np.random.RandomState(0)
    x = rs.randn(2, 3, 4, 8).astype(np.float32)
    norm = RMSNorm(8, 1e-6, dtype=jnp.float32, param_dtype=jnp.float32)
    scale = rs.randn(8).astype(np.float32)
    norm.scale[...] = scale
    ref = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * scale
    np.testing.assert_allclose(np.asarray(norm(jnp.asarray(x))), ref, rtol=1e-5, atol=1e-6)

    pos = rs.randint(0, 50, (2, 3))
    inv = 1.0 / (1e4 ** (np.arange(0, 8, 2) / 8))
    ang = pos[..., None, None] * np.concatenate([inv, inv])  # [2, 3, 1, 8]
    rot = np.concatenate([-x[..., 4:], x[..., :4]], -1)
    ref = x * np.cos(ang) + rot * np.sin(ang)
    np.testing.assert_allclose(
        np.asarray(rope(jnp.asarray(x), jnp.asarray(pos), 1e4)), ref, rtol=1e-4, atol=1e-5
    )


@pytest.mark.default_codegen
def test_rope_tables_fusion_boundary_changes_no_value(model, monkeypatch):
    """On CPU the tables of T > 1 positions come out of a one-trip while loop (a fusion boundary,
    see `rope_tables`): bit-identical to the plain formulation, for any first position (0, 7, and
    a negative one, which makes the loop run more trips), jitted, in the model's logits and
    gradients, and with T = 1 (no loop); both match numpy."""
    import rubric_rl.models.qwen3 as q3

    rs = np.random.RandomState(2)
    base = rs.randint(0, 300, (3, 6)).astype(np.int32)
    ids = jnp.asarray(rs.randint(0, CFG.vocab_size, (3, 6)))
    positions = []
    for first in (0, 7, -3):
        pos = base.copy()
        pos[0, 0] = first
        positions.append(pos)

    def run():
        # New jits, traced under the current ROPE_TABLE_LOOP; the positions are arguments, so
        # each program compiles once for the three first positions.
        tables = jax.jit(rope_tables, static_argnums=(1, 2))
        loss = nnx.jit(lambda m, p: jnp.sum(jnp.sin(m(ids, positions=p))))
        grad = nnx.jit(nnx.grad(loss))
        out = []
        for pos in positions:
            p = jnp.asarray(pos)
            t = [tables(p, 16, 1e6), tables(p[:, :1], 16, 1e6)]
            out.append((t, model(ids, positions=p), nnx.state(grad(model, p))))
        return out

    looped = run()
    text = jax.jit(rope_tables, static_argnums=(1, 2)).lower(positions[2], 16, 1e6).as_text()
    assert ("while" in text) == (jax.default_backend() == "cpu")
    monkeypatch.setattr(q3, "ROPE_TABLE_LOOP", False)
    plain = run()
    for pos, (tables, logits, grads), want in zip(positions, looped, plain, strict=True):
        got = jax.tree.leaves((tables, logits, grads))
        for a, b in zip(got, jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        ang = pos[..., None].astype(np.float64) / (1e6 ** (np.arange(0, 16, 2) / 16))
        np.testing.assert_allclose(np.asarray(tables[0][0][:, :, 0]), np.cos(ang), atol=5e-5)
        np.testing.assert_allclose(np.asarray(tables[0][1][:, :, 0]), np.sin(ang), atol=5e-5)
        assert tables[1][0].shape == (3, 1, 1, 8)


def test_gqa_attention_against_numpy():
    rs = np.random.RandomState(1)
    b, t, h, kv, d = 2, 5, 6, 2, 4
    q, k, v = rs.randn(b, t, h, d), rs.randn(b, t, kv, d), rs.randn(b, t, kv, d)
    mask = np.tril(np.ones((t, t), bool))[None] & (rs.rand(b, 1, t) > 0.3)
    mask[:, :, 0] = True
    got = np.asarray(attention(*(jnp.asarray(a, jnp.float32) for a in (q, k, v)), mask))
    ref = np.zeros((b, t, h, d))
    for i in range(b):
        for j in range(h):
            g = j // (h // kv)  # query head j reads kv head j // group
            s = q[i, :, j] @ k[i, :, g].T / np.sqrt(d)
            s = np.where(mask[i], s, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            ref[i, :, j] = (p / p.sum(-1, keepdims=True)) @ v[i, :, g]
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_logits_are_hidden_times_unembed(model):
    ids = jnp.asarray(np.random.RandomState(0).randint(0, CFG.vocab_size, (2, 5)))
    h, u, logits = nnx.jit(lambda m, i: (m.hidden_states(i), m.unembed(), m(i)))(model, ids)
    assert h.shape == (2, 5, CFG.hidden_size) and u.shape == (CFG.hidden_size, CFG.vocab_size)
    ref = np.asarray(h, np.float64).reshape(10, -1) @ np.asarray(u, np.float64)
    np.testing.assert_allclose(np.asarray(logits).reshape(10, -1), ref, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(np.asarray(u), np.asarray(model.embed.embedding[...]).T)


def test_padding_invariance_and_default_positions(model, helpers):
    """The same real tokens give the same logits unpadded, left-padded and right-padded."""
    ids = np.random.RandomState(5).randint(1, CFG.vocab_size, (1, 4)).astype(np.int32)
    plain = helpers.forward(model, ids)
    z = np.zeros((1, 3), np.int32)
    left = helpers.forward(
        model, np.concatenate([z, ids], 1), np.concatenate([z, np.ones_like(ids)], 1)
    )
    right = helpers.forward(
        model, np.concatenate([ids, z], 1), np.concatenate([np.ones_like(ids), z], 1)
    )
    np.testing.assert_allclose(left[:, 3:], plain, atol=1e-5)
    np.testing.assert_allclose(right[:, :4], plain, atol=1e-5)
    assert np.isfinite(left).all()
    # RoPE is relative: a uniform shift of positions keeps the logits; gaps change them.
    fwd = nnx.jit(lambda m, i, p: m(i, positions=p))
    shifted = np.asarray(fwd(model, jnp.asarray(ids), jnp.arange(4)[None] + 7))
    gapped = np.asarray(fwd(model, jnp.asarray(ids), jnp.asarray([[0, 2, 3, 9]])))
    np.testing.assert_allclose(shifted, plain, atol=1e-5)
    np.testing.assert_allclose(gapped[:, 0], plain[:, 0], atol=1e-5)
    assert np.abs(gapped[:, 1:] - plain[:, 1:]).max() > 1e-3


def test_bfloat16_compute(model, helpers):
    ids = np.random.RandomState(6).randint(0, CFG.vocab_size, (2, 6)).astype(np.int32)
    ref = helpers.forward(model, ids)
    graphdef, state = nnx.split(model)
    bf = Qwen3ForCausalLM(CFG, rngs=nnx.Rngs(0), dtype=jnp.bfloat16)
    nnx.update(bf, state)  # same float32 params, bf16 compute
    h, got = nnx.jit(lambda m, i: (m.hidden_states(i), m(i)))(bf, jnp.asarray(ids))
    assert h.dtype == jnp.bfloat16
    got = np.asarray(got)
    assert got.dtype == np.float32
    err = np.abs(got - ref).max()
    assert 0 < err < 0.05 * np.abs(ref).max() + 1e-3


def test_missing_fields_take_transformers_defaults():
    transformers = pytest.importorskip("transformers")
    minimal = {
        "vocab_size": 50,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 1,
        "num_attention_heads": 32,
    }
    ours = Qwen3Config.from_hf_dict(minimal)
    hf = transformers.Qwen3Config(**minimal)
    assert ours.rope_theta == hf.rope_parameters["rope_theta"]
    assert ours.head_dim == hf.head_dim
    assert ours.num_key_value_heads == hf.num_key_value_heads
    assert ours.tie_word_embeddings == hf.tie_word_embeddings
    assert ours.max_position_embeddings == hf.max_position_embeddings
    assert ours.rms_norm_eps == hf.rms_norm_eps


def test_remat_same_gradients():
    ids = jnp.asarray(np.random.RandomState(0).randint(0, CFG.vocab_size, (2, 6)))
    one_layer = dataclasses.replace(CFG, num_hidden_layers=1)  # smaller programs to compile
    graphdef, state = nnx.split(Qwen3ForCausalLM(one_layer, rngs=nnx.Rngs(2)))

    def loss(state, remat):
        m = nnx.merge(graphdef, state)
        m.remat = remat
        return jax.nn.log_softmax(m(ids)).mean()

    # one compiled program for both (compiles dominate on CPU)
    g0, g1 = jax.jit(lambda st: (jax.grad(loss)(st, False), jax.grad(loss)(st, True)))(state)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-7)
    assert "remat" in str(jax.make_jaxpr(jax.grad(loss), static_argnums=1)(state, True))
    assert "remat" not in str(jax.make_jaxpr(jax.grad(loss), static_argnums=1)(state, False))
    assert max(float(jnp.abs(a).max()) for a in jax.tree.leaves(g0)) > 0
