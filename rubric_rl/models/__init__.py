"""Qwen3, Qwen2/Qwen2.5 and Llama dense families and the Qwen3.5 dense text model (hybrid Gated
DeltaNet + gated attention) in Flax NNX, Hugging Face checkpoint import/export, GGUF import
(`gguf_io`), tokenizer wrapper."""

from rubric_rl.models.config import SHAPE_FIELDS, with_shape
from rubric_rl.models.hf_io import from_pretrained, save_pretrained
from rubric_rl.models.qwen3 import (
    PRESETS,
    Qwen3Config,
    Qwen3ForCausalLM,
    default_positions,
    get_config,
    logits_from_hidden,
)
from rubric_rl.models.qwen3_5 import QWEN3_5_PRESETS, Qwen3_5Config, Qwen3_5ForCausalLM
from rubric_rl.models.tokenizer import Tokenizer

__all__ = [
    "PRESETS",
    "QWEN3_5_PRESETS",
    "SHAPE_FIELDS",
    "Qwen3Config",
    "Qwen3ForCausalLM",
    "Qwen3_5Config",
    "Qwen3_5ForCausalLM",
    "Tokenizer",
    "default_positions",
    "from_pretrained",
    "get_config",
    "logits_from_hidden",
    "save_pretrained",
    "with_shape",
]
