"""Qwen3 and Qwen2/Qwen2.5 dense decoders (Qwen3ForCausalLM) in Flax NNX.

Architecture (matches Hugging Face `transformers` Qwen3ForCausalLM): token embedding; N decoder
layers of pre-norm grouped-query attention (per-head RMSNorm on q and k before RoPE, no biases)
and a SwiGLU MLP; final RMSNorm; tied or untied unembedding. With `config.model_type == "qwen2"`
the same module is `transformers`' Qwen2ForCausalLM: the q/k/v projections have biases and there
is no q/k RMSNorm (`Qwen3Config.attention_bias`, `.qk_norm`); nothing else differs.

Parameter layout (kernels are [in, out], i.e. the transpose of torch's Linear.weight):
  embed.embedding [V, D]                      out_sharding (('tensor', 'fsdp'), None)
  layers[i].attn.{q,k,v}_proj.kernel [D, n*hd] ('fsdp', 'tensor')
  layers[i].attn.o_proj.kernel [H*hd, D]       ('tensor', 'fsdp')
  layers[i].attn.{q,k,v}_proj.bias [n*hd]      ('tensor',)          (Qwen2 only)
  layers[i].attn.{q,k}_norm.scale [hd]         replicated           (Qwen3 only)
  layers[i].mlp.{gate,up}_proj.kernel [D, F]   ('fsdp', 'tensor')
  layers[i].mlp.down_proj.kernel [F, D]        ('tensor', 'fsdp')
  layers[i].{input,post_attention}_norm.scale [D], norm.scale [D]   replicated
  lm_head.kernel [D, V] (untied only)          ('fsdp', 'tensor')
With `config.scan_layers` the L layers are one `DecoderLayer` whose parameters carry a leading
layer axis: `layers.attn.q_proj.kernel [L, D, n*hd]`, out_sharding (None, 'fsdp', 'tensor') — the
layer axis is never sharded — and the forward and `decode` run one `jax.lax.scan` over it (compile
time flat in depth). Hugging Face I/O (`hf_io`) stacks / unstacks, so checkpoints are the same.
The `out_sharding` metadata names mesh axes of `rubric_rl.core.sharding.make_mesh`; parameters are
created unsharded (eager sharding off) and placed by `rubric_rl.core.sharding`, which also drops an
axis whose size does not divide the dimension.

Numerics: matmuls run in the compute `dtype` (bf16 on GPU) with 2-D operands (`[B*T, D] @ [D, F]`,
faster on XLA:CPU); RMSNorm statistics, RoPE, attention softmax and the logits are float32.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rubric_rl.models.config import PRESETS, Qwen3Config, get_config
from rubric_rl.models.layer_stack import (
    REMAT_POLICIES,
    remat_policy,
    scan_decoder_layers,
    stack_layers,
    unstack_layers,
)

__all__ = [
    "PRESETS",
    "REMAT_POLICIES",
    "Qwen3Config",
    "Qwen3ForCausalLM",
    "default_positions",
    "get_config",
    "logits_from_hidden",
    "remat_policy",
    "stack_layers",
    "unstack_layers",
]

Array = jax.Array
# Finite "minus infinity": a fully masked attention row (a left-pad query) stays finite.
_MASK_VALUE = -1e30


# ----------------------------------------------------------------------------- layers


_INIT_CHUNK = 1 << 16


@jax.jit
def _normal_chunk(key: Array, i: Array) -> Array:
    return jax.random.normal(jax.random.fold_in(key, i), (_INIT_CHUNK,), jnp.float32)


def _normal_init(key: Array, shape: tuple[int, ...], dtype: Any) -> Array:
    """HF Qwen3 init normal(0, initializer_range=0.02), drawn in fixed-size chunks.

    Why chunks: eager construction would otherwise compile a threefry kernel per parameter shape
    (~0.7 s each on this CPU); a fixed chunk shape compiles once. Concrete keys run chunk by chunk
    (host concatenation); traced keys (jit, eval_shape) vmap over the chunk index — same values.
    """
    n = math.prod(shape)
    count = -(-n // _INIT_CHUNK)
    if isinstance(key, jax.core.Tracer):
        flat = jax.vmap(lambda i: _normal_chunk(key, i))(jnp.arange(count)).reshape(-1)
        return (0.02 * flat[:n].reshape(shape)).astype(dtype)
    flat = np.concatenate([np.asarray(_normal_chunk(key, i)) for i in range(count)])
    return jnp.asarray((np.float32(0.02) * flat[:n].reshape(shape)).astype(dtype))


def _param(key, shape, sharding, dtype, init="normal"):
    if init == "ones":
        value = jnp.ones(shape, dtype)
    elif init == "zeros":
        value = jnp.zeros(shape, dtype)
    else:
        value = _normal_init(key, tuple(shape), jnp.dtype(dtype))
    # eager_sharding=False: the model builds unsharded anywhere; core/sharding.py places it.
    return nnx.Param(value, out_sharding=sharding, eager_sharding=False)


class Dense(nnx.Module):
    """Linear map y = x @ kernel (+ bias), run as one 2-D matmul in the compute dtype.

    bias=True (Qwen2's q/k/v projections): a [d_out] bias sharded like the kernel's output dim,
    initialised to zero as in transformers."""

    def __init__(self, d_in, d_out, sharding, *, rngs, dtype, param_dtype, bias=False):
        self.kernel = _param(rngs.params(), (d_in, d_out), sharding, param_dtype)
        if bias:
            self.bias = _param(None, (d_out,), sharding[1:], param_dtype, init="zeros")
        self.use_bias = bias
        self.dtype = dtype

    def __call__(self, x: Array) -> Array:
        lead = x.shape[:-1]
        y = jnp.dot(
            x.reshape(-1, x.shape[-1]).astype(self.dtype), self.kernel[...].astype(self.dtype)
        )
        if self.use_bias:
            y = y + self.bias[...].astype(self.dtype)
        return y.reshape(*lead, y.shape[-1])


class RMSNorm(nnx.Module):
    """HF Qwen3RMSNorm: x·rsqrt(mean(x²)+eps) in float32, cast back, times the scale."""

    def __init__(self, dim, eps, *, dtype, param_dtype):
        self.scale = _param(None, (dim,), (None,), param_dtype, init="ones")
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.scale[...].astype(self.dtype) * x32.astype(self.dtype)


# The one-trip loop around the rotary tables on CPU (see `rope_tables`); the tests switch it off
# to compare against the plain formulation.
ROPE_TABLE_LOOP = True


def rope_tables(positions: Array, head_dim: int, theta: float) -> tuple[Array, Array]:
    """(cos, sin) float32 [B, T, 1, head_dim/2] of the rotary angles positions · θ^(-2i/hd).

    The models compute them once per forward and pass them to every layer (`apply_rope`). On
    CPU (T > 1) they are computed inside a one-trip while loop whose trip count XLA cannot see:
    a fusion boundary. Without it XLA:CPU fuses cos/sin into every q/k RoPE fusion of the
    forward and backward passes and evaluates them per element there (per head and per half:
    8x the table for q): the q RoPE-and-transpose fusion of the peer workload took 1.1 ms with
    them fused and 0.45 ms with the loop (0.1 ms with the tables given). Same values."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = jax.lax.stop_gradient(positions.astype(jnp.float32)[..., None] * inv_freq)
    long = positions.ndim == 2 and positions.shape[1] > 1 and positions.shape[0] > 0
    if ROPE_TABLE_LOOP and long and jax.default_backend() == "cpu":
        # Starts at min(first position, 0) <= 0 and stops at 1: at least one trip, and the body
        # is idempotent, so any start is correct; XLA cannot fold it to one trip and inline it.
        # (Not for a decode step, T = 1: its tables are tiny, a loop per step costs more.)
        start = jnp.minimum(positions.reshape(-1)[0].astype(jnp.int32), 0)
        _, cos, sin = jax.lax.while_loop(
            lambda c: c[0] < 1,
            lambda c: (c[0] + 1, jnp.cos(freqs), jnp.sin(freqs)),
            (start, freqs, freqs),
        )
    else:
        cos, sin = jnp.cos(freqs), jnp.sin(freqs)
    return cos[:, :, None, :], sin[:, :, None, :]


def apply_rope(x: Array, tables: tuple[Array, Array]) -> Array:
    """Rotary embedding, HF convention (rotate_half: halves [x1, x2] -> [-x2, x1]).

    x: [B, T, n, hd]; tables: `rope_tables` of the same positions and hd. Computed in float32,
    returned in x.dtype."""
    cos, sin = tables
    hd = x.shape[-1]
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., : hd // 2], x32[..., hd // 2 :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def rope(x: Array, positions: Array, theta: float) -> Array:
    """`apply_rope` with its own tables. x: [B, T, n, hd]; positions: [B, T] int."""
    return apply_rope(x, rope_tables(positions, x.shape[-1], theta))


ATTENTION_IMPLS = ("xla", "cudnn", "auto")
# The KV cache's layout: keys [B, KV, hd, S] (slots last), values [B, KV, S, hd]; stacked (scan)
# with the layer axis at 1. KV_SLOT_AXES[name] is the slot axis of the cache array `name`.
KV_SLOT_AXES = {"k": -1, "v": -2}


def kv_cache_arrays(
    batch: int, kv_heads: int, max_len: int, head_dim: int, dtype: Any, layers: int | None = None
) -> dict[str, Array]:
    """One zeroed {"k": [B, KV, hd, S], "v": [B, KV, S, hd]} pair (see `attention` for why the
    keys are stored transposed); with `layers`, [B, L, ...] for a scanned model."""
    lead = (batch,) if layers is None else (batch, layers)
    return {
        "k": jnp.zeros((*lead, kv_heads, head_dim, max_len), dtype),
        "v": jnp.zeros((*lead, kv_heads, max_len, head_dim), dtype),
    }


def attention(
    q: Array,
    k: Array,
    v: Array,
    mask: Array,
    *,
    causal_blocks: int = 1,
    cache_layout: bool = False,
) -> Array:
    """Grouped-query attention with a float32 softmax (the XLA path, used on CPU).

    q [B, T, H, hd]; k, v [B, S, KV, hd], or with ``cache_layout`` the KV cache's own layout,
    k [B, KV, hd, S] and v [B, KV, S, hd] (`kv_cache_arrays`): the matmuls read the cache as it
    is, where a token-major cache would be transposed first (a copy of the whole cache per
    layer and decode step), and QK^T is a plain [G·T, hd] x [hd, S] product — with the keys
    slot-major ([S, hd]) XLA:CPU's dot ran 2.2-2.9x slower at S = 72..520 in a decode step;
    mask bool [B, T, S] or [1, T, S] (True = may attend).
    Returns [B, T, H, hd] in q.dtype. A fully masked row (a left-pad query) gets a uniform
    average of v: finite garbage, and no gradient reaches its scores.

    causal_blocks = n > 1 (only for a causal self-attention mask with S == T, n dividing T):
    query block i of T/n rows is scored against keys [0, (i+1)·T/n) only. The skipped keys are
    masked anyway, so every row with a real key is unchanged, and (n-1)/(2n) of the QK^T / PV
    work is saved; a fully masked row then averages fewer v (different garbage).

    Layout (why): the G = H/KV query heads that share a KV head are stacked along the query axis
    and the batch dims (B, KV) lead in both operands, so both matmuls are plain batched GEMMs
    [B, KV, G·T, hd] x [B, KV, S, hd] with no K/V repeat. On XLA:CPU the 5-D einsum this replaced
    ('btkgd,bskd->bkgts') ran ≈1.25× slower in forward+backward (transposes around the dots of
    the backward pass); the explicit transposes here fuse with RoPE / the output projection.
    The softmax scale is folded into q (T·hd multiplies instead of T·S; exact for hd = 64).
    """
    b, t, h, hd = q.shape
    if cache_layout:
        k_eq, k_slot = "bknd,bkds->bkns", -1
    else:
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        k_eq, k_slot = "bknd,bksd->bkns", -2
    kv, s_len = v.shape[1], v.shape[2]
    g = h // kv
    mask = jnp.asarray(mask)
    if causal_blocks > 1 and (s_len != t or t % causal_blocks):
        raise ValueError(
            f"attention: causal_blocks={causal_blocks} needs S == T divisible by it "
            f"(got T={t}, S={s_len})"
        )
    qh = (q * jnp.asarray(hd**-0.5, q.dtype)).reshape(b, t, kv, g, hd).transpose(0, 2, 3, 1, 4)
    tb = t // causal_blocks
    outs = []
    for i in range(causal_blocks):
        end = s_len if causal_blocks == 1 else (i + 1) * tb
        # (B, KV) as two leading batch dims of both operands, not one reshaped B·KV: a reshape of
        # a KV cache just written in a decode loop made XLA:CPU duplicate the cache update (one
        # for the carry, one for the dot) and copy the whole cache for each.
        qi = qh[:, :, :, i * tb : (i + 1) * tb].reshape(b, kv, g * tb, hd)
        mi = mask[:, i * tb : (i + 1) * tb, :end]
        ki = k if end == s_len else jax.lax.slice_in_dim(k, 0, end, axis=k.ndim + k_slot)
        scores = jnp.einsum(k_eq, qi, ki, preferred_element_type=jnp.float32)
        scores = scores.reshape(b, kv, g, tb, end)
        # `where`, not an additive bias: same cost here (it fuses into the softmax), and a fully
        # masked row's scores get exactly zero gradient, as in the reference formulation.
        scores = jnp.where(mi[:, None, None, :, :], scores, _MASK_VALUE)
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype).reshape(b, kv, g * tb, end)
        out = jnp.einsum(
            "bkns,bksd->bknd", probs, v[:, :, :end], preferred_element_type=jnp.float32
        )
        outs.append(out.reshape(b, kv, g, tb, hd))
    out = outs[0] if causal_blocks == 1 else jnp.concatenate(outs, axis=3)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, hd).astype(q.dtype)


