"""The Qwen2 / Qwen2.5 family (q/k/v biases, no q/k norm): its biases against
transformers' Qwen2ForCausalLM, its presets and config.json defaults, and the config.json fields
we refuse. Logit parity and export for both families: test_hf_parity.py; KV-cache decoding:
test_kv_cache.py; the JAX engine: tests/rollout/test_jax_engine.py."""

import json

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from rubric_rl.core.sharding import make_mesh
from rubric_rl.models import PRESETS, Qwen3Config, from_pretrained, get_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# config.json of Qwen/Qwen2.5-3B-Instruct on the Hugging Face Hub (transformers 4.43 layout).
QWEN2_5_3B_INSTRUCT = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 11008,
    "max_position_embeddings": 32768,
    "max_window_layers": 70,
    "model_type": "qwen2",
    "num_attention_heads": 16,
    "num_hidden_layers": 36,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


@pytest.fixture(scope="module")
def torch_ckpt(helpers, tmp_path_factory):
    """(torch Qwen2ForCausalLM, our model loaded from its save_pretrained directory). The logits
    parity of the family (GQA ratios, tyings, padding sides) is in test_hf_parity.py."""
    path = str(tmp_path_factory.mktemp("hf_qwen2"))
    hf = helpers.make_torch_checkpoint(helpers.PARITY_CONFIGS["qwen2_untied_gqa2"], path, seed=9)
    return hf, from_pretrained(path), path


def test_biases_are_read_and_matter(torch_ckpt, helpers):
    """The checkpoint's biases (random in it) are loaded, there is no q/k norm, and the logits
    parity would not hold without the biases: zeroing them moves the logits."""
    hf, ours, _ = torch_ckpt
    attn = ours.layers[1].attn
    assert not hasattr(attn, "q_norm") and not hasattr(attn, "k_norm")
    for proj in ("q_proj", "k_proj", "v_proj"):
        ref = getattr(hf.model.layers[1].self_attn, proj).bias.detach().numpy()
        np.testing.assert_array_equal(np.asarray(getattr(attn, proj).bias[...]), ref)
        assert np.abs(ref).max() > 0.1
    assert getattr(hf.model.layers[1].self_attn.o_proj, "bias", None) is None
    assert not hasattr(attn.o_proj, "bias")
    ids, mask = helpers.padded_batch(ours.config.vocab_size, [7, 4], 7, "right", seed=8)
    ref = helpers.torch_logits(hf, ids, mask)
    real = mask > 0
    np.testing.assert_allclose(helpers.forward(ours, ids, mask)[real], ref[real], atol=1e-4)
    graphdef, state = nnx.split(ours)
    unbiased = nnx.merge(
        graphdef,
        jax.tree_util.tree_map_with_path(
            lambda p, x: x * 0 if "bias" in jax.tree_util.keystr(p) else x, state
        ),
    )
    assert np.abs(helpers.forward(unbiased, ids, mask)[real] - ref[real]).max() > 1e-2


