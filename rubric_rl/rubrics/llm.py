"""One ``LLMClient`` interface for everything an LLM does (DESIGN.md §2), with three backends.

- ``genai``, ``openai``: HTTP backends in ``llm_backends.py`` (Gemini via google-genai; any
  OpenAI-compatible ``/chat/completions`` server such as SGLang or vLLM).
- ``local``: a hook wrapping any (async) callable ``(messages, params) -> text``, for the
  in-process JAX engine.

A truncated generation (MAX_TOKENS / ``"length"``) raises ``LLMTruncatedError``: a failure, never
an answer. API keys are read only from environment variables, are never stored in reprs and are
scrubbed from every error message. The interface and its value types are defined in
``llm_client.py`` and re-exported here.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

# The HTTP backends register "genai" and "openai" in CLIENTS on import.
from rubric_rl.rubrics import llm_backends as _llm_backends  # noqa: F401
from rubric_rl.rubrics.llm_client import (  # noqa: F401  (re-exported API)
    CLIENTS,
    RETRYABLE_STATUS,
    LLMClient,
    LLMError,
    LLMHTTPError,
    LLMRequest,
    LLMResponse,
    LLMTruncatedError,
    Secret,
    UsageCounters,
    api_key_from_env,
    parse_json_text,
    run_sync,
    strip_json_fence,
)


def make_client(kind: str, **cfg: Any) -> LLMClient:
    """``make_client("openai", model=..., base_url=...)``; kinds: genai, openai, local."""
    return CLIENTS.get(kind)(**cfg)


def client_from_settings(own: Any, fallback: Any) -> LLMClient:
    """A client from a config section's ``backend`` / ``model`` (and, for ``openai``,
    ``base_url`` / ``api_key_env``), each empty field taken from ``fallback`` (e.g.
    ``config.judge.llm``): ARISE's reflection and HarnessRL's evolver."""
    backend = own.backend or fallback.backend
    kw: dict[str, Any] = {"model": own.model or fallback.model}
    if backend == "openai":
        kw.update(
            base_url=own.base_url or fallback.base_url,
            api_key_env=own.api_key_env or fallback.api_key_env,
        )
    return make_client(backend, **kw)


EngineFn = Callable[[list[dict[str, str]], dict[str, Any]], Any]


@CLIENTS.register("local")
class LocalEngineClient(LLMClient):
    """Wraps an in-process engine: ``fn(messages, params) -> str`` (sync or async).

    ``params`` holds temperature, max_tokens, seed and json_schema. The callable may instead
    return ``(text, info)`` with ``info`` keys ``finish_reason`` ("length" = truncated),
    ``prompt_tokens`` and ``completion_tokens``. A sync callable runs in a worker thread.
    """

    kind = "local"

    def __init__(self, fn: EngineFn, *, model: str = "local", **kwargs: Any):
        if not callable(fn):
            raise TypeError(f"LocalEngineClient needs a callable, got {type(fn).__name__}")
        super().__init__(model=model, **kwargs)
        self.fn = fn

    async def _generate(self, request: LLMRequest) -> LLMResponse:
        params = {
            "temperature": request.temperature,
            "max_tokens": request.max_tokens,
            "seed": request.seed,
            "json_schema": request.json_schema,
        }
        messages = [m.to_dict() for m in request.messages]
        if inspect.iscoroutinefunction(self.fn):
            out = await self.fn(messages, params)
        else:
            out = await asyncio.to_thread(self.fn, messages, params)
            if inspect.isawaitable(out):
                out = await out
        text, info = out if isinstance(out, tuple) else (out, {})
        finish = str(info.get("finish_reason", "stop"))
        if finish == "length":
            raise LLMTruncatedError("local engine generation truncated at max_tokens")
        if not isinstance(text, str):
            raise LLMError(f"local engine returned {type(text).__name__}, expected str")
        return LLMResponse(
            text=text,
            parsed=parse_json_text(text) if request.json_schema is not None else None,
            finish_reason=finish,
            usage={
                "prompt_tokens": int(info.get("prompt_tokens", 0)),
                "completion_tokens": int(info.get("completion_tokens", 0)),
            },
            model=self.model,
        )