def causal_blocks_for(t: int) -> int:
    """Query blocks for `attention(..., causal_blocks=)` in a length-t causal forward: 4 (or 2)
    blocks of at least 64 rows; measured on XLA:CPU at T = 256, 4 blocks beat 2 and 8."""
    for n in (4, 2):
        if t % n == 0 and t // n >= 64:
            return n
    return 1


# cuDNN's fused attention as jax exposes it: bf16/fp16 inputs, head_dim a multiple of 8 up to 128.
_CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)


def _use_fused(impl: str, q: Array) -> bool:
    """Whether the full-sequence forward takes `fused_attention(..., "cudnn")`.

    "cudnn" always; "auto" on a GPU when q's dtype and head_dim suit cuDNN (else "xla"). "auto"
    resolves here, not in jax: `jax.nn.dot_product_attention(implementation=None)` is jax's XLA
    path in jax 0.10-0.11 (its source: "defaults to XLA for now"), not cuDNN. Seen on an H200
    (benchmarks/results/gpu_check-2026-12-04.jsonl): cuDNN with fully padded query rows matched
    the float64 reference (outputs and gradients); the train-step figures there predate this
    (their "auto" was jax's XLA attention)."""
    if impl == "cudnn":
        return True
    hd = q.shape[-1]
    return (
        impl == "auto"
        and jax.default_backend() == "gpu"
        and q.dtype in _CUDNN_DTYPES
        and hd % 8 == 0
        and hd <= 128
    )


