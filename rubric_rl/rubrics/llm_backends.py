"""HTTP ``LLMClient`` backends: ``genai`` (google-genai) and ``openai`` (OpenAI-compatible).

Both ask for structured JSON output when the request carries a schema and treat a truncated
generation (MAX_TOKENS / ``"length"``) as ``LLMTruncatedError`` — a failure, never an answer. Keys
come from environment variables only (``Secret``), and ``LLMClient.generate`` scrubs them from
errors.

Retries (``HTTPClient._with_retries``, one loop for both backends): 408/429/5xx and timeouts are
retried with exponential back-off honouring the server's requested delay; a refused connection
or a failed DNS lookup is retried only ``connect_attempts`` times, a fraction of a second apart
(the server is not there: waiting minutes will not bring it). Every call's attempts, waits
included, fit in ``max_retry_s``. A call that gives up names the backend, the URL and the cause;
when the server never answered (refused, timed out, dropped) or the budget ran out it raises
``LLMUnavailableError`` and the client counts the endpoint down (``LLMClient.down_cooldown_s``):
the step's other calls fail at once instead of each waiting out the same failure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import errno
import logging
import random
import socket
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from rubric_rl.rubrics.llm_client import (
    CLIENTS,
    RETRYABLE_STATUS,
    LLMClient,
    LLMError,
    LLMHTTPError,
    LLMRequest,
    LLMResponse,
    LLMTruncatedError,
    LLMUnavailableError,
    api_key_from_env,
    parse_json_text,
)

logger = logging.getLogger(__name__)

GEMINI_DEFAULT_URL = "https://generativelanguage.googleapis.com"


def _retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (delta-seconds or an HTTP date)."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def connect_failure_cause(error: BaseException) -> str:
    """Why a connection failed, from the OS error under the transport's wrapper ("All connection
    attempts failed" says nothing): "connection refused", "DNS lookup failed (...)", ..."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, socket.gaierror) or type(e).__name__ == "ClientConnectorDNSError":
            return f"DNS lookup failed ({e})"
        if isinstance(e, ConnectionRefusedError) or getattr(e, "errno", None) == errno.ECONNREFUSED:
            return f"connection refused ({e})"
        # aiohttp keeps the OS error in ``os_error``; httpx / anyio chain it as the cause.
        todo += [getattr(e, "os_error", None), e.__cause__, e.__context__]
    e = next((x for x in seen_errors(error) if isinstance(x, OSError) and x.errno), None)
    return f"{e.strerror or e} ({e})" if e is not None else f"{type(error).__name__}: {error}"


