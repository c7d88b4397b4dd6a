"""Our Qwen3.5 dense text model vs transformers' PyTorch `Qwen3_5ForCausalLM` on the same
safetensors (import, export, multimodal text tower), and its config handling."""

import json
import logging

import jax
import numpy as np
import pytest
from flax import nnx

from rubric_rl.models import from_pretrained, save_pretrained
from rubric_rl.models.qwen3_5 import QWEN3_5_PRESETS, Qwen3_5Config, Qwen3_5ForCausalLM
from rubric_rl.models.rngs import init_rngs

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

L, F = "linear_attention", "full_attention"


def _cfg(types, heads, kv, tied, **kw):
    base = dict(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=len(types),
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=16,
        layer_types=tuple(types),
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        tie_word_embeddings=tied,
    )
    return Qwen3_5Config(**{**base, **kw})


# Layer patterns, GQA ratios 4:1, 2:1, 1:1, tied and untied, partial rotary 0.25 / 0.5 / 1.
CONFIGS = {
    "lf_tied_gqa4": _cfg([L, F], 4, 1, True),
    "llfl_untied_gqa2": _cfg([L, L, F, L], 4, 2, False, partial_rotary_factor=0.5, rope_theta=1e6),
    "fl_untied_mha": _cfg([F, L], 2, 2, False, partial_rotary_factor=1.0, rms_norm_eps=1e-5),
    "ff_tied_kv_heads3": _cfg(
        [F, F, L], 3, 1, True, linear_num_key_heads=1, linear_num_value_heads=3, head_dim=8,
        partial_rotary_factor=0.5,
    ),
}  # fmt: skip


def make_torch_qwen3_5(cfg: Qwen3_5Config, seed: int):
    """A transformers Qwen3_5ForCausalLM of `cfg` with every weight random, including the norms
    (HF initialises the zero-centred ones to 0 and the gated one to 1, hiding mix-ups)."""
    torch.manual_seed(seed)
    hf_cfg = transformers.Qwen3_5TextConfig(**cfg.to_hf_dict())
    model = transformers.Qwen3_5ForCausalLM(hf_cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(("dt_bias", "A_log")):
                p.copy_(0.3 * torch.randn_like(p) + (1.0 if "linear_attn.norm" in name else 0.0))
    return model


@pytest.fixture(scope="module")
def torch_ckpts(tmp_path_factory):
    out = {}
    for i, (name, cfg) in enumerate(CONFIGS.items()):
        path = str(tmp_path_factory.mktemp(f"hf35_{name}"))
        hf = make_torch_qwen3_5(cfg, seed=i)
        hf.save_pretrained(path)
        out[name] = (path, hf, from_pretrained(path))
    return out


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers(torch_ckpts, helpers, name, side):
    _, hf, ours = torch_ckpts[name]
    assert isinstance(ours, Qwen3_5ForCausalLM) and ours.config == CONFIGS[name]
    ids, mask = helpers.padded_batch(ours.config.vocab_size, [9, 5, 1], 9, side, seed=3)
    ref = helpers.torch_logits(hf, ids, mask)
    got = helpers.forward(ours, ids, mask)
    assert got.dtype == np.float32 and got.shape == ref.shape
    real = mask > 0
    np.testing.assert_allclose(got[real], ref[real], atol=1e-4, rtol=0)
    assert np.abs(ref[real]).max() > 0.05  # not vacuous


def test_unpadded_and_long_sequence_match(torch_ckpts, helpers):
    """No mask, T = 70 (> one Gated DeltaNet chunk of 64): the chunk boundary is exercised."""
    _, hf, ours = torch_ckpts["llfl_untied_gqa2"]
    ids, mask = helpers.padded_batch(ours.config.vocab_size, [70, 70], 70, "left", seed=8)
    ref = helpers.torch_logits(hf, ids, mask)
    got = helpers.forward(ours, ids, None)
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_export_loads_in_transformers(torch_ckpts, helpers, tmp_path, name):
    _, _, ours = torch_ckpts[name]
    save_pretrained(ours, str(tmp_path))
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), output_loading_info=True
    )
    assert type(hf).__name__ == "Qwen3_5ForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    # test_logits_match_transformers' batch: the same compiled forward.
    ids, mask = helpers.padded_batch(ours.config.vocab_size, [9, 5, 1], 9, "left", seed=3)
    ref = helpers.torch_logits(hf.eval(), ids, mask)
    got = helpers.forward(ours, ids, mask)
    np.testing.assert_allclose(got[mask > 0], ref[mask > 0], atol=1e-4, rtol=0)
    with open(tmp_path / "config.json") as f:
        d = json.load(f)
    assert d["model_type"] == "qwen3_5_text" and d["architectures"] == ["Qwen3_5ForCausalLM"]
    assert Qwen3_5Config.from_hf_dict(d) == ours.config


