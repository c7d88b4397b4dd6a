"""`SGLangEngine`: a `RolloutEngine` over SGLang's native HTTP API (`/generate`).

Token ids in and out (`input_ids`, `output_ids`), behaviour log-probs from
`meta_info.output_token_logprobs` (`[logprob, token_id, text]` triples, checked one to one against
`output_ids`), `meta_info.finish_reason` and `meta_info.weight_version` — the protocol slime uses
to drive SGLang. One asyncio task per request under a semaphore; connection errors and 5xx are
retried with exponential back-off; a managed server that died is restarted (from the last synced
weights) and its in-flight requests are re-sent, so no request is ever dropped.

SGLang 0.5.23 facts this relies on (read from its source):
- output log-probs are `log(softmax(logits / T))` over the full vocabulary (before top-p/top-k),
  or `log_softmax(logits)` when the whole batch is greedy;
- `min_new_tokens` masks the stop and EOS tokens' logits before sampling (a penalizer), and
  `ignore_eos` skips the stop/EOS check; whether its returned log-probs at the masked positions are
  those of the masked distribution or of the full one (the JAX engine's) was not checked here;
- `sampling_seed` is honoured only by a server launched with `--enable-deterministic-inference`
  (on CPU that needs an sgl_kernel op our stand-in does not provide: seeds are sent but ignored);
- input (prompt) log-probs for scoring are always at T = 1; other temperatures are recovered
  exactly from the full-vocabulary input log-probs (costly: vocab floats per token).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import random
import time
from collections.abc import Sequence
from typing import Any, Literal

import httpx

from rubric_rl.rollout.engine import (
    Generation,
    GenerationRequest,
    RolloutEngine,
    SamplingParams,
)
from rubric_rl.rollout.sglang_server import SGLangServer
from rubric_rl.rollout.weight_sync import WeightSync, update_servers_from_disk

logger = logging.getLogger(__name__)

SeedMode = Literal["per_sample", "none"]


class SGLangRequestError(RuntimeError):
    """A request failed for good: a 4xx answer, or retries exhausted."""


class SGLangProtocolError(RuntimeError):
    """The server answered something that breaks the id/log-prob contract."""


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Exponential back-off: attempt k (0-based) waits min(max_s, base_s·2^k)·(1 ± jitter)."""

    max_attempts: int = 8
    base_s: float = 0.25
    max_s: float = 8.0
    jitter: float = 0.1

    def delay(self, attempt: int) -> float:
        d = min(self.max_s, self.base_s * (2.0**attempt))
        return d * (1.0 + self.jitter * (2.0 * random.random() - 1.0))


class _Endpoint:
    """One server: a fixed URL, or a managed `SGLangServer` (URL may change on restart)."""

    def __init__(self, target: SGLangServer | str) -> None:
        self.server = target if isinstance(target, SGLangServer) else None
        self._url = None if self.server is not None else str(target).rstrip("/")
        self.inflight = 0
        self.failures = 0  # consecutive failed sends; healthy servers are preferred
        self.generation = 0  # bumped at each restart; a failed send only restarts its own era
        self.restart_lock: asyncio.Lock | None = None

    @property
    def url(self) -> str:
        return self.server.url if self.server is not None else self._url  # type: ignore[return-value]


def _is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):  # connect/read/write errors, timeouts, resets
        return True
    return isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code >= 500


