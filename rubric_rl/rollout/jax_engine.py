"""The embedded default rollout engine: an in-process JAX sampler over the LIVE policy parameters.

Design (notes/jax-on-cpu.md, "Sampling"): a preallocated per-layer KV cache (a plain pytree), one
prefill call over left-padded prompts (positions ``cumsum(valid) − 1``), then a ``lax.while_loop``
decode that exits as soon as every row has stopped. Everything runs inside ONE jitted function per
static shape ``(batch bucket, prompt bucket, max_new_tokens, filtering on/off)``; temperature,
top-p, top-k, seeds, the stop-token set, ``min_new_tokens`` and ``ignore_eos`` are traced arrays,
so changing them never recompiles.
Group prefill (``JaxEngineConfig.group_prefill``, config ``rollout.group_prefill``, on by default):
the rows of one call that carry the same prompt tokens (a request's ``n`` samples, or requests
with identical prompts: a GRPO group) are found on the host; the prefill runs over the distinct
prompts only and each row's KV cache, cache mask and first logits are gathered from its prompt's
row (an exact copy), so a group of G rollouts prefills its prompt once instead of G times. Same
tokens and, to float32 rounding, the same log-probs as a prefill of every row: the rows' K/V come
from the same tokens at the same positions, only from a prefill matmul over fewer rows (CPU
matmul blocking depends on the row count: last-bit differences). The decode loop is unchanged.
Prompt lengths and row counts are rounded up to ``JaxEngineConfig`` buckets, so a training run
compiles a handful of shapes once and then reuses them step after step.

Weights: the engine holds a reference to the nnx state (``graphdef`` static, parameters a pytree
passed to the jitted function). ``update_weights(params, version)`` swaps that reference — no copy,
free. The train step donates its input state, so call ``update_weights`` with the new state after
every step (the previous buffers may be gone).

Log-probs (DESIGN §9): per generated token, ``log_softmax(logits / T)`` in float32 over the FULL
vocabulary — the exact expression of ``rubric_rl.core.logprobs`` (the trainer's π_old), NOT the
distribution renormalised after top-p / top-k. With top-p < 1 or top-k > 0 the sampler draws from
the truncated distribution while the log-probs describe the full one, so the importance ratio
π_θ/π_old is biased unless the truncation mask is replayed in the trainer: keep top-p = 1 and
top-k off in training rollouts. Greedy (T = 0) returns ``log_softmax(logits)`` (T = 1).

Stop handling: a row stops at the first token in ``eos_token_ids ∪ stop_token_ids``; that token is
kept in ``token_ids`` (it was sampled and is trained on, as the SGLang client's ``no_stop_trim``)
with finish_reason "stop"; rows that never stop end with "length". ``min_new_tokens``: the stop
tokens' logits are masked to -inf at positions < min_new_tokens (sampling and greedy argmax), the
returned log-probs stay the full-vocabulary ones above (engine.SamplingParams explains why).
``ignore_eos``: the done flags ignore stop tokens, so every row runs to max_new_tokens. Inside the
kernel, a finished row keeps emitting ``pad_id`` with log-prob 0; those positions are cut before
returning.

Sharding: with a ``mesh``, prompt rows and the KV cache are split over ("data", "fsdp") — the
training mesh's batch axes — and the parameters stay wherever the trainer put them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rubric_rl.core import sharding as sharding_lib
from rubric_rl.core.logprobs import sequence_logprobs
from rubric_rl.models.qwen3 import default_positions
from rubric_rl.rollout.engine import (
    Generation,
    GenerationRequest,
    RolloutEngine,
    SamplingParams,
)

# The sampling math and the decode loop live in jax_decode (shared with prefix_reuse, which this
# module's `JaxEngine.prefix_session` builds); re-exported here under their old names.
from rubric_rl.rollout.jax_decode import (  # noqa: F401
    _generation,
    filter_logits,
    sample_and_decode,
    sample_tokens,
    seed_key_data,
)
from rubric_rl.util.buckets import round_up_to_bucket

Array = jax.Array
MAX_STOP_IDS = 16  # static size of the traced stop-id set (padded with -1)


@dataclasses.dataclass(frozen=True)
class JaxEngineConfig:
    """Static-shape buckets and token conventions.

    prompt_buckets: prompt lengths are rounded up to the next bucket (above the largest: the next
      multiple of it). batch_buckets: rows (requests × n) are rounded up to the next bucket; more
      rows than the largest bucket run in several calls of the largest. eos_token_ids always stop
      a row (in addition to each call's ``stop_token_ids``). score_chunk_size: the trainer's
      LM-head chunk for ``score``. scan_decode: with a scanned model (``scan_layers``), decode
      under the scan over its stacked cache (True: the decode program does not grow with depth)
      or with its `Qwen3ForCausalLM.unscanned` view over per-layer caches (False: the layer
      weights sliced once per call, outside the decode loop, where the scan dynamic-slices
      every layer's weights and cache at every step; one transient copy of the layer weights
      per call, and a decode program that grows with depth). Same tokens either way.
      group_prefill: prefill each distinct prompt of a call once and copy its KV cache to the
      rows that share it (module docstring); used when the distinct prompts fit a smaller batch
      bucket than the rows. False: every row prefills its own prompt.
    """

    prompt_buckets: tuple[int, ...] = (32, 64, 128, 256, 512, 1024, 2048)
    batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    eos_token_ids: tuple[int, ...] = ()
    pad_id: int = 0
    score_chunk_size: int = 128
    scan_decode: bool = True
    group_prefill: bool = True

    def __post_init__(self) -> None:
        for name in ("prompt_buckets", "batch_buckets"):
            b = tuple(int(x) for x in getattr(self, name))
            if not b or min(b) < 1 or list(b) != sorted(set(b)):
                raise ValueError(f"JaxEngineConfig.{name} must be increasing positive ints: {b}")
            object.__setattr__(self, name, b)
        object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))
        if self.pad_id < 0:
            raise ValueError(f"JaxEngineConfig.pad_id must be >= 0, got {self.pad_id}")


# ----------------------------------------------------------------------------- the engine


class JaxEngine(RolloutEngine):
    """In-process sampler over a `Qwen3ForCausalLM`'s live parameters (see the module docstring).

    ``model``: the policy (its parameters are referenced, not copied). ``mesh``: the training mesh
    (None: wherever the parameters live, batch unsharded).
    """

    def __init__(
        self,
        model: nnx.Module,
        config: JaxEngineConfig | None = None,
        *,
        mesh: Mesh | None = None,
        weight_version: int = 0,
    ):
        self.config = config or JaxEngineConfig()
        self.mesh = mesh
        self._graphdef, self._params, self._rest = nnx.split(model, nnx.Param, ...)
        self._version = int(weight_version)
        self._closed = False
        self._traces = 0  # incremented at trace time only: counts compilations
        # Host-side counts over this engine's generate calls: rows sampled and prompt rows
        # prefilled (fewer than rows when group prefill shares a prompt's forward).
        self.stats = {"rows": 0, "prefill_rows": 0}
        self._gen_jit = jax.jit(self._generate_fn, static_argnames=("max_new_tokens", "filtering"))
        self._score_jit = jax.jit(self._score_fn, static_argnames=("temperature",))
        self._batch_multiple = (
            1 if mesh is None else sharding_lib._axis_size(mesh, sharding_lib.BATCH_AXES)
        )
        # Prefix reuse re-lays out KV slots; a model whose cache holds anything else (Qwen3.5's
        # conv + recurrent state) re-prefills each turn instead.
        cache = jax.eval_shape(lambda: self._for_decoding(model).init_cache(1, 1))
        self.kv_only_cache = all(isinstance(c, dict) and set(c) == {"k", "v"} for c in cache)

    def _for_decoding(self, model: nnx.Module) -> nnx.Module:
        """The model as this engine decodes it: a scanned model's `unscanned` view when
        ``config.scan_decode`` is False (see `JaxEngineConfig`), else the model itself. Called
        at the top of a jitted decode program, outside its decode loop."""
        if getattr(model.config, "scan_layers", False) and not self.config.scan_decode:
            return model.unscanned()
        return model

    def decode_model(self, params: Any, rest: Any) -> nnx.Module:
        """The engine's model over ``params`` / ``rest``, as it decodes (`_for_decoding`)."""
        return self._for_decoding(nnx.merge(self._graphdef, params, rest))

    @classmethod
    def from_train_state(
        cls,
        graphdef: nnx.GraphDef,
        state: Any,
        config: JaxEngineConfig | None = None,
        *,
        mesh: Mesh | None = None,
        weight_version: int = 0,
    ) -> JaxEngine:
        """An engine over a `core.train_step.TrainState`'s parameters (``.params``, ``.rest``),
        as returned with ``graphdef`` by ``init_train_state`` — referenced, not copied."""
        model = nnx.merge(graphdef, state.params, state.rest)
        return cls(model, config, mesh=mesh, weight_version=weight_version)

    # -- RolloutEngine ------------------------------------------------------------------------

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def num_traces(self) -> int:
        """How many times a jitted generate/score function was traced (= compiled)."""
        return self._traces

    def model(self) -> nnx.Module:
        """The policy as a module over the engine's current parameter reference."""
        return nnx.merge(self._graphdef, self._params, self._rest)

    def update_weights(self, params_or_path: Any, version: int) -> None:
        """Serve new parameters from now on, by reference. Accepts an ``nnx.Module``, a
        ``TrainState``-like object (``.params`` [+ ``.rest``]), an ``nnx.State`` of the
        ``nnx.Param`` leaves (``TrainState.params``), or a HF checkpoint directory."""
        x = params_or_path
        if isinstance(x, str):
            from rubric_rl.models.hf_io import from_pretrained

            x = from_pretrained(x, mesh=self.mesh)
        if isinstance(x, nnx.Module):
            _, params, rest = nnx.split(x, nnx.Param, ...)
        elif hasattr(x, "params"):
            params, rest = x.params, getattr(x, "rest", self._rest)
        else:
            params, rest = x, self._rest
        want = jax.tree.structure(self._params)
        got = jax.tree.structure(params)
        if want != got:
            raise ValueError(
                f"JaxEngine.update_weights(version={version}): parameter tree differs from the "
                f"engine's model:\n  expected {want}\n  got      {got}"
            )
        self._params, self._rest, self._version = params, rest, int(version)

    def snapshot(self) -> tuple[Any, Any, int]:
        """A copy of the served parameters (and the rest of the model state) with their version:
        a second parameter set in device memory, e.g. ARISE-RL's frozen solver. A copy, not a
        reference: the train step donates the live buffers."""
        copy = functools.partial(jax.tree.map, jnp.copy)
        return copy(self._params), copy(self._rest), self._version

    @contextlib.contextmanager
    def serving(self, snapshot: tuple[Any, Any, int]):
        """Samples from ``snapshot`` inside the block; the live parameters again after it."""
        params, rest, version = snapshot
        if jax.tree.structure(params) != jax.tree.structure(self._params):
            raise ValueError(
                "JaxEngine.serving: the snapshot's parameter tree differs from the model's"
            )
        live = (self._params, self._rest, self._version)
        self._params, self._rest, self._version = params, rest, int(version)
        try:
            yield
        finally:
            self._params, self._rest, self._version = live

    def snapshot_parts(self, snapshot: tuple[Any, Any, int]) -> tuple[Any, int]:
        """The snapshot's parameters (the ``nnx.Param`` state, as the train state holds them)
        and version; the rest of the model state is the live one's (never trained)."""
        params, _, version = snapshot
        return params, int(version)

    def snapshot_of(self, params: Any, version: int) -> tuple[Any, Any, int]:
        if jax.tree.structure(params) != jax.tree.structure(self._params):
            raise ValueError("JaxEngine.snapshot_of: the parameter tree differs from the model's")
        return params, jax.tree.map(jnp.copy, self._rest), int(version)

    def prefix_session(self):
        """A `rubric_rl.rollout.prefix_reuse.PrefixSession`: multi-turn generation that keeps
        each conversation's KV cache between turns (agent rollouts use it by default). None for
        a model whose cache is not KV-only (hybrid linear-attention layers carry a recurrent
        state that cannot be re-laid out by slot): callers then re-send whole conversations."""
        from rubric_rl.rollout.prefix_reuse import PrefixSession

        self._check_open()
        if not self.kv_only_cache:
            return None
        return PrefixSession(self)

    def health(self) -> bool:
        return not self._closed

    def close(self) -> None:
        self._closed = True
        self._close_sync_loop()

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[list[Generation]]:
        return self._generate(requests, params)

    async def agenerate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[list[Generation]]:
        return await asyncio.to_thread(self._generate, requests, params)

    def score(
        self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], temperature: float = 1.0
    ) -> list[list[float]]:
        return self._score(sequences, temperature)

    async def ascore(
        self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], temperature: float = 1.0
    ) -> list[list[float]]:
        return await asyncio.to_thread(self._score, sequences, temperature)

    # -- host side ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("JaxEngine is closed")

    def _put(self, *arrays: np.ndarray) -> list[Array]:
        if self.mesh is None:
            return [jnp.asarray(a) for a in arrays]
        sh = sharding_lib.batch_sharding(self.mesh)
        return [jax.device_put(a, sh) for a in arrays]

    def _stop_ids(self, params: SamplingParams) -> np.ndarray:
        ids = sorted(set(self.config.eos_token_ids) | set(params.stop_token_ids))
        if len(ids) > MAX_STOP_IDS:
            raise ValueError(
                f"JaxEngine: at most {MAX_STOP_IDS} stop token ids (eos_token_ids + "
                f"SamplingParams.stop_token_ids), got {len(ids)}"
            )
        return np.asarray(ids + [-1] * (MAX_STOP_IDS - len(ids)), np.int32)

    def _generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[list[Generation]]:
        self._check_open()
        version = self._version
        rows = [
            (ri, j, s) for ri, r in enumerate(requests) for j, s in enumerate(r.seeds(params.n))
        ]
        out: list[list[Generation | None]] = [[None] * params.n for _ in requests]
        stop_ids = jnp.asarray(self._stop_ids(params))
        scalars = (
            jnp.float32(params.temperature),
            jnp.float32(params.top_p),
            jnp.int32(params.top_k),
            jnp.int32(params.min_new_tokens),
            jnp.bool_(params.ignore_eos),
        )
        filtering = (not params.greedy) and (params.top_p < 1.0 or params.top_k > 0)
        max_rows = self.config.batch_buckets[-1]
        for start in range(0, len(rows), max_rows):
            chunk = rows[start : start + max_rows]
            b = round_up_to_bucket(len(chunk), self.config.batch_buckets, self._batch_multiple)
            p = round_up_to_bucket(
                max(len(requests[ri].prompt_ids) for ri, _, _ in chunk), self.config.prompt_buckets
            )
            # Distinct prompts of the chunk in first-seen order; row k reads prompt src[k].
            distinct: dict[tuple[int, ...], int] = {}
            src = [distinct.setdefault(tuple(requests[ri].prompt_ids), len(distinct))
                   for ri, _, _ in chunk]  # fmt: skip
            u = round_up_to_bucket(len(distinct), self.config.batch_buckets, self._batch_multiple)
            shared = self.config.group_prefill and u < b
            prompts = list(distinct) if shared else [requests[ri].prompt_ids for ri, _, _ in chunk]
            n_prefill = u if shared else b
            ids = np.full((n_prefill, p), self.config.pad_id, np.int32)
            mask = np.zeros((n_prefill, p), np.int32)
            mask[:, -1] = 1  # filler rows: one real token, so no attention row is empty
            for k, prompt in enumerate(prompts):
                ids[k, p - len(prompt) :] = prompt
                mask[k, p - len(prompt) :] = 1
            active = np.zeros((b,), bool)
            seeds = np.zeros((b, 2), np.uint32)
            row_src = np.zeros((b,), np.int32)  # filler rows read prompt 0 (inactive: unused)
            for k, (_, _, seed) in enumerate(chunk):
                active[k] = True
                seeds[k] = seed_key_data([seed])[0]
                row_src[k] = src[k]
            self.stats["rows"] += len(chunk)
            self.stats["prefill_rows"] += len(distinct) if shared else len(chunk)
            tokens, logps, lengths = self._gen_jit(
                self._params,
                self._rest,
                *self._put(ids, mask),
                self._put(row_src)[0] if shared else None,
                *self._put(seeds, active),
                *scalars,
                stop_ids,
                max_new_tokens=params.max_new_tokens,
                filtering=filtering,
            )
            tokens, logps, lengths = (sharding_lib.to_host(x) for x in (tokens, logps, lengths))
            stop_set = set(int(t) for t in stop_ids if t >= 0)
            for k, (ri, j, seed) in enumerate(chunk):
                out[ri][j] = _generation(
                    tokens[k], logps[k], int(lengths[k]), params, stop_set, version
                )
                out[ri][j] = dataclasses.replace(
                    out[ri][j], request_id=requests[ri].request_id, sample_index=j, seed=seed
                )
        return out  # type: ignore[return-value]

    def _score(
        self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], temperature: float
    ) -> list[list[float]]:
        self._check_open()
        # Greedy rollouts carry T = 1 log-probs (engine.py), so T = 0 scores at T = 1.
        temperature = float(temperature) if temperature > 0 else 1.0
        seqs = [(list(map(int, pr)), list(map(int, co))) for pr, co in sequences]
        for i, (pr, _) in enumerate(seqs):
            if not pr:
                raise ValueError(f"JaxEngine.score: sequence {i} has an empty prompt")
        out: list[list[float]] = []
        max_rows = self.config.batch_buckets[-1]
        for start in range(0, len(seqs), max_rows):
            chunk = seqs[start : start + max_rows]
            b = round_up_to_bucket(len(chunk), self.config.batch_buckets, self._batch_multiple)
            t = round_up_to_bucket(
                max(len(pr) + len(co) for pr, co in chunk), self.config.prompt_buckets
            )
            ids = np.full((b, t), self.config.pad_id, np.int32)
            mask = np.zeros((b, t), np.int32)
            mask[:, 0] = 1
            for k, (pr, co) in enumerate(chunk):  # right padding, as a TrainBatch row
                ids[k, : len(pr) + len(co)] = pr + co
                mask[k, : len(pr) + len(co)] = 1
            logps = sharding_lib.to_host(
                self._score_jit(
                    self._params, self._rest, *self._put(ids, mask), temperature=temperature
                )
            )
            for k, (pr, co) in enumerate(chunk):
                # prediction layout: position t holds log π(ids[t+1] | ids[≤t])
                out.append([float(x) for x in logps[k, len(pr) - 1 : len(pr) - 1 + len(co)]])
        return out

    # -- traced ---------------------------------------------------------------------------------

    def _constrain(self, x: Array) -> Array:
        if self.mesh is None:
            return x
        spec = P(sharding_lib.BATCH_AXES, *([None] * (x.ndim - 1)))
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

    def _score_fn(self, params, rest, ids, mask, *, temperature: float) -> Array:
        self._traces += 1
        model = nnx.merge(self._graphdef, params, rest)
        logps, _ = sequence_logprobs(
            model,
            ids,
            default_positions(ids, mask),
            mask,
            temperature=temperature,
            chunk_size=self.config.score_chunk_size,
        )
        return logps

    def _generate_fn(
        self,
        params,
        rest,
        prompt_ids: Array,
        prompt_mask: Array,
        row_src: Array | None,
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
    ) -> tuple[Array, Array, Array]:
        """tokens [B, N] (pad after stop), logps [B, N] (0 after stop), lengths [B].

        ``row_src`` None: the prompts are the B rows. Else the prompts are the distinct ones
        ([U, P], U <= B) and row b decodes from prompt ``row_src[b]``: its prefilled cache, mask
        and last logits are gathered (every cache array is batch-major)."""
        self._traces += 1
        model = self.decode_model(params, rest)
        u, p = prompt_ids.shape
        n = max_new_tokens
        cache_len = p + n - 1  # the last sampled token is never fed back
        cache = jax.tree.map(self._constrain, model.init_cache(u, cache_len))
        cache_mask = jnp.zeros((u, cache_len), jnp.int32).at[:, :p].set(prompt_mask)
        cache_mask = self._constrain(cache_mask)
        positions = default_positions(prompt_ids, prompt_mask)
        prompt_len = jnp.sum(prompt_mask, axis=-1).astype(jnp.int32)
        logits, cache = model.decode(
            prompt_ids, positions, cache, jnp.int32(0), cache_mask, last_only=True
        )
        if row_src is not None:

            def rows(x: Array) -> Array:
                return self._constrain(jnp.take(x, row_src, axis=0))

            cache, cache_mask, logits, prompt_len = jax.tree.map(
                rows, (cache, cache_mask, logits, prompt_len)
            )
        tokens, logps, lengths, _ = sample_and_decode(
            model,
            logits[:, 0],
            cache,
            cache_mask,
            jnp.int32(p),
            prompt_len,
            seeds,
            active,
            (temperature, top_p, top_k, min_new_tokens, ignore_eos),
            stop_ids,
            max_new_tokens=n,
            filtering=filtering,
            pad_id=self.config.pad_id,
            constrain=self._constrain,
        )
        return tokens, logps, lengths
