"""HTTP ``LLMClient`` backends: ``genai`` (google-genai) and ``openai`` (OpenAI-compatible).

Both ask for structured JSON output when the request carries a schema, retry transient failures
(408/429/5xx, timeouts) honouring the server's requested delay, and treat a truncated generation
(MAX_TOKENS / ``"length"``) as ``LLMTruncatedError`` — a failure, never an answer. Keys come from
environment variables only (``Secret``), and ``LLMClient.generate`` scrubs them from errors.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
import weakref
from collections.abc import Mapping, Sequence
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
    api_key_from_env,
    parse_json_text,
)

logger = logging.getLogger(__name__)


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


@CLIENTS.register("openai")
class OpenAIClient(LLMClient):
    """An OpenAI-compatible chat server: POST ``{base_url}/chat/completions``.

    Retries (``max_attempts`` in all) on 408/429/5xx, connection errors and timeouts, waiting
    ``max(Retry-After, initial_delay * 2**i)`` (jittered, capped at ``max_delay``; a Retry-After
    longer than ``max_retry_after`` is not waited for: the call fails).
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
        super().__init__(model=model, **kwargs)
        envs = [api_key_env] if isinstance(api_key_env, str) else list(api_key_env)
        self._secret = api_key_from_env(envs, required=require_api_key, what="OpenAIClient")
        self.base_url = base_url.rstrip("/")
        self.timeout = float(timeout)
        self.max_attempts = max(1, int(max_attempts))
        self.initial_delay = float(initial_delay)
        self.max_delay = float(max_delay)
        self.max_retry_after = float(max_retry_after)
        self.structured_output = structured_output
        self._http: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"OpenAIClient(model={self.model!r}, base_url={self.base_url!r})"

    def _client(self):
        import httpx

        loop = asyncio.get_running_loop()
        client = self._http.get(loop)
        if client is None:
            client = self._http[loop] = httpx.AsyncClient(timeout=self.timeout)
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
        last_error = "no attempt made"
        for attempt in range(self.max_attempts):
            retry_after = None
            try:
                r = await self._client().post(url, json=body, headers=headers)
            except (httpx.TimeoutException, httpx.TransportError) as e:
                last_error = f"{type(e).__name__} after {self.timeout:g}s timeout: {e}"
            else:
                if r.status_code == 200:
                    return self._parse(r.json(), request)
                snippet = r.text[:300]
                last_error = f"HTTP {r.status_code} from {url}: {snippet}"
                if r.status_code not in RETRYABLE_STATUS:
                    raise LLMHTTPError(last_error, r.status_code)
                retry_after = _retry_after_seconds(r.headers)
            if attempt + 1 == self.max_attempts:
                break
            if retry_after is not None and retry_after > self.max_retry_after:
                raise LLMHTTPError(f"{last_error} (Retry-After {retry_after:g}s too long)")
            backoff = min(self.max_delay, self.initial_delay * 2**attempt)
            backoff *= 1.0 + 0.25 * random.random()
            delay = max(retry_after or 0.0, backoff)
            self.counters.add(retries=1)
            logger.info("retrying %s in %.2fs: %s", url, delay, self._scrub(last_error))
            await asyncio.sleep(delay)
        raise LLMHTTPError(f"gave up after {self.max_attempts} attempts; last: {last_error}")

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
class GenAIClient(LLMClient):
    """Gemini via google-genai (``generate_content`` on the async client).

    408/5xx are retried by the library's ``HttpRetryOptions`` (exponential back-off). 429 and
    timeouts are retried here (``attempts`` in all): the library's back-off cannot honour the
    server's ``Retry-After`` header / ``RetryInfo.retryDelay``, and its aiohttp transport does not
    retry a timeout. We wait ``max(server delay, initial_delay * 2**i)``.
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
        super().__init__(model=model, **kwargs)
        envs = [api_key_env] if isinstance(api_key_env, str) else list(api_key_env)
        self._secret = api_key_from_env(envs, required=True, what="GenAIClient")
        self.base_url = base_url
        self.timeout = float(timeout)
        self.attempts = max(1, int(attempts))
        self.initial_delay = float(initial_delay)
        self.max_delay = float(max_delay)
        self.jitter = float(jitter)
        self.max_retry_after = float(max_retry_after)
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"GenAIClient(model={self.model!r}, base_url={self.base_url!r})"

    def _client(self):
        from google import genai
        from google.genai import types

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            http_options = types.HttpOptions(
                base_url=self.base_url,
                timeout=max(1, int(self.timeout * 1000)),  # milliseconds
                retry_options=types.HttpRetryOptions(
                    attempts=self.attempts,
                    initial_delay=self.initial_delay,
                    max_delay=self.max_delay,
                    jitter=self.jitter,
                    http_status_codes=[c for c in RETRYABLE_STATUS if c != 429],
                ),
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
        for attempt in range(self.attempts):
            try:
                response = await self._client().aio.models.generate_content(
                    model=self.model, contents=contents, config=config
                )
                break
            except errors.APIError as e:
                last_error = f"Gemini API error {e.code}: {e.message}"
                if e.code != 429 or attempt + 1 == self.attempts:
                    raise LLMHTTPError(last_error, e.code) from None
                server_delay = _gemini_retry_delay(e)
            except TimeoutError as e:  # aiohttp's total timeout (asyncio.TimeoutError)
                last_error = f"timed out after {self.timeout:g}s ({attempt + 1} attempts)"
                if attempt + 1 == self.attempts:
                    raise LLMError(last_error) from e
                server_delay = None
            if server_delay is not None and server_delay > self.max_retry_after:
                raise LLMHTTPError(f"{last_error} (retry delay {server_delay:g}s too long)", 429)
            backoff = min(self.max_delay, self.initial_delay * 2**attempt)
            delay = max(server_delay or 0.0, backoff * (1.0 + self.jitter * 0.25 * random.random()))
            self.counters.add(retries=1)
            logger.info("retrying Gemini in %.2fs: %s", delay, self._scrub(last_error))
            await asyncio.sleep(delay)
        return self._parse(response, request)

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
