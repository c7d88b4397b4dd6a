"""The JAX engine's sampling math and decode loop, shared by `rubric_rl.rollout.jax_engine`
(stateless generation) and `rubric_rl.rollout.prefix_reuse` (multi-turn sessions that keep a
conversation's KV cache): the seeds' key data, top-k / top-p filtering, one sampling step, the
loop after a prefill, and a kernel row as a `Generation`. Depends on neither of those modules."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rubric_rl.rollout.engine import Generation, SamplingParams

Array = jax.Array


def seed_key_data(seeds: Sequence[int]) -> np.ndarray:
    """63-bit seeds -> threefry key data uint32 [n, 2] (hi, lo) — no int64 needed in JAX."""
    s = np.asarray([int(x) for x in seeds], dtype=np.uint64).reshape(-1)
    return np.stack([(s >> np.uint64(32)), s & np.uint64(0xFFFFFFFF)], -1).astype(np.uint32)


# ----------------------------------------------------------------------------- sampling math


def filter_logits(scaled: Array, top_p: Array, top_k: Array) -> Array:
    """``scaled`` [B, V] with tokens outside top-k, then outside the top-p nucleus (of the top-k
    renormalised distribution, the vLLM/SGLang order), set to -inf. ``top_k <= 0``: no top-k
    cut; ``top_p >= 1``: no nucleus cut. Ties at a threshold are all kept."""
    v = scaled.shape[-1]
    srt = -jnp.sort(-scaled, axis=-1)  # descending
    k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)
    in_k = jnp.arange(v)[None, :] < k
    srt = jnp.where(in_k, srt, -jnp.inf)
    probs = jax.nn.softmax(srt, axis=-1)
    # Keep sorted token i when the mass strictly before it is < top_p (the first always stays).
    keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p
    keep = keep & in_k
    n_keep = jnp.maximum(jnp.sum(keep, axis=-1, keepdims=True), 1)
    threshold = jnp.take_along_axis(srt, n_keep - 1, axis=-1)
    return jnp.where(scaled >= threshold, scaled, -jnp.inf)


def sample_tokens(
    logits: Array,
    keys: Array,
    temperature: Array,
    top_p: Array,
    top_k: Array,
    *,
    filtering: bool,
    banned: Array | None = None,
) -> tuple[Array, Array]:
    """One sampling step. logits [B, V] float32, keys [B] (typed PRNG keys).

    ``banned``: an optional bool mask broadcastable to [B, V]; those tokens are never chosen
    (sampled or greedy), as if their logits were -inf.

    Returns (token [B] int32, logp [B] float32) with logp = log_softmax(logits / T)[token] over the
    full vocabulary (core/logprobs.py's expression, ``banned`` tokens included in the
    normaliser); T = 0 is greedy with T = 1 log-probs.
    """
    greedy = temperature <= 0
    t = jnp.where(greedy, jnp.float32(1.0), temperature)
    scaled = logits.astype(jnp.float32) / t
    logps = scaled - jax.nn.logsumexp(scaled, axis=-1, keepdims=True)
    cand = filter_logits(scaled, top_p, top_k) if filtering else scaled
    if banned is not None:
        cand = jnp.where(banned, -jnp.inf, cand)
        logits = jnp.where(banned, -jnp.inf, logits)
    sampled = jax.vmap(jax.random.categorical)(keys, cand)
    token = jnp.where(greedy, jnp.argmax(logits, axis=-1), sampled).astype(jnp.int32)
    return token, jnp.take_along_axis(logps, token[:, None], axis=-1)[:, 0]


def _generation(
    tokens: np.ndarray,
    logps: np.ndarray,
    n: int,
    params: SamplingParams,
    stop_set: set[int],
    version: int,
) -> Generation:
    """One kernel row (host arrays) as a `Generation`: the first ``n`` tokens; "stop" when the
    last one is a stop token (and stops are honoured), else "length"."""
    toks = tuple(int(t) for t in tokens[:n])
    stopped = not params.ignore_eos and n > 0 and toks[-1] in stop_set
    return Generation(
        token_ids=toks,
        logprobs=tuple(float(x) for x in logps[:n]),
        finish_reason="stop" if stopped else "length",
        weight_version=version,
    )


def sample_and_decode(
    model: nnx.Module,
    logits: Array,
    cache: Any,
    cache_mask: Array,
    first_slot: Array,
    next_position: Array,
    seeds: Array,
    active: Array,
    scalars: tuple[Array, Array, Array, Array, Array],
    stop_ids: Array,
    *,
    max_new_tokens: int,
    filtering: bool,
    pad_id: int,
    constrain: Any = lambda x: x,
) -> tuple[Array, Array, Array, Any]:
    """The decode loop after a prefill (shared by `JaxEngine.generate` and prefix sessions).

    ``logits`` [B, V]: the prefill's last-token logits; generated token i (i >= 1) is fed back at
    cache slot ``first_slot + i - 1`` with position ``next_position + i - 1`` ([B]); token i is
    drawn with key ``fold_in(key(seed), i)`` — a function of the seed and i only, so the draws do
    not depend on how the context got into the cache. Returns tokens [B, N] (pad after stop),
    logps [B, N] (0 after stop), lengths [B], and the cache with the fed tokens written.
    """
    temperature, top_p, top_k, min_new_tokens, ignore_eos = scalars
    b, n = logits.shape[0], max_new_tokens
    base_keys = jax.random.wrap_key_data(seeds)
    fold = jax.vmap(jax.random.fold_in, in_axes=(0, None))
    pad = jnp.int32(pad_id)
    # The vocabulary's stop tokens, once per call (-1 pads of stop_ids match none).
    vocab = jnp.arange(logits.shape[-1], dtype=jnp.int32)
    is_stop = jnp.any(vocab[:, None] == stop_ids[None, :], axis=-1)

    def sample(i, logits, done):
        # The first min_new_tokens tokens (i < min_new_tokens) are never stop tokens: a stop
        # is token min_new_tokens + 1 at the earliest (SGLang's and HF's convention).
        banned = is_stop[None, :] & (i < min_new_tokens)
        token, lp = sample_tokens(
            logits,
            fold(base_keys, i),
            temperature,
            top_p,
            top_k,
            filtering=filtering,
            banned=banned,
        )
        token = jnp.where(done, pad, token)
        lp = jnp.where(done, 0.0, lp)
        hit = jnp.any(token[:, None] == stop_ids[None, :], axis=-1) & ~ignore_eos
        return token, lp, done | hit

    done0 = ~active
    tok0, lp0, done = sample(0, logits, done0)
    tokens = constrain(jnp.full((b, n), pad).at[:, 0].set(tok0))
    logps = constrain(jnp.zeros((b, n), jnp.float32).at[:, 0].set(lp0))
    lengths = (~done0).astype(jnp.int32)

    def cond(carry):
        i, _, _, _, _, done, _ = carry
        return (i < n) & ~jnp.all(done)

    def body(carry):
        i, cache, cache_mask, tokens, logps, done, lengths = carry
        slot = first_slot + i - 1
        prev = jax.lax.dynamic_slice_in_dim(tokens, i - 1, 1, axis=1)
        cache_mask = jax.lax.dynamic_update_slice_in_dim(
            cache_mask, jnp.ones((b, 1), jnp.int32), slot, axis=1
        )
        pos = (next_position + i - 1)[:, None]
        logits, cache = model.decode(prev, pos, cache, slot, cache_mask, last_only=True)
        tok, lp, new_done = sample(i, logits[:, 0], done)
        lengths = lengths + (~done).astype(jnp.int32)
        tokens = jax.lax.dynamic_update_slice_in_dim(tokens, tok[:, None], i, axis=1)
        logps = jax.lax.dynamic_update_slice_in_dim(logps, lp[:, None], i, axis=1)
        return i + 1, cache, cache_mask, tokens, logps, new_done, lengths

    carry = (jnp.int32(1), cache, cache_mask, tokens, logps, done, lengths)
    _, cache, _, tokens, logps, _, lengths = jax.lax.while_loop(cond, body, carry)
    return tokens, logps, lengths, cache
