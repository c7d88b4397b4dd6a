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
import collections
import dataclasses
import inspect
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

# The HTTP backends register "genai" and "openai" in CLIENTS on import.
from rubric_rl.rubrics import llm_backends as _llm_backends  # noqa: F401
from rubric_rl.rubrics.llm_client import (  # noqa: F401  (re-exported API)
    CLIENTS,
    RETRYABLE_STATUS,
    LLMClient,
    LLMEndpointDownError,
    LLMError,
    LLMHTTPError,
    LLMRequest,
    LLMResponse,
    LLMTruncatedError,
    LLMUnavailableError,
    Secret,
    UsageCounters,
    api_key_from_env,
    parse_json_text,
    run_sync,
    strip_json_fence,
)
from rubric_rl.rubrics.types import Message

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    """A versioned chat prompt of an LLM role (reflection, tagger, coach): editing a prompt
    means a new version, never an in-place change."""

    name: str
    version: int
    system: str
    user: str

    @property
    def key(self) -> str:
        return f"{self.name}@v{self.version}"


def make_client(kind: str, **cfg: Any) -> LLMClient:
    """``make_client("openai", model=..., base_url=...)``; kinds: genai, openai, local."""
    return CLIENTS.get(kind)(**cfg)


def client_from_settings(own: Any, fallback: Any, *, where: str = "judge.llm") -> LLMClient:
    """A client from a config section's ``backend`` / ``model`` / ``base_url`` (and, for
    ``openai``, ``api_key_env``), each empty field taken from ``fallback`` (e.g.
    ``config.judge.llm``), with the fallback's ``timeout_s`` and ``max_retry_s``: ARISE's
    reflection and HarnessRL's evolver. ``where`` names ``fallback`` in errors."""
    backend = own.backend or fallback.backend
    kw: dict[str, Any] = {"model": own.model or fallback.model}
    base_url = own.get("base_url") or fallback.get("base_url")
    if base_url:
        kw["base_url"] = base_url
    if backend == "openai":
        kw["api_key_env"] = own.get("api_key_env") or fallback.api_key_env
    if backend in ("openai", "genai"):
        kw.update(_retry_settings(fallback, where))
    return make_client(backend, **kw)


def judge_client(llm: Any, *, where: str = "judge.llm") -> LLMClient:
    """The judge's client from ``config.judge.llm``: every HTTP setting passed to either backend
    (``base_url``, ``timeout_s``, ``max_retry_s``) and ``concurrency`` calls in flight."""
    concurrency = int(llm.concurrency)
    if concurrency < 1:
        raise ValueError(f"config.{where}.concurrency must be >= 1, got {llm.concurrency}")
    client = client_from_settings(llm, llm, where=where)
    client.allow_concurrency(concurrency)
    return client


def _retry_settings(section: Any, where: str) -> dict[str, float]:
    """``timeout`` / ``max_retry_s`` for an HTTP backend from ``timeout_s`` / ``max_retry_s``."""
    out: dict[str, float] = {}
    for key, kwarg in (("timeout_s", "timeout"), ("max_retry_s", "max_retry_s")):
        value = section.get(key)
        if value is None:
            continue
        if not float(value) > 0:
            raise ValueError(f"config.{where}.{key} must be > 0 seconds, got {value}")
        out[kwarg] = float(value)
    return out


# --------------------------------------------------------------------------------------------
# ``*_env`` settings: the NAME of an environment variable, never its value

# Prefixes of common API keys and tokens (OpenAI / Anthropic, Google, GitHub, Hugging Face, Slack,
# AWS access key ids, GitLab).
_KEY_PREFIXES = ("sk-", "sk_", "AIza", "ya29.", "ghp_", "gho_", "github_pat_", "hf_", "xox")
_KEY_PREFIXES += ("AKIA", "glpat-")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def looks_like_a_key(value: str) -> str | None:
    """Why ``value`` looks like a secret rather than an environment variable's name (None when
    it is a plausible name: letters, digits, underscores, e.g. ``OPENAI_API_KEY``)."""
    prefix = next((p for p in _KEY_PREFIXES if value.startswith(p)), None)
    if prefix is not None:
        return f"it starts with {prefix!r}, as API keys do"
    if not _ENV_NAME.fullmatch(value):
        return "it holds characters no environment variable name has"
    if len(value) >= 24 and "_" not in value and not value.isupper():
        return f"it is {len(value)} mixed-case characters with no underscore"
    return None


