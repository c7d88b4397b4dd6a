"""The ``LLMClient`` interface: requests, responses, errors, secrets, and the ``CLIENTS`` registry.

Shared by ``llm.py`` (the public module: ``make_client`` and the ``local`` backend) and
``llm_backends.py`` (the HTTP backends), which both import it and not each other's definitions;
``llm.py`` re-exports every name here.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import json
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from rubric_rl.rubrics.types import Message
from rubric_rl.util.registry import Registry

logger = logging.getLogger(__name__)

RETRYABLE_STATUS = (408, 429, 500, 502, 503, 504)


class LLMError(RuntimeError):
    """A call that produced no usable answer (after the backend's retries)."""


class LLMTruncatedError(LLMError):
    """The generation hit the token limit: its text is not an answer."""


class LLMHTTPError(LLMError):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class LLMUnavailableError(LLMHTTPError):
    """The endpoint could not be reached (refused connection, failed DNS lookup) or gave no
    usable answer within the retry budget. The client then counts it as down for a while: calls
    fail at once instead of each waiting out its own retries."""


class LLMEndpointDownError(LLMUnavailableError):
    """A call refused without trying: the endpoint failed recently (``LLMUnavailableError``)."""


@dataclasses.dataclass(frozen=True)
class LLMRequest:
    """A chat request. ``json_schema`` asks the backend for structured JSON output."""

    messages: tuple[Message, ...]
    temperature: float = 0.0
    max_tokens: int = 1024
    json_schema: Mapping[str, Any] | None = dataclasses.field(default=None, hash=False)
    seed: int | None = None
    schema_name: str = "response"

    def __post_init__(self):
        msgs = tuple(m if isinstance(m, Message) else Message(**m) for m in self.messages)
        if not msgs:
            raise ValueError("LLMRequest.messages is empty")
        object.__setattr__(self, "messages", msgs)
        if self.max_tokens <= 0:
            raise ValueError(f"LLMRequest.max_tokens must be positive, got {self.max_tokens}")


@dataclasses.dataclass(frozen=True)
class LLMResponse:
    text: str
    parsed: Any | None
    finish_reason: str
    usage: Mapping[str, int]
    model: str


def strip_json_fence(text: str) -> str:
    """The body of a fenced ```json ... ``` block if the text is one, else the stripped text."""
    m = re.fullmatch(r"\s*```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```\s*", text, flags=re.DOTALL)
    return m.group(1).strip() if m else text.strip()


def parse_json_text(text: str) -> Any | None:
    try:
        return json.loads(strip_json_fence(text))
    except (json.JSONDecodeError, ValueError):
        return None


class UsageCounters:
    """Thread-safe call / token / cost counters shared by every user of one client."""

    _FIELDS = ("calls", "failures", "retries", "prompt_tokens", "completion_tokens", "cache_hits")

    def __init__(self, price_prompt_per_1k: float = 0.0, price_completion_per_1k: float = 0.0):
        self._lock = threading.Lock()
        self._values = dict.fromkeys(self._FIELDS, 0)
        self.price_prompt_per_1k = float(price_prompt_per_1k)
        self.price_completion_per_1k = float(price_completion_per_1k)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, value in deltas.items():
                if name not in self._values:
                    raise KeyError(f"unknown counter {name!r}; known: {list(self._FIELDS)}")
                self._values[name] += int(value)

    def __getattr__(self, name: str) -> int:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def cost(self) -> float:
        return (
            self._values["prompt_tokens"] * self.price_prompt_per_1k
            + self._values["completion_tokens"] * self.price_completion_per_1k
        ) / 1000.0

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            out: dict[str, float] = dict(self._values)
        out["cost"] = self.cost
        return out


class Secret:
    """An API key that prints as ``***`` (reprs, ``vars()``, tracebacks); ``reveal()`` to use it."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret(***)"

    __str__ = __repr__


def api_key_from_env(names: Sequence[str], *, required: bool, what: str) -> Secret | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return Secret(value)
    if required:
        raise LLMError(f"{what}: no API key; set one of the environment variables {list(names)}")
    return None


def run_sync(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    """Runs ``coro_fn()`` to completion from sync code (in a worker thread if a loop is running)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_fn())
    box: dict[str, Any] = {}

    def worker():
        try:
            box["value"] = asyncio.run(coro_fn())
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=worker, name="llm-run-sync")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


