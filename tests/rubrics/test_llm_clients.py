"""LLM client backends against the loopback provider (real google-genai / httpx on the wire)."""

import asyncio
import logging
import time

import pytest

from rubric_rl.rubrics import llm, llm_backends
from rubric_rl.rubrics.llm import (
    LLMEndpointDownError,
    LLMError,
    LLMHTTPError,
    LLMRequest,
    LLMTruncatedError,
    LLMUnavailableError,
    LocalEngineClient,
    make_client,
)
from rubric_rl.rubrics.llm_backends import GenAIClient, OpenAIClient
from rubric_rl.rubrics.types import Message
from tests.rubrics import loopback as lb

Reply = lb.Reply

SECRET = "sk-test-SECRET-0123456789abcdef"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture
def server():
    with lb.LoopbackLLMServer(default=lambda req: Reply(text='{"a": 1}')) as s:
        yield s


@pytest.fixture(autouse=True)
def _keys(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("GEMINI_API_KEY", SECRET)


# A generous timeout: on a loaded CI machine a first request can take over a second, and a
# spurious client timeout would be retried into the server's default reply. Tests of the
# timeout path pass their own short timeout.
CLIENT_TIMEOUT_S = 10.0


def make(kind, server, **kw):
    if kind == "openai":
        cfg = dict(model="judge-test", base_url=server.url + "/v1", timeout=CLIENT_TIMEOUT_S)
        cfg.update(max_attempts=3, initial_delay=0.01, max_delay=0.05)
    else:
        cfg = dict(model="gemini-test", base_url=server.url, timeout=CLIENT_TIMEOUT_S)
        cfg.update(attempts=3, initial_delay=0.01, max_delay=0.05, jitter=0.0)
    cfg.update(kw)
    return make_client(kind, **cfg)


def request(**kw):
    msgs = (Message("system", "be terse"), Message("user", "say a=1"))
    return LLMRequest(messages=msgs, temperature=0.3, max_tokens=64, seed=7, **kw)


def test_openai_wire_format(server):
    client = make("openai", server)
    server.push(Reply(text='{"a": 3}', prompt_tokens=12, completion_tokens=5))
    out = client.generate_sync(request(json_schema=SCHEMA, schema_name="s"))
    assert (out.text, out.parsed, out.finish_reason, out.model) == (
        '{"a": 3}',
        {"a": 3},
        "stop",
        "judge-test",
    )
    assert dict(out.usage) == {"prompt_tokens": 12, "completion_tokens": 5}
    (req,) = server.requests
    assert req.path == "/v1/chat/completions"
    assert req.headers["Authorization"] == f"Bearer {SECRET}"
    body = req.body
    assert body["messages"] == [
        {"role": "system", "content": "be terse"},
        {"role": "user", "content": "say a=1"},
    ]
    assert (body["model"], body["temperature"], body["max_tokens"], body["seed"]) == (
        "judge-test",
        0.3,
        64,
        7,
    )
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "s", "schema": SCHEMA, "strict": True},
    }
    snap = client.counters.snapshot()
    assert (snap["calls"], snap["prompt_tokens"], snap["completion_tokens"]) == (1, 12, 5)


def test_genai_wire_format(server):
    client = make("genai", server)
    server.push(Reply(text='{"a": 4}', prompt_tokens=9, completion_tokens=2))
    out = client.generate_sync(request(json_schema=SCHEMA))
    assert (out.text, out.parsed, out.finish_reason) == ('{"a": 4}', {"a": 4}, "STOP")
    assert out.model == "gemini-test-loopback"
    assert dict(out.usage) == {"prompt_tokens": 9, "completion_tokens": 2}
    (req,) = server.requests
    assert req.path.endswith("/models/gemini-test:generateContent")
    assert req.headers["x-goog-api-key"] == SECRET
    assert req.body["contents"] == [{"role": "user", "parts": [{"text": "say a=1"}]}]
    assert req.body["systemInstruction"]["parts"] == [{"text": "be terse"}]
    gen = req.body["generationConfig"]
    assert gen["responseMimeType"] == "application/json"
    assert gen["responseJsonSchema"] == SCHEMA
    assert (gen["temperature"], gen["maxOutputTokens"], gen["seed"]) == (0.3, 64, 7)


