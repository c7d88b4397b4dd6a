"""A scripted fake LLM provider on 127.0.0.1 speaking two wire formats.

- OpenAI: ``POST .../chat/completions`` → ``{"choices":[{"message":{"content"},"finish_reason"}],
  "usage":{"prompt_tokens","completion_tokens"},"model"}``; errors ``{"error":{"message",...}}``.
- Gemini (as google-genai 3.6.1 sends it): ``POST .../models/{model}:generateContent`` with
  ``contents``/``systemInstruction``/``generationConfig`` → ``{"candidates":[{"content":{"role":
  "model","parts":[{"text"}]},"finishReason"}],"usageMetadata":{...},"modelVersion"}``; errors
  ``{"error":{"code","message","status"}}``.

Tests queue ``Reply`` objects (``server.push(...)``); when the queue is empty the ``default``
callable answers (it sees the request, e.g. to grade whichever criteria the prompt names).
Every request is recorded in ``server.requests``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_GEMINI_STATUS = {
    400: "INVALID_ARGUMENT",
    408: "DEADLINE_EXCEEDED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


@dataclasses.dataclass
class Reply:
    """What the fake provider does for one request.

    ``text``: the model's output, wrapped in the requester's format; ``finish``: "stop" or
    "length" (→ ``STOP`` / ``MAX_TOKENS`` for Gemini); ``status`` != 200 gives an error body;
    ``delay``: seconds to sleep first (beyond the client's timeout = a timeout); ``raw``: send
    these bytes as the body, bypassing the envelope.
    """

    text: str | None = "{}"
    finish: str = "stop"
    status: int = 200
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    delay: float = 0.0
    raw: bytes | None = None
    error_details: list[dict[str, Any]] | None = None  # Gemini error "details" (e.g. RetryInfo)
    prompt_tokens: int = 20
    completion_tokens: int = 10


@dataclasses.dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    time: float

    @property
    def wire(self) -> str:
        return "gemini" if ":generateContent" in self.path else "openai"

    @property
    def prompt_text(self) -> str:
        """All prompt text (system + turns) regardless of the wire format."""
        if self.wire == "openai":
            return "\n".join(m["content"] for m in self.body.get("messages", []))
        parts = []
        system = self.body.get("systemInstruction")
        for content in ([system] if system else []) + self.body.get("contents", []):
            parts.extend(p.get("text", "") for p in content.get("parts", []))
        return "\n".join(parts)


# A fenced quote of policy text (rubric_rl.rubrics.prompts.fence): markers with the same id.
FENCED = re.compile(r"<(\w+) id=([0-9a-f]{16})>\n.*?\n</\1 id=\2>", flags=re.DOTALL)


def fenced_texts(prompt: str) -> list[str]:
    """The policy texts a prompt quotes between fence markers, in prompt order."""
    return [m.group(0).split("\n", 1)[1].rsplit("\n", 1)[0] for m in FENCED.finditer(prompt)]


def criterion_names(prompt: str) -> list[str]:
    """The criterion names a rubric judge prompt asks about, in prompt order: its ``- name:``
    lines outside any fenced quote, as a model that keeps to the prompt's stated rule reads it
    (a v1 prompt has no fence: a response's own ``- name:`` lines count)."""
    outside = FENCED.sub("", prompt)
    return [json.loads(m) for m in re.findall(r'^- name: (".*")$', outside, flags=re.MULTILINE)]


def verdicts_json(decisions: list[tuple[str, str]], *, fenced: bool = False) -> str:
    body = json.dumps(
        {"verdicts": [{"name": n, "reason": f"because {n}", "verdict": v} for n, v in decisions]}
    )
    return f"```json\n{body}\n```" if fenced else body


def judge_responder(decide: Callable[[str], str] = lambda name: "yes") -> Callable:
    """A default handler that grades every criterion named in the prompt with ``decide(name)``."""

    def handler(request: Request) -> Reply:
        names = criterion_names(request.prompt_text)
        return Reply(text=verdicts_json([(n, decide(n)) for n in names]))

    return handler


class _Server(ThreadingHTTPServer):
    # The default backlog (5) drops connection attempts of a burst, which the client's TCP stack
    # retries a second later: tests of 32 calls in flight need room for them.
    request_queue_size = 128


class LoopbackLLMServer:
    def __init__(self, default: Callable[[Request], Reply] | None = None):
        self.default = default or judge_responder()
        self.queue: collections.deque[Reply] = collections.deque()
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 (http.server naming)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"_unparsed": raw.decode("utf-8", "replace")}
                req = Request(self.path, dict(self.headers), body, time.monotonic())
                with owner._lock:
                    owner.requests.append(req)
                    reply = owner.queue.popleft() if owner.queue else None
                if reply is None:
                    reply = owner.default(req)
                if reply.delay:
                    time.sleep(reply.delay)
                payload = reply.raw if reply.raw is not None else owner._envelope(req, reply)
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout): that is the point of the delay

            def log_message(self, *args):
                pass

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def push(self, *replies: Reply) -> None:
        with self._lock:
            self.queue.extend(replies)

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def _envelope(self, req: Request, reply: Reply) -> bytes:
        if reply.status != 200:
            if req.wire == "gemini":
                err = {
                    "code": reply.status,
                    "message": f"injected {reply.status}",
                    "status": _GEMINI_STATUS.get(reply.status, "UNKNOWN"),
                }
                if reply.error_details is not None:
                    err["details"] = reply.error_details
            else:
                err = {"message": f"injected {reply.status}", "type": "server_error", "code": None}
            return json.dumps({"error": err}).encode()
        if req.wire == "gemini":
            model = req.path.rsplit("/models/", 1)[-1].split(":")[0]
            parts = [] if reply.text is None else [{"text": reply.text}]
            out = {
                "candidates": [
                    {
                        "content": {"role": "model", "parts": parts},
                        "finishReason": "MAX_TOKENS" if reply.finish == "length" else "STOP",
                        "index": 0,
                    }
                ],
                "usageMetadata": {
                    "promptTokenCount": reply.prompt_tokens,
                    "candidatesTokenCount": reply.completion_tokens,
                    "totalTokenCount": reply.prompt_tokens + reply.completion_tokens,
                },
                "modelVersion": f"{model}-loopback",
            }
        else:
            out = {
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "model": req.body.get("model", "unknown"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": reply.text},
                        "finish_reason": reply.finish,
                    }
                ],
                "usage": {
                    "prompt_tokens": reply.prompt_tokens,
                    "completion_tokens": reply.completion_tokens,
                    "total_tokens": reply.prompt_tokens + reply.completion_tokens,
                },
            }
        return json.dumps(out).encode()

    def __enter__(self) -> LoopbackLLMServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