def test_preset_round_trip_exact(tmp_path, helpers):
    cfg = QWEN3_5_PRESETS["qwen3_5_tiny"]
    model = Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(4))
    save_pretrained(model, str(tmp_path))
    back = from_pretrained(str(tmp_path))
    assert back.config == cfg
    a, b = nnx.state(model, nnx.Param), nnx.state(back, nnx.Param)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    ids, mask = helpers.padded_batch(cfg.vocab_size, [7, 3], 7, "right", seed=1)
    np.testing.assert_array_equal(
        helpers.forward(model, ids, mask), helpers.forward(back, ids, mask)
    )


def test_multimodal_checkpoint_loads_text_tower(tmp_path, helpers, caplog):
    """A transformers Qwen3_5ForConditionalGeneration checkpoint (model_type "qwen3_5"): its
    text tower loads; the vision weights are ignored with one log line."""
    text = CONFIGS["llfl_untied_gqa2"]
    torch.manual_seed(11)
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32)
    hf_cfg = transformers.Qwen3_5Config(
        text_config=text.to_hf_dict(), vision_config=vision, tie_word_embeddings=False
    )
    mm = transformers.Qwen3_5ForConditionalGeneration(hf_cfg).eval()
    with torch.no_grad():
        for name, p in mm.named_parameters():
            if "norm" in name and "language_model" in name:
                p.copy_(0.3 * torch.randn_like(p) + (1.0 if "linear_attn.norm" in name else 0.0))
    mm.save_pretrained(str(tmp_path))
    with caplog.at_level(logging.INFO, logger="rubric_rl.models.hf_io"):
        ours = from_pretrained(str(tmp_path))
    lines = [r.getMessage() for r in caplog.records if "multimodal" in r.getMessage()]
    assert len(lines) == 1 and "ignoring" in lines[0]
    assert ours.config == text
    # test_logits_match_transformers' batch: the same compiled forward (the same config).
    ids, mask = helpers.padded_batch(text.vocab_size, [9, 5, 1], 9, "left", seed=3)
    ref = helpers.torch_logits(mm, ids, mask)
    got = helpers.forward(ours, ids, mask)
    np.testing.assert_allclose(got[mask > 0], ref[mask > 0], atol=1e-4, rtol=0)


