"""The chat client: SSE parsing, retry policy, limits, preflight and secrecy, over real HTTP on
127.0.0.1 against the simulator (and, where a provider must misbehave in one exact way, a tiny
aiohttp app written here)."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import Decimal
from email.utils import formatdate
from typing import Any

import orjson
import pytest
from aiohttp import web

from eyrie.jobs.api import ApiUnreachable, AuthError, ChatClient, InsufficientCredits, RequestFailed
from eyrie.jobs.api.errors import Retryable
from eyrie.jobs.api.limits import TokenBucket, backoff_delay, is_loopback, parse_retry_after
from eyrie.jobs.api.sse import SSEAccumulator, parse_completion
from eyrie.jobs.simulator import SimulatorServer

KEY = "sk-or-v1-eyrie-test-secret-0123456789abcdef"
StartSim = Callable[..., Awaitable[SimulatorServer]]

TOOLS = [{"type": "function", "function": {
    "name": "search", "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 50},
        "filters": {"type": "object", "properties": {"lang": {"enum": ["en", "de"]}}, "required": ["lang"]}},
        "required": ["query", "filters"]}}}]


def body(i: int, **extra: Any) -> dict[str, Any]:
    return {"model": "acme/model", "messages": [{"role": "user", "content": f"Tell me about item {i}."}],
            "max_tokens": 300, **extra}


def client(url: str, **kw: Any) -> ChatClient:
    opts: dict[str, Any] = {"timeout": 5.0, "max_retries": 8, "max_concurrency": 16, "backoff_base": 0.002,
                            "backoff_max": 0.05}
    opts.update(kw)
    key = opts.pop("api_key", None)
    return ChatClient(url, key, **opts)


@pytest.fixture
async def app_server() -> AsyncIterator[Callable[[web.Application], Awaitable[str]]]:
    """A hand-written provider on 127.0.0.1; returns its base URL."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}/v1"

    yield start
    for r in runners:
        await r.cleanup()


# ---------------------------------------------------------------------------------------- SSE


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    doc = {"id": "gen-1", "provider": "P", "model": "m", "object": "chat.completion.chunk",
           "choices": choices, **extra}
    return b"data: " + orjson.dumps(doc) + b"\n\n"


STREAM = b"".join([
    b": OPENROUTER PROCESSING\r\n\r\n",
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"reasoning": "Think "}),
    _chunk({"reasoning_content": "h\u00e4rd."}),
    b": OPENROUTER PROCESSING\n\n",
    b"event: message\nid: 7\nretry: 10\n",
    _chunk({"content": "Caf\u00e9 "}),
    _chunk({"content": "\u6771\u4eac"}),
    _chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                            "function": {"name": "search", "arguments": ""}}]}),
    _chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                            "function": {"name": "open", "arguments": "{\"u"}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"q\": "}}]}),
    _chunk({"tool_calls": [{"index": 1, "function": {"arguments": "rl\":1}"}}]}),
    # one event split over two data lines (the SSE spec joins them with a newline)
    b'data: {"id": "gen-1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,\ndata: '
    b'"function": {"arguments": " \\"x\\"}"}}]}}]}\n\n',
    _chunk({}, "tool_calls"),
    _chunk(None, usage={"prompt_tokens": 3, "completion_tokens": 9, "cost": 1.5e-05}),
    b"data: [DONE]\n\n",
])
EXPECTED = {"id": "gen-1", "provider": "P", "model": "m", "finish_reason": "tool_calls",
            "reasoning": "Think h\u00e4rd.", "content": "Caf\u00e9 \u6771\u4eac",
            "tool_calls": [{"id": "call_a", "type": "function",
                            "function": {"name": "search", "arguments": "{\"q\":  \"x\"}"}},
                           {"id": "call_b", "type": "function",
                            "function": {"name": "open", "arguments": "{\"url\":1}"}}]}


@pytest.mark.parametrize("step", [1, 2, 7, 64, len(STREAM)])
def test_sse_assembles_any_byte_split(step: int) -> None:
    acc = SSEAccumulator()
    for i in range(0, len(STREAM), step):
        acc.feed(STREAM[i:i + step])
    resp, usage = acc.finish()
    assert resp == EXPECTED
    assert usage == {"prompt_tokens": 3, "completion_tokens": 9, "cost": 1.5e-05}
    assert acc.done