# `fused_attention`'s padding-causal path (cuDNN's causal kernel with sequence lengths for masks
# that are causal + contiguous padding). False: every mask goes to `masked_attention`, the path
# the first H200 run checked numerically (the padding-causal one is checked on CPU through jax's
# XLA implementation; on a GPU by benchmarks/gpu_check.py's attention and parity parts).
CUDNN_PADDING_CAUSAL = True


def fused_attention(
    q: Array, k: Array, v: Array, mask: Array, impl: str, *, causal_padding: bool = False
) -> Array:
    """`jax.nn.dot_product_attention` with the same contract as `attention`; impl "cudnn" (flash
    attention on NVIDIA GPUs) or "xla" (jax's own XLA formulation, for comparison). cuDNN wants
    bf16/fp16 inputs and takes GQA directly (KV heads divide H).

    A self-attention mask that is exactly causal-by-index with padding keys excluded (what
    `full_sequence_inputs` builds) runs as `causal_padded_attention` (cuDNN's causal kernel with
    sequence lengths: no mask tensor); any other mask as `masked_attention` (the mask as a
    [B, 1, T, S] tensor). Why: with a mask cuDNN reads a [B, 1, T, S] bias per block, skips no
    causal block (twice the attention work of the causal kernel) and computes the bias's
    gradient, which jax then drops.

    ``causal_padding=True``: the caller states that ``mask`` is causal & its last row (the
    model's full-sequence forward, whose mask `full_sequence_inputs` builds), and the
    padding-causal path runs unconditionally. Otherwise the choice is made per call at run time
    (`lax.cond` on `padded_causal_rows`); real rows get the same values either way (tests). The
    model does not take the `lax.cond`: compiled for several GPUs, XLA cannot keep the batch
    sharding of cuDNN's custom call inside a conditional's branch and all-gathers q, k and v
    over the batch (every device then attends for every row; `benchmarks/aot_fit.py` counts
    those gathers in the target compile). `CUDNN_PADDING_CAUSAL = False` sends every mask to
    `masked_attention`."""
    if impl not in ("cudnn", "xla"):
        raise ValueError(f"fused_attention: impl={impl!r}; expected 'cudnn' or 'xla'")
    mask = jnp.broadcast_to(jnp.asarray(mask), (q.shape[0], *jnp.shape(mask)[1:]))
    self_attention = q.shape[1] == k.shape[1] == mask.shape[1] == mask.shape[2]
    if not (CUDNN_PADDING_CAUSAL and self_attention):
        return masked_attention(q, k, v, mask, impl)
    if causal_padding:
        return causal_padded_attention(q, k, v, mask[:, -1, :], impl)
    fast, key_real = padded_causal_rows(mask)
    return jax.lax.cond(
        fast,
        lambda q, k, v: causal_padded_attention(q, k, v, key_real, impl),
        lambda q, k, v: masked_attention(q, k, v, mask, impl),
        q,
        k,
        v,
    )