def env_settings(config: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every ``(dotted field, value)`` of the config whose key ends in ``_env``."""
    items = config.items() if isinstance(config, Mapping) or hasattr(config, "items") else ()
    for key, value in items:
        field = f"{prefix}{key}"
        if str(key).endswith("_env") and isinstance(value, str | list | tuple):
            yield field, value
        elif isinstance(value, Mapping) or hasattr(value, "items"):
            yield from env_settings(value, f"{field}.")


# The api_key_env settings read only when their section builds a client (_read_env_settings).
_SECTION_ENV_SETTINGS = tuple(f"{s}.llm.api_key_env" for s in ("judge", "arise", "harness"))
_SECTION_ENV_SETTINGS += ("arise_rl.coach_llm.api_key_env",)


def _read_env_settings(config: Any) -> set[str]:
    """Which of ``_SECTION_ENV_SETTINGS`` an openai client of this run reads (``genai`` reads
    GEMINI_API_KEY / GOOGLE_API_KEY): judge.llm's for an LLM judge; for ARISE's reflection and
    HarnessRL's evolver and ARISE-RL's LLM coach their own, or judge.llm's when theirs is empty, as
    ``client_from_settings`` does."""
    judge = config.get("judge")
    if judge is None:
        return set()
    sections = [("judge", judge.llm, judge.get("kind") == "llm")]
    if config.get("arise") is not None:
        sections.append(("arise", config.arise.llm, config.arise.get("reflection") == "llm"))
    if config.get("harness") is not None:
        sections.append(("harness", config.harness.llm, config.harness.get("evolver") == "llm"))
    read = set()
    arise_rl = config.get("arise_rl")
    if arise_rl is not None and arise_rl.get("coach") == "llm":
        own = arise_rl.coach_llm
        if (own.get("backend") or judge.llm.get("backend")) == "openai":
            key = "arise_rl.coach_llm" if own.get("api_key_env") else "judge.llm"
            read.add(f"{key}.api_key_env")
    for name, llm, on in sections:
        if on and (llm.get("backend") or judge.llm.get("backend")) == "openai":
            read.add(f"{name if llm.get('api_key_env') else 'judge'}.llm.api_key_env")
    return read


def check_env_settings(config: Any, environ: Mapping[str, str] | None = None) -> list[str]:
    """Start-up check of every ``*_env`` setting (the NAME of an environment variable holding a
    key). A value that looks like a key itself is a ``ValueError`` naming the field but not the
    value, which must reach no log and no run directory (``validate_config`` runs this before
    ``config.json`` is written). A setting a client will read that names an unset variable is a
    warning; the warnings are logged and returned."""
    environ = os.environ if environ is None else environ
    read = _read_env_settings(config)
    warnings = []
    for field, value in env_settings(config):
        names = [str(n) for n in ([value] if isinstance(value, str) else value) if n]
        for name in names:
            why = looks_like_a_key(name)
            if why is not None:
                raise ValueError(
                    f"config.{field}: takes the NAME of an environment variable, but its value "
                    f"looks like an API key ({why}). Export the key instead (export "
                    f"MY_KEY=<the key>) and set config.{field}=MY_KEY; the value given is not "
                    "written to the run directory"
                )
        if field in _SECTION_ENV_SETTINGS and field not in read:
            continue
        if names and not any(n in environ for n in names):
            message = (
                f"config.{field} names the environment variable {' / '.join(names)}, which is "
                "not set: the client sends no API key (fine for a local server; a hosted one "
                "refuses the calls)"
            )
            logger.warning("%s", message)
            warnings.append(message)
    return warnings


def redact_env_settings(record: Any) -> Any:
    """``record`` (a config as plain dicts, e.g. ``config.json``'s content) with every ``*_env``
    value that looks like a key replaced by a placeholder: a last guard for writers that do not
    run ``check_env_settings`` first."""
    if isinstance(record, Mapping):
        out = {}
        for key, value in record.items():
            if str(key).endswith("_env") and isinstance(value, str) and looks_like_a_key(value):
                value = "<redacted: looked like an API key>"
            elif str(key).endswith("_env") and isinstance(value, list | tuple):
                value = [
                    "<redacted: looked like an API key>"
                    if isinstance(v, str) and looks_like_a_key(v)
                    else v
                    for v in value
                ]
            else:
                value = redact_env_settings(value)
            out[key] = value
        return out
    if isinstance(record, list | tuple):
        return type(record)(redact_env_settings(v) for v in record)
    return record


class LLMRoleError(RuntimeError):
    """An LLM-backed role (tagger, attributor, proposer, reflection) failed too often: the run
    stops, naming the role, rather than training on what its failures left empty."""


class FailureRateStop:
    """The judge's ``max_failure_rate`` for the other LLM roles: over a role's last ``window``
    calls (once ``min_calls`` were made), a failed share above ``max_rate`` raises
    ``LLMRoleError`` naming the role, the share and the latest error. A window, not the whole
    run, so a role that starts failing midway stops within ``window`` calls (ours: 20, at least
    4). The window is part of its role's checkpointed state (``state_dict``), so a resumed run
    stops at the same call as the uninterrupted one instead of forgetting recent failures."""

    def __init__(self, role: str, max_rate: float = 0.5, *, window: int = 20, min_calls: int = 4):
        if not 0 <= float(max_rate) <= 1:
            raise ValueError(f"{role}: max_failure_rate must be in [0, 1], got {max_rate}")
        self.role, self.max_rate = role, float(max_rate)
        self.window, self.min_calls = int(window), int(min_calls)
        self.outcomes: collections.deque[bool] = collections.deque(maxlen=self.window)
        self.last_error: str | None = None

    def record(self, ok: bool, error: str | None = None) -> None:
        self.outcomes.append(bool(ok))
        if not ok:
            self.last_error = error

    def check(self) -> None:
        n, failed = len(self.outcomes), self.outcomes.count(False)
        if n >= self.min_calls and failed / n > self.max_rate:
            raise LLMRoleError(
                f"{self.role}: {failed} of its last {n} calls failed (> max_failure_rate="
                f"{self.max_rate:g}); latest error: {self.last_error}"
            )

    def state_dict(self) -> dict[str, Any]:
        return {"outcomes": list(self.outcomes), "last_error": self.last_error}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """``state`` from ``state_dict``; ``None`` (a checkpoint written before the window was
        saved) starts an empty window."""
        self.outcomes.clear()
        self.last_error = None
        if state:
            self.outcomes.extend(bool(ok) for ok in state["outcomes"])
            self.last_error = state.get("last_error")


ROLES_MAX_FAILURE_RATE_OF_JUDGE = -1.0


def role_max_failure_rate(config: Any) -> float:
    """The failure-rate limit of the LLM roles besides the judge: ``config.llm_roles.
    max_failure_rate``, or the judge's ``judge.max_failure_rate`` where it is -1 (the default:
    one limit for every LLM call unless the roles are given their own)."""
    rate = float(config.llm_roles.max_failure_rate)
    if rate == ROLES_MAX_FAILURE_RATE_OF_JUDGE:
        return float(config.judge.max_failure_rate)
    return rate


class SchemaCaller:
    """Asks a client for one reply under a JSON schema, for a controller that evolves something
    from a model's answers (ARISE's reflection, HarnessRL's attributor and proposer), and counts
    what became of the answers: ``calls`` / ``accepted`` / ``rejected`` and the ``last_error``.
    ``template``: anything with ``system``, ``name`` (the schema's) and ``key`` (its version).
    ``role`` names the caller in ``FailureRateStop``'s error; every ``reject`` and ``accept``
    is one call's outcome there."""

    role = "LLM role"

    def __init__(
        self,
        client: LLMClient,
        *,
        temperature: float,
        max_tokens: int,
        max_failure_rate: float = 0.5,
    ):
        self.client = client
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens)
        self.counts = {"calls": 0, "accepted": 0, "rejected": 0}
        self.last_error: str | None = None
        self.failure_stop = FailureRateStop(self.role, max_failure_rate)

    def ask(self, template: Any, user: str, schema: Mapping[str, Any], seed: int) -> str:
        """The reply's text; a client failure is ``LLMError`` with the template's key first."""
        self.counts["calls"] += 1
        req = LLMRequest(
            messages=(Message("system", template.system), Message("user", user)),
            temperature=self.temperature, max_tokens=self.max_tokens, json_schema=schema,
            seed=int(seed), schema_name=template.name,
        )  # fmt: skip
        try:
            return self.client.generate_sync(req).text
        except LLMError as e:
            raise LLMError(f"{template.key}: client error: {e}") from e

    def reject(self, why: str) -> None:
        """One call whose reply was unusable (client error or invalid); raises ``LLMRoleError``
        when the role's failure rate is past its limit."""
        self.counts["rejected"] += 1
        self.last_error = why
        self.failure_stop.record(False, why)
        self.failure_stop.check()

    def accept(self, n: int = 1) -> None:
        """One call whose reply was used; ``n`` of its items accepted."""
        self.counts["accepted"] += int(n)
        self.failure_stop.record(True)

    def stats(self) -> dict[str, int]:
        return dict(self.counts)

    def state_dict(self) -> dict[str, Any]:
        return {
            "counts": dict(self.counts),
            "last_error": self.last_error,
            "failure_stop": self.failure_stop.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.counts = {k: int(state["counts"][k]) for k in self.counts}
        self.last_error = state.get("last_error")
        self.failure_stop.load_state_dict(state.get("failure_stop"))


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
