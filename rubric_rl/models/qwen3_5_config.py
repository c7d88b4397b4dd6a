"""Configuration of the Qwen3.5 dense text model (`Qwen3_5Config`), read from and written to the
`config.json` of transformers 5.24's `Qwen3_5TextConfig` (`model_type` "qwen3_5_text") or of a
multimodal `Qwen3_5Config` ("qwen3_5", whose `text_config` we read), and its named presets.

Kept apart from `config.py` (the Qwen3 / Qwen2 dense families): the fields differ (layer_types,
the Gated DeltaNet shapes, partial rotary), and the decoder is `qwen3_5.Qwen3_5ForCausalLM`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rubric_rl.models.config import PRESETS, Qwen3Config, check_decoder_shape
from rubric_rl.models.gated_deltanet import GatedDeltaNetConfig

LAYER_TYPES = ("linear_attention", "full_attention")
# model_type -> the transformers class whose text stack we implement.
QWEN3_5_MODEL_TYPES = {
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
}


@dataclasses.dataclass(frozen=True)
class Qwen3_5Config:
    """Shapes and constants of a Qwen3.5 dense text model (transformers' field names and, where a
    field may be absent from config.json, transformers' defaults).

    layer_types: one of "linear_attention" (Gated DeltaNet) / "full_attention" (gated attention)
    per layer. Only the first `rotary_dim = int(head_dim * partial_rotary_factor)` dims of each
    q/k head are rotated. `mrope_section` / `mrope_interleaved` are kept for export only: for
    text, transformers feeds the same position to all three mrope sections, which is ordinary
    RoPE over the rotary dims (what we compute).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.25
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool | None = None
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None

    model_type = "qwen3_5_text"

    def __post_init__(self):
        check_decoder_shape(self)
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"Qwen3_5Config.layer_types has {len(self.layer_types)} entries, expected "
                f"num_hidden_layers={self.num_hidden_layers}"
            )
        bad = sorted({t for t in self.layer_types if t not in LAYER_TYPES})
        if bad:
            raise ValueError(f"Qwen3_5Config.layer_types: {bad} not in {list(LAYER_TYPES)}")
        rd = self.rotary_dim
        if rd <= 0 or rd % 2 or rd > self.head_dim:
            raise ValueError(
                f"Qwen3_5Config.partial_rotary_factor={self.partial_rotary_factor} with head_dim="
                f"{self.head_dim} gives rotary_dim {rd}; it must be even and in (0, head_dim]"
            )
        if self.mrope_section is not None:
            object.__setattr__(self, "mrope_section", tuple(self.mrope_section))
        if isinstance(self.eos_token_id, list):  # hashable (jit static arg)
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        _ = self.deltanet  # validates the Gated DeltaNet fields

    @property
    def rotary_dim(self) -> int:
        """Rotated dims per head (transformers: int(head_dim * partial_rotary_factor))."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def deltanet(self) -> GatedDeltaNetConfig:
        """The Gated DeltaNet layers' config."""
        return GatedDeltaNetConfig(
            hidden_size=self.hidden_size,
            linear_num_key_heads=self.linear_num_key_heads,
            linear_num_value_heads=self.linear_num_value_heads,
            linear_key_head_dim=self.linear_key_head_dim,
            linear_value_head_dim=self.linear_value_head_dim,
            linear_conv_kernel_dim=self.linear_conv_kernel_dim,
            rms_norm_eps=self.rms_norm_eps,
        )

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> Qwen3_5Config:
        """From a config.json dict: model_type "qwen3_5_text", or "qwen3_5" (multimodal; its
        `text_config` is read and the top-level `tie_word_embeddings`, which is what transformers'
        Qwen3_5ForConditionalGeneration ties by). MoE variants and what we do not implement raise
        NotImplementedError naming the field."""
        mt = d.get("model_type")
        if mt is not None and "moe" in str(mt):
            raise NotImplementedError(
                f"config.json: model_type {mt!r} (Qwen3.5 MoE) is not supported; only the dense "
                "Qwen3.5 text model (model_type 'qwen3_5_text' or 'qwen3_5')"
            )
        if mt not in QWEN3_5_MODEL_TYPES:
            raise ValueError(
                f"config.json: model_type must be one of {list(QWEN3_5_MODEL_TYPES)}, got {mt!r}"
            )
        prefix = ""
        tie = d.get("tie_word_embeddings", False)
        if mt == "qwen3_5":
            if "text_config" not in d:
                raise KeyError("config.json: model_type 'qwen3_5' needs a text_config")
            d, prefix = d["text_config"] or {}, "text_config."
            tmt = d.get("model_type", "qwen3_5_text")
            if tmt != "qwen3_5_text":
                raise NotImplementedError(
                    f"config.json: text_config.model_type {tmt!r} is not supported (only "
                    "'qwen3_5_text')"
                )
        if "num_experts" in d or "moe_intermediate_size" in d:
            raise NotImplementedError(
                f"config.json: {prefix}num_experts / moe_intermediate_size: Qwen3.5 MoE is not "
                "supported (dense only)"
            )
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise NotImplementedError(
                f"config.json: {prefix}rope_parameters.rope_type {rope_type!r} is not supported "
                "(only 'default')"
            )
        for field, ok in (
            ("hidden_act", d.get("hidden_act", "silu") == "silu"),
            ("attention_bias", not d.get("attention_bias", False)),
            ("attention_dropout", not (d.get("attention_dropout") or 0.0)),
        ):
            if not ok:
                raise NotImplementedError(
                    f"config.json: {prefix}{field}={d[field]!r} is not supported (Qwen3.5 uses "
                    "silu, no attention bias, no attention dropout)"
                )
        try:
            n = d["num_hidden_layers"]
            types = d.get("layer_types")
            if types is None:  # transformers: every full_attention_interval-th layer is full
                types = interval_layer_types(n, d.get("full_attention_interval", 4))
            heads = d.get("num_attention_heads", 16)
            theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
            prf = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 0.25))
            return cls(
                vocab_size=d.get("vocab_size", 248320),
                hidden_size=d.get("hidden_size", 4096),
                intermediate_size=d.get("intermediate_size", 12288),
                num_hidden_layers=n,
                num_attention_heads=heads,
                num_key_value_heads=d.get("num_key_value_heads", 4),
                head_dim=d.get("head_dim") or 256,
                layer_types=tuple(types),
                linear_num_key_heads=d.get("linear_num_key_heads", 16),
                linear_num_value_heads=d.get("linear_num_value_heads", 32),
                linear_key_head_dim=d.get("linear_key_head_dim", 128),
                linear_value_head_dim=d.get("linear_value_head_dim", 128),
                linear_conv_kernel_dim=d.get("linear_conv_kernel_dim", 4),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=float(theta),
                partial_rotary_factor=float(prf),
                tie_word_embeddings=bool(tie),
                max_position_embeddings=d.get("max_position_embeddings", 32768),
                mrope_section=rope.get("mrope_section"),
                mrope_interleaved=rope.get("mrope_interleaved"),
                bos_token_id=d.get("bos_token_id"),
                eos_token_id=d.get("eos_token_id"),
            )
        except KeyError as e:
            raise KeyError(f"config.json: missing field {prefix}{e.args[0]!r}") from None
        except ValueError as e:
            raise ValueError(f"config.json: {e}") from None

    def to_hf_dict(self, dtype: str = "float32") -> dict[str, Any]:
        """config.json of transformers' Qwen3_5ForCausalLM (model_type "qwen3_5_text")."""
        rope: dict[str, Any] = {
            "rope_type": "default",
            "rope_theta": self.rope_theta,
            "partial_rotary_factor": self.partial_rotary_factor,
        }
        if self.mrope_section is not None:
            rope["mrope_section"] = list(self.mrope_section)
        if self.mrope_interleaved is not None:
            rope["mrope_interleaved"] = self.mrope_interleaved
        d: dict[str, Any] = {
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5_text",
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
            "layer_types": list(self.layer_types),
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": rope,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "use_cache": True,
            "dtype": dtype,
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
        attn = d * 2 * h * hd + 2 * d * kv * hd + h * hd * d + 2 * hd
        g = self.deltanet
        hv, kk = g.linear_num_value_heads, g.linear_conv_kernel_dim
        linear = d * (g.conv_dim + g.value_dim + 2 * hv) + kk * g.conv_dim + 2 * hv
        linear += g.linear_value_head_dim + g.value_dim * d
        per_layer = 3 * d * f + 2 * d
        mixers = sum(attn if t == "full_attention" else linear for t in self.layer_types)
        embed = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return embed + mixers + self.num_hidden_layers * per_layer + d


def interval_layer_types(n: int, every: int = 4) -> tuple[str, ...]:
    """transformers' default layer_types: layer i is full attention when (i + 1) % every == 0."""
    return tuple("full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n))


QWEN3_5_PRESETS: dict[str, Qwen3_5Config] = {
    # Test size: [linear, full] x 2, every shape small; compiles in seconds on CPU.
    "qwen3_5_tiny": Qwen3_5Config(
        128,
        64,
        128,
        4,
        4,
        2,
        32,
        layer_types=interval_layer_types(4, 2),
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    ),
    # The seed papers' Qwen3.5 text towers (Qwen/Qwen3.5-4B, -9B, -27B: Qwen3_5ForConditional-
    # Generation checkpoints whose text_config we implement; their vision encoder and MTP head are
    # not part of these shapes). No official config.json is stored here, so every value is taken
    # from public copies and cross-checked; the sources (S1..S9) are listed once, then cited per
    # field (a field citing one source has no second one found).
    #   S1 Megatron args of THUDM/slime scripts/models/qwen3.5-27B.sh; radixark/miles scripts/
    #      models/qwen3.5-{4B,9B,27B}.sh; PolynomialTime/slime scripts/models/qwen3.5-9B.sh;
    #      Osmosis-AI/slime-rl scripts/models/qwen3.5-4B.sh; vllm-project/vime scripts/models/
    #      qwen3.5-27B.sh (--num-layers, --hidden-size, --ffn-hidden-size, --num-attention-heads,
    #      --num-query-groups, --kv-channels, --rotary-percent 0.25, --rotary-base 10000000,
    #      --norm-epsilon 1e-6, --vocab-size 248320; --untie-embeddings-and-output-weights on 9B
    #      and 27B, absent on 4B). One lineage (slime and forks), so ONE source; it holds no Gated
    #      DeltaNet sizes (its plugin spec reads them from the HF config).
    #   S2 config.json of fine-tunes on the HF hub (same shapes as their base), the fields seen:
    #      4B huggingface.co/halen214/st01 and coderofpears/ClankerCode-Checkpoint1 (hidden,
    #      intermediate, head_dim, full_attention_interval 4, the 32 layer_types, linear 16 / 32
    #      heads of 128, conv 4, max_position_embeddings 262144); 9B KnowledgeXLab/ComActor-9B and
    #      NexVeridian/OmniCoder-9B-5bit text_config (hidden, intermediate, head_dim, interval 4,
    #      the 32 layer_types); 27B ApolloRaines/Sharona_Q27B-R_CodeSecurity (hidden,
    #      intermediate, head_dim, interval 4).
    #   S3 the official model cards (huggingface.co/Qwen/Qwen3.5-{4B,9B,27B}) as quoted in public
    #      repositories' notes: hidden layout 8 x (3 x (Gated DeltaNet -> FFN) -> 1 x (Gated
    #      Attention -> FFN)) (16 x on 27B); linear attention heads 32 for V and 16 for QK (48 / 16
    #      on 27B); attention heads 16 for Q and 4 for KV (24 / 4 on 27B); 4B / 9B also: hidden
    #      2560 / 4096, FFN 9216 / 12288, linear head dim 128, attention head dim 256, RoPE dim 64,
    #      token embedding 248320 (tied to the LM output on 4B), context 262,144.
    #   S4 a transformers Qwen3_5Config of Qwen3.5-27B written out in a public repository (text_
    #      config: 64 layers, 5120 / 17408, 24 / 4 heads, head_dim 256, linear 16 / 48 heads of
    #      128, conv 4, full_attention_interval 4, rope_theta 1e7, partial_rotary_factor 0.25,
    #      max_position_embeddings 262144, rms_norm_eps 1e-6, untied, vocab 248320).
    #   S5 transformers 5.24 `Qwen3_5TextConfig` defaults (this venv): 248320 / 4096 / 12288 /
    #      32 layers / 16 / 4 heads / head_dim 256 / linear 16 / 32 heads of 128 / conv 4 / eps
    #      1e-6 / untied = the 9B shape (its rope_theta 1e4 and max_position_embeddings 32768 are
    #      library defaults, not the checkpoint's: not used).
    #   S6 GGUF metadata of Qwen3.5-9B (lzwjava.github.io/qwen3-5-9b-hybrid-review-en): 32 layers,
    #      embed 4096, FFN 12288, 16 heads / 4 KV, ssm d_state 128, d_conv 4, dt_rank 32 (= V
    #      heads), 16 groups (= QK heads), full attention every 4 layers, rope base 1e7 over 64
    #      dims, context 262,144, 8.95B params.
    #   S7 published parameter counts equal to `num_params()` of these presets: a text-only 4B
    #      fine-tune's 4,205,751,296 (exactly; needs tied embeddings and 32 V heads); 9B 8.95B
    #      (S6; tied would be 7.94B). The 27B checkpoint's 27.78B includes vision and MTP weights.
    #   S8 a public test fixture of the 4B text_config (hidden 2560, 9216, 16 / 4 heads, head_dim
    #      256, linear 16 / 32 of 128, conv 4, eps 1e-6, rope_theta 1e7, partial 0.25, tied,
    #      max_position_embeddings 262144).
    #   S9 other public 27B-shaped qwen3_5_text configs (the Qwen3.6 / 3.8-27B successors, which
    #      their cards give the same text architecture): 5120 / 17408, 24 / 4 heads of 256,
    #      linear 16 / 48 of 128, conv 4, rope_theta 1e7, partial 0.25, 262144, untied.
    #      Consistent with S4 but not the same checkpoint.
    # bos / eos are left None (the tokenizer's, as for every non-embedded run): the checkpoints'
    # text_config says eos 248044 while the top level / chat end is 248046 (S2 9B, S4), so the
    # sources disagree by level. mrope_section / mrope_interleaved (export only; [11, 11, 10] /
    # true in S4 and the 4B card notes) are not set: unverified for 9B.
    "qwen3_5_4b": Qwen3_5Config(
        vocab_size=248320,  # S1, S3
        hidden_size=2560,  # S1, S2, S3, S8
        intermediate_size=9216,  # S1, S2, S3, S8
        num_hidden_layers=32,  # S1, S2 (32 layer_types), S3, S8
        num_attention_heads=16,  # S1, S3, S8
        num_key_value_heads=4,  # S1 (--num-query-groups), S3, S8
        head_dim=256,  # S1 (--kv-channels), S2, S3, S8
        layer_types=interval_layer_types(32, 4),  # S2 (interval 4 and the list), S3
        linear_num_key_heads=16,  # S2, S3, S8
        linear_num_value_heads=32,  # S2, S3, S8, S7
        linear_key_head_dim=128,  # S2, S3, S8
        linear_value_head_dim=128,  # S2, S3, S8
        linear_conv_kernel_dim=4,  # S2, S8
        rms_norm_eps=1e-6,  # S1, S8
        rope_theta=1e7,  # S1, S8
        partial_rotary_factor=0.25,  # S1 (--rotary-percent), S3 (RoPE dim 64 of 256), S8
        tie_word_embeddings=True,  # S1 (no --untie flag, unlike 9B / 27B), S3, S7, S8
        max_position_embeddings=262144,  # S2, S3, S8
    ),
    "qwen3_5_9b": Qwen3_5Config(
        vocab_size=248320,  # S1, S3, S5
        hidden_size=4096,  # S1, S2, S3, S5, S6
        intermediate_size=12288,  # S1, S2, S3, S5, S6
        num_hidden_layers=32,  # S1, S2, S3, S5, S6
        num_attention_heads=16,  # S1, S3, S5, S6
        num_key_value_heads=4,  # S1, S3, S5, S6
        head_dim=256,  # S1, S2, S3, S5
        layer_types=interval_layer_types(32, 4),  # S2, S3, S6
        linear_num_key_heads=16,  # S3, S5, S6 (ssm groups)
        linear_num_value_heads=32,  # S3, S5, S6 (dt_rank), S7
        linear_key_head_dim=128,  # S3, S5, S6 (d_state)
        linear_value_head_dim=128,  # S3, S5
        linear_conv_kernel_dim=4,  # S5, S6 (d_conv)
        rms_norm_eps=1e-6,  # S1, S5
        rope_theta=1e7,  # S1, S6
        partial_rotary_factor=0.25,  # S1, S3 and S6 (64 rotary dims of 256)
        tie_word_embeddings=False,  # S1 (--untie-embeddings-and-output-weights), S5, S7
        max_position_embeddings=262144,  # S3, S6
    ),
    "qwen3_5_27b": Qwen3_5Config(
        vocab_size=248320,  # S1, S4, S9
        hidden_size=5120,  # S1, S2, S4, S9
        intermediate_size=17408,  # S1, S2, S4, S9
        num_hidden_layers=64,  # S1, S3, S4
        num_attention_heads=24,  # S1, S3, S4, S9
        num_key_value_heads=4,  # S1, S3, S4, S9
        head_dim=256,  # S1, S2, S4, S9
        layer_types=interval_layer_types(64, 4),  # S2 (interval 4), S3, S4
        linear_num_key_heads=16,  # S3, S4, S9
        linear_num_value_heads=48,  # S3, S4, S9
        linear_key_head_dim=128,  # S4, S9
        linear_value_head_dim=128,  # S4, S9
        linear_conv_kernel_dim=4,  # S4, S9
        rms_norm_eps=1e-6,  # S1, S4
        rope_theta=1e7,  # S1, S4, S9
        partial_rotary_factor=0.25,  # S1, S4, S9
        tie_word_embeddings=False,  # S1, S4, S9
        max_position_embeddings=262144,  # S4, S9 (the cards' 262,144 context)
    ),
}

# Every named model preset, both families (what `config.model.name` may name).
ALL_PRESETS: dict[str, Qwen3Config | Qwen3_5Config] = {**PRESETS, **QWEN3_5_PRESETS}