def test_config_defaults_and_errors():
    d = dict(
        model_type="qwen3_5_text", vocab_size=64, hidden_size=32, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=48,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=8,
    )  # fmt: skip
    cfg = Qwen3_5Config.from_hf_dict(d)
    # transformers' defaults: full attention every 4th layer, rope 1e4, partial rotary 0.25.
    assert cfg.layer_types == (L, L, L, F) * 2
    assert cfg.rope_theta == 1e4 and cfg.rotary_dim == 4 and not cfg.tie_word_embeddings
    hf = transformers.Qwen3_5TextConfig(**{k: v for k, v in d.items() if k != "model_type"})
    assert list(cfg.layer_types) == hf.layer_types
    with pytest.raises(NotImplementedError, match="qwen3_5_moe"):
        Qwen3_5Config.from_hf_dict({**d, "model_type": "qwen3_5_moe_text"})
    with pytest.raises(NotImplementedError, match="num_experts"):
        Qwen3_5Config.from_hf_dict({**d, "num_experts": 8})
    with pytest.raises(NotImplementedError, match="attention_bias"):
        Qwen3_5Config.from_hf_dict({**d, "attention_bias": True})
    with pytest.raises(NotImplementedError, match="rope_type"):
        Qwen3_5Config.from_hf_dict({**d, "rope_parameters": {"rope_type": "yarn"}})
    with pytest.raises(NotImplementedError, match="text_config.hidden_act"):
        mm = {"model_type": "qwen3_5", "text_config": {**d, "hidden_act": "gelu"}}
        Qwen3_5Config.from_hf_dict(mm)
    with pytest.raises(ValueError, match="layer_types"):
        Qwen3_5Config.from_hf_dict({**d, "layer_types": [L, F]})
    with pytest.raises(KeyError, match="num_hidden_layers"):
        Qwen3_5Config.from_hf_dict({k: v for k, v in d.items() if k != "num_hidden_layers"})


def test_num_params_matches_transformers():
    for cfg in [*CONFIGS.values(), QWEN3_5_PRESETS["qwen3_5_tiny"]]:
        hf = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**cfg.to_hf_dict()))
        n = sum(p.numel() for p in hf.parameters())  # tied: counted once by parameters()
        assert cfg.num_params() == n
        ours = Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(0))
        assert sum(x.size for x in jax.tree.leaves(nnx.state(ours, nnx.Param))) == n


@pytest.mark.parametrize("name", ["llfl_untied_gqa2", "ff_tied_kv_heads3"])
def test_decode_with_cache_matches_full_forward(torch_ckpts, helpers, name):
    """Left-padded prefill, then a 3-token chunk and two single steps through the cache (KV for
    attention layers, conv + recurrent state for linear ones): every logit equals the full
    forward's at the same position; a row whose slot is masked keeps its cache."""
    _, _, model = torch_ckpts[name]
    # p + n = 9 with 3 rows: the full forward is test_logits_match_transformers' compiled program.
    lengths, p, n = [4, 3, 1], 4, 5
    prompt, pmask = helpers.padded_batch(model.config.vocab_size, lengths, p, "left", seed=4)
    rs = np.random.RandomState(9)
    cont = rs.randint(0, model.config.vocab_size, (3, n)).astype(np.int32)
    ids = np.concatenate([prompt, cont], 1)
    mask = np.concatenate([pmask, np.ones((3, n), np.int32)], 1)
    full = helpers.forward(model, ids, mask)  # [B, p + n, V]

    decode = nnx.jit(lambda m, i, pos, c, idx, cm: m.decode(i, pos, c, idx, cm))
    cache = model.init_cache(3, p + n + 1)  # one spare slot for the masked step at the end
    cache_mask = np.zeros((3, p + n + 1), np.int32)
    cache_mask[:, :p] = pmask
    pos = np.maximum(np.cumsum(pmask, -1) - 1, 0).astype(np.int32)
    logits, cache = decode(model, prompt, pos, cache, 0, cache_mask)
    got = [np.asarray(logits)[:, -1]]
    real_len = np.asarray(lengths, np.int32)
    slot = p
    for chunk in (3, 1, 1):
        tok = cont[:, slot - p : slot - p + chunk]
        cache_mask[:, slot : slot + chunk] = 1
        pos = (real_len[:, None] + (slot - p) + np.arange(chunk)).astype(np.int32)
        logits, cache = decode(model, tok, pos, cache, slot, cache_mask)
        got.extend(np.asarray(logits)[:, j] for j in range(chunk))
        slot += chunk
    got = np.stack(got[:-1], 1)  # logits predicting tokens p .. p + n - 1
    np.testing.assert_allclose(got, full[:, p - 1 : p + n - 1], atol=1e-4, rtol=0)

    # One more step with row 0 masked (finished): its linear layers' state is unchanged.
    cache_mask[:, slot] = [0, 1, 1]
    last = cont[:, -1:]
    new = decode(model, last, pos[:, -1:] + 1, cache, slot, cache_mask)[1]
    layer = model.config.layer_types.index(L)
    for a, b in zip(jax.tree.leaves(cache[layer]), jax.tree.leaves(new[layer]), strict=True):
        np.testing.assert_array_equal(np.asarray(a)[0], np.asarray(b)[0])
        assert not np.array_equal(np.asarray(a)[1], np.asarray(b)[1])