def masked_attention(q: Array, k: Array, v: Array, mask: Array, impl: str) -> Array:
    """`jax.nn.dot_product_attention` with the bool mask [B, T, S] as a [B, 1, T, S] tensor. On
    cuDNN that is a bias the kernel reads for every block, with no causal block skipping, and
    whose gradient it computes and jax drops (jax 0.10-0.11 exports dbias whenever a bias is
    given): the general path, kept for masks `causal_padded_attention` cannot express."""
    mask = jnp.broadcast_to(jnp.asarray(mask), (q.shape[0], *jnp.shape(mask)[1:]))[:, None]
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=impl)


def padded_causal_rows(mask: Array) -> tuple[Array, Array]:
    """(ok, key_real [B, T]) of a self-attention mask [B, T, T]: ok (a scalar bool) when the mask
    is exactly causal by index with the padding keys key_real excluded (any padding pattern:
    `causal_padded_attention` compacts each row). key_real is the last query row's mask, which
    under causality sees every key."""
    t = mask.shape[-1]
    key_real = mask[:, -1, :]
    causal = jnp.tril(jnp.ones((t, t), bool))
    return jnp.all(mask == (causal[None] & key_real[:, None, :])), key_real


def causal_padded_attention(q: Array, k: Array, v: Array, key_real: Array, impl: str) -> Array:
    """Causal self-attention over each row's real tokens (key_real [B, T]; any pattern: left,
    right or both padding, holes): each row's real tokens are moved, in order, to the slots
    before its padding (a stable sort), attended with ``is_causal`` and the rows' lengths
    (cuDNN's padding-causal kernel: causal block skipping, no mask tensor, no bias gradient)
    and moved back. Same values as the mask formulation on real query rows (the move keeps
    their order, and causality by index among real tokens is the same); padding query rows
    get zeros. Rows without a real token attend their first slot."""
    t = key_real.shape[1]
    n = jnp.maximum(jnp.sum(key_real, axis=-1), 1).astype(jnp.int32)
    slots = jnp.arange(t, dtype=jnp.int32)
    # forward[b, i]: the token at compacted slot i (real tokens first, each group in order).
    forward = jnp.argsort(~key_real.astype(bool), axis=-1, stable=True).astype(jnp.int32)
    back = jnp.argsort(forward, axis=-1).astype(jnp.int32)  # token j's compacted slot

    # Slots past a row's length are zeroed going in and coming out: whatever a kernel leaves
    # in those rows of its output or of its dQ/dK/dV (undefined for tokens beyond the lengths
    # in some fused kernels) is selected away, never multiplied into a finite gradient.
    live = (slots[None, :] < n[:, None])[:, :, None, None]

    def gather(x, idx):
        return jnp.take_along_axis(x, idx[:, :, None, None], axis=1)

    def compacted(x):
        return jnp.where(live, gather(x, forward), jnp.zeros((), x.dtype))

    o = jax.nn.dot_product_attention(
        compacted(q),
        compacted(k),
        compacted(v),
        is_causal=True,
        query_seq_lengths=n,
        key_value_seq_lengths=n,
        implementation=impl,
    )
    o = jnp.where(live, o, jnp.zeros((), o.dtype))
    return gather(o, back)


