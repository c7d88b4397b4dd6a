"""The Llama family (models/llama.py): config.json defaults and the fields we refuse, the decoder
without biases or q/k norm, KV-cache decoding. Logit parity against transformers'
LlamaForCausalLM (tied / untied, GQA, left / right padding) and export: test_hf_parity.py; GGUF
files: test_gguf.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_rl.models import Qwen3Config, Qwen3ForCausalLM
from rubric_rl.models.config import MODEL_TYPES

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 100,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}


def test_config_defaults_are_transformers_llama_defaults():
    """Missing fields take LlamaConfig's defaults: one KV head per query head, head_dim
    hidden / heads, rope θ 1e4, 2048 positions, untied; architectures alone picks the family."""
    cfg = Qwen3Config.from_hf_dict(LLAMA)
    assert cfg.model_type == "llama" and MODEL_TYPES["llama"] == "LlamaForCausalLM"
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.rope_theta) == (4, 8, 1e4)
    assert (cfg.max_position_embeddings, cfg.tie_word_embeddings) == (2048, False)
    assert not cfg.attention_bias and not cfg.qk_norm
    by_arch = {k: v for k, v in LLAMA.items() if k != "model_type"}
    assert Qwen3Config.from_hf_dict(by_arch) == cfg
    d = cfg.to_hf_dict()
    assert d["architectures"] == ["LlamaForCausalLM"]
    assert d["attention_bias"] is False and d["mlp_bias"] is False
    assert Qwen3Config.from_hf_dict(d) == cfg


@pytest.mark.parametrize(
    "extra, match",
    [
        ({"attention_bias": True}, "attention_bias=true"),
        ({"mlp_bias": True}, "mlp_bias=true"),
        ({"pretraining_tp": 2}, "pretraining_tp=2"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_type 'llama3'"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling.rope_type 'linear'"),
        ({"rope_parameters": {"rope_type": "yarn"}}, "rope_parameters.rope_type 'yarn'"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ],
)
def test_refused_fields_are_named(extra, match):
    with pytest.raises(NotImplementedError, match=match):
        Qwen3Config.from_hf_dict({**LLAMA, **extra})


def test_decoder_has_no_biases_or_qk_norm_and_counts_params():
    cfg = Qwen3Config(96, 32, 48, 2, 4, 2, 16, tie_word_embeddings=False, model_type="llama")
    model = Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0))
    attn = model.layers[0].attn
    assert not hasattr(attn, "q_norm") and not hasattr(attn, "k_norm")
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
        assert not hasattr(proj, "bias")
    params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    d, f, v = 32, 48, 96
    per_layer = d * 4 * 16 + 2 * d * 2 * 16 + 4 * 16 * d + 3 * d * f + 2 * d
    assert params == cfg.num_params() == 2 * v * d + 2 * per_layer + d


def test_cache_decode_equals_full_forward():
    """Prefill then one-token steps through the KV cache give the full forward's logits."""
    cfg = Qwen3Config(96, 32, 48, 2, 4, 2, 16, model_type="llama")
    model = Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(3))
    ids = np.random.RandomState(0).randint(0, 96, (2, 7)).astype(np.int32)
    full = np.asarray(nnx.jit(lambda m, i: m(i))(model, jnp.asarray(ids)))
    # Jitted (eager decoding compiles op by op): one program for the prefill, one for the steps.
    decode = nnx.jit(lambda m, i, p, c, s, k: m.decode(i, p, c, s, k))
    cache = model.init_cache(2, 8)
    mask = np.zeros((2, 8), np.int32)
    mask[:, :4] = 1
    pos = np.broadcast_to(np.arange(7, dtype=np.int32), (2, 7))
    logits, cache = decode(model, ids[:, :4], pos[:, :4], cache, jnp.int32(0), jnp.asarray(mask))
    got = [np.asarray(logits)]
    for i in range(4, 7):
        mask[:, i] = 1
        step, cache = decode(model, ids[:, i : i + 1], pos[:, i : i + 1], cache, jnp.int32(i), mask)
        got.append(np.asarray(step))
    np.testing.assert_allclose(np.concatenate(got, axis=1), full, atol=1e-5, rtol=0)