def test_sse_failures_are_classified() -> None:
    def run(*parts: bytes) -> str:
        acc = SSEAccumulator()
        with pytest.raises(Retryable) as e:
            for p in parts:
                acc.feed(p)
            acc.finish()
        return e.value.kind

    assert run(_chunk({"content": "a"})) == "dropped-stream"  # no finish_reason, no [DONE]
    assert run(b": OPENROUTER PROCESSING\n\n") == "dropped-stream"
    assert run(_chunk(None), b"data: [DONE]\n\n") == "empty-choices"
    assert run(_chunk({"content": "a"}), b'data: {"choices": [{"delta": {"cont\n\n') == "malformed-json"
    err = _chunk({"content": ""}, "error", error={"code": 502, "message": "upstream died"})
    assert run(_chunk({"content": "a"}), err) == "error-body"
    assert run(_chunk({"content": "a"}, "error")) == "error-body"
    with pytest.raises(InsufficientCredits, match="out of credits"):
        SSEAccumulator().feed(_chunk(None, error={"code": 402, "message": "out of credits"}))
    # an answer whose [DONE] was lost after finish_reason is complete: not re-bought
    acc = SSEAccumulator()
    acc.feed(_chunk({"content": "ok"}) + _chunk({}, "stop")[:-2])  # last event lacks its blank line
    assert acc.finish()[0]["content"] == "ok"


def test_parse_completion_normalises_like_the_stream() -> None:
    doc = {"id": "gen-1", "provider": "P", "model": "m", "choices": [{"index": 0, "finish_reason": "tool_calls",
           "logprobs": {"content": [{"token": "a", "logprob": -0.1}]},
           "message": {"role": "assistant", "content": "", "reasoning_content": "r",
                       "tool_calls": [{"id": "c1", "type": "function", "index": 0,
                                       "function": {"name": "f", "arguments": {"a": 1}}}]}}],
           "usage": {"cost": 0.25}}
    resp, usage = parse_completion(doc)
    assert resp == {"id": "gen-1", "provider": "P", "model": "m", "finish_reason": "tool_calls",
                    "reasoning": "r", "content": None, "logprobs": {"content": [{"token": "a", "logprob": -0.1}]},
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}]}
    assert usage == {"cost": 0.25}
    for bad, kind in (({"choices": []}, "empty-choices"), ([], "malformed-json"),
                      ({"error": {"code": 429, "message": "slow down"}}, "error-body")):
        with pytest.raises(Retryable) as e:
            parse_completion(bad)
        assert e.value.kind == kind
    with pytest.raises(InsufficientCredits):
        parse_completion({"error": {"code": "402", "message": "pay"}})


# --------------------------------------------------------------------------------- pure helpers


def test_retry_after_parsing_and_backoff_bounds() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0 ") == 0.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    now = 1_700_000_000.0
    assert parse_retry_after(formatdate(now + 30, usegmt=True), now=now) == 30.0
    assert parse_retry_after(formatdate(now - 30, usegmt=True), now=now) == 0.0
    assert backoff_delay(1, 0.5, 60, None, rand=1.0) == 0.5
    assert backoff_delay(4, 0.5, 60, None, rand=1.0) == 4.0
    assert backoff_delay(20, 0.5, 60, None, rand=1.0) == 60.0  # capped
    assert backoff_delay(3, 0.5, 60, None, rand=0.0) == 0.0  # full jitter reaches zero
    assert backoff_delay(1, 0.5, 60, 7.0, rand=0.1) == 7.0  # Retry-After wins
    assert backoff_delay(1, 0.5, 60, 600.0, rand=0.1) == 60.0  # ... up to the cap


