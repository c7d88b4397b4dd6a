"""Our parameter paths <-> Hugging Face tensor names (the Qwen3 / Qwen2 / Llama / Qwen3.5 text
families). Shared by the safetensors I/O (`hf_io`) and the GGUF reader (`gguf_io`), which maps a
GGUF file's tensors through the same names; kept apart so neither of them imports the other for it.
"""

from __future__ import annotations

from typing import Any

_LEAF_NAMES = {
    ("attn", "q_proj", "kernel"): ("self_attn.q_proj.weight", True),
    ("attn", "k_proj", "kernel"): ("self_attn.k_proj.weight", True),
    ("attn", "v_proj", "kernel"): ("self_attn.v_proj.weight", True),
    ("attn", "o_proj", "kernel"): ("self_attn.o_proj.weight", True),
    ("attn", "q_proj", "bias"): ("self_attn.q_proj.bias", False),  # Qwen2
    ("attn", "k_proj", "bias"): ("self_attn.k_proj.bias", False),
    ("attn", "v_proj", "bias"): ("self_attn.v_proj.bias", False),
    ("attn", "q_norm", "scale"): ("self_attn.q_norm.weight", False),
    ("attn", "k_norm", "scale"): ("self_attn.k_norm.weight", False),
    ("input_norm", "scale"): ("input_layernorm.weight", False),
    ("post_attention_norm", "scale"): ("post_attention_layernorm.weight", False),
    ("mlp", "gate_proj", "kernel"): ("mlp.gate_proj.weight", True),
    ("mlp", "up_proj", "kernel"): ("mlp.up_proj.weight", True),
    ("mlp", "down_proj", "kernel"): ("mlp.down_proj.weight", True),
    # Qwen3.5 Gated DeltaNet layers (gated_deltanet.py's table). "conv": our [K, C] kernel is
    # HF's depthwise Conv1d weight [C, 1, K].
    ("linear_attn", "in_proj_qkv", "kernel"): ("linear_attn.in_proj_qkv.weight", True),
    ("linear_attn", "in_proj_z", "kernel"): ("linear_attn.in_proj_z.weight", True),
    ("linear_attn", "in_proj_b", "kernel"): ("linear_attn.in_proj_b.weight", True),
    ("linear_attn", "in_proj_a", "kernel"): ("linear_attn.in_proj_a.weight", True),
    ("linear_attn", "out_proj", "kernel"): ("linear_attn.out_proj.weight", True),
    ("linear_attn", "conv1d", "kernel"): ("linear_attn.conv1d.weight", "conv"),
    ("linear_attn", "dt_bias"): ("linear_attn.dt_bias", False),
    ("linear_attn", "A_log"): ("linear_attn.A_log", False),
    ("linear_attn", "norm", "scale"): ("linear_attn.norm.weight", False),
}
# A multimodal Qwen3.5 checkpoint (model_type "qwen3_5") keeps its text tower here.
MULTIMODAL_TEXT_PREFIX = "model.language_model."


def stacked_layer_param(keys: tuple[Any, ...]) -> bool:
    """Whether `param_keys` name a scanned model's stacked layer parameter ("layers", "attn", ...)
    rather than one layer's ("layers", 3, "attn", ...)."""
    return len(keys) > 1 and keys[0] == "layers" and not isinstance(keys[1], int)


def param_keys(path: tuple[Any, ...]) -> tuple[Any, ...]:
    """A pytree path of our model's state as plain keys: ("embed", "embedding"), ("layers", 0, ...).
    A leaf inside an ``nnx.Variable`` keeps its trailing attribute key."""
    return tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path)


def hf_name(path: tuple[Any, ...], prefix: str = "model.") -> tuple[str, bool | str]:
    """(HF tensor name, layout) for a parameter path of our model's state; `prefix` is where the
    text model's tensors live ("model.", or `MULTIMODAL_TEXT_PREFIX`).

    layout: False (same array), True (transpose: our kernels are [in, out], torch Linear weights
    [out, in]) or "conv" (our [K, C] depthwise kernel = HF's [C, 1, K] Conv1d weight).
    """
    keys = param_keys(path)
    if keys == ("embed", "embedding"):
        return f"{prefix}embed_tokens.weight", False
    if keys == ("norm", "scale"):
        return f"{prefix}norm.weight", False
    if keys == ("lm_head", "kernel"):
        return "lm_head.weight", True
    if keys[0] == "layers" and keys[2:] in _LEAF_NAMES:
        name, layout = _LEAF_NAMES[keys[2:]]
        return f"{prefix}layers.{int(keys[1])}.{name}", layout
    raise KeyError(f"no Hugging Face name for parameter {'/'.join(map(str, keys))}")
