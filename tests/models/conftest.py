"""Shared helpers for tests/models: tiny configs and torch reference checkpoints."""

import numpy as np
import pytest

from rubric_rl.models import Qwen3Config

# Tiny shapes covering tied/untied embeddings and GQA ratios 4:1, 2:1, 1:1.
PARITY_CONFIGS = {
    "tied_gqa4": Qwen3Config(96, 32, 64, 2, 4, 1, 8, tie_word_embeddings=True, rope_theta=1e4),
    "untied_gqa2": Qwen3Config(96, 32, 48, 2, 4, 2, 16, tie_word_embeddings=False),
    "untied_mha": Qwen3Config(
        80, 48, 64, 1, 3, 3, 16, tie_word_embeddings=False, rms_norm_eps=1e-5
    ),
    # The Qwen2 family (q/k/v biases, no q/k norm) over the same GQA ratios and tyings.
    "qwen2_tied_gqa4": Qwen3Config(
        96, 32, 64, 2, 4, 1, 8, tie_word_embeddings=True, rope_theta=1e4, model_type="qwen2"
    ),
    "qwen2_untied_gqa2": Qwen3Config(
        96, 32, 48, 2, 4, 2, 16, tie_word_embeddings=False, model_type="qwen2"
    ),
    "qwen2_untied_mha": Qwen3Config(
        80, 48, 64, 1, 3, 3, 16, tie_word_embeddings=False, rms_norm_eps=1e-5, model_type="qwen2"
    ),
    # The Llama family (no biases, no q/k norm) over the same GQA ratios and tyings.
    "llama_tied_gqa4": Qwen3Config(
        96, 32, 64, 2, 4, 1, 8, tie_word_embeddings=True, rope_theta=1e4, model_type="llama"
    ),
    "llama_untied_gqa2": Qwen3Config(
        96, 32, 48, 2, 4, 2, 16, tie_word_embeddings=False, model_type="llama"
    ),
    "llama_untied_mha": Qwen3Config(
        80, 48, 64, 1, 3, 3, 16, tie_word_embeddings=False, rms_norm_eps=1e-5, model_type="llama"
    ),
}


_jit_forward = None


def forward(model, ids, mask=None):
    """Jitted `model(ids, attention_mask=mask)` as numpy (eager dispatch compiles op by op)."""
    global _jit_forward
    if _jit_forward is None:
        import jax.numpy as jnp
        from flax import nnx

        _jit_forward = nnx.jit(lambda m, i, k: m(i, attention_mask=k))
        forward.jnp = jnp
    jnp = forward.jnp
    mask = np.ones(np.shape(ids), np.int32) if mask is None else mask
    return np.asarray(_jit_forward(model, jnp.asarray(ids), jnp.asarray(mask)))


def padded_batch(vocab: int, lengths: list[int], total: int, side: str, seed: int = 0):
    """(ids, mask) with rows of the given real lengths padded to `total` on `side`."""
    rs = np.random.RandomState(seed)
    ids = rs.randint(0, vocab, (len(lengths), total)).astype(np.int32)
    mask = np.zeros((len(lengths), total), np.int32)
    for i, n in enumerate(lengths):
        if side == "left":
            mask[i, total - n :] = 1
        else:
            mask[i, :n] = 1
    ids = np.where(mask > 0, ids, 0).astype(np.int32)
    return ids, mask


def torch_logits(hf_model, ids, mask):
    """transformers' logits with explicit attention_mask and position_ids = cumsum(mask) - 1."""
    import torch

    pos = np.maximum(np.cumsum(mask, -1) - 1, 0)
    with torch.no_grad():
        out = hf_model(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(pos, dtype=torch.long),
        )
    return out.logits.float().numpy()


def make_torch_checkpoint(cfg: Qwen3Config, path: str, seed: int, dtype: str = "float32"):
    """A randomly initialised transformers Qwen3ForCausalLM (Qwen2ForCausalLM / LlamaForCausalLM
    for a model_type="qwen2" / "llama" config) saved with its own save_pretrained.

    Norm weights and biases are randomised too (HF initialises them to 1 and 0, which would hide
    a mix-up)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    family = {"qwen3": "Qwen3", "qwen2": "Qwen2", "llama": "Llama"}[cfg.model_type]
    hf_cfg = getattr(transformers, f"{family}Config")(**cfg.to_hf_dict())
    model = getattr(transformers, f"{family}ForCausalLM")(hf_cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn_like(p))
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="session")
def helpers():
    """The helpers above, for test modules (importlib import mode: conftest isn't importable)."""
    import types

    return types.SimpleNamespace(
        PARITY_CONFIGS=PARITY_CONFIGS,
        padded_batch=padded_batch,
        forward=forward,
        torch_logits=torch_logits,
        make_torch_checkpoint=make_torch_checkpoint,
    )