@pytest.mark.parametrize("kind", ["openai", "genai"])
def test_retry_after_is_honoured(server, kind):
    client = make(kind, server)
    server.push(Reply(status=429, headers={"Retry-After": "1"}), Reply(text='{"a": 2}'))
    t0 = time.monotonic()
    out = client.generate_sync(request())
    elapsed = time.monotonic() - t0
    assert out.text == '{"a": 2}'
    assert server.count == 2
    gap = server.requests[1].time - server.requests[0].time
    assert gap >= 1.0 and elapsed >= 1.0
    assert client.counters.retries == 1 and client.counters.failures == 0


def test_genai_retry_info_delay_is_honoured(server):
    client = make("genai", server)
    info = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "0.6s"}
    server.push(Reply(status=429, error_details=[info]), Reply(text='{"a": 2}'))
    assert client.generate_sync(request()).text == '{"a": 2}'
    assert server.count == 2
    assert server.requests[1].time - server.requests[0].time >= 0.6


@pytest.mark.parametrize("kind", ["openai", "genai"])
def test_429_retries_exhausted(server, kind):
    client = make(kind, server)
    server.push(*[Reply(status=429, headers={"Retry-After": "0"})] * 3)
    with pytest.raises(LLMHTTPError, match="429"):
        client.generate_sync(request())
    assert server.count == 3 and client.counters.retries == 2


def test_openai_retry_after_ms_and_http_date():
    assert llm_backends._retry_after_seconds({"retry-after-ms": "250"}) == 0.25
    assert llm_backends._retry_after_seconds({"retry-after": "2"}) == 2.0
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 <= llm_backends._retry_after_seconds({"retry-after": date}) <= 31
    assert llm_backends._retry_after_seconds({}) is None


@pytest.mark.parametrize("kind", ["openai", "genai"])
def test_retry_after_too_long_fails_fast(server, kind):
    client = make(kind, server, max_retry_after=5.0)
    server.push(Reply(status=429, headers={"Retry-After": "3600"}))
    t0 = time.monotonic()
    with pytest.raises(LLMHTTPError, match="too long"):
        client.generate_sync(request())
    assert time.monotonic() - t0 < 2 and server.count == 1


@pytest.mark.parametrize("kind", ["openai", "genai"])
def test_5xx_retried_then_success(server, kind):
    client = make(kind, server)
    server.push(Reply(status=500), Reply(status=503), Reply(text='{"a": 5}'))
    assert client.generate_sync(request()).text == '{"a": 5}'
    assert server.count == 3


@pytest.mark.parametrize("kind", ["openai", "genai"])
def test_an_endpoint_answering_only_5xx_is_marked_down_but_a_rate_limit_is_not(server, kind):
    client = make(kind, server)
    server.push(*[Reply(status=503)] * 3)
    with pytest.raises(LLMUnavailableError, match="503"):
        client.generate_sync(request())
    with pytest.raises(LLMEndpointDownError, match="marked down"):
        client.generate_sync(request())  # at once, without a request
    assert server.count == 3
    client = make(kind, server)
    server.push(*[Reply(status=429)] * 3, Reply(text="ok"))
    with pytest.raises(LLMHTTPError, match="429") as e:
        client.generate_sync(request())
    assert not isinstance(e.value, LLMUnavailableError)  # busy, not down: the next call goes
    assert client.generate_sync(request()).text == "ok" and server.count == 7


@pytest.mark.parametrize("kind", ["openai", "genai"])
def test_retries_exhausted_is_an_error(server, kind):
    client = make(kind, server)
    server.push(*[Reply(status=500)] * 3)
    with pytest.raises(LLMHTTPError, match="500"):
        client.generate_sync(request())
    assert server.count == 3  # attempts = 3, no more
    assert client.counters.failures == 1


@pytest.mark.parametrize("kind", ["openai", "genai"])
def test_400_is_not_retried(server, kind):
    client = make(kind, server)
    server.push(Reply(status=400))
    with pytest.raises(LLMHTTPError) as err:
        client.generate_sync(request())
    assert err.value.status == 400 and server.count == 1


@pytest.mark.parametrize("kind", ["openai", "genai"])
def test_timeout_is_retried(server, kind):
    # The first reply comes long after the client's timeout; the retry is answered at once.
    client = make(kind, server, timeout=1.0)
    server.push(Reply(text='{"a": 0}', delay=5.0), Reply(text='{"a": 6}'))
    assert client.generate_sync(request()).text == '{"a": 6}'
    assert server.count == 2


@pytest.mark.parametrize("kind", ["openai", "genai"])
def test_truncation_is_a_failure(server, kind):
    client = make(kind, server)
    server.push(Reply(text='{"a": ', finish="length"))
    with pytest.raises(LLMTruncatedError):
        client.generate_sync(request(json_schema=SCHEMA))
    assert server.count == 1 and client.counters.failures == 1


