"""The Llama family (`transformers`' LlamaForCausalLM: Llama 2/3 layouts, SmolLM, TinyLlama...).

Its decoder is the Qwen2 path of `Qwen3ForCausalLM` without the q/k/v biases: token embedding;
pre-norm grouped-query attention with RoPE (rotate_half convention, no q/k norm, no biases) and
a SwiGLU MLP; final RMSNorm; tied or untied unembedding. So `Qwen3Config(model_type="llama")`
is the whole of it (`attention_bias` and `qk_norm` both False), and the HF checkpoint I/O, the KV
cache, the engines and the trainer serve it unchanged. GGUF files of the family: `gguf_io`.

What a LlamaConfig may say that this decoder does not do is refused by `check_llama_fields`,
naming the config.json field: biases (`attention_bias`, `mlp_bias`) and tensor-parallel
pretraining slices (`pretraining_tp` > 1); `Qwen3Config.from_hf_dict` refuses, for every family,
a rope scaling other than none ("linear", "dynamic", "yarn", "longrope", "llama3": the rope_type
is named in the error), an activation other than SiLU and attention dropout. `head_dim` is read
when given (else hidden_size // num_attention_heads, as transformers does).
"""

from __future__ import annotations

from typing import Any


def check_llama_fields(d: dict[str, Any]) -> None:
    """NotImplementedError naming the config.json field for the LlamaConfig variants the decoder
    does not implement (see the module docstring). The rope type and activation are checked by
    `Qwen3Config.from_hf_dict` for every family."""
    for field in ("attention_bias", "mlp_bias"):
        if d.get(field, False):
            raise NotImplementedError(
                f"config.json: {field}=true is not supported for model_type 'llama' (the "
                "decoder has no biases on the attention or MLP projections)"
            )
    if (d.get("pretraining_tp") or 1) != 1:
        raise NotImplementedError(
            f"config.json: pretraining_tp={d['pretraining_tp']} is not supported for model_type "
            "'llama' (only 1)"
        )