def test_token_bucket_is_smooth_after_one_second_of_burst() -> None:
    now = [100.0]
    b = TokenBucket(600, clock=lambda: now[0])  # 10/s, burst of 10
    assert [b.reserve(1) for _ in range(10)] == [0.0] * 10
    assert b.reserve(1) == pytest.approx(0.1)
    assert b.reserve(1) == pytest.approx(0.2)
    now[0] += 5.0  # refills to the cap, never beyond
    assert b.level == pytest.approx(-2.0)
    assert b.reserve(0) == 0.0 and b.level == pytest.approx(10.0)
    t = TokenBucket(6000, clock=lambda: now[0])  # 100 tokens/s
    assert t.reserve(250) == pytest.approx(1.5)  # a request bigger than the burst waits its share


def test_loopback_detection() -> None:
    assert is_loopback("http://127.0.0.1:9/v1") and is_loopback("http://localhost/v1")
    assert is_loopback("http://[::1]:8/v1")
    assert not is_loopback("https://openrouter.ai/api/v1") and not is_loopback("http://10.0.0.1/v1")


# ------------------------------------------------------------------------------ against the simulator


async def test_the_generation_id_is_heard_before_the_answer_and_the_provider_says_what_each_cost(
        start_sim: StartSim) -> None:
    """A slow stream: the id arrives with the head (`X-Generation-Id`, the first chunk), seconds before
    the answer; `generation_cost` then reads what it cost, and one abandoned mid-way reads as free
    (the simulator bills only what it finished, like a provider that stops on cancel); `key_usage`
    is the key's total."""
    sim = await start_sim(latency_ms=1500)
    heard: list[tuple[str, float]] = []
    async with client(sim.base_url, stream=True, timeout=30.0) as c:
        t0 = asyncio.get_running_loop().time()
        done = await c.complete(body(1), on_id=lambda g: heard.append((g, asyncio.get_running_loop().time() - t0)))
        took = asyncio.get_running_loop().time() - t0
        assert [g for g, _ in heard] == [done.response["id"]] and heard[0][1] < took - 1.0
        assert await c.generation_cost(done.response["id"]) == done.cost
        task = asyncio.ensure_future(c.complete(body(2), on_id=lambda g: heard.append((g, 0.0))))
        while len(heard) < 2:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.2)  # the simulator sees the hang-up
        assert await c.generation_cost(heard[1][0]) == 0
        assert await c.generation_cost("gen-unknown") is None
        assert await c.key_usage() == done.cost


async def test_streaming_and_plain_give_identical_answers(start_sim: StartSim) -> None:
    sim = await start_sim()
    bodies = [body(i, tools=TOOLS, reasoning={"effort": "high"}) for i in range(30)] + [body(i) for i in range(10)]
    async with client(sim.base_url, stream=True) as s, client(sim.base_url, stream=False) as p:
        streamed = await asyncio.gather(*(s.complete(b) for b in bodies))
        plain = await asyncio.gather(*(p.complete(b) for b in bodies))
    for a, b in zip(streamed, plain, strict=True):
        assert a.response["id"] != b.response["id"]  # a generation id of its own each
        assert {**a.response, "id": None} == {**b.response, "id": None}
        assert a.usage == b.usage and a.cost == b.cost and a.cost is not None
        assert a.attempts == b.attempts == 1
    calls = [c for r in streamed for c in r.response["tool_calls"]]
    assert calls and all(c["function"]["name"] == "search" for c in calls)
    assert all(r.response["reasoning"] for r in streamed[:30])
    assert all(r.response["content"] for r in streamed if not r.response["tool_calls"])
    stats = await sim.stats()
    assert stats["completed"] == 80
    assert Decimal(stats["billedUSD"]) == sum(r.cost for r in streamed + plain)


RETRYABLE = {"429": "http-429", "429-no-retry-after": "http-429", "500": "http-500", "502": "http-502",
             "503": "http-503", "stream-cut": None, "200-error": "error-body",
             "malformed-json": "malformed-json", "empty-choices": "empty-choices"}


