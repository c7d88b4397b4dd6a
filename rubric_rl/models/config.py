"""Qwen3 model configuration: `Qwen3Config`, named `PRESETS`, `get_config`, and `with_shape` (a
preset with some of its fields replaced: ``config.model.shape``).

Re-exported by `rubric_rl.models.qwen3` and `rubric_rl.models`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """Shapes and constants of a Qwen3 dense model (the fields of HF's Qwen3Config we use)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 40960
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None

    def __post_init__(self):
        for f in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
        ):
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"Qwen3Config.{f} must be a positive int, got {v!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                "Qwen3Config.num_attention_heads must be a multiple of num_key_value_heads, got "
                f"{self.num_attention_heads} and {self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"Qwen3Config.head_dim must be even for RoPE, got {self.head_dim}")
        if isinstance(self.eos_token_id, list):  # keep the dataclass hashable (jit static arg)
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> Qwen3Config:
        """Builds a config from a HF `config.json` dict (transformers v4 or v5 layout).

        Optional fields missing from `d` take transformers' Qwen3Config defaults (rope_theta 1e4,
        head_dim 128, num_key_value_heads 32, max_position_embeddings 32768, untied), so a
        checkpoint means the same model here and in transformers."""
        mt = d.get("model_type", "qwen3")
        if mt != "qwen3":
            raise ValueError(f"config.json: model_type must be 'qwen3', got {mt!r}")
        rope = d.get("rope_parameters") or {}
        scaling = d.get("rope_scaling")
        rope_type = rope.get("rope_type", (scaling or {}).get("rope_type", "default"))
        if rope_type != "default":
            raise NotImplementedError(f"config.json: rope_type {rope_type!r} is not supported")
        theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
        if d.get("attention_bias", False):
            raise NotImplementedError("config.json: attention_bias=true is not supported")
        if d.get("use_sliding_window", False):
            raise NotImplementedError("config.json: use_sliding_window=true is not supported")
        try:
            return cls(
                vocab_size=d["vocab_size"],
                hidden_size=d["hidden_size"],
                intermediate_size=d["intermediate_size"],
                num_hidden_layers=d["num_hidden_layers"],
                num_attention_heads=d["num_attention_heads"],
                num_key_value_heads=d.get("num_key_value_heads") or 32,
                head_dim=d.get("head_dim") or 128,
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=float(theta),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                max_position_embeddings=d.get("max_position_embeddings", 32768),
                bos_token_id=d.get("bos_token_id"),
                eos_token_id=d.get("eos_token_id"),
            )
        except KeyError as e:
            raise KeyError(f"config.json: missing field {e.args[0]!r}") from None

    def to_hf_dict(self, dtype: str = "float32") -> dict[str, Any]:
        """HF `config.json` for Qwen3ForCausalLM, readable by transformers v4/v5 and SGLang."""
        d = {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            # v5 reads rope_parameters, v4 (and SGLang builds on it) reads rope_theta.
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "max_window_layers": self.num_hidden_layers,
            "use_sliding_window": False,
            "sliding_window": None,
            "use_cache": True,
            "dtype": dtype,
            "torch_dtype": dtype,
        }
        if self.bos_token_id is not None:
            d["bos_token_id"] = self.bos_token_id
        if self.eos_token_id is not None:
            eos = self.eos_token_id
            d["eos_token_id"] = list(eos) if isinstance(eos, tuple) else eos
        return d

    def num_params(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        d, hd, f = self.hidden_size, self.head_dim, self.intermediate_size
        h, kv = self.num_attention_heads, self.num_key_value_heads
        attn = d * h * hd + 2 * d * kv * hd + h * hd * d + 2 * hd
        layer = attn + 3 * d * f + 2 * d
        embed = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return embed + self.num_hidden_layers * layer + d


PRESETS: dict[str, Qwen3Config] = {
    # Test size: compiles in a second or two on CPU.
    "tiny": Qwen3Config(128, 64, 128, 2, 4, 2, 16, max_position_embeddings=512),
    # Embedded-default sizes (counts from num_params(): 1.02M, 5.24M, 20.9M).
    "1m": Qwen3Config(1024, 128, 448, 4, 4, 2, 32, max_position_embeddings=2048),
    "5m": Qwen3Config(2048, 256, 768, 6, 8, 4, 32, max_position_embeddings=2048),
    "20m": Qwen3Config(4096, 512, 1536, 6, 8, 4, 64, max_position_embeddings=2048),
    # The GRPO peer workload's shape (the TRL / Tunix step-time comparison): 3,279,616 params
    # with its 512-id tokenizer. Embedded like the sizes above: vocabulary from the tokenizer.
    "peer-3m": Qwen3Config(512, 256, 768, 4, 4, 2, 64, max_position_embeddings=2048),
    # Real Qwen3 shapes (HF config.json of Qwen/Qwen3-*).
    "qwen3_0_6b": Qwen3Config(151936, 1024, 3072, 28, 16, 8, 128, eos_token_id=151645),
    "qwen3_1_7b": Qwen3Config(151936, 2048, 6144, 28, 16, 8, 128, eos_token_id=151645),
    "qwen3_4b": Qwen3Config(151936, 2560, 9728, 36, 32, 8, 128, eos_token_id=151645),
    "qwen3_8b": Qwen3Config(
        151936, 4096, 12288, 36, 32, 8, 128, tie_word_embeddings=False, eos_token_id=151645
    ),
}


# The fields ``config.model.shape`` may override (``with_shape``): every Qwen3Config field but the
# special token ids, which come from the tokenizer.
SHAPE_FIELDS: tuple[str, ...] = tuple(
    f.name
    for f in dataclasses.fields(Qwen3Config)
    if f.name not in ("bos_token_id", "eos_token_id")
)
_FLOAT_FIELDS = ("rms_norm_eps", "rope_theta")
_BOOL_FIELDS = ("tie_word_embeddings",)


def with_shape(
    base: Qwen3Config, shape: Mapping[str, Any], *, field: str = "config.model.shape"
) -> Qwen3Config:
    """``base`` with the fields in ``shape`` replaced (``SHAPE_FIELDS`` only). A key that is not
    one, a value of the wrong type or an inconsistent result (heads not a multiple of the KV
    heads, odd head_dim) is a ValueError naming ``<field>.<key>``."""
    for key in shape:
        if key not in SHAPE_FIELDS:
            raise ValueError(
                f"{field}.{key}: not a field of the model's shape; the valid ones are "
                f"{list(SHAPE_FIELDS)}"
            )
    values: dict[str, Any] = {}
    for key, v in shape.items():
        number = isinstance(v, int | float) and not isinstance(v, bool)
        if key in _BOOL_FIELDS:
            ok, kind = isinstance(v, bool), "True or False"
        elif key in _FLOAT_FIELDS:
            ok, kind = number and v > 0, "a positive number"
            v = float(v) if ok else v
        else:
            ok, kind = number and isinstance(v, int) and v > 0, "a positive int"
        if not ok:
            raise ValueError(f"{field}.{key}: must be {kind}, got {v!r}")
        values[key] = v
    try:
        return dataclasses.replace(base, **values)
    except ValueError as e:  # Qwen3Config's own consistency checks: "Qwen3Config.<key> must ..."
        raise ValueError(re.sub(r"^Qwen3Config\.(\w+) ", rf"{field}.\1: ", str(e))) from None


def checkpoint_shape_error(name: str) -> str:
    """The error of a ``config.model.shape`` given with a checkpoint directory as the model."""
    return (
        f"config.model.shape: model.name {name!r} is a checkpoint directory, whose config.json "
        "fixes the shape and whose weights are loaded; a shape builds a random-init model from a "
        f"preset (model.name one of {list(PRESETS)}, e.g. 'tiny', then its fields replaced)"
    )


def get_config(name_or_path: str) -> Qwen3Config:
    """A preset name (see PRESETS), a HF checkpoint directory, or a path to a config.json."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = name_or_path
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise ValueError(
            f"model {name_or_path!r} is neither a preset ({sorted(PRESETS)}) nor a directory "
            "with a config.json"
        )
    with open(path) as f:
        return Qwen3Config.from_hf_dict(json.load(f))