class Attention(nnx.Module):
    def __init__(self, cfg: Qwen3Config, *, rngs, dtype, param_dtype):
        d, hd = cfg.hidden_size, cfg.head_dim
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        qkv = dict(kw, bias=cfg.attention_bias)
        self.q_proj = Dense(d, cfg.num_attention_heads * hd, ("fsdp", "tensor"), **qkv)
        self.k_proj = Dense(d, cfg.num_key_value_heads * hd, ("fsdp", "tensor"), **qkv)
        self.v_proj = Dense(d, cfg.num_key_value_heads * hd, ("fsdp", "tensor"), **qkv)
        self.o_proj = Dense(cfg.num_attention_heads * hd, d, ("tensor", "fsdp"), **kw)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype=dtype, param_dtype=param_dtype)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype=dtype, param_dtype=param_dtype)
        self.cfg = cfg

    def qkv(self, x: Array, rot: tuple[Array, Array]) -> tuple[Array, Array, Array]:
        """Projections (+ Qwen2's biases) -> per-head q/k RMSNorm (Qwen3 only) -> RoPE with the
        `rope_tables` rot."""
        b, t, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).reshape(b, t, c.num_attention_heads, c.head_dim)
        k = self.k_proj(x).reshape(b, t, c.num_key_value_heads, c.head_dim)
        v = self.v_proj(x).reshape(b, t, c.num_key_value_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, rot), apply_rope(k, rot), v

    def out(self, o: Array) -> Array:
        b, t = o.shape[:2]
        return self.o_proj(o.reshape(b, t, -1))


class MLP(nnx.Module):
    def __init__(self, cfg: Qwen3Config, *, rngs, dtype, param_dtype):
        d, f = cfg.hidden_size, cfg.intermediate_size
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.gate_proj = Dense(d, f, ("fsdp", "tensor"), **kw)
        self.up_proj = Dense(d, f, ("fsdp", "tensor"), **kw)
        self.down_proj = Dense(f, d, ("tensor", "fsdp"), **kw)

    def __call__(self, x: Array) -> Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


def write_kv_cache(
    kv_cache: dict[str, Array], k: Array, v: Array, cache_index: Array
) -> tuple[Array, Array, dict[str, Array]]:
    """Writes k, v [B, t, KV, hd] at slots [cache_index, cache_index + t) of kv_cache
    {"k": [B, KV, hd, S], "v": [B, KV, S, hd]} (`kv_cache_arrays`); returns (all S keys, all S
    values, in that layout and k's dtype, the new cache). Only the t new tokens are transposed."""
    ci = jnp.asarray(cache_index, jnp.int32)
    new_k = jax.lax.dynamic_update_slice_in_dim(
        kv_cache["k"], k.transpose(0, 2, 3, 1).astype(kv_cache["k"].dtype), ci, axis=3
    )
    new_v = jax.lax.dynamic_update_slice_in_dim(
        kv_cache["v"], v.transpose(0, 2, 1, 3).astype(kv_cache["v"].dtype), ci, axis=2
    )
    return new_k.astype(k.dtype), new_v.astype(k.dtype), {"k": new_k, "v": new_v}


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: Qwen3Config, *, rngs, dtype, param_dtype):
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)
        self.attn = Attention(cfg, rngs=rngs, **kw)
        self.post_attention_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)
        self.mlp = MLP(cfg, rngs=rngs, **kw)

    def __call__(
        self,
        x,
        rot,
        mask,
        kv_cache=None,
        cache_index=None,
        attention_impl="xla",
        causal_blocks=1,
    ):
        """One pre-norm block; rot = `rope_tables` of the T tokens' positions. With `kv_cache` =
        {"k","v"} (`kv_cache_arrays`) the new k/v are written at slots [cache_index,
        cache_index + T) and attention runs over all S slots; returns (x, new_kv_cache or None).
        `attention_impl` (see Qwen3ForCausalLM) applies without a cache only; the KV-cache path
        always uses `attention`. `causal_blocks`: see `attention` (only for a causal mask over
        the T tokens themselves)."""
        q, k, v = self.attn.qkv(self.input_norm(x), rot)
        new_cache = None
        if kv_cache is not None:
            k, v, new_cache = write_kv_cache(kv_cache, k, v, cache_index)
        if kv_cache is None and _use_fused(attention_impl, q):
            # Without a cache the mask is `full_sequence_inputs`' (causal & padding keys).
            o = fused_attention(q, k, v, mask, "cudnn", causal_padding=True)
        else:
            o = attention(
                q, k, v, mask, causal_blocks=causal_blocks, cache_layout=kv_cache is not None
            )
        x = x + self.attn.out(o)
        x = x + self.mlp(self.post_attention_norm(x))
        return x, new_cache


