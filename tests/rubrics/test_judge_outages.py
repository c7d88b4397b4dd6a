"""Judge outages on real local sockets: a refused port fails fast naming the backend, URL and
cause; a server that accepts and never answers is bounded by ``judge.llm.max_retry_s``; an
endpoint found down is not hammered; ``judge.llm.concurrency`` above 16 is honoured; the genai
backend goes to ``base_url`` with ``timeout_s``."""

import socket
import threading
import time

import pytest

from configs import grpo
from rubric_rl.config.builders import build_judge
from rubric_rl.rubrics.judges import JudgeItem, LLMJudge
from rubric_rl.rubrics.llm import (
    LLMEndpointDownError,
    LLMRequest,
    LLMUnavailableError,
    judge_client,
)
from rubric_rl.rubrics.types import Criterion, Message, Rubric, Task
from rubric_rl.services import ComponentError, Services
from tests.rubrics import loopback as lb

CRITERIA = tuple(Criterion(f"c{i}", f"Criterion number {i}.", weight=1.0) for i in range(8))
TASK = Task("t-outage", (Message("user", "Say something."),), Rubric(CRITERIA))


@pytest.fixture(autouse=True)
def _keys(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-outage-test-key")
    monkeypatch.setenv("GEMINI_API_KEY", "g-outage-test-key")


def free_port() -> int:
    """A port on 127.0.0.1 that nobody listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SilentServer:
    """Accepts connections and reads them, never answers: a hung judge server."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        self.conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        self.sock.settimeout(0.05)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)  # held open, never written to

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        for c in self.conns:
            c.close()
        self.sock.close()


def judge_config(base_url: str, **llm):
    c = grpo.get_config("smoke")
    c.judge.kind = "llm"
    c.judge.retries = 2
    c.judge.llm.model = "judge-test"
    c.judge.llm.base_url = base_url
    for k, v in llm.items():
        c.judge.llm[k] = v
    return c


def request():
    return LLMRequest(messages=(Message("user", "hi"),), max_tokens=16)


# ---------------------------------------------------------------------------------------------
# Refused connections


@pytest.mark.parametrize("backend", ["openai", "genai"])
def test_refused_connection_fails_fast_naming_backend_url_and_cause(backend):
    url = f"http://127.0.0.1:{free_port()}" + ("/v1" if backend == "openai" else "")
    client = judge_client(judge_config(url, backend=backend).judge.llm)
    if backend == "genai":
        import google.genai  # noqa: F401  (its first import, seconds on a loaded machine, is not the timeout)
    t0 = time.monotonic()
    with pytest.raises(LLMUnavailableError) as err:
        client.generate_sync(request())
    assert time.monotonic() - t0 < 3.0
    msg = str(err.value)
    assert msg.startswith(f"{backend} backend at {url}"), msg
    assert "connection refused" in msg and "timeout" not in msg, msg


def test_refused_judge_step_error_names_the_llm_judge_and_url(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    config = judge_config(url)
    judge = build_judge(config, str(tmp_path))
    services = Services(config, None, None, judge, None, str(tmp_path), None)
    t0 = time.monotonic()
    with pytest.raises(ComponentError) as err:
        services.judge([TASK] * 4, [["an answer"] * 8] * 4)
    elapsed = time.monotonic() - t0
    assert elapsed < 5.0, elapsed  # was 115 s: 5 HTTP tries x 3 judge tries with back-off
    msg = str(err.value)
    assert f"LLMJudge(openai backend at {url}/chat/completions)" in msg, msg
    assert "256/256 verdicts failed" in msg and "connection refused" in msg, msg
    assert "after 120s timeout" not in msg


# ---------------------------------------------------------------------------------------------
# A server that never answers


def test_silent_server_is_bounded_by_max_retry_s_and_then_not_hammered():
    with SilentServer() as server:
        llm = judge_config(server.url + "/v1", timeout_s=0.5, max_retry_s=2.0).judge.llm
        client = judge_client(llm)
        judge = LLMJudge(client, criteria_per_call=1, max_retries=2, concurrency=8)
        t0 = time.monotonic()
        (row,) = judge.score([JudgeItem(TASK, "an answer")])
        elapsed = time.monotonic() - t0
        # 8 verdicts in parallel, each bounded by max_retry_s (was 3 judge tries x 5 HTTP tries
        # x timeout plus back-off); a failure, never a score of 0.
        assert elapsed < 2.0 + 1.5, elapsed
        assert [v.met for v in row] == [None] * 8
        for v in row:
            assert "max_retry_s=2s" in v.error and server.url in v.error, v.error
            assert v.error.startswith("attempt 1:")  # not re-asked: the endpoint is down
        accepted = server.accepted
        assert accepted <= 8 * 2  # two timed-out attempts per verdict at most
        # Known down: the next call fails at once without touching the server, naming the cause.
        t0 = time.monotonic()
        with pytest.raises(LLMEndpointDownError, match="max_retry_s=2s"):
            client.generate_sync(request())
        assert time.monotonic() - t0 < 0.5
        assert server.accepted == accepted


def test_endpoint_is_tried_again_after_the_cooldown():
    with lb.LoopbackLLMServer(default=lambda req: lb.Reply(text="ok")) as up:
        client = judge_client(judge_config(f"http://127.0.0.1:{free_port()}/v1").judge.llm)
        client.down_cooldown_s = 0.5
        with pytest.raises(LLMUnavailableError):
            client.generate_sync(request())
        client.base_url = up.url + "/v1"  # the server comes back
        with pytest.raises(LLMEndpointDownError):
            client.generate_sync(request())
        assert up.count == 0
        time.sleep(0.6)
        assert client.generate_sync(request()).text == "ok"
        assert up.count == 1


# ---------------------------------------------------------------------------------------------
# Concurrency and the genai backend's settings


def test_judge_concurrency_above_16_is_honoured(tmp_path):
    cond, state = threading.Condition(), {"now": 0, "peak": 0}

    def slow(req):
        # Each call holds its slot until 32 are in flight at once (or 10 s pass): a fixed sleep
        # let a loaded machine start the last calls after the first had finished (peak 27).
        with cond:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
            cond.notify_all()
            cond.wait_for(lambda: state["peak"] >= 32, timeout=10.0)
            state["now"] -= 1
        return lb.judge_responder()(req)

    criteria = tuple(Criterion(f"k{i}", f"Criterion {i}.") for i in range(32))
    task = Task("t-many", (Message("user", "q"),), Rubric(criteria))
    with lb.LoopbackLLMServer(default=slow) as server:
        config = judge_config(server.url + "/v1", concurrency=32)
        judge = build_judge(config, str(tmp_path))
        (row,) = judge.score([JudgeItem(task, "an answer")])
    assert all(v.met is True for v in row)
    assert state["peak"] == 32, state


@pytest.mark.parametrize("through", ["judge_client", "build_judge"])
def test_genai_backend_uses_base_url_and_timeout(through, tmp_path):
    with lb.LoopbackLLMServer(default=lambda req: lb.Reply(text="late", delay=3.0)) as server:
        config = judge_config(server.url, backend="genai", timeout_s=1.0, max_retry_s=1.5)
        if through == "judge_client":
            client = judge_client(config.judge.llm)
        else:  # what a run builds from its config
            client = build_judge(config, str(tmp_path)).fallback.client
        import google.genai  # noqa: F401  (imported before the clock starts)

        t0 = time.monotonic()
        with pytest.raises(LLMUnavailableError, match="genai backend at " + server.url):
            client.generate_sync(request())
        assert time.monotonic() - t0 < 3.0
        assert server.count >= 1 and server.requests[0].wire == "gemini"


def test_bad_retry_settings_name_the_field():
    with pytest.raises(ValueError, match=r"config\.judge\.llm\.max_retry_s must be > 0"):
        judge_client(judge_config("http://127.0.0.1:1/v1", max_retry_s=0.0).judge.llm)
    with pytest.raises(ValueError, match=r"config\.judge\.llm\.timeout_s must be > 0"):
        judge_client(judge_config("http://127.0.0.1:1/v1", timeout_s=-1.0).judge.llm)
