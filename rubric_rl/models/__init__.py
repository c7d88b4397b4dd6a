"""Qwen3 and Qwen2/Qwen2.5 dense families in Flax NNX, Hugging Face checkpoint import/export,
tokenizer wrapper."""

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
from rubric_rl.models.tokenizer import Tokenizer

__all__ = [
    "PRESETS",
    "SHAPE_FIELDS",
    "Qwen3Config",
    "Qwen3ForCausalLM",
    "Tokenizer",
    "default_positions",
    "from_pretrained",
    "get_config",
    "logits_from_hidden",
    "save_pretrained",
    "with_shape",
]