class LLMClient(abc.ABC):
    """``await generate(request)``; a global per-client concurrency limit; usage/cost counters."""

    kind = "abstract"

    def __init__(
        self,
        *,
        model: str,
        max_concurrency: int = 16,
        price_prompt_per_1k: float = 0.0,
        price_completion_per_1k: float = 0.0,
        down_cooldown_s: float = 30.0,
    ):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if down_cooldown_s < 0:
            raise ValueError(f"down_cooldown_s must be >= 0, got {down_cooldown_s}")
        self.model = model
        self.max_concurrency = int(max_concurrency)
        self.counters = UsageCounters(price_prompt_per_1k, price_completion_per_1k)
        self._secret: Secret | None = None
        # asyncio primitives bind to one event loop; keep one semaphore per loop.
        self._semaphores: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # Circuit breaker: after an LLMUnavailableError every call fails at once, naming the
        # cause, until ``down_cooldown_s`` has passed; then the next call tries the endpoint.
        self.down_cooldown_s = float(down_cooldown_s)
        self._down: tuple[float, str] | None = None  # (time.monotonic() it went down, cause)

    @property
    def endpoint(self) -> str:
        """What this client talks to, for error messages: backend and URL (or model)."""
        return f"{self.kind} backend (model {self.model!r})"

    def raise_if_down(self) -> None:
        """``LLMEndpointDownError`` while the endpoint is marked down (see ``down_cooldown_s``)."""
        down = self._down
        if down is None:
            return
        since, cause = down
        ago = time.monotonic() - since
        if ago >= self.down_cooldown_s:
            return
        raise LLMEndpointDownError(
            f"{cause} [not retried: the endpoint was marked down {ago:.1f}s ago; calls fail at "
            f"once until {self.down_cooldown_s:g}s have passed]"
        )

    def allow_concurrency(self, n: int) -> None:
        """Raises the limit to ``n`` calls in flight (never lowers it): a user asking for ``n``
        gets ``n``, not a silent cap at the client's default."""
        if n > self.max_concurrency:
            logger.info("%s: max_concurrency %d -> %d", self.endpoint, self.max_concurrency, n)
            self.max_concurrency = int(n)
            self._semaphores = weakref.WeakKeyDictionary()  # rebuilt with the new limit

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._semaphores.get(loop)
        if sem is None:
            sem = self._semaphores[loop] = asyncio.Semaphore(self.max_concurrency)
        return sem

    def _scrub(self, message: str) -> str:
        if self._secret is not None:
            message = message.replace(self._secret.reveal(), "***")
        return message

    async def generate(self, request: LLMRequest) -> LLMResponse:
        self._fail_if_down()
        async with self._semaphore():
            self._fail_if_down()
            try:
                response = await self._generate(request)
            except LLMHTTPError as e:
                self.counters.add(calls=1, failures=1)
                message = self._scrub(str(e))
                if isinstance(e, LLMUnavailableError) and not isinstance(e, LLMEndpointDownError):
                    self._down = (time.monotonic(), message)
                    logger.warning("LLM endpoint down: %s", message)
                raise type(e)(message, e.status) from None
            except LLMError as e:
                self.counters.add(calls=1, failures=1)
                raise type(e)(self._scrub(str(e))) from None
            except Exception as e:  # a backend bug or transport error: still a failure, scrubbed
                self.counters.add(calls=1, failures=1)
                raise LLMError(self._scrub(f"{type(e).__name__}: {e}")) from None
        self._down = None
        self.counters.add(
            calls=1,
            prompt_tokens=response.usage.get("prompt_tokens", 0),
            completion_tokens=response.usage.get("completion_tokens", 0),
        )
        return response

    def _fail_if_down(self) -> None:
        try:
            self.raise_if_down()
        except LLMEndpointDownError as e:
            self.counters.add(calls=1, failures=1)
            raise LLMEndpointDownError(self._scrub(str(e))) from None

    def generate_sync(self, request: LLMRequest) -> LLMResponse:
        async def call():
            try:
                return await self.generate(request)
            finally:
                await self.aclose()

        return run_sync(call)

    @abc.abstractmethod
    async def _generate(self, request: LLMRequest) -> LLMResponse: ...

    async def aclose(self) -> None:  # noqa: B027 (optional hook; the default holds nothing)
        """Releases this event loop's network resources (the client stays usable)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r})"


CLIENTS: Registry[type[LLMClient]] = Registry("llm client")