def test_sharded_import_equals_one_device(torch_ckpt, helpers):
    """On an (fsdp=2, tensor=4) mesh of 8 CPU devices the biases are split over "tensor" like
    their kernels' output dim, every device holds only its slice, and the logits are unchanged."""
    _, ours, path = torch_ckpt
    sharded = from_pretrained(path, mesh=make_mesh(data=1, fsdp=2, tensor=4))
    for proj in ("q_proj", "k_proj", "v_proj"):
        bias = getattr(sharded.layers[0].attn, proj).bias[...]
        assert bias.sharding.spec == P("tensor"), proj
        assert {s.data.shape for s in bias.addressable_shards} == {(bias.shape[0] // 4,)}
    ids, mask = helpers.padded_batch(ours.config.vocab_size, [8, 3, 6, 1], 8, "left", seed=4)
    np.testing.assert_allclose(
        helpers.forward(sharded, ids, mask), helpers.forward(ours, ids, mask), atol=1e-5, rtol=0
    )


def test_qwen2_5_3b_preset_is_the_hub_config():
    cfg = Qwen3Config.from_hf_dict(QWEN2_5_3B_INSTRUCT)
    assert cfg == PRESETS["qwen2_5_3b"]
    assert cfg.head_dim == 128 and cfg.tie_word_embeddings and cfg.model_type == "qwen2"
    # transformers builds the same model from our export config (counted on the meta device)
    hf_cfg = transformers.Qwen2Config(**cfg.to_hf_dict())
    with torch.device("meta"):
        hf = transformers.Qwen2ForCausalLM(hf_cfg)
    assert sum(p.numel() for p in hf.parameters()) == cfg.num_params() == 3_085_938_688
    assert hf_cfg.layer_types == ["full_attention"] * 36


def test_family_from_architectures_and_qwen2_defaults():
    """Without model_type, `architectures` names the family; Qwen2Config's defaults apply to
    missing fields (head_dim = hidden_size // heads; a null num_key_value_heads = heads)."""
    d = {k: v for k, v in QWEN2_5_3B_INSTRUCT.items() if k != "model_type"}
    assert Qwen3Config.from_hf_dict(d) == PRESETS["qwen2_5_3b"]
    small = dict(
        architectures=["Qwen2ForCausalLM"], vocab_size=64, hidden_size=48, intermediate_size=32,
        num_hidden_layers=1, num_attention_heads=3, num_key_value_heads=None,
    )  # fmt: skip
    cfg = Qwen3Config.from_hf_dict(small)
    hf = transformers.Qwen2Config(**small)
    assert (cfg.head_dim, cfg.num_key_value_heads) == (16, 3) == (48 // 3, hf.num_key_value_heads)
    assert cfg.rope_theta == hf.rope_parameters["rope_theta"] == 1e4
    assert cfg.tie_word_embeddings is hf.tie_word_embeddings is False
    assert cfg.max_position_embeddings == hf.max_position_embeddings
    # sliding window switched on but starting past the last layer: every layer is full attention
    full = {**QWEN2_5_3B_INSTRUCT, "use_sliding_window": True}
    assert Qwen3Config.from_hf_dict(full) == PRESETS["qwen2_5_3b"]
    with pytest.raises(ValueError, match=r"architectures \['MistralForCausalLM'\]"):
        Qwen3Config.from_hf_dict({**small, "architectures": ["MistralForCausalLM"]})


UNSUPPORTED = {
    "sliding_window": (
        dict(use_sliding_window=True, max_window_layers=20),
        r"sliding-window attention.*use_sliding_window=True, max_window_layers=20.*layers "
        r"\[20, 21, .*35\]",
    ),
    "layer_types": (
        dict(layer_types=["full_attention"] * 35 + ["sliding_attention"]),
        r"sliding-window attention.*layer_types: layers \[35\]",
    ),
    "rope_scaling": (
        dict(rope_scaling={"type": "yarn", "rope_type": "yarn", "factor": 4.0}),
        r"rope_scaling\.rope_type 'yarn' is not supported",
    ),
    "rope_parameters": (
        dict(rope_parameters={"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0}),
        r"rope_parameters\.rope_type 'linear' is not supported",
    ),
    "hidden_act": (dict(hidden_act="gelu"), r"hidden_act 'gelu' is not supported"),
    "attention_bias": (dict(attention_bias=False), r"attention_bias=false .* 'qwen2'"),
    "attention_dropout": (dict(attention_dropout=0.1), r"attention_dropout 0\.1"),
}


@pytest.mark.parametrize("field", sorted(UNSUPPORTED))
def test_unsupported_fields_are_refused_naming_the_field(tmp_path, field):
    change, msg = UNSUPPORTED[field]
    (tmp_path / "config.json").write_text(json.dumps({**QWEN2_5_3B_INSTRUCT, **change}))
    with pytest.raises(NotImplementedError, match=r"^config\.json: " + msg):
        from_pretrained(str(tmp_path))  # refused from config.json, before any weight is read


def test_unknown_model_type_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({**QWEN2_5_3B_INSTRUCT, "model_type": "qwen2_5_vl"})
    )
    families = r"\['qwen3', 'qwen2', 'llama'\]"
    with pytest.raises(ValueError, match=rf"model_type must be one of {families}, got "):
        get_config(str(tmp_path))
