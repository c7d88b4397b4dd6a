"""Model configuration of the Qwen3 and Qwen2/Qwen2.5 dense families: `Qwen3Config` (its
`model_type` says which), named `PRESETS`, `get_config`, and `with_shape` (a preset with some of its
fields replaced: ``config.model.shape``).

Re-exported by `rubric_rl.models.qwen3` and `rubric_rl.models`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from rubric_rl.models.llama import check_llama_fields

# The dense families one decoder serves, and what tells them apart (transformers 5.24):
# Qwen2 / Qwen2.5 (`Qwen2ForCausalLM`) have biases on the q/k/v projections and no q/k norm;
# Qwen3 (`Qwen3ForCausalLM`) has a per-head RMSNorm on q and k and no biases; Llama
# (`LlamaForCausalLM`, models/llama.py) has neither: the Qwen2 path without its biases.
MODEL_TYPES = {
    "qwen3": "Qwen3ForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
}


def check_decoder_shape(cfg: Any) -> None:
    """ValueError naming `<Class>.<field>` unless the decoder sizes are positive ints and the
    attention heads a multiple of the KV heads (Qwen3Config, Qwen3_5Config)."""
    owner = type(cfg).__name__
    for f in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
    ):
        v = getattr(cfg, f)
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"{owner}.{f} must be a positive int, got {v!r}")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ValueError(
            f"{owner}.num_attention_heads must be a multiple of num_key_value_heads, got "
            f"{cfg.num_attention_heads} and {cfg.num_key_value_heads}"
        )


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """Shapes and constants of a Qwen3, Qwen2/Qwen2.5 or Llama dense model (the fields of HF's
    Qwen3Config / Qwen2Config / LlamaConfig we use). `model_type` picks the family ("qwen3",
    "qwen2" or "llama"); the decoder reads the difference from `attention_bias` and `qk_norm`."""

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
    model_type: str = "qwen3"
    # Not a shape and not in config.json: run the decoder layers as one `jax.lax.scan` over
    # parameters stacked on a leading layer axis (compile time flat in depth; see
    # `Qwen3ForCausalLM`). Checkpoints on disk (HF safetensors) are the same either way.
    scan_layers: bool = False

    @property
    def attention_bias(self) -> bool:
        """Biases on the q/k/v projections (Qwen2's attention; o_proj has none in either)."""
        return self.model_type == "qwen2"

    @property
    def qk_norm(self) -> bool:
        """Per-head RMSNorm on q and k before RoPE (Qwen3's attention)."""
        return self.model_type == "qwen3"

    def __post_init__(self):
        if self.model_type not in MODEL_TYPES:
            raise ValueError(
                f"Qwen3Config.model_type must be one of {list(MODEL_TYPES)}, "
                f"got {self.model_type!r}"
            )
        check_decoder_shape(self)
        if self.head_dim % 2:
            raise ValueError(f"Qwen3Config.head_dim must be even for RoPE, got {self.head_dim}")
        if isinstance(self.eos_token_id, list):  # keep the dataclass hashable (jit static arg)
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> Qwen3Config:
        """Builds a config from a HF `config.json` dict (transformers v4 or v5 layout) of a
        Qwen3, Qwen2/Qwen2.5 or Llama checkpoint, the family read from `model_type` (or, without
        one, `architectures`).

        Optional fields missing from `d` take transformers' defaults for that family, so a
        checkpoint means the same model here and in transformers: rope_theta 1e4,
        num_key_value_heads 32, max_position_embeddings 32768, untied; head_dim 128 (Qwen3) or
        hidden_size // num_attention_heads (Qwen2, Llama; Llama's max_position_embeddings 2048).
        What we do not implement (another rope type,
        sliding-window layers, an activation other than SiLU, attention dropout, Qwen2 without
        its biases) is a NotImplementedError naming the config.json field."""
        mt = _model_type(d)
        rope = d.get("rope_parameters") or {}
        scaling = d.get("rope_scaling")
        # transformers v4 configs name the scaling by "type" as well as "rope_type".
        scaling_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        rope_type = rope.get("rope_type", scaling_type)
        if rope_type != "default":
            field = "rope_parameters" if "rope_type" in rope else "rope_scaling"
            raise NotImplementedError(
                f"config.json: {field}.rope_type {rope_type!r} is not supported (only 'default')"
            )
        theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
        if d.get("hidden_act", "silu") != "silu":
            raise NotImplementedError(
                f"config.json: hidden_act {d['hidden_act']!r} is not supported (only 'silu')"
            )
        if d.get("attention_dropout") or 0.0:
            raise NotImplementedError(
                f"config.json: attention_dropout {d['attention_dropout']!r} is not supported "
                "(only 0.0)"
            )
        try:
            if mt == "qwen3":
                if d.get("attention_bias", False):
                    raise NotImplementedError(
                        "config.json: attention_bias=true is not supported for model_type 'qwen3'"
                    )
                if d.get("use_sliding_window", False):
                    raise NotImplementedError(
                        "config.json: use_sliding_window=true is not supported"
                    )
                kv_heads = d.get("num_key_value_heads") or 32
                head_dim = d.get("head_dim") or 128
            else:
                if mt == "qwen2":
                    _check_qwen2_attention(d)
                else:
                    check_llama_fields(d)
                kv_heads = d.get("num_key_value_heads", 32 if mt == "qwen2" else None)
                # transformers' Qwen2Config: an explicit null means one KV head per query head.
                kv_heads = d["num_attention_heads"] if kv_heads is None else kv_heads
                head_dim = d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"]
            return cls(
                vocab_size=d["vocab_size"],
                hidden_size=d["hidden_size"],
                intermediate_size=d["intermediate_size"],
                num_hidden_layers=d["num_hidden_layers"],
                num_attention_heads=d["num_attention_heads"],
                num_key_value_heads=kv_heads,
                head_dim=head_dim,
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=float(theta),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                max_position_embeddings=d.get(
                    "max_position_embeddings", 2048 if mt == "llama" else 32768
                ),
                bos_token_id=d.get("bos_token_id"),
                eos_token_id=d.get("eos_token_id"),
                model_type=mt,
            )
        except KeyError as e:
            raise KeyError(f"config.json: missing field {e.args[0]!r}") from None

    def to_hf_dict(self, dtype: str = "float32") -> dict[str, Any]:
        """HF `config.json` for Qwen3ForCausalLM or Qwen2ForCausalLM (per `model_type`), readable
        by transformers v4/v5 and SGLang."""
        d = {
            "architectures": [MODEL_TYPES[self.model_type]],
            "model_type": self.model_type,
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
        if self.model_type != "qwen2":  # Qwen2Config has no such field: its biases are always on
            d["attention_bias"] = False
        if self.model_type == "llama":
            d["mlp_bias"] = False
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
        attn = d * h * hd + 2 * d * kv * hd + h * hd * d
        attn += (h * hd + 2 * kv * hd) if self.attention_bias else 0
        attn += 2 * hd if self.qk_norm else 0
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
    # Qwen2 family (q/k/v biases, no q/k norm). Test size, embedded like "tiny" (the smoke run's
    # Qwen2: configs/grpo.py:smoke,model=qwen2_tiny).
    "qwen2_tiny": Qwen3Config(
        128, 64, 128, 2, 4, 2, 16, max_position_embeddings=512, model_type="qwen2"
    ),
    # HF config.json of Qwen/Qwen2.5-3B-Instruct (3,085,938,688 params).
    "qwen2_5_3b": Qwen3Config(
        151936,
        2048,
        11008,
        36,
        16,
        2,
        128,
        max_position_embeddings=32768,
        bos_token_id=151643,
        eos_token_id=151645,
        model_type="qwen2",
    ),
}


# The fields ``config.model.shape`` may override (``with_shape``): every Qwen3Config field but the
# special token ids, which come from the tokenizer, the family, which is the preset's, and
# scan_layers, which is ``config.model.scan_layers``.
SHAPE_FIELDS: tuple[str, ...] = tuple(
    f.name
    for f in dataclasses.fields(Qwen3Config)
    if f.name not in ("bos_token_id", "eos_token_id", "model_type", "scan_layers")
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


def _model_type(d: dict[str, Any]) -> str:
    """The family of a config.json: its `model_type`, else the class in `architectures`, else
    Qwen3 (what a config.json without either always meant here)."""
    if "model_type" in d:
        mt = d["model_type"]
        if mt not in MODEL_TYPES:
            raise ValueError(
                f"config.json: model_type must be one of {list(MODEL_TYPES)}, got {mt!r}"
            )
        return mt
    by_class = {cls: mt for mt, cls in MODEL_TYPES.items()}
    archs = d.get("architectures") or []
    if not archs:
        return "qwen3"
    known = [by_class[a] for a in archs if a in by_class]
    if not known:
        raise ValueError(
            "config.json: no model_type, and architectures "
            f"{archs!r} names none of {list(by_class)}"
        )
    return known[0]


def _check_qwen2_attention(d: dict[str, Any]) -> None:
    """Refuses the Qwen2 attention variants we do not implement (transformers' Qwen2Config)."""
    if d.get("attention_bias", True) is False:
        # transformers' Qwen2 ignores the field and always builds the biases.
        raise NotImplementedError(
            "config.json: attention_bias=false is not supported for model_type 'qwen2' (its "
            "q/k/v projections always have biases)"
        )
    n = d["num_hidden_layers"]
    types = d.get("layer_types")
    if types is None:  # transformers: sliding from layer max_window_layers on, when enabled
        window = d.get("sliding_window", 4096) if d.get("use_sliding_window", False) else None
        first = d.get("max_window_layers", 28)
        types = ["sliding_attention" if window is not None and i >= first else "full_attention"
                 for i in range(n)]  # fmt: skip
    sliding = [i for i, t in enumerate(types) if t != "full_attention"]
    if sliding:
        raise NotImplementedError(
            f"config.json: sliding-window attention is not supported (use_sliding_window="
            f"{d.get('use_sliding_window')}, max_window_layers={d.get('max_window_layers')}, "
            f"layer_types: layers {sliding} are not 'full_attention'); only full attention is"
        )


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
