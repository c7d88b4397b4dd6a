"""Our Qwen3 / Qwen2 / Llama vs transformers' PyTorch Qwen3ForCausalLM / Qwen2ForCausalLM /
LlamaForCausalLM on the same safetensors, both directions."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rubric_rl.models import PRESETS, Qwen3ForCausalLM, from_pretrained, save_pretrained
from rubric_rl.models.config import MODEL_TYPES

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIG_NAMES = [
    "tied_gqa4", "untied_gqa2", "untied_mha",
    "qwen2_tied_gqa4", "qwen2_untied_gqa2", "qwen2_untied_mha",
    "llama_tied_gqa4", "llama_untied_gqa2", "llama_untied_mha",
]  # fmt: skip


@pytest.fixture(scope="module")
def torch_ckpts(helpers, tmp_path_factory):
    """name -> (checkpoint dir, torch model, our model loaded from it)."""
    out = {}
    for i, name in enumerate(CONFIG_NAMES):
        path = str(tmp_path_factory.mktemp(f"hf_{name}"))
        cfg = helpers.PARITY_CONFIGS[name]
        hf = helpers.make_torch_checkpoint(cfg, path, seed=i)
        out[name] = (path, hf, from_pretrained(path))
    return out


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_logits_match_transformers(torch_ckpts, helpers, name, side):
    path, hf, ours = torch_ckpts[name]
    # The special token ids are transformers' defaults for the family (LlamaConfig: 1 and 2).
    special = dict(bos_token_id=hf.config.bos_token_id, eos_token_id=hf.config.eos_token_id)
    assert ours.config == dataclasses.replace(helpers.PARITY_CONFIGS[name], **special)
    assert type(hf).__name__ == MODEL_TYPES[ours.config.model_type]
    ids, mask = helpers.padded_batch(ours.config.vocab_size, [9, 5, 1], 9, side, seed=3)
    ref = helpers.torch_logits(hf, ids, mask)
    got = helpers.forward(ours, ids, mask)
    assert got.dtype == np.float32 and got.shape == ref.shape
    real = mask > 0
    np.testing.assert_allclose(got[real], ref[real], atol=1e-4, rtol=0)
    # The comparison is not vacuous: logits vary across the vocabulary and positions.
    assert np.abs(ref[real]).max() > 0.05


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_export_loads_in_transformers(torch_ckpts, helpers, tmp_path, name):
    _, _, ours = torch_ckpts[name]
    save_pretrained(ours, str(tmp_path))
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), output_loading_info=True
    )
    family = ours.config.model_type
    assert type(hf).__name__ == MODEL_TYPES[family]
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    # test_logits_match_transformers' batch: the same compiled forward.
    ids, mask = helpers.padded_batch(ours.config.vocab_size, [9, 5, 1], 9, "left", seed=3)
    ref = helpers.torch_logits(hf.eval(), ids, mask)
    got = helpers.forward(ours, ids, mask)
    np.testing.assert_allclose(got[mask > 0], ref[mask > 0], atol=1e-4, rtol=0)
    with open(tmp_path / "config.json") as f:
        cfg = json.load(f)
    assert cfg["model_type"] == family and cfg["architectures"] == [MODEL_TYPES[family]]
    assert os.path.isfile(tmp_path / "generation_config.json")


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("preset", ["tiny", "qwen2_tiny", "llama"])
def test_round_trip_ours_exact(tmp_path, preset, tied):
    base = PRESETS["tiny"] if preset == "llama" else PRESETS[preset]
    family = "llama" if preset == "llama" else base.model_type
    cfg = dataclasses.replace(base, tie_word_embeddings=tied, model_type=family)
    model = Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(7))
    save_pretrained(model, str(tmp_path))
    back = from_pretrained(str(tmp_path))
    assert back.config == cfg
    a = jax.tree.leaves(nnx.state(model, nnx.Param))
    b = jax.tree.leaves(nnx.state(back, nnx.Param))
    assert len(a) == len(b) == len(jax.tree.leaves(nnx.state(model)))
    # per layer: 4 attention + 3 MLP kernels and 2 norms, plus Qwen3's 2 q/k norms (11) or
    # Qwen2's 3 q/k/v biases (12); Llama has neither (9)
    per_layer = {"qwen3": 11, "qwen2": 12, "llama": 9}[cfg.model_type]
    assert len(a) == 2 + (not tied) + cfg.num_hidden_layers * per_layer
    assert sum(x.size for x in a) == cfg.num_params()
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_bfloat16_checkpoints(helpers, tmp_path):
    """A bf16 torch checkpoint loads exactly (upcast to float32 params); a bf16-param model
    exports BF16 tensors that transformers reads back bit for bit."""
    cfg = helpers.PARITY_CONFIGS["untied_gqa2"]
    src = tmp_path / "torch_bf16"
    hf = helpers.make_torch_checkpoint(cfg, str(src), seed=11, dtype="bfloat16")
    ours = from_pretrained(str(src))
    ref_q = hf.model.layers[1].self_attn.q_proj.weight.detach().float().numpy()
    got_q = np.asarray(ours.layers[1].attn.q_proj.kernel[...])
    assert got_q.dtype == np.float32
    np.testing.assert_array_equal(got_q, ref_q.T)

    bf = from_pretrained(str(src), param_dtype=jnp.bfloat16, dtype=jnp.bfloat16)
    assert bf.layers[0].mlp.up_proj.kernel[...].dtype == jnp.bfloat16
    out = tmp_path / "ours_bf16"
    save_pretrained(bf, str(out))
    with open(out / "config.json") as f:
        assert json.load(f)["dtype"] == "bfloat16"
    hf2 = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16)
    for n, p in hf.named_parameters():
        assert torch.equal(p, dict(hf2.named_parameters())[n]), n
