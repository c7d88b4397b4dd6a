"""Scanned decoder layers (`Qwen3Config.scan_layers`) against the loop version on the same weights:
logits, gradients (with and without remat), KV-cache decoding through the JAX engine and its
prefix-reuse sessions, Hugging Face I/O (byte-identical files, transformers' logits), sharding
on 8 forced CPU devices, orbax train-state checkpoints and the builder's flag."""

import dataclasses
import filecmp
import functools
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_rl.core import checkpointing as ck
from rubric_rl.core import sharding
from rubric_rl.core import train_step as ts
from rubric_rl.models import PRESETS, Qwen3ForCausalLM, from_pretrained, save_pretrained
from rubric_rl.models.layer_stack import stack_layers, unstack_layers
from rubric_rl.rollout.engine import GenerationRequest, SamplingParams
from rubric_rl.rollout.jax_engine import JaxEngine, JaxEngineConfig

LAYERS = 2  # the smallest stack where a dropped, repeated or swapped layer shows
FAMILIES = ["tiny", "qwen2_tiny"]
ENGINE_CFG = JaxEngineConfig(prompt_buckets=(16,), batch_buckets=(4,), pad_id=0)
is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731


def _cfg(preset: str, scan: bool, **kw) -> object:
    return dataclasses.replace(PRESETS[preset], num_hidden_layers=LAYERS, scan_layers=scan, **kw)


def _pair(preset: str = "tiny", seed: int = 0, **kw) -> tuple[Qwen3ForCausalLM, Qwen3ForCausalLM]:
    """(looped, scanned) models of one seed: the same weights, the scanned one stacked. Qwen2's
    zero-initialised biases are randomised in both (else they would hide a mix-up)."""
    loop = Qwen3ForCausalLM(_cfg(preset, False, **kw), rngs=nnx.Rngs(seed))
    if loop.config.attention_bias:
        for i, layer in enumerate(loop.layers):
            for j, proj in enumerate((layer.attn.q_proj, layer.attn.k_proj, layer.attn.v_proj)):
                key = jax.random.key(100 * seed + 3 * i + j)
                proj.bias[...] = 0.1 * jax.random.normal(key, proj.bias.shape)
    scan = Qwen3ForCausalLM(_cfg(preset, True, **kw), rngs=nnx.Rngs(seed + 1))
    nnx.update(scan.layers, nnx.state(stack_layers(list(loop.layers))))
    nnx.update(scan, nnx.state(loop, nnx.Not(nnx.PathContains("layers"))))
    return loop, scan


def _batch(vocab: int, side: str):
    rs = np.random.RandomState(3)
    ids = rs.randint(1, vocab, (3, 10)).astype(np.int32)
    mask = np.ones_like(ids)
    for row, n in enumerate((10, 6, 1)):
        if side == "left":
            mask[row, : 10 - n] = 0
        else:
            mask[row, n:] = 0
    return jnp.asarray(np.where(mask > 0, ids, 0)), jnp.asarray(mask)


@nnx.jit
def _logits(model, ids, mask):
    return model(ids, attention_mask=mask)


def _loss(model, ids, mask):
    """Masked next-token NLL: touches every parameter (embedding, every layer, norm, head)."""
    logp = jax.nn.log_softmax(model(ids, attention_mask=mask)[:, :-1])
    nll = -jnp.take_along_axis(logp, ids[:, 1:, None], -1)[..., 0]
    w = (mask[:, 1:] * mask[:, :-1]).astype(jnp.float32)
    return jnp.sum(nll * w) / jnp.sum(w)


@functools.partial(jax.jit, static_argnums=0)
def _value_and_grad(graphdef, params, rest, ids, mask):
    return jax.value_and_grad(lambda p: _loss(nnx.merge(graphdef, p, rest), ids, mask))(params)