def test_sharded_import_equals_one_device(torch_ckpts, helpers):
    """On an (fsdp=2, tensor=4) mesh of 8 CPU devices the Gated DeltaNet's conv kernel (HF
    [C, 1, K] read as our [K, C] slice by slice) and per-head vectors are split over "tensor",
    and the logits are unchanged."""
    from jax.sharding import PartitionSpec as P

    from rubric_rl.core.sharding import make_mesh

    path, _, ours = torch_ckpts["llfl_untied_gqa2"]
    sharded = from_pretrained(path, mesh=make_mesh(data=1, fsdp=2, tensor=4))
    gdn = sharded.layers[0].linear_attn
    conv = gdn.conv1d.kernel[...]
    assert conv.sharding.spec == P(None, "tensor")
    assert {s.data.shape for s in conv.addressable_shards} == {(conv.shape[0], conv.shape[1] // 4)}
    np.testing.assert_array_equal(
        np.asarray(conv), np.asarray(ours.layers[0].linear_attn.conv1d.kernel[...])
    )
    assert gdn.A_log[...].sharding.spec == P("tensor")
    # test_logits_match_transformers' batch: the one-device forward is compiled already.
    ids, mask = helpers.padded_batch(ours.config.vocab_size, [9, 5, 1], 9, "left", seed=3)
    np.testing.assert_allclose(
        helpers.forward(sharded, ids, mask), helpers.forward(ours, ids, mask), atol=1e-5, rtol=0
    )


# Nominal sizes of the seed papers' Qwen3.5 checkpoints: the model cards' "Number of Parameters"
# of the language model (Qwen/Qwen3.5-4B / -9B / -27B). Our presets are the text tower only:
# embedding, decoder layers, final norm and (untied: 9B, 27B) the LM head; the vision encoder and
# the MTP head of the published checkpoints are not counted (the 27B checkpoint's 27.78B with
# them). The count is read off the abstract parameter shapes, not from `num_params()`.
NOMINAL_PARAMS = {"qwen3_5_4b": 4e9, "qwen3_5_9b": 9e9, "qwen3_5_27b": 27e9}


@pytest.mark.parametrize("name", list(NOMINAL_PARAMS))
def test_named_presets_build_abstractly_at_nominal_size(name):
    """Each seed-paper preset builds under `nnx.eval_shape` (no weights materialised) and its
    parameter count, summed over the abstract shapes, is within 10 % of the nominal size."""
    cfg = QWEN3_5_PRESETS[name]
    model = nnx.eval_shape(lambda: Qwen3_5ForCausalLM(cfg, rngs=init_rngs(0)))
    leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    n = sum(int(np.prod(x.shape)) for x in leaves)
    assert abs(n - NOMINAL_PARAMS[name]) <= 0.1 * NOMINAL_PARAMS[name], (name, n)
    assert n == cfg.num_params()  # the closed form agrees with the shapes
    assert len(model.layers) == cfg.num_hidden_layers
    assert cfg.layer_types.count(F) * 4 == cfg.num_hidden_layers  # 3 linear : 1 full
    assert hasattr(model, "lm_head") != cfg.tie_word_embeddings
    # The preset survives a config.json round trip (what export writes, what import reads).
    assert Qwen3_5Config.from_hf_dict(cfg.to_hf_dict()) == cfg
