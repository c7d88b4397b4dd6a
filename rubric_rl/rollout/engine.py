"""The rollout-engine interface: token ids in, sampled token ids + behaviour log-probs out.

Every engine (the in-process JAX sampler, SGLang servers over HTTP) implements `RolloutEngine`.
The trainer, the agent loop and the controllers only ever talk to this interface.

Contract (DESIGN.md §3–§4):
- Prompts are token ids, never text: what the engine sampled from is exactly what the trainer
  scores (no re-tokenisation drift).
- `generate` returns, per request, `params.n` samples. Each sample has its own seed,
  `sample_seed(step, task_index, sample_offset + j)`, so members of a group never share a seed
  (identical seeds ⇒ identical samples ⇒ zero advantage) and a rerun reproduces wherever the
  backend honours seeds.
- Log-probs are per generated token at the sampling temperature: log_softmax(logits / T) of the
  full vocabulary (before top-p/top-k truncation), the quantity the trainer recomputes as π_old.
  For greedy decoding (T = 0) they are log_softmax(logits), i.e. at T = 1.
- Every sample records the weight version that produced it (staleness control, TrainBatch
  `weight_version`).
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort"]
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort")

_SEED_DOMAIN = b"rubric_rl/sample_seed/v1"


def sample_seed(step: int, task: int, sample: int) -> int:
    """The sampling seed of sample `sample` of task `task` at training step `step`.

    Hash: the first 8 bytes (big-endian) of BLAKE2b-128 over
    ``b"rubric_rl/sample_seed/v1" + step, task, sample as signed 8-byte big-endian``, masked to
    63 bits so it is a non-negative int64 (what SGLang's `sampling_seed` and JAX's PRNGKey accept).
    A cryptographic hash, not Python's `hash()`: stable across processes and versions, and
    neighbouring (step, task, sample) triples give unrelated seeds.
    """
    for name, value in (("step", step), ("task", task), ("sample", sample)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"sample_seed: {name} must be an int, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"sample_seed: {name} must be >= 0, got {value}")
    payload = _SEED_DOMAIN + b"".join(
        v.to_bytes(8, "big", signed=True) for v in (step, task, sample)
    )
    digest = hashlib.blake2b(payload, digest_size=16).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample. `temperature == 0` means greedy; `top_k <= 0` means no top-k cut.

    A sample ends at `max_new_tokens` ("length") or at its first stop token ("stop"), which is
    kept in `token_ids` (it was sampled and is trained on). Stop tokens are `stop_token_ids` plus
    the model's EOS ids, which every engine honours unless `ignore_eos` (SGLang reads them from
    the checkpoint's config, the JAX engine from its `eos_token_ids`).

    `min_new_tokens`: the stop tokens cannot be sampled (their logits are masked to -inf) while
    fewer than that many tokens have been generated: the first `min_new_tokens` tokens are never
    stop tokens, so a "stop" sample has at least `min_new_tokens + 1` tokens, the stop included
    (SGLang's and Hugging Face's convention).
    `ignore_eos`: no token ends a sample (neither EOS nor `stop_token_ids`, as SGLang's
    `ignore_eos`); every sample runs to `max_new_tokens` ("length"). A stop token may then be
    sampled anywhere and is kept. Both are SGLang's sampling parameters of the same names.

    Log-probs under `min_new_tokens` (JAX engine): the full-vocabulary `log_softmax(logits / T)`
    of the sampled token, the trainer's π_old, NOT the renormalised masked distribution the token
    was drawn from (which is higher by −log(1 − p_stop) at a masked position). This is the same
    convention as top-p / top-k: the trainer's ratio π_θ/π_old compares like with like; the
    behaviour policy differs from π_old only on those first positions.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    n: int = 1
    min_new_tokens: int = 0
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(
                f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}"
            )
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {self.n}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(
                f"SamplingParams.min_new_tokens must be in [0, max_new_tokens="
                f"{self.max_new_tokens}], got {self.min_new_tokens}"
            )
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(
                f"SamplingParams.ignore_eos must be a bool, got {type(self.ignore_eos).__name__}"
            )
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    """One prompt to sample from. Sample j of it is seeded by
    `sample_seed(step, task_index, sample_offset + j)`; `sample_offset` lets a task issue several
    requests (e.g. a second batch of samples) without reusing seeds."""

    prompt_ids: tuple[int, ...]
    request_id: str
    step: int = 0
    task_index: int = 0
    sample_offset: int = 0

    def __post_init__(self) -> None:
        ids = tuple(int(t) for t in self.prompt_ids)
        if not ids:
            raise ValueError(f"GenerationRequest {self.request_id!r}: prompt_ids is empty")
        if min(ids) < 0:
            raise ValueError(f"GenerationRequest {self.request_id!r}: negative token id in prompt")
        object.__setattr__(self, "prompt_ids", ids)

    def seeds(self, n: int) -> tuple[int, ...]:
        """The seeds of this request's n samples."""
        return tuple(
            sample_seed(self.step, self.task_index, self.sample_offset + j) for j in range(n)
        )


