"""Qwen3.5 dense text model (hybrid Gated DeltaNet + gated attention) in Flax NNX.

Reference: transformers 5.24 `models/qwen3_5/modeling_qwen3_5.py` (`Qwen3_5ForCausalLM`,
`Qwen3_5TextModel`, `Qwen3_5DecoderLayer`, `Qwen3_5Attention`, `Qwen3_5RMSNorm`).

Architecture: token embedding; N pre-norm decoder layers whose token mixer is chosen by
`config.layer_types[i]` — "linear_attention": `GatedDeltaNet` (gated_deltanet.py);
"full_attention": grouped-query attention whose q_proj also produces a per-head output gate
(o = attention(q, k, v) · sigmoid(gate), before o_proj), with per-head q/k RMSNorm and RoPE on the
first `rotary_dim` dims of each head only (partial rotary) — then a SwiGLU MLP; final norm; tied or
untied unembedding.

Every RMSNorm of the decoder (input / post-attention norms, q/k norms, final norm) is
transformers' *zero-centred* `Qwen3_5RMSNorm`: out = norm(x)·(1 + w), w initialised to 0, the
product taken in float32 before the cast back. The Gated DeltaNet's output norm is the plain
gated RMSNorm (w·norm(x)·silu(z), w initialised to 1) of gated_deltanet.py.

Parameter layout (kernels [in, out]; HF names in hf_io.py):
  embed.embedding [V, D]; norm.scale [D]; lm_head.kernel [D, V] (untied only)
  layers[i].{input,post_attention}_norm.scale [D]               (zero-centred)
  layers[i].attn.q_proj.kernel [D, H·2·hd]  per head [query hd | gate hd]   (full_attention)
  layers[i].attn.{k,v}_proj.kernel [D, KV·hd], o_proj.kernel [H·hd, D], {q,k}_norm.scale [hd]
  layers[i].linear_attn.*  (see `GatedDeltaNet`)                (linear_attention)
  layers[i].mlp.{gate,up,down}_proj.kernel
Sharding metadata as in qwen3.py.

Positions: for text, transformers gives all three mrope sections the same position ids, so the
interleaved mrope is plain RoPE over the rotary dims (inv_freq = θ^(−2i/rotary_dim)).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rubric_rl.models.gated_deltanet import GatedDeltaNet
from rubric_rl.models.layer_stack import remat_policy
from rubric_rl.models.qwen3 import (
    MLP,
    Dense,
    Qwen3ForCausalLM,
    _param,
    _use_fused,
    apply_rope,
    attention,
    cache_attention_mask,
    check_attention_impl,
    full_sequence_inputs,
    fused_attention,
    kv_cache_arrays,
    logits_from_hidden,
    rope_tables,
    token_embedding,
    write_kv_cache,
)
from rubric_rl.models.qwen3_5_config import QWEN3_5_PRESETS, Qwen3_5Config

__all__ = ["QWEN3_5_PRESETS", "Qwen3_5Config", "Qwen3_5ForCausalLM"]

Array = jax.Array


class ZeroCenteredRMSNorm(nnx.Module):
    """transformers' Qwen3_5RMSNorm: x·rsqrt(mean(x²)+eps)·(1 + w) in float32, cast back to the
    compute dtype; w starts at 0."""

    def __init__(self, dim, eps, *, dtype, param_dtype):
        self.scale = _param(None, (dim,), (None,), param_dtype, init="zeros")
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (x32 * (1.0 + self.scale[...].astype(jnp.float32))).astype(self.dtype)


def partial_rope(x: Array, rot: tuple[Array, Array], rotary_dim: int) -> Array:
    """RoPE (HF rotate_half convention) on the first `rotary_dim` dims of each head; the rest
    pass through. x [B, T, n, hd]; rot: `rope_tables(positions, rotary_dim, θ)`, computed once
    per forward (as Qwen3's) and shared by every attention layer's q and k."""
    if rotary_dim == x.shape[-1]:
        return apply_rope(x, rot)
    rotated = apply_rope(x[..., :rotary_dim], rot)
    return jnp.concatenate([rotated, x[..., rotary_dim:]], axis=-1)


class GatedAttention(nnx.Module):
    """Qwen3_5Attention: GQA with an output gate from q_proj, zero-centred q/k norm, partial
    RoPE. No biases (attention_bias=true is refused at config load)."""

    def __init__(self, cfg: Qwen3_5Config, *, rngs, dtype, param_dtype):
        d, hd = cfg.hidden_size, cfg.head_dim
        h, kv = cfg.num_attention_heads, cfg.num_key_value_heads
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.q_proj = Dense(d, h * 2 * hd, ("fsdp", "tensor"), **kw)
        self.k_proj = Dense(d, kv * hd, ("fsdp", "tensor"), **kw)
        self.v_proj = Dense(d, kv * hd, ("fsdp", "tensor"), **kw)
        self.o_proj = Dense(h * hd, d, ("tensor", "fsdp"), **kw)
        norm_kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.q_norm = ZeroCenteredRMSNorm(hd, cfg.rms_norm_eps, **norm_kw)
        self.k_norm = ZeroCenteredRMSNorm(hd, cfg.rms_norm_eps, **norm_kw)
        self.cfg = cfg

    def qkv_gate(self, x: Array, rot: tuple[Array, Array]) -> tuple[Array, Array, Array, Array]:
        """(q [B,T,H,hd], k, v [B,T,KV,hd], gate [B,T,H,hd]); q, k normed and rotated (`rot`:
        the forward's rotary tables, see `partial_rope`)."""
        b, t, _ = x.shape
        c = self.cfg
        qg = self.q_proj(x).reshape(b, t, c.num_attention_heads, 2 * c.head_dim)
        q, gate = qg[..., : c.head_dim], qg[..., c.head_dim :]
        k = self.k_proj(x).reshape(b, t, c.num_key_value_heads, c.head_dim)
        v = self.v_proj(x).reshape(b, t, c.num_key_value_heads, c.head_dim)
        q, k = self.q_norm(q), self.k_norm(k)
        q = partial_rope(q, rot, c.rotary_dim)
        k = partial_rope(k, rot, c.rotary_dim)
        return q, k, v, gate

    def out(self, o: Array, gate: Array) -> Array:
        b, t = o.shape[:2]
        gated = o * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(o.dtype)
        return self.o_proj(gated.reshape(b, t, -1))


class HybridDecoderLayer(nnx.Module):
    """Qwen3_5DecoderLayer: pre-norm token mixer (Gated DeltaNet or gated attention) + MLP."""

    def __init__(self, cfg: Qwen3_5Config, layer_type: str, *, rngs, dtype, param_dtype):
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.layer_type = layer_type
        self.input_norm = ZeroCenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg.deltanet, rngs=rngs, **kw)
        else:
            self.attn = GatedAttention(cfg, rngs=rngs, **kw)
        self.post_attention_norm = ZeroCenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)
        self.mlp = MLP(cfg, rngs=rngs, **kw)

    def __call__(
        self,
        x,
        rot,
        token_mask,
        attn_mask,
        attention_impl="xla",
        causal_blocks=1,
        cache=None,
        cache_index=None,
    ):
        """rot: the forward's rotary tables (`Qwen3_5ForCausalLM._rope_tables`; attention layers
        only). token_mask [B, T] (1 = real; None = all real) for a linear layer; attn_mask bool
        [B or 1, T, S] for an attention one. Without `cache`: the full-sequence forward,
        returning x. With `cache` (this layer's entry of `Qwen3_5ForCausalLM.init_cache`): the
        T new tokens continue from it (attention: k/v written at slots [cache_index,
        cache_index + T), S = all slots; linear: the recurrent and conv state); returns
        (x, new cache)."""
        h = self.input_norm(x)
        new_cache = None
        if self.layer_type == "linear_attention":
            if cache is None:
                h = self.linear_attn(h, token_mask)
            elif x.shape[1] == 1:
                h, new_cache = self.linear_attn.decode_step(h, cache, token_mask[:, 0])
            else:
                h, new_cache = self.linear_attn.prefill(h, token_mask, cache)
        else:
            q, k, v, gate = self.attn.qkv_gate(h, rot)
            if cache is not None:
                k, v, new_cache = write_kv_cache(cache, k, v, cache_index)
                o = attention(q, k, v, attn_mask, cache_layout=True)
            elif _use_fused(attention_impl, q):
                # Without a cache the mask is `full_sequence_inputs`' (causal & padding keys).
                o = fused_attention(q, k, v, attn_mask, "cudnn", causal_padding=True)
            else:
                o = attention(q, k, v, attn_mask, causal_blocks=causal_blocks)
            h = self.attn.out(o, gate)
        x = x + h.astype(x.dtype)
        x = x + self.mlp(self.post_attention_norm(x))
        return x if cache is None else (x, new_cache)


