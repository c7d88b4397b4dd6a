"""Prefix reuse for multi-turn rollouts: the JAX engine keeps each live conversation's KV cache
between turns, so an agent turn prefills only the tokens appended since the last one.

Why: `JaxEngine.generate` is stateless — an agent turn sends the whole conversation (prompt, every
earlier model turn, every tool observation) and the engine re-prefills all of it, so turn k costs
a prefill of the whole history. A `PrefixSession` (``engine.prefix_session()``) keeps, per
conversation key, the device KV of every token it has fed the model; the next turn's prompt is
checked against those tokens on the host and only the new suffix (the previous turn's last sampled
token — never fed back during decoding — plus the tool observation) is prefilled into the kept
cache. SGLang needs none of this (its radix cache reuses prefixes server-side):
`RolloutEngine.prefix_session()` returns None there and the agent loop re-sends whole prompts.

Exactness: the same request gives the same tokens and, to float32 rounding, the same log-probs as
a full re-prefill. Token i of a turn is drawn with ``fold_in(key(seed), i)`` in both paths (the
decode loop is `jax_decode.sample_and_decode`, shared), positions are the conversation's own
(0, 1, … over real tokens, however the cache slots are laid out), and masked cache slots
contribute exact zeros. What differs is only which matmul computed a cached K/V (a decode step
of one token vs a prefill of many) and the length of the masked attention reductions, i.e.
float32 summation order: last-bit differences, never a different distribution. Reuse is decided
on tokens, not trust: a conversation reuses the longest common prefix of its cached tokens and
the new prompt (at most ``len(prompt) - 1``, so the last prompt token is always prefilled and
gives the first logits); a prompt that diverges from the cache reuses only the shared part.

Layout per call (one jitted kernel, `extend`): every row's reused prefix is gathered (``relayout``,
a pure gather, exact) right-aligned to end at slot ``c`` = the longest reused prefix; the new
tokens are left-padded into slots ``[c, c + T)`` (T = the new-token bucket); decoding writes from
slot ``c + T`` on. Holes (left padding, slots after a row stopped) are masked. Shapes are buckets:
rows → ``batch_buckets``, T and ``c + T`` → ``prompt_buckets``, the cache length is ``S =
bucket(c + T) + max_new_tokens - 1`` (the stateless path's ``bucket(prompt) + max_new_tokens -
1``); ``c`` is traced. So a run compiles at most one `extend` per (rows, T, S,
max_new_tokens, filtering) bucket, one `relayout` per (old rows, old S, rows, S) and one `fresh`
per (rows, S) — none per turn or per conversation length within a bucket.

Weights: a session remembers the parameter reference and version it cached under; when the engine's
weights changed (``update_weights``) every kept cache is dropped before the next call, which then
prefills from scratch — results equal a fresh engine's.

Memory: one device cache of ``layers × 2 × B × S × kv_heads × head_dim`` elements (the compute
dtype), B = batch bucket of the conversations in the LAST call, S as above (at most
``bucket(longest prompt + T) + max_new_tokens - 1``: a re-prefill's cache plus one new-token
bucket) — transiently two during the relayout. A conversation absent from a call is dropped
there (its episode ended); ``close()`` (or leaving the ``with`` block) frees everything. Calls
with more conversations than the largest batch bucket fall back to the stateless path (no reuse).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rubric_rl.core import sharding as sharding_lib
from rubric_rl.models.qwen3 import KV_SLOT_AXES
from rubric_rl.rollout.engine import Generation, GenerationRequest, SamplingParams
from rubric_rl.rollout.jax_decode import _generation, sample_and_decode, seed_key_data
from rubric_rl.util.buckets import round_up_to_bucket

# The engine is a `rubric_rl.rollout.jax_engine.JaxEngine`, which builds sessions
# (`JaxEngine.prefix_session`); this module does not import it (no import cycle).
JaxEngine = Any

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class _Row:
    index: int  # row of the session's device cache
    slots: np.ndarray  # int32 [len(tokens)]: the cache slot of tokens[i]
    tokens: tuple[int, ...]  # every token fed to the model so far, in conversation order


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    x = np.asarray(a[:n], np.int64) != np.asarray(b[:n], np.int64)
    return int(np.argmax(x)) if x.any() else n


class PrefixKernels:
    """The engine's jitted session programs (created once per engine, shared by its sessions, so
    a new session never recompiles). Each trace increments ``engine._traces``."""

    def __init__(self, engine: JaxEngine):
        self.engine = engine
        self.extend = jax.jit(
            self._extend_fn,
            static_argnames=("max_new_tokens", "filtering"),
            donate_argnames=("cache",),
        )
        self.relayout = jax.jit(self._relayout_fn)
        self.fresh = jax.jit(self._fresh_fn, static_argnames=("batch", "cache_len"))

    def _fresh_fn(self, params, rest, *, batch: int, cache_len: int):
        self.engine._traces += 1
        model = self.engine.decode_model(params, rest)
        return jax.tree.map(self.engine._constrain, model.init_cache(batch, cache_len))

    def _relayout_fn(self, cache, src_row: Array, src_slot: Array):
        """new[b, ..., s, ...] = old[src_row[b], ..., src_slot[b, s], ...] per layer and array (an
        exact gather along each array's slot axis, `KV_SLOT_AXES`)."""
        self.engine._traces += 1

        def gather(name: str, x: Array) -> Array:
            axis = x.ndim + KV_SLOT_AXES[name]
            shape = [1] * x.ndim
            shape[0], shape[axis] = src_slot.shape
            slots = src_slot.reshape(shape)
            return self.engine._constrain(jnp.take_along_axis(x[src_row], slots, axis=axis))

        return [{name: gather(name, x) for name, x in layer.items()} for layer in cache]

    def _extend_fn(
        self,
        params,
        rest,
        cache,
        prefix_len: Array,
        prefix_end: Array,
        new_ids: Array,
        new_mask: Array,
        seeds: Array,
        active: Array,
        temperature: Array,
        top_p: Array,
        top_k: Array,
        min_new_tokens: Array,
        ignore_eos: Array,
        stop_ids: Array,
        *,
        max_new_tokens: int,
        filtering: bool,
    ):
        eng = self.engine
        eng._traces += 1
        model = eng.decode_model(params, rest)
        t = new_ids.shape[1]
        s = cache[0]["v"].shape[KV_SLOT_AXES["v"]]
        slots = jnp.arange(s, dtype=jnp.int32)[None, :]
        cache_mask = (slots >= prefix_end - prefix_len[:, None]) & (slots < prefix_end)
        cache_mask = jax.lax.dynamic_update_slice_in_dim(
            cache_mask.astype(jnp.int32), new_mask, prefix_end, axis=1
        )
        cache_mask = eng._constrain(cache_mask)
        # The conversation's own positions: the reused prefix holds 0 .. prefix_len - 1.
        positions = prefix_len[:, None] + jnp.maximum(jnp.cumsum(new_mask, axis=-1) - 1, 0)
        logits, cache = model.decode(
            new_ids, positions, cache, prefix_end, cache_mask, last_only=True
        )
        new_len = jnp.sum(new_mask, axis=-1).astype(jnp.int32)
        return sample_and_decode(
            model,
            logits[:, 0],
            cache,
            cache_mask,
            prefix_end + t,
            prefix_len + new_len,
            seeds,
            active,
            (temperature, top_p, top_k, min_new_tokens, ignore_eos),
            stop_ids,
            max_new_tokens=max_new_tokens,
            filtering=filtering,
            pad_id=eng.config.pad_id,
            constrain=eng._constrain,
        )


class PrefixSession:
    """Kept KV caches of a set of conversations over one engine (see the module docstring).

    ``generate(requests, params, keys)``: as `JaxEngine.generate` with ``params.n == 1``;
    ``keys[i]`` names request i's conversation (hashable, unique per call). Use one session per
    rollout call and close it (``with engine.prefix_session() as s: ...``).
    """

    def __init__(self, engine: JaxEngine):
        self._engine = engine
        if getattr(engine, "_prefix_kernels", None) is None:
            engine._prefix_kernels = PrefixKernels(engine)
        self._kernels: PrefixKernels = engine._prefix_kernels
        self._cache: Any = None
        self._rows: dict[Hashable, _Row] = {}
        self._params_ref: Any = engine._params
        self._version = engine.weight_version
        self.stats = {"reused_tokens": 0, "prefilled_tokens": 0, "invalidations": 0}

    @property
    def num_conversations(self) -> int:
        """Conversations whose KV is kept now."""
        return len(self._rows)

    def close(self) -> None:
        self._cache, self._rows = None, {}

    def __enter__(self) -> PrefixSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def agenerate(
        self,
        requests: Sequence[GenerationRequest],
        params: SamplingParams,
        keys: Sequence[Hashable],
    ) -> list[list[Generation]]:
        return await asyncio.to_thread(self.generate, requests, params, keys)

    def generate(
        self,
        requests: Sequence[GenerationRequest],
        params: SamplingParams,
        keys: Sequence[Hashable],
    ) -> list[list[Generation]]:
        eng = self._engine
        eng._check_open()
        if params.n != 1:
            raise ValueError(f"PrefixSession.generate: SamplingParams.n must be 1, got {params.n}")
        keys = list(keys)
        if len(keys) != len(requests) or len(set(keys)) != len(keys):
            raise ValueError(
                f"PrefixSession.generate: need one distinct key per request, got {len(keys)} "
                f"keys ({len(set(keys))} distinct) for {len(requests)} requests"
            )
        if eng._params is not self._params_ref or eng.weight_version != self._version:
            # New weights: every kept K/V was computed by the old ones.
            if self._rows:
                self.stats["invalidations"] += 1
            self.close()
            self._params_ref, self._version = eng._params, eng.weight_version
        cfg = eng.config
        if len(requests) > cfg.batch_buckets[-1]:
            self.close()
            return eng.generate(requests, params)
        reuse = []
        for r, k in zip(requests, keys, strict=True):
            row = self._rows.get(k)
            m = 0 if row is None else _common_prefix(row.tokens, r.prompt_ids)
            reuse.append(min(m, len(r.prompt_ids) - 1))
        new_lens = [len(r.prompt_ids) - m for r, m in zip(requests, reuse, strict=True)]
        c = max(reuse, default=0)
        n = params.max_new_tokens
        t = round_up_to_bucket(max(new_lens), cfg.prompt_buckets)
        b = round_up_to_bucket(len(requests), cfg.batch_buckets, eng._batch_multiple)
        # As the stateless engine's p + n - 1 (p = the prompt bucket): the same cache length, and
        # so the same decode cost, as a re-prefill of this conversation would get.
        s = round_up_to_bucket(c + t, cfg.prompt_buckets) + n - 1

        if c == 0:
            cache = self._kernels.fresh(eng._params, eng._rest, batch=b, cache_len=s)
        else:
            src_row = np.zeros((b,), np.int32)
            src_slot = np.zeros((b, s), np.int32)
            for i, (k, m) in enumerate(zip(keys, reuse, strict=True)):
                if m:
                    row = self._rows[k]
                    src_row[i] = row.index
                    src_slot[i, c - m : c] = row.slots[:m]
            cache = self._kernels.relayout(self._cache, *eng._put(src_row, src_slot))
        self._cache, self._rows = None, {}  # the old layout is garbage from here on

        ids = np.full((b, t), cfg.pad_id, np.int32)
        mask = np.zeros((b, t), np.int32)
        mask[:, -1] = 1  # filler rows: one real token, so no attention row is empty
        prefix_len = np.zeros((b,), np.int32)
        seeds = np.zeros((b, 2), np.uint32)
        active = np.zeros((b,), bool)
        seeds_of = [r.seeds(1)[0] for r in requests]
        for i, (r, m) in enumerate(zip(requests, reuse, strict=True)):
            new = r.prompt_ids[m:]
            ids[i, t - len(new) :] = new
            mask[i, t - len(new) :] = 1
            prefix_len[i] = m
            seeds[i] = seed_key_data([seeds_of[i]])[0]
            active[i] = True
        stop_ids = eng._stop_ids(params)
        filtering = (not params.greedy) and (params.top_p < 1.0 or params.top_k > 0)
        tokens, logps, lengths, cache = self._kernels.extend(
            eng._params,
            eng._rest,
            cache,
            *eng._put(prefix_len),
            jnp.int32(c),
            *eng._put(ids, mask, seeds, active),
            jnp.float32(params.temperature),
            jnp.float32(params.top_p),
            jnp.int32(params.top_k),
            jnp.int32(params.min_new_tokens),
            jnp.bool_(params.ignore_eos),
            jnp.asarray(stop_ids),
            max_new_tokens=n,
            filtering=filtering,
        )
        tokens, logps, lengths = (sharding_lib.to_host(x) for x in (tokens, logps, lengths))
        stop_set = {int(x) for x in stop_ids if x >= 0}
        out: list[list[Generation]] = []
        rows: dict[Hashable, _Row] = {}
        for i, (r, k, m) in enumerate(zip(requests, keys, reuse, strict=True)):
            length = int(lengths[i])
            g = _generation(tokens[i], logps[i], length, params, stop_set, eng.weight_version)
            g = dataclasses.replace(g, request_id=r.request_id, seed=int(seeds_of[i]))
            out.append([g])
            # Fed so far: the reused prefix, the new tokens, and every generated token but the
            # last (decode step j >= 1 feeds token j - 1 at slot c + t + j - 1).
            slots = np.concatenate(
                [
                    np.arange(c - m, c),
                    np.arange(c + t - new_lens[i], c + t),
                    np.arange(c + t, c + t + length - 1),
                ]
            ).astype(np.int32)
            rows[k] = _Row(i, slots, r.prompt_ids + g.token_ids[: length - 1])
        self._cache, self._rows = cache, rows
        self.stats["reused_tokens"] += sum(reuse)
        self.stats["prefilled_tokens"] += sum(new_lens)
        return out