def seen_errors(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions it was raised from, first to last."""
    out: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and e not in out:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


@dataclasses.dataclass
class TransientFailure(Exception):
    """One attempt's failure that another attempt may not repeat.

    ``kind``: "connect" (nothing listening, DNS), "timeout", "status" (408/429/5xx) or
    "transport" (the connection dropped mid-answer)."""

    kind: str
    cause: str
    status: int | None = None
    retry_after: float | None = None

    def __str__(self) -> str:
        return self.cause


class HTTPClient(LLMClient):
    """The retry loop the HTTP backends share (see the module docstring)."""

    def __init__(
        self,
        *,
        model: str,
        timeout: float,
        max_attempts: int,
        initial_delay: float,
        max_delay: float,
        max_retry_after: float,
        max_retry_s: float = 300.0,  # as configs/common.py judge.llm.max_retry_s
        connect_attempts: int = 2,
        connect_retry_delay: float = 0.25,
        jitter: float = 1.0,
        **kwargs: Any,
    ):
        super().__init__(model=model, **kwargs)
        if timeout <= 0:
            raise ValueError(f"{type(self).__name__}: timeout must be > 0 s, got {timeout}")
        if max_retry_s <= 0:
            raise ValueError(f"{type(self).__name__}: max_retry_s must be > 0 s, got {max_retry_s}")
        self.timeout = float(timeout)
        self.max_attempts = max(1, int(max_attempts))
        self.initial_delay = float(initial_delay)
        self.max_delay = float(max_delay)
        self.max_retry_after = float(max_retry_after)
        self.max_retry_s = float(max_retry_s)
        self.connect_attempts = max(1, int(connect_attempts))
        self.connect_retry_delay = float(connect_retry_delay)
        self.jitter = float(jitter)

    async def _with_retries(
        self, attempt: Callable[[], Awaitable[LLMResponse]], what: str
    ) -> LLMResponse:
        """``await attempt()`` until it returns, raises a permanent error, or the retries or the
        ``max_retry_s`` budget run out (``LLMUnavailableError``). ``what`` names the request in
        logs and errors (backend and URL)."""
        start = time.monotonic()
        deadline = start + self.max_retry_s
        connect_failures = 0
        last: TransientFailure | None = None
        for n in range(1, self.max_attempts + 1):
            self.raise_if_down()  # another call found the endpoint down while this one waited
            remaining = deadline - time.monotonic()
            if remaining <= 0 and last is not None:
                raise self._give_up(what, last, n - 1, start, budget_spent=True)
            try:
                async with asyncio.timeout(max(0.0, remaining)) as budget:
                    return await attempt()
            except TransientFailure as failure:
                last = failure
            except TimeoutError:
                if not budget.expired():
                    raise
                cut = TransientFailure("timeout", f"no answer within {max(0.0, remaining):.1f}s")
                if last is not None:  # the earlier failure says more than the cut-short attempt
                    cut.cause = f"{last.cause}; then {cut.cause}"
                raise self._give_up(what, cut, n, start, budget_spent=True) from None
            if last.kind == "connect":
                connect_failures += 1
                if connect_failures >= self.connect_attempts:
                    raise self._give_up(what, last, n, start) from None
                delay = self.connect_retry_delay
            else:
                if n == self.max_attempts:
                    raise self._give_up(what, last, n, start) from None
                if last.retry_after is not None and last.retry_after > self.max_retry_after:
                    raise LLMHTTPError(
                        f"{what}: {last.cause} (server retry delay {last.retry_after:g}s too "
                        f"long; the limit is {self.max_retry_after:g}s)",
                        last.status,
                    )
                backoff = min(self.max_delay, self.initial_delay * 2 ** (n - 1))
                backoff *= 1.0 + self.jitter * 0.25 * random.random()
                delay = max(last.retry_after or 0.0, backoff)
            if time.monotonic() + delay >= deadline:
                raise self._give_up(what, last, n, start, budget_spent=True) from None
            self.counters.add(retries=1)
            logger.info("retrying %s in %.2fs: %s", what, delay, self._scrub(last.cause))
            await asyncio.sleep(delay)
        raise AssertionError("unreachable: the loop returns or raises")

    def _give_up(
        self,
        what: str,
        last: TransientFailure,
        attempts: int,
        start: float,
        *,
        budget_spent: bool = False,
    ) -> LLMHTTPError:
        """The error of a call that gives up: ``LLMUnavailableError`` (the client counts the
        endpoint down) unless the server did answer within the budget with 408 or 429 (busy or
        rate-limited: alive). An endpoint that answers every attempt with a 5xx is as down as
        one that times out: marked down, so the step's other calls fail at once instead of each
        spending its own attempts on it."""
        elapsed = time.monotonic() - start
        why = f" (the retry budget max_retry_s={self.max_retry_s:g}s is spent)"
        server_error = last.status is not None and last.status >= 500
        answered = last.kind == "status" and not budget_spent and not server_error
        return (LLMHTTPError if answered else LLMUnavailableError)(
            f"{what}: {last.cause}; gave up after {attempts} attempt"
            f"{'s' if attempts != 1 else ''} in {elapsed:.1f}s{why if budget_spent else ''}",
            last.status,
        )


@CLIENTS.register("openai")
class OpenAIClient(HTTPClient):
    """An OpenAI-compatible chat server: POST ``{base_url}/chat/completions``.

    Retries (``max_attempts`` in all, within ``max_retry_s``) on 408/429/5xx, dropped connections
    and timeouts, waiting ``max(Retry-After, initial_delay * 2**i)`` (jittered, capped at
    ``max_delay``; a Retry-After longer than ``max_retry_after`` is not waited for: the call
    fails). A refused connection is tried ``connect_attempts`` times only.
    """

    kind = "openai"

    def __init__(
        self,
        *,
        model: str,
        base_url: str = "http://127.0.0.1:30000/v1",
        api_key_env: str | Sequence[str] = "OPENAI_API_KEY",
        require_api_key: bool = False,
        timeout: float = 120.0,
        max_attempts: int = 5,
        initial_delay: float = 1.0,
        max_delay: float = 30.0,
        max_retry_after: float = 300.0,
        structured_output: bool = True,
        **kwargs: Any,
    ):
        super().__init__(
            model=model,
            timeout=timeout,
            max_attempts=max_attempts,
            initial_delay=initial_delay,
            max_delay=max_delay,
            max_retry_after=max_retry_after,
            **kwargs,
        )
        envs = [api_key_env] if isinstance(api_key_env, str) else list(api_key_env)
        self._secret = api_key_from_env(envs, required=require_api_key, what="OpenAIClient")
        self.base_url = base_url.rstrip("/")
        self.structured_output = structured_output
        self._http: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"OpenAIClient(model={self.model!r}, base_url={self.base_url!r})"

    @property
    def endpoint(self) -> str:
        return f"openai backend at {self.base_url}/chat/completions"

    def _client(self):
        import httpx

        loop = asyncio.get_running_loop()
        client = self._http.get(loop)
        if client is None:
            # A connection that is not set up in 10 s is not coming (a blackholed address).
            timeout = httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0))
            client = self._http[loop] = httpx.AsyncClient(timeout=timeout)
        return client

    async def aclose(self) -> None:
        client = self._http.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    def _body(self, request: LLMRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [m.to_dict() for m in request.messages],
            "temperature": request.temperature,
            "max_tokens": request.max_tokens,
        }
        if request.seed is not None:
            body["seed"] = request.seed
        if request.json_schema is not None and self.structured_output:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": request.schema_name,
                    "schema": dict(request.json_schema),
                    "strict": True,
                },
            }
        return body

    async def _generate(self, request: LLMRequest) -> LLMResponse:
        import httpx

        headers = {"Content-Type": "application/json"}
        if self._secret is not None:
            headers["Authorization"] = f"Bearer {self._secret.reveal()}"
        url = f"{self.base_url}/chat/completions"
        body = self._body(request)

        async def attempt() -> LLMResponse:
            try:
                r = await self._client().post(url, json=body, headers=headers)
            except httpx.ConnectError as e:
                raise TransientFailure("connect", connect_failure_cause(e)) from None
            except httpx.ConnectTimeout:
                raise TransientFailure(
                    "connect", f"connection not set up within {min(self.timeout, 10.0):g}s"
                ) from None
            except httpx.TimeoutException as e:
                raise TransientFailure(
                    "timeout", f"no answer within {self.timeout:g}s ({type(e).__name__})"
                ) from None
            except httpx.TransportError as e:
                raise TransientFailure("transport", f"{type(e).__name__}: {e}") from None
            if r.status_code == 200:
                return self._parse(r.json(), request)
            cause = f"HTTP {r.status_code}: {r.text[:300]}"
            if r.status_code not in RETRYABLE_STATUS:
                raise LLMHTTPError(f"{self.endpoint}: {cause}", r.status_code)
            raise TransientFailure("status", cause, r.status_code, _retry_after_seconds(r.headers))

        return await self._with_retries(attempt, self.endpoint)

    def _parse(self, payload: Mapping[str, Any], request: LLMRequest) -> LLMResponse:
        try:
            choice = payload["choices"][0]
            text = choice["message"].get("content")
            finish = choice.get("finish_reason") or ""
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            raise LLMError(f"malformed chat/completions response ({e!r})") from None
        if finish == "length":
            raise LLMTruncatedError("generation truncated at max_tokens (finish_reason='length')")
        if not isinstance(text, str):
            raise LLMError(f"response has no text (finish_reason={finish!r})")
        usage = payload.get("usage") or {}
        return LLMResponse(
            text=text,
            parsed=parse_json_text(text) if request.json_schema is not None else None,
            finish_reason=finish,
            usage={
                "prompt_tokens": int(usage.get("prompt_tokens") or 0),
                "completion_tokens": int(usage.get("completion_tokens") or 0),
            },
            model=str(payload.get("model") or self.model),
        )


@CLIENTS.register("genai")
class GenAIClient(HTTPClient):
    """Gemini via google-genai (``generate_content`` on the async client), at ``base_url`` (the
    public endpoint by default) with a per-request ``timeout``.

    The library's own retries are off (``HttpRetryOptions(attempts=1)``): 408/429/5xx, timeouts
    and refused connections are retried here, in the loop the OpenAI backend uses, so the
    server's ``Retry-After`` header / ``RetryInfo.retryDelay`` is honoured and ``max_retry_s``
    bounds the whole call. ``attempts`` is the number of attempts in all.
    """

    kind = "genai"

    def __init__(
        self,
        *,
        model: str = "gemini-2.5-flash",
        api_key_env: str | Sequence[str] = ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
        base_url: str | None = None,
        timeout: float = 120.0,
        attempts: int = 5,
        initial_delay: float = 1.0,
        max_delay: float = 60.0,
        jitter: float = 1.0,
        max_retry_after: float = 300.0,
        **kwargs: Any,
    ):
        super().__init__(
            model=model,
            timeout=timeout,
            max_attempts=attempts,
            initial_delay=initial_delay,
            max_delay=max_delay,
            max_retry_after=max_retry_after,
            jitter=jitter,
            **kwargs,
        )
        envs = [api_key_env] if isinstance(api_key_env, str) else list(api_key_env)
        self._secret = api_key_from_env(envs, required=True, what="GenAIClient")
        self.base_url = base_url or None
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @property
    def attempts(self) -> int:
        return self.max_attempts

    def __repr__(self) -> str:
        return f"GenAIClient(model={self.model!r}, base_url={self.base_url!r})"

    @property
    def endpoint(self) -> str:
        return f"genai backend at {self.base_url or GEMINI_DEFAULT_URL} (model {self.model!r})"

    def _client(self):
        from google import genai
        from google.genai import types

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            http_options = types.HttpOptions(
                base_url=self.base_url,
                timeout=max(1, int(self.timeout * 1000)),  # milliseconds
                retry_options=types.HttpRetryOptions(attempts=1),  # retried in _with_retries
            )
            client = genai.Client(api_key=self._secret.reveal(), http_options=http_options)
            self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aio.aclose()

    def _config(self, request: LLMRequest):
        from google.genai import types

        system = "\n\n".join(m.content for m in request.messages if m.role == "system")
        cfg: dict[str, Any] = {
            "temperature": request.temperature,
            "max_output_tokens": request.max_tokens,
            "candidate_count": 1,
        }
        if system:
            cfg["system_instruction"] = system
        if request.seed is not None:
            cfg["seed"] = request.seed
        if request.json_schema is not None:
            cfg["response_mime_type"] = "application/json"
            cfg["response_json_schema"] = dict(request.json_schema)
        return types.GenerateContentConfig(**cfg)

    async def _generate(self, request: LLMRequest) -> LLMResponse:
        from google.genai import errors, types

        contents = [
            types.Content(
                role="model" if m.role == "assistant" else "user",
                parts=[types.Part(text=m.content)],
            )
            for m in request.messages
            if m.role != "system"
        ]
        config = self._config(request)

        async def attempt() -> LLMResponse:
            try:
                response = await self._client().aio.models.generate_content(
                    model=self.model, contents=contents, config=config
                )
            except errors.APIError as e:
                cause = f"Gemini API error {e.code}: {e.message}"
                if e.code not in RETRYABLE_STATUS:
                    raise LLMHTTPError(f"{self.endpoint}: {cause}", e.code) from None
                raise TransientFailure("status", cause, e.code, _gemini_retry_delay(e)) from None
            except Exception as e:  # the transport's errors (httpx, or aiohttp for Vertex mTLS)
                raise _transport_failure(e, self.timeout) from None
            return self._parse(response, request)

        return await self._with_retries(attempt, self.endpoint)

    def _parse(self, response: Any, request: LLMRequest) -> LLMResponse:
        candidates = response.candidates or []
        if not candidates:
            feedback = getattr(response, "prompt_feedback", None)
            raise LLMError(f"Gemini returned no candidates (prompt_feedback={feedback})")
        finish = candidates[0].finish_reason
        finish_name = getattr(finish, "name", str(finish or ""))
        if finish_name == "MAX_TOKENS":
            raise LLMTruncatedError("generation truncated at max_output_tokens (MAX_TOKENS)")
        text = response.text
        if text is None:
            raise LLMError(f"Gemini returned no text (finish_reason={finish_name})")
        meta = response.usage_metadata
        completion = (getattr(meta, "candidates_token_count", 0) or 0) + (
            getattr(meta, "thoughts_token_count", 0) or 0
        )
        return LLMResponse(
            text=text,
            parsed=parse_json_text(text) if request.json_schema is not None else None,
            finish_reason=finish_name,
            usage={
                "prompt_tokens": int(getattr(meta, "prompt_token_count", 0) or 0),
                "completion_tokens": int(completion),
            },
            model=str(response.model_version or self.model),
        )


def _transport_failure(error: Exception, timeout: float) -> TransientFailure:
    """A transport exception as a ``TransientFailure``; anything else is re-raised."""
    name = type(error).__name__
    if name in ("ConnectError", "ClientConnectorError") or isinstance(
        error, ConnectionRefusedError | socket.gaierror
    ):
        return TransientFailure("connect", connect_failure_cause(error))
    if name == "ConnectTimeout":
        return TransientFailure("connect", f"connection not set up within {timeout:g}s")
    if isinstance(error, TimeoutError) or name.endswith("Timeout"):
        return TransientFailure("timeout", f"no answer within {timeout:g}s ({name})")
    if name in ("RemoteProtocolError", "ReadError", "WriteError", "ServerDisconnectedError"):
        return TransientFailure("transport", f"{name}: {error}")
    raise error


def _gemini_retry_delay(error: Any) -> float | None:
    """The server's requested delay: ``Retry-After`` header or ``RetryInfo.retryDelay`` ("13s")."""
    headers = getattr(getattr(error, "response", None), "headers", None)
    if headers is not None:
        delay = _retry_after_seconds({k.lower(): v for k, v in headers.items()})
        if delay is not None:
            return delay
    details = error.details if isinstance(error.details, Mapping) else {}
    details = details.get("error", details).get("details") or []
    for item in details if isinstance(details, list) else []:
        value = item.get("retryDelay") if isinstance(item, Mapping) else None
        if isinstance(value, str) and value.endswith("s"):
            try:
                return max(0.0, float(value[:-1]))
            except ValueError:
                pass
    return None