# ----------------------------------------------------------------------------- model


def default_positions(input_ids: Array, attention_mask: Array | None) -> Array:
    """Position ids: cumsum(mask) - 1 clipped at 0 (left padding -> real tokens start at 0)."""
    if attention_mask is None:
        return jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def check_attention_impl(owner: str, attention_impl: str) -> None:
    if attention_impl not in ATTENTION_IMPLS:
        raise ValueError(
            f"{owner}: attention_impl={attention_impl!r}; expected one of {ATTENTION_IMPLS}"
        )


# The token embedding's sharding: the vocabulary over "tensor" x "fsdp" (Megatron's vocabulary
# split, extended over the FSDP axis), its model dim whole. With tensor = 1 a vocabulary on
# "tensor" alone left the table replicated on every device: 1.45 GiB of float32 for Qwen3's
# 151,936 x 2,560, 2.4-4.7 GiB for Qwen3.5's 248,320-token tables, x4 with the gradient and
# AdamW's moments. Sharding the model dim on "fsdp" instead made the lookup's backward
# rematerialise the whole table, so the vocabulary is the dim split.
EMBED_SHARDING: tuple = (("tensor", "fsdp"), None)


def token_embedding(config: Any, *, rngs: nnx.Rngs, dtype: Any, param_dtype: Any) -> nnx.Embed:
    """The [V, D] token embedding, HF init normal(0, 0.02), sharded `EMBED_SHARDING`."""
    return nnx.Embed(
        config.vocab_size,
        config.hidden_size,
        embedding_init=nnx.with_partitioning(
            lambda key, shape, dtype: _normal_init(key, tuple(shape), jnp.dtype(dtype)),
            EMBED_SHARDING,
            eager_sharding=False,
        ),
        rngs=rngs,
        dtype=dtype,
        param_dtype=param_dtype,
    )


def full_sequence_inputs(
    input_ids: Array, positions: Array | None, attention_mask: Array | None
) -> tuple[Array, Array, int]:
    """(positions, attention mask bool [B or 1, T, T], causal_blocks) of a full-sequence forward:
    positions default to `default_positions`; the mask is causal by array index and excludes
    padding keys; causal_blocks from `causal_blocks_for(T)`."""
    if positions is None:
        positions = default_positions(input_ids, attention_mask)
    t = input_ids.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))[None]
    mask = causal if attention_mask is None else causal & (attention_mask[:, None, :] > 0)
    return positions, mask, causal_blocks_for(t)