class Qwen3_5ForCausalLM(nnx.Module):
    """Qwen3.5 dense text causal LM (transformers `Qwen3_5ForCausalLM`); same call API as
    `Qwen3ForCausalLM`'s full-sequence forward: `hidden_states`, `unembed`, `__call__`."""

    def __init__(
        self,
        config: Qwen3_5Config,
        *,
        rngs: nnx.Rngs,
        dtype: Any = jnp.float32,
        param_dtype: Any = jnp.float32,
        remat: bool | str = False,
        attention_impl: str = "xla",
    ):
        """remat / attention_impl: as for `Qwen3ForCausalLM` (attention_impl applies to the
        full-attention layers). The layers always run as a loop (two kinds: no scan)."""
        check_attention_impl("Qwen3_5ForCausalLM", attention_impl)
        remat_policy(remat)
        self.attention_impl = attention_impl
        self.config = config
        self.dtype = dtype
        self.remat = remat
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.embed = token_embedding(config, rngs=rngs, **kw)
        self.layers = nnx.List(
            [HybridDecoderLayer(config, t, rngs=rngs, **kw) for t in config.layer_types]
        )
        self.norm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        if not config.tie_word_embeddings:
            self.lm_head = Dense(
                config.hidden_size, config.vocab_size, ("fsdp", "tensor"), rngs=rngs, **kw
            )

    def hidden_states(
        self,
        input_ids: Array,
        positions: Array | None = None,
        attention_mask: Array | None = None,
    ) -> Array:
        """Final-norm hidden states [B, T, D]. attention_mask [B, T] (1 = real, 0 = padding;
        left, right or both); positions default to `default_positions`. Attention layers never
        attend to padding keys; linear layers skip padding tokens (their state is unchanged by
        them). Padding rows are finite garbage for the caller to mask."""
        positions, attn_mask, blocks = full_sequence_inputs(input_ids, positions, attention_mask)
        rot = self._rope_tables(positions)
        x = self.embed(input_ids).astype(self.dtype)

        def run(layer, x):
            return layer(
                x,
                rot,
                attention_mask,
                attn_mask,
                attention_impl=self.attention_impl,
                causal_blocks=blocks,
            )

        remat, policy = remat_policy(self.remat)
        if remat:
            run = nnx.remat(run, policy=policy)
        for layer in self.layers:
            x = run(layer, x)
        return self.norm(x)

    # -- decoding with a cache (KV for attention layers, conv + recurrent state for linear) ----

    def init_cache(self, batch: int, max_len: int, dtype: Any = None) -> list[Any]:
        """Zeroed cache, one entry per layer: Qwen3's {"k", "v"} pair (`kv_cache_arrays`; compute
        dtype unless `dtype`) for an attention layer, a `GatedDeltaNetCache` (float32 recurrent
        state) for a linear one. A plain pytree for jit / while_loop."""
        c = self.config
        dtype = dtype or self.dtype
        return [
            layer.linear_attn.init_cache(batch, dtype)
            if layer.layer_type == "linear_attention"
            else kv_cache_arrays(batch, c.num_key_value_heads, max_len, c.head_dim, dtype)
            for layer in self.layers
        ]

    def decode(
        self,
        input_ids: Array,
        positions: Array,
        cache: list[Any],
        cache_index: Array,
        cache_mask: Array,
        *,
        last_only: bool = False,
    ) -> tuple[Array, list[Any]]:
        """`Qwen3ForCausalLM.decode`'s contract for the hybrid stack: t new tokens [B, t] at
        slots [cache_index, cache_index + t); cache_mask [B, max_len] is 1 on real slots,
        including the t new ones (its slice over them is the linear layers' token mask: a 0
        there leaves their state unchanged, so prompts may be left-padded and finished rows
        frozen). Returns (logits [B, t, V] float32 — [B, 1, V] when `last_only` —, new cache);
        the logits equal the full forward's at the same positions."""
        t = input_ids.shape[1]
        cache_index = jnp.asarray(cache_index, jnp.int32)
        attn_mask = cache_attention_mask(t, cache_index, cache_mask)
        token_mask = jax.lax.dynamic_slice_in_dim(cache_mask, cache_index, t, axis=1)
        x = self.embed(input_ids).astype(self.dtype)
        rot = self._rope_tables(positions)
        new_cache = []
        for layer, layer_cache in zip(self.layers, cache, strict=True):
            x, lc = layer(x, rot, token_mask, attn_mask, cache=layer_cache, cache_index=cache_index)
            new_cache.append(lc)
        h = self.norm(x)
        if last_only:
            h = h[:, -1:]
        return logits_from_hidden(h, self.unembed()), new_cache

    def _rope_tables(self, positions: Array) -> tuple[Array, Array]:
        """The rotary tables of the rotated head dims, once per forward (`partial_rope`)."""
        return rope_tables(positions, self.config.rotary_dim, self.config.rope_theta)

    # The same unembedding and logits as Qwen3ForCausalLM (tied: embedding transpose).
    unembed = Qwen3ForCausalLM.unembed
    __call__ = Qwen3ForCausalLM.__call__