@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
@pytest.mark.parametrize("fault", list(RETRYABLE))
async def test_each_transient_fault_is_retried_until_every_request_succeeds(
        start_sim: StartSim, fault: str, stream: bool) -> None:
    sim = await start_sim(fault_rate=0.3, faults=[fault], retry_after_s=0, seed=11)
    async with client(sim.base_url, stream=stream, max_retries=12) as c:
        done = await asyncio.gather(*(c.complete(body(i)) for i in range(50)))
    stats = await sim.stats()
    kind = RETRYABLE[fault] or ("dropped-stream" if stream else "connection")
    assert all(d.response["finish_reason"] in ("stop", "length") for d in done)
    assert stats["faults"][fault] == c.stats.retries > 0
    assert c.stats.errors_by_kind == {kind: c.stats.retries}
    assert c.stats.requests == stats["requests"] == 50 + c.stats.retries
    assert sum(d.attempts for d in done) == c.stats.requests
    assert (c.stats.completed, c.stats.in_flight) == (50, 0)
    # every retried request was paid once: the provider billed exactly what the client was told
    assert stats["completed"] == 50
    assert Decimal(stats["billedUSD"]) == sum(d.cost for d in done)


async def test_completing_faults_are_returned_as_is(start_sim: StartSim) -> None:
    sim = await start_sim(fault_rate=1.0, faults=["length-empty"])
    async with client(sim.base_url) as c:
        d = await c.complete(body(1, reasoning={"effort": "high"}))
    assert (d.response["finish_reason"], d.response["content"], d.response["reasoning"],
            d.response["tool_calls"], d.attempts) == ("length", None, None, [], 1)
    assert d.usage is not None and d.usage["completion_tokens"] == 300
    sim = await start_sim(fault_rate=1.0, faults=["leak"])
    async with client(sim.base_url, stream=False) as c:
        d = await c.complete(body(1, tools=TOOLS))
    assert d.response["tool_calls"] == []
    assert "<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0" in d.response["content"]


@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
async def test_402_stops_at_once(start_sim: StartSim, stream: bool) -> None:
    sim = await start_sim(fault_rate=1.0, faults=["402"])
    async with client(sim.base_url, stream=stream) as c:
        with pytest.raises(InsufficientCredits, match=r"HTTP 402.*Insufficient credits"):
            await c.complete(body(1))
    assert (await sim.stats())["requests"] == 1
    assert (c.stats.requests, c.stats.retries) == (1, 0)


async def test_retries_exhausted_raise_request_failed(start_sim: StartSim) -> None:
    sim = await start_sim(fault_rate=1.0, faults=["500"])
    async with client(sim.base_url, max_retries=3) as c:
        with pytest.raises(RequestFailed) as e:
            await c.complete(body(1))
    assert (e.value.kind, e.value.attempts) == ("http-500", 4)
    assert str(e.value).startswith("http-500 after 4 attempt(s): HTTP 500: Internal Server Error (simulated)")
    stats = await sim.stats()
    assert (stats["requests"], stats["completed"], stats["billedUSD"]) == (4, 0, "0")
    assert c.stats.errors_by_kind == {"http-500": 4} and c.stats.retries == 3


async def test_retry_after_is_honoured(start_sim: StartSim) -> None:
    sim = await start_sim(fault_rate=1.0, faults=["429"], retry_after_s=1)
    async with client(sim.base_url, max_retries=1, backoff_max=10) as c:
        t0 = time.monotonic()
        with pytest.raises(RequestFailed) as e:
            await c.complete(body(1))
        waited = time.monotonic() - t0
    assert (e.value.kind, e.value.attempts) == ("http-429", 2)
    assert 1.0 <= waited < 4
    sim = await start_sim(fault_rate=1.0, faults=["429-no-retry-after"])
    async with client(sim.base_url, max_retries=1, backoff_max=10) as c:
        t0 = time.monotonic()
        with pytest.raises(RequestFailed):
            await c.complete(body(1))
        assert time.monotonic() - t0 < 0.5  # only the (tiny) backoff


@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
async def test_timeouts_are_retried_then_fail(start_sim: StartSim, stream: bool) -> None:
    sim = await start_sim(latency_ms=3000)
    async with client(sim.base_url, timeout=0.3, max_retries=2, stream=stream) as c:
        t0 = time.monotonic()
        with pytest.raises(RequestFailed) as e:
            await c.complete(body(1))
        assert time.monotonic() - t0 < 2.0
    assert (e.value.kind, e.value.attempts) == ("timeout", 3)
    hang = await start_sim(fault_rate=0.3, faults=["timeout"], seed=2)
    async with client(hang.base_url, timeout=0.3, max_retries=10, stream=stream) as c:
        done = await asyncio.gather(*(c.complete(body(i)) for i in range(30)))
    assert len(done) == 30 and c.stats.errors_by_kind == {"timeout": c.stats.retries}
    assert c.stats.retries == (await hang.stats())["faults"]["timeout"] > 0