class Qwen3ForCausalLM(nnx.Module):
    """Qwen3 causal LM, or Qwen2/Qwen2.5 when `config.model_type == "qwen2"`. See the module
    docstring for the parameter layout and numerics."""

    def __init__(
        self,
        config: Qwen3Config,
        *,
        rngs: nnx.Rngs,
        dtype: Any = jnp.float32,
        param_dtype: Any = jnp.float32,
        remat: bool | str = False,
        attention_impl: str = "xla",
    ):
        """remat: rematerialise each decoder layer in the backward pass of `hidden_states`
        (activation memory O(layers * B*T*D) instead of everything; same values): True / "full",
        or "dots" (keep the matmul outputs, recompute the rest; see `REMAT_POLICIES`); False /
        "none" = off. May be changed later by assigning `model.remat`. Applies to the scanned
        layers too (`config.scan_layers`: a checkpointed scan body).

        attention_impl (full-sequence forward only; KV-cache decoding always uses "xla"):
          "xla"   — `attention`, hand-written for XLA (the fast choice on CPU; the default);
          "cudnn" — `jax.nn.dot_product_attention(implementation="cudnn")`: flash attention on
                    NVIDIA GPUs with a bf16/fp16 compute dtype (numerics checked on an H200 by
                    benchmarks/gpu_check.py; CI is CPU-only);
          "auto"  — "cudnn" on a GPU when the compute dtype is bf16/fp16 and head_dim a
                    multiple of 8 up to 128, "xla" otherwise (see `_use_fused`).
        """
        check_attention_impl("Qwen3ForCausalLM", attention_impl)
        remat_policy(remat)  # a bad setting fails here, not at the first backward pass
        self.attention_impl = attention_impl
        self.config = config
        self.dtype = dtype
        self.remat = remat
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.embed = token_embedding(config, rngs=rngs, **kw)
        # Built layer by layer either way: the same rngs draws, so a scanned and a looped model
        # of one seed hold the same weights (scanned: stacked on a leading layer axis).
        layers = [DecoderLayer(config, rngs=rngs, **kw) for _ in range(config.num_hidden_layers)]
        self.layers = stack_layers(layers) if config.scan_layers else nnx.List(layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        if not config.tie_word_embeddings:
            self.lm_head = Dense(
                config.hidden_size, config.vocab_size, ("fsdp", "tensor"), rngs=rngs, **kw
            )

    # -- full-sequence forward (training, scoring) -----------------------------------------

    def hidden_states(
        self,
        input_ids: Array,
        positions: Array | None = None,
        attention_mask: Array | None = None,
    ) -> Array:
        """Final-norm hidden states [B, T, D] in the compute dtype.

        input_ids [B, T] int; attention_mask [B, T] (1 = real token, 0 = padding; default all 1);
        positions [B, T] (default `default_positions`). Attention is causal by array index and
        never attends to padding keys, so left and right padding both work; padding rows give
        finite garbage that callers mask out. Attention skips the key blocks above the causal
        diagonal (`causal_blocks_for`), which changes only that garbage.
        """
        positions, mask, blocks = full_sequence_inputs(input_ids, positions, attention_mask)
        rot = self._rope_tables(positions)
        x = self.embed(input_ids).astype(self.dtype)

        def run(layer, x):
            return layer(x, rot, mask, attention_impl=self.attention_impl, causal_blocks=blocks)[0]

        remat, policy = remat_policy(self.remat)
        if self.config.scan_layers:
            x, _ = scan_decoder_layers(
                self.layers,
                lambda layer, x, _: (run(layer, x), None),
                x,
                remat=remat,
                policy=policy,
            )
            return self.norm(x)
        if remat:
            run = nnx.remat(run, policy=policy)
        for layer in self.layers:
            x = run(layer, x)
        return self.norm(x)

    def unembed(self) -> Array:
        """[D, V] unembedding: the embedding's transpose when tied, else the lm_head kernel.

        logits = hidden_states(...) @ unembed(), computed in float32 (see `logits_from_hidden`).
        """
        if self.config.tie_word_embeddings:
            return self.embed.embedding[...].T
        return self.lm_head.kernel[...]

    def __call__(
        self,
        input_ids: Array,
        positions: Array | None = None,
        attention_mask: Array | None = None,
    ) -> Array:
        """Logits [B, T, V] float32 = logits_from_hidden(hidden_states(...), unembed())."""
        return logits_from_hidden(
            self.hidden_states(input_ids, positions, attention_mask), self.unembed()
        )

    # -- KV-cache decoding (rollout engine) -------------------------------------------------

    def init_cache(self, batch: int, max_len: int, dtype: Any = None) -> list[dict[str, Array]]:
        """Zeroed KV cache: a list (one per layer) of {"k": [batch, KV, hd, max_len], "v":
        [batch, KV, max_len, hd]} in `dtype` (default: the compute dtype). A plain pytree: pass
        it through jit/while_loop. Heads-major, keys stored transposed, so decode attention reads
        the cache without transposing it (see `attention`); `KV_SLOT_AXES` gives each array's
        slot axis.

        With `config.scan_layers`: a list of ONE {"k", "v"} pair [batch, L, ...], all layers
        stacked on axis 1 — batch first, where the engine shards rows — and the scan updates
        each layer's slots in place."""
        c = self.config
        stacked = c.num_hidden_layers if c.scan_layers else None
        return [
            kv_cache_arrays(
                batch, c.num_key_value_heads, max_len, c.head_dim, dtype or self.dtype, stacked
            )
            for _ in range(1 if c.scan_layers else c.num_hidden_layers)
        ]

    def decode(
        self,
        input_ids: Array,
        positions: Array,
        cache: list[dict[str, Array]],
        cache_index: Array,
        cache_mask: Array,
        *,
        last_only: bool = False,
    ) -> tuple[Array, list[dict[str, Array]]]:
        """Runs t new tokens against the KV cache; a pure function of arrays (jit/scan friendly).

        input_ids, positions: [B, t] — the new tokens and their position ids (RoPE).
        cache: from `init_cache`; slots [0, cache_index) hold earlier tokens.
        cache_index: int32 scalar (may be traced); the new tokens are written to slots
          [cache_index, cache_index + t) of every row (rows share the slot index, so prompts are
          left-padded to a common length).
        cache_mask: [B, max_len], 1 where a slot holds a real token, INCLUDING the t slots written
          by this call (the caller sets them before calling; 0 for padding / finished rows).
        Query i (slot cache_index + i) attends to slots j <= cache_index + i with cache_mask 1.

        Prefill: t = prompt length P, cache_index = 0, cache_mask[:, :P] = prompt attention mask,
        positions = default_positions(prompt, mask). Step: t = 1, cache_index = P + s,
        positions = last position + 1, cache_mask[:, cache_index] = 1.
        Returns (logits [B, t, V] float32 — [B, 1, V] of the last token when `last_only` —,
        new_cache). The logits equal the full forward's at the same positions.
        """
        cache_index = jnp.asarray(cache_index, jnp.int32)
        mask = cache_attention_mask(input_ids.shape[1], cache_index, cache_mask)
        x = self.embed(input_ids).astype(self.dtype)
        rot = self._rope_tables(positions)
        if self.config.scan_layers:
            x, new_cache = self._decode_scanned(x, rot, mask, cache, cache_index)
        else:
            new_cache = []
            for layer, layer_cache in zip(self.layers, cache, strict=True):
                x, lc = layer(x, rot, mask, kv_cache=layer_cache, cache_index=cache_index)
                new_cache.append(lc)
        h = self.norm(x)
        if last_only:
            h = h[:, -1:]
        return logits_from_hidden(h, self.unembed()), new_cache

    def unscanned(self) -> Qwen3ForCausalLM:
        """This model with its layers as a loop (``scan_layers`` off), each layer a view of the
        stacked parameters (`unstack_layers`: static slices), or the model itself if unscanned.
        For decoding under jit: take it once, outside the decode loop (the JAX engine's
        `JaxEngineConfig.scan_decode` False). Scanned, the decode loop dynamic-slices every
        layer's weights and KV cache out of the stacked arrays at every step (XLA:CPU does not
        hoist them); unscanned, the weight slices are taken once per call and each layer has
        its own cache. Same values; the program grows with depth."""
        if not self.config.scan_layers:
            return self
        view = nnx.merge(*nnx.split(self))  # a new module object over the same arrays
        view.layers = nnx.List(unstack_layers(self.layers))
        view.config = dataclasses.replace(self.config, scan_layers=False)
        return view

    def _rope_tables(self, positions: Array) -> tuple[Array, Array]:
        """The rotary tables of `positions`, once per forward for all layers (`rope_tables`)."""
        return rope_tables(positions, self.config.head_dim, self.config.rope_theta)

    def _decode_scanned(self, x, rot, mask, cache, cache_index):
        """The layers of `decode` as one scan; the stacked cache ([B, L, ...] of
        `kv_cache_arrays`) rides in the carry and only layer i's t new slots are written back
        (in place under jit)."""
        if len(cache) != 1 or cache[0]["k"].ndim != 5:
            raise ValueError(
                "Qwen3ForCausalLM.decode: config.scan_layers needs the stacked cache of "
                "init_cache (one {'k','v'} pair [B, L, ...])"
            )
        t = x.shape[1]

        def body(layer, carry, i):
            x, ks, vs = carry
            layer_cache = {
                "k": jax.lax.dynamic_index_in_dim(ks, i, axis=1, keepdims=False),
                "v": jax.lax.dynamic_index_in_dim(vs, i, axis=1, keepdims=False),
            }
            x, lc = layer(x, rot, mask, kv_cache=layer_cache, cache_index=cache_index)
            new_k = jax.lax.dynamic_slice_in_dim(lc["k"], cache_index, t, axis=3)
            new_v = jax.lax.dynamic_slice_in_dim(lc["v"], cache_index, t, axis=2)
            ks = jax.lax.dynamic_update_slice(ks, new_k[:, None], (0, i, 0, 0, cache_index))
            vs = jax.lax.dynamic_update_slice(vs, new_v[:, None], (0, i, 0, cache_index, 0))
            return (x, ks, vs), None

        layers = jnp.arange(self.config.num_hidden_layers, dtype=jnp.int32)
        (x, ks, vs), _ = scan_decoder_layers(
            self.layers, body, (x, cache[0]["k"], cache[0]["v"]), layers
        )
        return x, [{"k": ks, "v": vs}]


def cache_attention_mask(t: int, cache_index: Array, cache_mask: Array) -> Array:
    """bool [B, t, S]: query i (slot cache_index + i) may attend to slot j <= cache_index + i
    whose cache_mask [B, S] is 1 (see `Qwen3ForCausalLM.decode`)."""
    q_slot = cache_index + jnp.arange(t, dtype=jnp.int32)  # [t]
    causal = jnp.arange(cache_mask.shape[1], dtype=jnp.int32)[None, :] <= q_slot[:, None]
    return causal[None] & (cache_mask[:, None, :] > 0)


def logits_from_hidden(hidden: Array, unembed: Array) -> Array:
    """float32 logits [..., V] = hidden [..., D] @ unembed [D, V], as one 2-D float32 matmul."""
    lead = hidden.shape[:-1]
    out = jnp.dot(
        hidden.reshape(-1, hidden.shape[-1]).astype(jnp.float32), unembed.astype(jnp.float32)
    )
    return out.reshape(*lead, out.shape[-1])