def _grads(model, ids, mask):
    """(loss, gradients): one compiled program per model structure (the graphdef, remat
    included), shared by every test that differentiates that structure."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return _value_and_grad(graphdef, params, rest, ids, mask)


def _unstacked_grads(grads, cfg) -> nnx.State:
    """A scanned model's gradient state laid out like the looped model's (layers 0..L-1)."""
    holder = Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0))
    nnx.update(holder, grads)
    loop = Qwen3ForCausalLM(dataclasses.replace(cfg, scan_layers=False), rngs=nnx.Rngs(0))
    for dst, src in zip(loop.layers, unstack_layers(holder.layers), strict=True):
        nnx.update(dst, nnx.state(src))
    nnx.update(loop, nnx.state(holder, nnx.Not(nnx.PathContains("layers"))))
    return nnx.state(loop, nnx.Param)


def _assert_trees_close(a, b, atol):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        assert x.shape == y.shape
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=0)


# ----------------------------------------------------------------------------- parameters


def test_same_seed_same_weights_stacked_with_replicated_layer_axis():
    loop = Qwen3ForCausalLM(_cfg("tiny", False), rngs=nnx.Rngs(5))
    scan = Qwen3ForCausalLM(_cfg("tiny", True), rngs=nnx.Rngs(5))
    per_layer = [jax.tree.leaves(nnx.state(layer), is_leaf=is_var) for layer in loop.layers]
    stacked = jax.tree.leaves(nnx.state(scan.layers), is_leaf=is_var)
    assert len(stacked) == len(per_layer[0]) > 0
    for i, var in enumerate(stacked):
        want = np.stack([np.asarray(layer[i].get_value()) for layer in per_layer])
        np.testing.assert_array_equal(np.asarray(var.get_value()), want)  # same rng draws
        loop_names = per_layer[0][i].get_metadata()["out_sharding"]
        assert var.get_metadata()["out_sharding"] == (None, *loop_names)
    assert scan.config.num_params() == loop.config.num_params()
    n = lambda m: sum(x.size for x in jax.tree.leaves(nnx.state(m, nnx.Param)))  # noqa: E731
    assert n(scan) == n(loop) == loop.config.num_params()
    # unstack_layers inverts stack_layers exactly.
    for a, b in zip(unstack_layers(scan.layers), loop.layers, strict=True):
        _assert_trees_close(nnx.state(a), nnx.state(b), atol=0)


# ----------------------------------------------------------------------------- forward, grads


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("preset", FAMILIES)
def test_logits_equal_loop(preset, side):
    loop, scan = _pair(preset)
    ids, mask = _batch(loop.config.vocab_size, side)
    want, got = np.asarray(_logits(loop, ids, mask)), np.asarray(_logits(scan, ids, mask))
    real = np.asarray(mask) > 0
    np.testing.assert_allclose(got[real], want[real], atol=1e-5, rtol=0)
    assert np.abs(want[real]).max() > 0.05  # not vacuous


@pytest.mark.parametrize(
    "preset,remat",
    [
        ("tiny", False),
        ("tiny", True),
        ("tiny", "dots"),
        ("qwen2_tiny", False),
        ("qwen2_tiny", "full"),
    ],
)
def test_gradients_equal_loop(preset, remat):
    """Scanned (with the remat setting) vs the plain loop: the same loss and gradients."""
    loop, scan = _pair(preset, seed=2, tie_word_embeddings=False)
    scan.remat = remat
    ids, mask = _batch(loop.config.vocab_size, "left")
    loss_l, g_loop = _grads(loop, ids, mask)
    loss_s, g_scan = _grads(scan, ids, mask)
    np.testing.assert_allclose(float(loss_s), float(loss_l), atol=1e-6, rtol=0)
    _assert_trees_close(_unstacked_grads(g_scan, scan.config), g_loop, atol=1e-5)
    # Every layer receives a gradient (the scan did not drop or repeat a layer).
    up = np.asarray(g_scan["layers"]["mlp"]["up_proj"]["kernel"].get_value())
    assert up.shape[0] == LAYERS and (np.abs(up).reshape(LAYERS, -1).max(-1) > 0).all()


# ----------------------------------------------------------------------------- decoding


def _requests(vocab: int, lens=(3, 9, 14, 5)):
    rs = np.random.RandomState(7)
    return [
        GenerationRequest(tuple(int(t) for t in rs.randint(1, vocab, n)), f"r{i}", task_index=i)
        for i, n in enumerate(lens)
    ]


def _generate(engine, reqs, n=6):
    out = engine.generate(reqs, SamplingParams(max_new_tokens=n, temperature=0.0))
    return [g[0].token_ids for g in out], [np.asarray(g[0].logprobs) for g in out]


def test_init_cache_is_one_stacked_pair():
    _, scan = _pair()
    c = scan.config
    (cache,) = scan.init_cache(3, 11)
    assert set(cache) == {"k", "v"}
    assert cache["k"].shape == (3, LAYERS, c.num_key_value_heads, c.head_dim, 11)
    assert cache["v"].shape == (3, LAYERS, c.num_key_value_heads, 11, c.head_dim)
    mesh = sharding.make_mesh(2, 2, 2)
    sh = sharding.kv_cache_shardings(scan.init_cache(4, 8), mesh)
    assert sh[0]["k"].spec == jax.sharding.PartitionSpec(
        ("data", "fsdp"), None, "tensor", None, None
    )


def _session_turns(engine, vocab: int):
    """Two agent turns of two conversations through a prefix-reuse session: ([(tokens,
    log-probs)] per conversation and turn, the session's reused prompt tokens)."""
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    convs = [list(r.prompt_ids) for r in _requests(vocab, (3, 6))]
    turns = []
    with engine.prefix_session() as s:
        for k in range(2):
            reqs = [GenerationRequest(tuple(c), f"e{e}/{k}") for e, c in enumerate(convs)]
            gens = s.generate(reqs, params, [f"e{e}" for e in range(len(convs))])
            for e, (g,) in enumerate(gens):
                turns.append((g.token_ids, np.asarray(g.logprobs)))
                convs[e] += list(g.token_ids) + [5 + e, 7]
        reused = s.stats["reused_tokens"]
    return turns, reused


@pytest.fixture(scope="module", params=FAMILIES)
def decoding(request):
    """A (looped, scanned) pair and the looped model's decoding through the JAX engine, read by
    the decoding tests: greedy tokens and log-probs of `_requests`, prefix-session turns."""
    loop, scan = _pair(request.param, seed=3)
    vocab = loop.config.vocab_size
    engine = JaxEngine(loop, ENGINE_CFG)
    reqs = _requests(vocab)
    greedy = _generate(engine, reqs)
    turns, reused = _session_turns(engine, vocab)
    assert reused > 0
    return types.SimpleNamespace(
        preset=request.param, loop=loop, scan=scan, reqs=reqs, greedy=greedy, turns=turns
    )


def test_engine_greedy_equals_loop(decoding):
    """Scanned decoding (under the scan over the stacked cache) == looped: greedy tokens and
    log-probs; and (tiny) two agent turns through a prefix-reuse session (slot relayout of the
    stacked cache)."""
    tok_l, lp_l = decoding.greedy
    eng = JaxEngine(decoding.scan, ENGINE_CFG)
    assert eng.kv_only_cache  # prefix reuse stays available for the scanned cache
    tok_s, lp_s = _generate(eng, decoding.reqs)
    assert tok_s == tok_l and all(len(t) == 6 for t in tok_l)
    for a, b in zip(lp_s, lp_l, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    assert len({t for toks in tok_l for t in toks}) > 3  # not one repeated token
    if decoding.preset == "tiny":
        turns, reused = _session_turns(eng, decoding.loop.config.vocab_size)
        assert reused > 0
        for (ta, la), (tb, lb) in zip(turns, decoding.turns, strict=True):
            assert ta == tb
            np.testing.assert_allclose(la, lb, atol=1e-5, rtol=0)


def test_unscanned_decode_of_a_scanned_model_equals_loop(decoding):
    """`JaxEngineConfig(scan_decode=False)`: a scanned model decodes through its `unscanned`
    view (layers as a loop over slices of the stacked weights, per-layer caches): the loop
    model's tokens and log-probs, bit for bit; a prefix-reuse session equals the loop's too.
    The view leaves the scanned model as it was."""
    loop, scan = decoding.loop, decoding.scan
    assert loop.unscanned() is loop
    view = scan.unscanned()
    assert not view.config.scan_layers and len(view.layers) == LAYERS
    assert scan.config.scan_layers and len(scan.init_cache(3, 11)) == 1
    cache = view.init_cache(3, 11)
    assert len(cache) == LAYERS and cache[0]["k"].ndim == 4
    tok_l, lp_l = decoding.greedy
    eng = JaxEngine(scan, dataclasses.replace(ENGINE_CFG, scan_decode=False))
    assert eng.kv_only_cache
    tok_u, lp_u = _generate(eng, decoding.reqs)
    assert tok_u == tok_l and len({t for toks in tok_l for t in toks}) > 3
    for a, b in zip(lp_u, lp_l, strict=True):
        np.testing.assert_array_equal(a, b)
    turns, reused = _session_turns(eng, loop.config.vocab_size)
    assert reused > 0
    assert [t for t, _ in turns] == [t for t, _ in decoding.turns]


# ----------------------------------------------------------------------------- HF I/O


@pytest.mark.parametrize("preset", FAMILIES)
def test_hf_export_identical_and_load_scanned(tmp_path, preset):
    loop, scan = _pair(preset, seed=5, tie_word_embeddings=False)
    save_pretrained(loop, str(tmp_path / "loop"))
    save_pretrained(scan, str(tmp_path / "scan"))
    files = sorted(os.listdir(tmp_path / "loop"))
    assert files == sorted(os.listdir(tmp_path / "scan")) and "model.safetensors" in files
    for f in files:  # byte for byte: tensor order, names, config.json (no scan_layers in it)
        assert filecmp.cmp(tmp_path / "loop" / f, tmp_path / "scan" / f, shallow=False), f
    back = from_pretrained(str(tmp_path / "loop"), scan_layers=True)
    assert back.config == scan.config
    _assert_trees_close(nnx.state(back), nnx.state(scan), atol=0)


def test_hf_load_scanned_matches_transformers(helpers, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    cfg = dataclasses.replace(helpers.PARITY_CONFIGS["untied_gqa2"], num_hidden_layers=3)
    hf = helpers.make_torch_checkpoint(cfg, str(tmp_path), seed=9)
    ours = from_pretrained(str(tmp_path), scan_layers=True)
    assert ours.config == dataclasses.replace(cfg, scan_layers=True)
    ids, mask = helpers.padded_batch(cfg.vocab_size, [9, 5, 1], 9, "left", seed=3)
    ref = helpers.torch_logits(hf, ids, mask)
    got = np.asarray(_logits(ours, jnp.asarray(ids), jnp.asarray(mask)))
    np.testing.assert_allclose(got[mask > 0], ref[mask > 0], atol=1e-4, rtol=0)


def test_hf_sharded_load_reads_every_layer(tmp_path):
    _, scan = _pair(seed=6)
    save_pretrained(scan, str(tmp_path))
    mesh = sharding.make_mesh(1, 4, 2)
    back = from_pretrained(str(tmp_path), scan_layers=True, mesh=mesh)
    kernel = back.layers.mlp.up_proj.kernel.get_value()
    assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    _assert_trees_close(nnx.state(back), nnx.state(scan), atol=0)


# ----------------------------------------------------------------------------- sharding


def test_sharded_equals_unsharded():
    """Mesh (data 2, fsdp 2, tensor 2) of the 8 forced CPU devices: the stacked layer axis is
    replicated, the rest as in the looped model; logits, gradients and greedy decoding equal the
    1-device scanned model."""
    _, scan = _pair(seed=7, tie_word_embeddings=False)
    ids, mask = _batch(scan.config.vocab_size, "left")
    ids, mask = jnp.concatenate([ids, ids[:1]]), jnp.concatenate([mask, mask[:1]])  # B = 4
    want_logits = np.asarray(_logits(scan, ids, mask))
    want_loss, want_grads = _grads(scan, ids, mask)
    reqs = _requests(scan.config.vocab_size)
    want_tok, want_lp = _generate(JaxEngine(scan, ENGINE_CFG), reqs)

    mesh = sharding.make_mesh(2, 2, 2)
    sharded = Qwen3ForCausalLM(scan.config, rngs=nnx.Rngs(0))
    nnx.update(sharded, nnx.state(scan))
    sharding.shard_model(sharded, mesh)
    q = sharded.layers.attn.q_proj.kernel.get_value()
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    assert len(q.devices()) == 8
    batch = sharding.shard_batch({"ids": ids, "mask": mask}, mesh)
    got = np.asarray(_logits(sharded, batch["ids"], batch["mask"]))
    real = np.asarray(mask) > 0
    np.testing.assert_allclose(got[real], want_logits[real], atol=1e-5, rtol=0)
    loss, grads = _grads(sharded, batch["ids"], batch["mask"])
    np.testing.assert_allclose(float(loss), float(want_loss), atol=1e-6, rtol=0)
    _assert_trees_close(grads, want_grads, atol=1e-5)
    tok, lp = _generate(JaxEngine(sharded, ENGINE_CFG, mesh=mesh), reqs)
    assert tok == want_tok
    for a, b in zip(lp, want_lp, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    # scan_decode=False on the mesh: the unscanned view's layers keep the stacked weights'
    # sharding less the layer axis, and decode the same tokens.
    view = sharded.unscanned()
    q0 = view.layers[0].attn.q_proj.kernel.get_value()
    assert q0.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    np.testing.assert_array_equal(np.asarray(q0), np.asarray(q)[0])
    cfg = dataclasses.replace(ENGINE_CFG, scan_decode=False)
    tok, lp = _generate(JaxEngine(sharded, cfg, mesh=mesh), reqs)
    assert tok == want_tok
    for a, b in zip(lp, want_lp, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------- checkpoints


def test_orbax_train_state_round_trip_and_layout_mismatch(tmp_path):
    mesh = sharding.make_mesh(2, 2, 2)
    cfg = _cfg("tiny", True)
    model = sharding.init_sharded(lambda: Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)), mesh)
    _, state = ts.init_train_state(model, ts.TrainConfig(), mesh)
    keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(state))))
    state = jax.tree.map(
        lambda x: x + jax.random.normal(next(keys), x.shape, x.dtype) if x.dtype.kind == "f" else x,
        state,
    )
    manager = ck.make_checkpoint_manager(str(tmp_path / "ckpt"))
    assert ck.save_train_state(manager, 3, state, wait=True)
    other = sharding.make_mesh(1, 4, 2)
    target = ck.abstract_train_state(state, ts.train_state_shardings(state, other))
    restored = ck.restore_train_state(manager, target)
    _assert_trees_close(restored, jax.tree.map(np.asarray, state), atol=0)
    kernel = restored.params["layers"]["mlp"]["up_proj"]["kernel"].get_value()
    assert kernel.shape[0] == LAYERS and kernel.sharding.spec[0] is None
    # A looped model's state is another tree: orbax refuses it (the run's config record refuses
    # a flipped model.scan_layers on --resume before it gets here).
    loop = sharding.init_sharded(
        lambda: Qwen3ForCausalLM(_cfg("tiny", False), rngs=nnx.Rngs(0)), mesh
    )
    _, loop_state = ts.init_train_state(loop, ts.TrainConfig(), mesh)
    loop_target = ck.abstract_train_state(loop_state, ts.train_state_shardings(loop_state, mesh))
    with pytest.raises(Exception):  # noqa: B017 - orbax's own error type varies by version
        ck.restore_train_state(manager, loop_target)


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_loop_remat_policies_keep_gradients(remat):
    # test_gradients_equal_loop's looped model and batch: its gradient program is shared.
    loop, _ = _pair(seed=2, tie_word_embeddings=False)
    ids, mask = _batch(loop.config.vocab_size, "left")
    _, want = _grads(loop, ids, mask)
    loop.remat = remat
    _, got = _grads(loop, ids, mask)
    _assert_trees_close(got, want, atol=1e-6)