@dataclasses.dataclass(frozen=True)
class Generation:
    """One sampled completion. `logprobs[i]` is the log-prob of `token_ids[i]` (same length)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    weight_version: int
    request_id: str = ""
    sample_index: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"Generation {self.request_id!r}/{self.sample_index}: {len(self.token_ids)} token "
                f"ids but {len(self.logprobs)} log-probs"
            )
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(
                f"Generation {self.request_id!r}: finish_reason {self.finish_reason!r} not in "
                f"{FINISH_REASONS}"
            )


class RolloutEngine(abc.ABC):
    """A source of rollouts. Implementations: `SGLangEngine` (HTTP), the in-process JAX engine.

    Subclasses implement `agenerate`, `ascore`, `update_weights`, `health`, `close`; the sync
    `generate` / `score` wrappers run the async versions on one private, persistent event loop
    (so loop-bound clients survive between calls). They must not be called from inside a running
    loop — await the `a*` methods there. Subclasses call `self._close_sync_loop()` in `close`.
    """

    _sync_loop: asyncio.AbstractEventLoop | None = None

    @abc.abstractmethod
    async def agenerate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[list[Generation]]:
        """`params.n` samples for each request, in request order (outer) and sample order."""

    @abc.abstractmethod
    async def ascore(
        self,
        sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
        temperature: float = 1.0,
    ) -> list[list[float]]:
        """Per-token log-probs of fixed completions: for each `(prompt_ids, completion_ids)`,
        `log_softmax(logits / T)[completion token]` for every completion token, conditioned on
        the prompt and the preceding completion tokens (teachers, π_old)."""

    @abc.abstractmethod
    def update_weights(self, params_or_path: Any, version: int) -> None:
        """Serve new weights from now on, tagged `version` (a parameter pytree / model object or
        a directory of Hugging Face safetensors, as the engine supports)."""

    @abc.abstractmethod
    def health(self) -> bool:
        """True when the engine can serve requests now."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release clients, servers and threads. Idempotent."""

    @property
    @abc.abstractmethod
    def weight_version(self) -> int:
        """The version the engine was last told to serve."""

    # -- a second parameter set (ARISE-RL's frozen solver, the frozen base policy) ------------

    def snapshot(self) -> Any:
        """A copy of the parameters served now, held by the caller (an opaque object for
        ``serving`` / ``snapshot_parts``). Engines that cannot hold a second parameter set (SGLang:
        its servers hold one set) raise ``NotImplementedError`` naming themselves."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot hold a second parameter set (a snapshot of the policy); "
            "the in-process JAX engine (rollout.engine='jax') can"
        )

    def serving(self, snapshot: Any) -> Any:
        """A context manager: inside it the engine samples from ``snapshot``, after it from the
        live parameters again (those given last to ``update_weights``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot serve a snapshot")

    def snapshot_parts(self, snapshot: Any) -> tuple[Any, int]:
        """What a checkpoint keeps of ``snapshot``: (its parameter tree, its weight version)."""
        raise NotImplementedError(f"{type(self).__name__} cannot checkpoint a snapshot")

    def snapshot_of(self, params: Any, version: int) -> Any:
        """The snapshot of ``snapshot_parts``' two parts (a restored checkpoint's)."""
        raise NotImplementedError(f"{type(self).__name__} cannot restore a snapshot")

    def prefix_session(self) -> Any:
        """A session that keeps conversations' KV caches between agent turns (an object with
        ``generate(requests, params, keys)``, ``agenerate``, ``close``), or None when the engine
        has none — then callers re-send whole conversations (SGLang reuses prefixes itself, in
        its radix cache). The JAX engine's: `rubric_rl.rollout.prefix_reuse.PrefixSession`."""
        return None

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[list[Generation]]:
        return self._run_sync(self.agenerate(requests, params))

    def score(
        self,
        sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
        temperature: float = 1.0,
    ) -> list[list[float]]:
        return self._run_sync(self.ascore(sequences, temperature))

    def _run_sync(self, coro: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError(
                f"{type(self).__name__}.generate/score called inside a running event loop; "
                "await agenerate/ascore instead"
            )
        if self._sync_loop is None or self._sync_loop.is_closed():
            self._sync_loop = asyncio.new_event_loop()
        return self._sync_loop.run_until_complete(coro)

    def _close_sync_loop(self, final: Any = None) -> None:
        """Runs `final` (an optional coroutine, e.g. closing clients) and closes the sync loop."""
        loop, self._sync_loop = self._sync_loop, None
        if loop is None or loop.is_closed():
            if final is not None:
                final.close()
            return
        if final is not None:
            loop.run_until_complete(final)
        loop.close()

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