def test_genai_no_text_is_a_failure(server):
    client = make("genai", server)
    server.push(Reply(text=None))
    with pytest.raises(LLMError, match="no text"):
        client.generate_sync(request())


@pytest.mark.parametrize("kind", ["openai", "genai"])
def test_fenced_json_is_parsed(server, kind):
    client = make(kind, server)
    server.push(Reply(text='```json\n{"a": 8}\n```'))
    assert client.generate_sync(request(json_schema=SCHEMA)).parsed == {"a": 8}


@pytest.mark.parametrize("kind", ["openai", "genai"])
def test_api_key_never_in_reprs_errors_or_logs(server, kind, caplog):
    caplog.set_level(logging.DEBUG)
    client = make(kind, server)
    server.push(*[Reply(status=500)] * 3, Reply(status=400))
    errors = []
    for _ in range(2):
        try:
            client.generate_sync(request())
        except LLMError as e:
            errors.append(e)
    assert len(errors) == 2
    # the key is really used on the wire ...
    assert any(SECRET in str(v) for v in server.requests[0].headers.values())
    # ... and nowhere else
    texts = [repr(client), str(client), caplog.text] + [str(e) for e in errors]
    texts += [repr(e) for e in errors] + [str(vars(client))]
    assert all(SECRET not in t for t in texts)


def test_scrub_replaces_a_leaked_key():
    async def leaky(messages, params):
        raise RuntimeError(f"backend echoed {SECRET}")

    client = LocalEngineClient(leaky)
    client._secret = llm.Secret(SECRET)
    with pytest.raises(LLMError) as err:
        client.generate_sync(request())
    assert SECRET not in str(err.value) and "***" in str(err.value)


def test_missing_key_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("GEMINI_API_KEY")
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    with pytest.raises(LLMError, match="GEMINI_API_KEY"):
        GenAIClient(model="m")
    monkeypatch.setenv("MY_JUDGE_KEY", "k-123")
    assert GenAIClient(model="m", api_key_env="MY_JUDGE_KEY")._secret.reveal() == "k-123"


def test_local_engine_sync_and_async_callables():
    seen = []

    def engine(messages, params):
        seen.append((messages, params))
        return '{"a": 9}', {"prompt_tokens": 3, "completion_tokens": 4}

    async def aengine(messages, params):
        return "plain"

    c = make_client("local", fn=engine, model="tiny")
    out = c.generate_sync(request(json_schema=SCHEMA))
    assert (out.text, out.parsed, out.model) == ('{"a": 9}', {"a": 9}, "tiny")
    assert seen[0][0][1] == {"role": "user", "content": "say a=1"}
    assert seen[0][1] == {"temperature": 0.3, "max_tokens": 64, "seed": 7, "json_schema": SCHEMA}
    assert c.counters.completion_tokens == 4
    assert LocalEngineClient(aengine).generate_sync(request()).text == "plain"
    truncating = LocalEngineClient(lambda m, p: ("{", {"finish_reason": "length"}))
    with pytest.raises(LLMTruncatedError):
        truncating.generate_sync(request())


def test_global_concurrency_limit_is_shared_by_all_callers():
    state = {"now": 0, "max": 0}

    async def engine(messages, params):
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        await asyncio.sleep(0.02)
        state["now"] -= 1
        return "ok"

    client = LocalEngineClient(engine, max_concurrency=3)

    async def main():
        await asyncio.gather(*(client.generate(request()) for _ in range(12)))

    asyncio.run(main())
    assert state["max"] == 3 and client.counters.calls == 12


def test_cost_counters():
    client = LocalEngineClient(
        lambda m, p: ("x", {"prompt_tokens": 1000, "completion_tokens": 500}),
        price_prompt_per_1k=0.5,
        price_completion_per_1k=2.0,
    )
    for _ in range(2):
        client.generate_sync(request())
    snap = client.counters.snapshot()
    assert snap["calls"] == 2 and snap["prompt_tokens"] == 2000
    assert snap["cost"] == pytest.approx(2 * (0.5 + 1.0))


def test_generate_sync_inside_a_running_loop():
    client = LocalEngineClient(lambda m, p: "inner")

    async def main():
        return client.generate_sync(request())

    assert asyncio.run(main()).text == "inner"


def test_registry_of_backends():
    assert {"genai", "openai", "local"} <= set(llm.CLIENTS.names())
    assert isinstance(make_client("openai", model="m"), OpenAIClient)
    with pytest.raises(KeyError, match="unknown llm client 'nope'"):
        make_client("nope")