def parse_weight_version(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def parse_generation(
    item: dict[str, Any],
    *,
    request_id: str,
    sample_index: int,
    seed: int | None,
    default_version: int,
) -> Generation:
    """One `/generate` result -> `Generation`, checking ids and log-prob triples line up."""
    where = f"SGLang /generate result for request {request_id!r} sample {sample_index}"
    try:
        output_ids = [int(t) for t in item["output_ids"]]
        meta = item["meta_info"]
        triples = meta["output_token_logprobs"]
    except (KeyError, TypeError) as exc:
        raise SGLangProtocolError(f"{where}: missing field {exc} in {str(item)[:300]}") from exc
    if len(triples) != len(output_ids):
        raise SGLangProtocolError(
            f"{where}: {len(output_ids)} output_ids but {len(triples)} output_token_logprobs"
        )
    logprobs = []
    for i, (triple, tok) in enumerate(zip(triples, output_ids)):
        if int(triple[1]) != tok:
            raise SGLangProtocolError(
                f"{where}: output_token_logprobs[{i}] is for token {triple[1]}, output_ids[{i}] "
                f"is {tok}"
            )
        lp = float(triple[0]) if triple[0] is not None else math.nan
        logprobs.append(lp)
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else finish
    if kind not in ("stop", "length", "abort"):
        raise SGLangProtocolError(f"{where}: unknown finish_reason {finish!r}")
    return Generation(
        token_ids=tuple(output_ids),
        logprobs=tuple(logprobs),
        finish_reason=kind,
        weight_version=parse_weight_version(meta.get("weight_version"), default_version),
        request_id=request_id,
        sample_index=sample_index,
        seed=seed,
    )


class SGLangEngine(RolloutEngine):
    """Rollouts from one or more SGLang servers (managed `SGLangServer`s or URLs, e.g. a router).

    Args:
      targets: servers to send requests to (least-loaded first).
      max_concurrency: requests in flight across all servers.
      seed_mode: "per_sample" sends the n samples of a request as a batch of n items, each with
        its own `sampling_seed` (reproducible on a server with `--enable-deterministic-inference`);
        "none" sends one request with `n` and no seed (the server's RNG; group members still
        differ). Never one seed for n samples: identical seeds ⇒ identical samples.
      weight_update_urls: where weight updates go when `targets` is a router (its workers).
      vocab_size: needed only to score at a temperature other than 1.
    """

    def __init__(
        self,
        targets: Sequence[SGLangServer | str],
        *,
        max_concurrency: int = 64,
        retry: RetryPolicy = RetryPolicy(),
        request_timeout_s: float = 600.0,
        seed_mode: SeedMode = "per_sample",
        weight_version: int = 0,
        weight_update_urls: Sequence[str] = (),
        vocab_size: int | None = None,
        weight_sync: WeightSync | None = None,
        eos_token_ids: Sequence[int] = (),
        owns_servers: bool = False,
    ) -> None:
        if not targets:
            raise ValueError("SGLangEngine: targets is empty (give SGLangServer objects or URLs)")
        if seed_mode not in ("per_sample", "none"):
            raise ValueError(f"SGLangEngine: seed_mode {seed_mode!r} not in ('per_sample', 'none')")
        if max_concurrency < 1:
            raise ValueError(f"SGLangEngine: max_concurrency must be >= 1, got {max_concurrency}")
        self.endpoints = [_Endpoint(t) for t in targets]
        self.max_concurrency = max_concurrency
        self.retry = retry
        self.request_timeout_s = request_timeout_s
        self.seed_mode = seed_mode
        self.weight_update_urls = tuple(u.rstrip("/") for u in weight_update_urls)
        self.vocab_size = vocab_size
        self.weight_sync = weight_sync
        # Stop tokens of every request besides the request's own and the checkpoint's EOS (as the
        # JAX engine's eos_token_ids): the tokenizer's EOS when the checkpoint names none.
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.owns_servers = owns_servers  # close() stops the SGLangServer targets
        self._weight_version = weight_version
        self._weights_path: str | None = None  # last synced checkpoint, for restarts
        self._loop_state: dict[int, tuple[asyncio.AbstractEventLoop, httpx.AsyncClient, Any]] = {}
        self.stats = {"retries": 0, "restarts": 0, "requests": 0}

    # ------------------------------------------------------------ plumbing
    @property
    def weight_version(self) -> int:
        return self._weight_version

    def _state(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        """A client and semaphore per event loop (both are loop-bound)."""
        loop = asyncio.get_running_loop()
        entry = self._loop_state.get(id(loop))
        if entry is None or entry[0] is not loop:
            timeout = httpx.Timeout(self.request_timeout_s, connect=10.0)
            limits = httpx.Limits(max_connections=self.max_concurrency + 8)
            client = httpx.AsyncClient(timeout=timeout, limits=limits)
            entry = (loop, client, asyncio.Semaphore(self.max_concurrency))
            self._loop_state[id(loop)] = entry
            for ep in self.endpoints:
                ep.restart_lock = None
        return entry[1], entry[2]

    def _pick(self) -> _Endpoint:
        return min(self.endpoints, key=lambda ep: (ep.failures, ep.inflight))

    async def _restart_if_dead(self, ep: _Endpoint, era: int) -> bool:
        """Restarts `ep`'s managed server if it died (once per era). True if it restarted."""
        if ep.server is None:
            return False
        if ep.restart_lock is None:
            ep.restart_lock = asyncio.Lock()
        async with ep.restart_lock:
            if ep.generation != era:  # another request already restarted it
                return True
            if ep.server.alive():  # busy or erroring but running: back off, never kill it
                return False
            logger.warning(
                "SGLang server %s died; restarting (version %s)", ep.url, self._weight_version
            )
            t0 = time.monotonic()
            await asyncio.to_thread(
                ep.server.restart,
                self._weights_path,
                self._weight_version if self._weights_path is not None else None,
            )
            ep.generation += 1
            ep.failures = 0
            self.stats["restarts"] += 1
            logger.warning("SGLang server back at %s after %.1f s", ep.url, time.monotonic() - t0)
            return True

    async def _post(self, path: str, payload: dict[str, Any], *, what: str) -> Any:
        """POSTs to the least-loaded server with retries; restarts a dead managed server."""
        client, sem = self._state()
        async with sem:
            ep = self._pick()
            ep.inflight += 1
            try:
                attempt = 0
                while True:
                    era = ep.generation
                    try:
                        resp = await client.post(ep.url + path, json=payload)
                        resp.raise_for_status()
                        ep.failures = 0
                        return resp.json()
                    except (httpx.TransportError, httpx.HTTPStatusError) as exc:
                        if not _is_retryable(exc):
                            raise SGLangRequestError(
                                f"{what}: {ep.url}{path} answered {exc.response.status_code}: "
                                f"{exc.response.text[:500]}"
                            ) from exc
                        attempt += 1
                        ep.failures += 1
                        self.stats["retries"] += 1
                        if attempt >= self.retry.max_attempts:
                            raise SGLangRequestError(
                                f"{what}: {ep.url}{path} failed {attempt} times; last error "
                                f"{type(exc).__name__}: {exc}"
                            ) from exc
                        if await self._restart_if_dead(ep, era):
                            continue  # fresh server: re-send at once
                        await asyncio.sleep(self.retry.delay(attempt - 1))
                        # fail over to the least-loaded server (the same one if it is alone)
                        ep.inflight -= 1
                        ep = self._pick()
                        ep.inflight += 1
            finally:
                ep.inflight -= 1

    # ------------------------------------------------------------ generate
    def _sampling_params(self, params: SamplingParams) -> dict[str, Any]:
        sp: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,
            # keep the matched stop token in output_ids: it was sampled and is trained on
            "no_stop_trim": True,
            "skip_special_tokens": False,
            # SGLang's own names and meaning (engine.SamplingParams); its defaults are 0 / False
            "min_new_tokens": params.min_new_tokens,
            "ignore_eos": params.ignore_eos,
        }
        stop = list(dict.fromkeys((*params.stop_token_ids, *self.eos_token_ids)))
        if stop:
            sp["stop_token_ids"] = stop
        return sp

    async def _generate_one(
        self, req: GenerationRequest, params: SamplingParams
    ) -> list[Generation]:
        seeds = req.seeds(params.n)
        base = self._sampling_params(params)
        if self.seed_mode == "per_sample":
            payload: dict[str, Any] = {
                "input_ids": [list(req.prompt_ids)] * params.n,
                "sampling_params": [dict(base, sampling_seed=s) for s in seeds],
                "return_logprob": True,
            }
            send_seeds: Sequence[int | None] = seeds
        else:
            payload = {
                "input_ids": list(req.prompt_ids),
                "sampling_params": dict(base, n=params.n),
                "return_logprob": True,
            }
            send_seeds = [None] * params.n
        self.stats["requests"] += 1
        out = await self._post("/generate", payload, what=f"generate {req.request_id!r}")
        items = out if isinstance(out, list) else [out]
        if len(items) != params.n:
            raise SGLangProtocolError(
                f"SGLang /generate for request {req.request_id!r}: asked for {params.n} samples, "
                f"got {len(items)}"
            )
        return [
            parse_generation(
                item,
                request_id=req.request_id,
                sample_index=j,
                seed=send_seeds[j],
                default_version=self._weight_version,
            )
            for j, item in enumerate(items)
        ]

    async def agenerate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[list[Generation]]:
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError("SGLangEngine.agenerate: duplicate request_id in the batch")
        return list(await asyncio.gather(*(self._generate_one(r, params) for r in requests)))

    # ------------------------------------------------------------ score
    async def _score_one(
        self, prompt_ids: Sequence[int], completion_ids: Sequence[int], temperature: float
    ) -> list[float]:
        prompt, completion = [int(t) for t in prompt_ids], [int(t) for t in completion_ids]
        if not prompt:
            raise ValueError("SGLangEngine.score: empty prompt (the first token has no log-prob)")
        if not completion:
            return []
        if temperature <= 0:
            raise ValueError(f"SGLangEngine.score: temperature must be > 0, got {temperature}")
        payload: dict[str, Any] = {
            "input_ids": prompt + completion,
            "sampling_params": {"max_new_tokens": 0, "temperature": 1.0},
            "return_logprob": True,
            # From the last prompt position: starting at len(prompt) would let the radix cache
            # serve the whole prompt, and the first completion token's log-prob (which needs the
            # last prompt position's logits) comes back None.
            "logprob_start_len": len(prompt) - 1,
        }
        rescale = abs(temperature - 1.0) > 1e-12
        if rescale:
            if self.vocab_size is None:
                raise ValueError(
                    "SGLangEngine.score at temperature != 1 needs vocab_size (the server returns "
                    "prompt log-probs at T = 1 only; we renormalise the full distribution)"
                )
            payload["top_logprobs_num"] = self.vocab_size
        self.stats["requests"] += 1
        out = await self._post("/generate", payload, what="score")
        meta = out["meta_info"]
        triples = [t for t in meta["input_token_logprobs"] if t[0] is not None]
        triples = triples[-len(completion) :]
        got_ids = [int(t[1]) for t in triples]
        if got_ids != completion:
            raise SGLangProtocolError(
                f"SGLang score: input_token_logprobs ids {got_ids[:8]}… do not match the "
                f"completion {completion[:8]}…"
            )
        if not rescale:
            return [float(t[0]) for t in triples]
        tops = meta["input_top_logprobs"][-len(completion) :]
        result = []
        for tok, top in zip(completion, tops):
            # log_softmax(z/T) = lp/T − logsumexp(lp/T), with lp = log_softmax(z) (shift-invariant)
            scaled = {int(t[1]): float(t[0]) / temperature for t in top}
            m = max(scaled.values())
            lse = m + math.log(sum(math.exp(v - m) for v in scaled.values()))
            result.append(scaled[tok] - lse)
        return result

    async def ascore(
        self,
        sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
        temperature: float = 1.0,
    ) -> list[list[float]]:
        return list(
            await asyncio.gather(*(self._score_one(p, c, temperature) for p, c in sequences))
        )

    # ------------------------------------------------------------ weights
    def _admin_urls(self) -> list[str]:
        return list(self.weight_update_urls) or [ep.url for ep in self.endpoints]

    def update_weights(self, params_or_path: Any, version: int) -> dict[str, float]:
        """Serves new weights as `version` on every server (pause → flush cache →
        update_weights_from_disk → continue, then a probe checks the version).

        `params_or_path` is a HF checkpoint directory, or a model when the engine was given a
        `weight_sync` (which exports it to `<root>/v{version}/` first)."""
        if not isinstance(params_or_path, str | os.PathLike):
            if self.weight_sync is None:
                raise TypeError(
                    "SGLangEngine.update_weights got a model, not a checkpoint directory: pass "
                    "SGLangEngine(..., weight_sync=WeightSync(root)) or call "
                    "WeightSync(root).sync(engine, model, version)"
                )
            return self.weight_sync.sync(self, params_or_path, version)
        metrics = update_servers_from_disk(self._admin_urls(), str(params_or_path), version)
        self._weight_version = int(version)
        self._weights_path = str(params_or_path)
        return metrics

    # ------------------------------------------------------------ lifecycle
    def health(self) -> bool:
        for url in (ep.url for ep in self.endpoints):
            try:
                if httpx.get(url + "/health", timeout=5.0).status_code != 200:
                    return False
            except httpx.HTTPError:
                return False
        return True

    def close(self) -> None:
        """Closes the HTTP clients; with `owns_servers` (servers the trainer started) also stops
        the `SGLangServer` targets, else they are stopped by their owner (`SGLangServer.stop()`
        / its context manager). A server runs in its own process group: nothing else ends it."""

        async def _aclose(clients: list[httpx.AsyncClient]) -> None:
            for c in clients:
                await c.aclose()

        sync_loop = self._sync_loop
        mine = [c for (loop, c, _) in self._loop_state.values() if loop is sync_loop]
        self._loop_state.clear()
        self._close_sync_loop(_aclose(mine) if mine else None)
        if self.owns_servers:
            for ep in self.endpoints:
                if ep.server is not None:
                    ep.server.stop()