async def test_other_4xx_fail_at_once_with_the_provider_message(start_sim: StartSim) -> None:
    sim = await start_sim()
    async with client(sim.base_url) as c:
        with pytest.raises(RequestFailed) as e:
            await c.complete({"model": "m", "messages": []})
    assert (e.value.kind, e.value.attempts) == ("http-400", 1)
    assert "messages: a non-empty array is required" in str(e.value)
    assert (await sim.stats())["requests"] == 1


async def test_concurrency_and_request_rate_limits(start_sim: StartSim) -> None:
    sim = await start_sim(latency_ms=100)
    async with client(sim.base_url, max_concurrency=5) as c:
        t0 = time.monotonic()
        await asyncio.gather(*(c.complete(body(i)) for i in range(20)))
        assert time.monotonic() - t0 >= 0.4
    assert (await sim.stats())["maxInFlight"] == 5
    fast = await start_sim()
    async with client(fast.base_url, max_concurrency=50, requests_per_minute=1200) as c:  # 20/s, burst 20
        t0 = time.monotonic()
        await asyncio.gather(*(c.complete(body(i)) for i in range(40)))
        assert 0.9 <= time.monotonic() - t0 < 5
    async with client(fast.base_url, max_concurrency=50, tokens_per_minute=60_000) as c:  # 1000 tokens/s
        t0 = time.monotonic()
        await asyncio.gather(*(c.complete(body(i), est_tokens=500) for i in range(4)))
        assert 0.9 <= time.monotonic() - t0 < 5


# ------------------------------------------------------------------------------ preflight and secrets


async def test_preflight_errors(start_sim: StartSim) -> None:
    async with ChatClient("https://openrouter.example/api/v1", None, timeout=2, max_retries=0,
                          max_concurrency=1) as c:
        with pytest.raises(AuthError) as e:
            await c.preflight()
    assert str(e.value) == "no API key: set EYRIE_API_KEY or api.apiKeySecretRef"
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    async with client(dead) as c:
        with pytest.raises(ApiUnreachable, match=re.escape(f"the API at {dead} is unreachable")):
            await c.preflight()
    async with client("http://no-such-host.invalid/v1", api_key=KEY) as c:
        with pytest.raises(ApiUnreachable, match=r"no-such-host\.invalid") as e:
            await c.preflight()
        assert KEY not in str(e.value)
    sim = await start_sim(api_key="the-right-key")
    async with client(sim.base_url, api_key=KEY) as c:
        with pytest.raises(AuthError, match="rejected the API key \\(HTTP 401 on /models") as e:
            await c.preflight()
        assert KEY not in str(e.value) and KEY not in repr(c)
    async with client(sim.base_url, api_key="the-right-key") as c:
        await c.preflight()
        assert (await c.complete(body(1))).attempts == 1
    async with client((await start_sim()).base_url) as c:  # loopback needs no key
        await c.preflight()