def test_remat_setting_is_checked():
    with pytest.raises(ValueError, match="remat='some'"):
        Qwen3ForCausalLM(_cfg("tiny", True), rngs=nnx.Rngs(0), remat="some")


def test_builder_passes_the_flag_and_refuses_qwen3_5():
    from rubric_rl.config import builders
    from rubric_rl.config.defaults import get_base_config

    config = get_base_config()
    tok = type("Tok", (), {"vocab_size": 100, "eos_id": 2})()
    config.model.name = "tiny"
    assert builders.model_config(config, tok).scan_layers is False
    config.model.scan_layers = True
    assert builders.model_config(config, tok).scan_layers is True
    config.model.remat = "dots"
    model = builders.build_model(config, tok, sharding.make_mesh(1, 1, 1, jax.devices()[:1]))
    assert model.config.scan_layers and model.remat == "dots"
    tok.pad_id = 0
    assert builders.build_engine(config, model, tok, None).config.scan_decode is True
    config.rollout.scan_decode = False
    assert builders.build_engine(config, model, tok, None).config.scan_decode is False
    from rubric_rl.config.config_validation import validate_config

    validate_config(config)
    with config.unlocked():
        del config.rollout["scan_decode"]
        config.rollout.scan_decode = "no"
    with pytest.raises(ValueError, match="rollout.scan_decode.*True or False"):
        validate_config(config)
    config.model.remat = "everything"
    with pytest.raises(ValueError, match="config.model.remat"):
        builders.build_model(config, tok, None)
    config.model.remat = "none"
    qwen35 = [n for n in builders.PRESETS if n.startswith("qwen3_5") and "tiny" in n]
    if qwen35:
        config.model.name = qwen35[0]
        with pytest.raises(ValueError, match="config.model.scan_layers"):
            builders.model_config(config, tok)
