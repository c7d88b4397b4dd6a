"""Rollouts from external servers on several processes: sampled once, seen by every process.

Every process of a multi-host run runs the same loop on the same data (the trainer's batch is a
global array built from identical host copies). A server's samples differ from call to call, so
only process 0 talks to the SGLang servers; `BroadcastEngine` hands its results to the other
processes through jax.distributed's key-value store (the coordinator's, over its gRPC
connection: no device collective, so it is safe from a prefetch thread while a train step runs
on the devices). Weight updates go to the servers from process 0 alone, after the export
(written once, `weight_sync.export_checkpoint`) and a barrier.

A call is matched across processes by its content (the requests and sampling parameters) and
how often that content was asked before, not by call order: concurrent `agenerate` calls (agent
episodes under `asyncio.gather`) reach the engine in different orders on different processes.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import pickle
import threading
import zlib
from collections.abc import Sequence
from typing import Any

from rubric_rl.rollout.engine import Generation, GenerationRequest, RolloutEngine, SamplingParams

# The coordinator's gRPC messages are limited (4 MiB by default); a step's rollouts can be more.
CHUNK_BYTES = 1 << 20
WAIT_S = 4 * 3600.0  # how long a process waits for process 0's results (a rollout phase)
_barriers = collections.Counter()


def _client():
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("rubric_rl.rollout.multihost: jax.distributed is not initialised")
    return client


def barrier(name: str, timeout_s: float = WAIT_S) -> None:
    """Every process waits here until all have arrived (the n-th barrier of each `name`)."""
    import jax

    if jax.process_count() == 1:
        return
    _barriers[name] += 1
    _client().wait_at_barrier(f"rubric_rl/{name}/{_barriers[name]}", int(timeout_s * 1000))


class Broadcast:
    """Process 0 publishes a Python value under a key; every other process reads it once, and
    the last reader deletes it."""

    def __init__(self, prefix: str, timeout_s: float = WAIT_S) -> None:
        import jax

        self.prefix = prefix
        self.timeout_s = timeout_s
        self.index = jax.process_index()
        self.count = jax.process_count()

    def publish(self, key: str, value: Any) -> None:
        data = zlib.compress(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), 1)
        chunks = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]
        client = _client()
        base = f"{self.prefix}/{key}"
        for i, chunk in enumerate(chunks):
            client.key_value_set_bytes(f"{base}/{i}", chunk)
        client.key_value_set(f"{base}/n", str(len(chunks)))  # last: readers wait on it

    def receive(self, key: str) -> Any:
        client = _client()
        base = f"{self.prefix}/{key}"
        ms = int(self.timeout_s * 1000)
        try:
            n = int(client.blocking_key_value_get(f"{base}/n", ms))
        except Exception as exc:  # the coordinator's timeout or a lost process 0
            raise RuntimeError(
                f"process {self.index}: no rollouts from process 0 for {base} within "
                f"{self.timeout_s:.0f} s ({type(exc).__name__}: {exc})"
            ) from exc
        data = b"".join(client.blocking_key_value_get_bytes(f"{base}/{i}", ms) for i in range(n))
        if client.key_value_increment(f"{base}/reads", 1) == self.count - 1:
            for i in range(n):
                client.key_value_delete(f"{base}/{i}")
            client.key_value_delete(f"{base}/n")
            client.key_value_delete(f"{base}/reads")
        return pickle.loads(zlib.decompress(data))


class BroadcastEngine(RolloutEngine):
    """A `RolloutEngine` for several processes: process 0's `inner` engine (an `SGLangEngine`)
    samples and scores, the other processes (``inner=None``) receive the same results.
    ``update_weights`` reaches the servers from process 0 only; every process records the
    version. Exceptions on process 0 are re-raised on every process with its message."""

    def __init__(self, inner: RolloutEngine | None, *, weight_version: int = 0) -> None:
        import jax

        self.primary = jax.process_index() == 0
        if self.primary != (inner is not None):
            raise ValueError("BroadcastEngine: process 0 needs the engine, the others None")
        self.inner = inner
        self.channel = Broadcast("rubric_rl/rollouts")
        self._version = int(inner.weight_version) if inner is not None else int(weight_version)
        self._seen: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def _key(self, kind: str, *content: Any) -> str:
        digest = hashlib.sha256(pickle.dumps(content, protocol=4)).hexdigest()[:32]
        with self._lock:
            self._seen[kind + digest] += 1
            return f"{kind}/{digest}/{self._seen[kind + digest]}"

    async def _shared(self, key: str, call) -> Any:
        if not self.primary:
            result = await asyncio.to_thread(self.channel.receive, key)
            if isinstance(result, _Failure):
                raise RuntimeError(f"process 0's rollout engine failed: {result.message}")
            return result
        try:
            result = await call()
        except Exception as exc:
            self.channel.publish(key, _Failure(f"{type(exc).__name__}: {exc}"))
            raise
        self.channel.publish(key, result)
        return result

    async def agenerate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[list[Generation]]:
        key = self._key("generate", list(requests), params)
        return await self._shared(key, lambda: self.inner.agenerate(requests, params))

    async def ascore(
        self,
        sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
        temperature: float = 1.0,
    ) -> list[list[float]]:
        seqs = [(tuple(p), tuple(c)) for p, c in sequences]
        key = self._key("score", seqs, float(temperature))
        return await self._shared(key, lambda: self.inner.ascore(sequences, temperature))

    def update_weights(self, params_or_path: Any, version: int) -> Any:
        metrics = self.inner.update_weights(params_or_path, version) if self.primary else {}
        self._version = int(version)
        return metrics

    @property
    def weight_version(self) -> int:
        return self._version

    def health(self) -> bool:
        return self.inner.health() if self.primary else True

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
        self._close_sync_loop()


class _Failure:
    def __init__(self, message: str) -> None:
        self.message = message