@pytest.mark.integration
async def test_the_key_never_appears_in_errors(app_server: Callable[[web.Application], Awaitable[str]]) -> None:
    seen: list[str] = []

    async def echo(request: web.Request) -> web.Response:
        """A hostile provider that echoes the Authorization header into its error messages."""
        auth = request.headers.get("Authorization", "")
        seen.append(auth)
        status = 401 if request.method == "GET" else int(request.query["status"])
        err = {"error": {"code": status, "message": f"bad {auth}"}}
        return web.Response(status=status, body=orjson.dumps(err), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", echo)
    app.router.add_get("/v1/models", echo)
    url = await app_server(app)
    errors: list[Exception] = []
    for status, exc in ((400, RequestFailed), (401, AuthError), (402, InsufficientCredits), (503, RequestFailed)):
        async with ChatClient(url, KEY, timeout=2, max_retries=1, max_concurrency=2, backoff_base=0.001,
                              headers={"X-Title": "eyrie"}) as c:
            c._url = f"{c._url}?status={status}"
            with pytest.raises(exc) as e:
                await c.complete(body(1))
            errors.append(e.value)
            assert KEY not in repr(c)
    with pytest.raises(AuthError) as e:
        async with ChatClient(url, KEY, timeout=2, max_retries=0, max_concurrency=1) as c:
            await c.preflight()
    errors.append(e.value)
    assert seen and all(s == f"Bearer {KEY}" for s in seen)
    for err in errors:
        assert KEY not in str(err) and KEY not in repr(err) and "bad Bearer ***" in str(err)


@pytest.mark.integration
async def test_a_json_answer_to_a_stream_request_is_accepted(
        app_server: Callable[[web.Application], Awaitable[str]]) -> None:
    async def plain(request: web.Request) -> web.Response:
        got = orjson.loads(await request.read())
        assert got["stream"] is True and got["stream_options"] == {"include_usage": True}
        assert "usage" not in got  # only OpenRouter is asked for usage accounting
        return web.Response(body=orjson.dumps({"id": "x", "choices": [
            {"finish_reason": "stop", "message": {"content": "hi"}}], "usage": {"prompt_tokens": 1}}),
            content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", plain)
    async with client(await app_server(app)) as c:
        d = await c.complete(body(1))
    assert d.response["content"] == "hi" and d.cost is None and d.usage == {"prompt_tokens": 1}


@pytest.mark.integration
async def test_request_flags_added_to_the_body(app_server: Callable[[web.Application], Awaitable[str]]) -> None:
    got: list[dict[str, Any]] = []

    async def record(request: web.Request) -> web.Response:
        got.append(orjson.loads(await request.read()))
        return web.Response(body=orjson.dumps({"id": "x", "choices": [
            {"finish_reason": "stop", "message": {"content": "hi"}}], "usage": {"cost": 0.5}}),
            content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", record)
    url = await app_server(app)
    sent = body(1, stream=True, provider={"order": ["moonshotai"]}, reasoning={"effort": "high"})
    async with client(url, stream=False, openrouter_usage=True) as c:
        d = await c.complete(sent)
    assert d.cost == Decimal("0.5")
    assert got == [{**sent, "stream": False, "usage": {"include": True}}]
    assert sent["stream"] is True  # the caller's body is not modified
    assert ChatClient("https://openrouter.ai/api/v1", KEY, timeout=1, max_retries=0,
                      max_concurrency=1)._extra == {"usage": {"include": True}, "stream": True,
                                                    "stream_options": {"include_usage": True}}


@pytest.mark.integration
async def test_preflight_asks_openrouter_about_the_key(app_server: Callable[[web.Application], Awaitable[str]]) -> None:
    asked: list[str] = []

    async def models(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.Response(body=b'{"data": []}', content_type="application/json")

    async def key(request: web.Request) -> web.Response:
        asked.append(request.path)
        ok = request.headers.get("Authorization") == "Bearer good"
        return web.Response(status=200 if ok else 401, content_type="application/json",
                            body=b'{"data": {}}' if ok else b'{"error": {"code": 401, "message": "User not found."}}')

    app = web.Application()
    app.router.add_get("/api/v1/models", models)
    app.router.add_get("/api/v1/key", key)
    url = (await app_server(app)).removesuffix("/v1") + "/api/v1"
    async with client(url, api_key=KEY) as c:
        c._openrouter = True  # as for https://openrouter.ai/api/v1
        with pytest.raises(AuthError, match=r"HTTP 401 on /key: User not found\.") as e:
            await c.preflight()
        assert KEY not in str(e.value)
    async with client(url, api_key="good") as c:
        c._openrouter = True
        await c.preflight()
    async with client(url, api_key=KEY) as c:  # any other API: /models only
        await c.preflight()
    assert asked == ["/api/v1/models", "/api/v1/key", "/api/v1/models", "/api/v1/key", "/api/v1/models"]


# ----------------------------------------------------------- OpenRouter's documented error shapes


def test_documented_error_shapes_in_bodies_and_streams_are_classified() -> None:
    """errors-and-debugging.mdx: a non-streaming error beside partial output sits in
    `choices[0].error`; a mid-stream error is a chunk with a top-level `error` whose
    `metadata.error_type` is typed. Length limits and content-policy flags are refusals of this
    sample (with the usage reported, if any); other in-band errors are retried; a 402 in-band is
    classified like the HTTP one (in-flight budget: retried; otherwise out of credits)."""
    from eyrie.jobs.api import SampleRefused

    partial = {"choices": [{"message": {"role": "assistant", "content": "partial output..."},
                            "finish_reason": "error",
                            "error": {"code": 400, "message": "context too long",
                                      "metadata": {"error_type": "context_length_exceeded"}}}],
               "usage": {"prompt_tokens": 9000, "completion_tokens": 3, "cost": 0.002}}
    with pytest.raises(SampleRefused) as e:
        parse_completion(partial)
    assert (e.value.kind, e.value.details, e.value.usage["cost"]) == ("length-limit",
                                                                      {"error_type": "context_length_exceeded"}, 0.002)
    partial["choices"][0]["error"] = {"code": 502, "message": "Provider disconnected mid-stream",
                                      "metadata": {"error_type": "provider_unavailable"}}
    with pytest.raises(Retryable):
        parse_completion(partial)
    flagged = _chunk({"content": ""}, "error", error={"code": 400, "message": "output flagged",
                                                      "metadata": {"error_type": "content_policy_violation"}})
    with pytest.raises(SampleRefused, match="moderation after 1 attempt"):
        SSEAccumulator().feed(_chunk({"content": "a"}) + flagged)
    in_flight = {"code": 402, "message": "in flight", "metadata": {"reason": "in_flight_budget_exhausted"}}
    with pytest.raises(Retryable) as r:
        parse_completion({"error": in_flight})
    assert r.value.kind == "402-in-flight"


def test_reasoning_details_without_a_reasoning_string_in_a_json_answer() -> None:
    """reasoning-tokens.mdx, "Non-Streaming Response": `message.reasoning_details` holds a summary and
    a text item; the text item is the reasoning, both items are kept as returned."""
    details = [{"type": "reasoning.summary", "summary": "Analyzed the problem by breaking it into components",
                "id": "reasoning-summary-1", "format": "anthropic-claude-v1", "index": 0},
               {"type": "reasoning.text", "text": "Let me work through this systematically:\n1. First...",
                "signature": None, "id": "reasoning-text-1", "format": "anthropic-claude-v1", "index": 1}]
    resp, _ = parse_completion({"choices": [{"finish_reason": "stop", "native_finish_reason": "end_turn",
                                             "message": {"role": "assistant", "content": "I recommend...",
                                                         "reasoning_details": details}}]})
    assert resp["reasoning"] == "Let me work through this systematically:\n1. First..."
    assert resp["reasoning_details"] == details and resp["native_finish_reason"] == "end_turn"


def test_reported_cost_counts_byok_upstream_cost() -> None:
    """usage-accounting.mdx: `cost` is what OpenRouter charged, `cost_details.upstream_inference_cost`
    what the provider charged (BYOK: the user's own key)."""
    from eyrie.jobs.api import reported_cost

    byok = {"cost": 0.00002, "is_byok": True, "cost_details": {"upstream_inference_cost": 0.0004}}
    assert reported_cost(byok) == Decimal("0.00042")
    assert reported_cost({**byok, "is_byok": None}) == Decimal("0.00042")  # not said: counted
    assert reported_cost({**byok, "is_byok": False}) == Decimal("0.00002")  # already inside cost
    assert reported_cost({"cost": 0.5, "cost_details": {"upstream_inference_cost": None}}) == Decimal("0.5")
    assert reported_cost({"prompt_tokens": 3}) is None and reported_cost({"cost": "nan"}) is None


def test_request_failed_says_how_many_attempts_it_took():
    """The client sets `attempts` after an error raised inside an attempt: the message follows."""
    from eyrie.jobs.api import RequestFailed

    e = RequestFailed("http-400", "HTTP 400: bad request", 1)
    e.attempts = 4
    assert str(e) == "http-400 after 4 attempt(s): HTTP 400: bad request"
    import pickle

    assert str(pickle.loads(pickle.dumps(e))) == "http-400 after 4 attempt(s): HTTP 400: bad request"
