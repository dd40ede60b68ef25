"""The simulator's HTTP server (aiohttp): OpenRouter's chat completions, plain and SSE with its comment lines,
`usage.cost` billed only for what completed (so a test compares eyrie's spend with the provider's), the model
listing and endpoints, and /sim/stats and /sim/reset for tests. One `Simulator` per server holds the counters."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections import Counter, deque
from dataclasses import replace
from decimal import Decimal
from typing import Any

import orjson
from aiohttp import web

from eyrie.jobs.simulator.answers import (
    Answer,
    PromptCounter,
    completion_limit,
    count_completion,
    kimi_call_ids,
    make_answer,
    model_answer,
)
from eyrie.jobs.simulator.config import BYOK_FEE, DEFAULT_FAULTS, MILLION, MODEL_ID, PROVIDER, SimulatorConfig
from eyrie.jobs.simulator.endpoints import NO_ENDPOINT, SimEndpoints
from eyrie.jobs.simulator.faults import HTTP_FAULTS, RequestWindow, apply_content_fault, error_body, flagged

_COMMENT = b": OPENROUTER PROCESSING\n\n"
_DONE = b"data: [DONE]\n\n"
_ENDPOINT = web.RequestKey("eyrie_endpoint", object)  # the endpoint a request was routed to
_GEN_ID = web.RequestKey("eyrie_generation", str)  # the generation's id: one per request, as OpenRouter's
_EARLY = web.RequestKey("eyrie_early", object)  # a stream whose head went out before the model's latency
GENERATIONS_KEPT = 200_000  # `GET /generation` answers for the latest this many


OCCUPANCY_EVERY_S = 0.25
OCCUPANCY_SAMPLES = 20_000  # the last 83 minutes of samples


class Simulator:
    """Request handling and counters; one per server."""

    def __init__(self, cfg: SimulatorConfig):
        self.cfg = cfg
        self.faults = tuple(cfg.faults) or DEFAULT_FAULTS
        self.prompt_counter = PromptCounter(cfg) if cfg.tokenizer else None
        self.endpoints = SimEndpoints(cfg)
        self.reset()

    def warm(self) -> None:
        """Load what the first answer needs (the target's tokenizer and format; `answerModel`'s weights) before
        it is asked for: otherwise the first requests wait for it, ~10 s of torch and the model on a loaded 2-core
        machine, while the client starting up (a local run's Ray) leaves the simulator idle."""
        if self.prompt_counter is None:
            return
        self.prompt_counter.load()
        if self.cfg.answer_model:
            from eyrie.jobs.extract import tiny

            tiny.preload(tiny.model_folder(str(self.cfg.answer_model)))

    def reset(self) -> None:
        self.rng = random.Random(self.cfg.seed)
        self.requests = 0
        self.completed = 0
        self.billed = Decimal(0)
        self.credits = Decimal(0)  # what the key's `usage` says: the billed cost without BYOK's upstream part
        self.byok = Decimal(0)
        self.generations: dict[str, dict[str, Any]] = {}  # id -> what `GET /generation` says (finished ones)
        self.generation_seq = 0
        self.fault_counts: Counter[str] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self.latency_rng = random.Random(f"{self.cfg.seed}/latency")  # its own draws: the faults' stay as they were
        self.started = time.monotonic()
        # (seconds since start, requests open, received, completed)
        self.occupancy: deque[tuple[float, int, int, int]] = deque(maxlen=OCCUPANCY_SAMPLES)
        self.by_provider: Counter[str] = Counter()  # requests routed to each endpoint (several providers)
        cfg = self.cfg
        self.window = None if cfg.rate_limit_requests is None else RequestWindow(cfg.rate_limit_requests,
                                                                                 cfg.rate_limit_window_s)

    def stats(self) -> dict[str, Any]:
        return {"requests": self.requests, "completed": self.completed, "billedUSD": str(self.billed),
                "faults": dict(self.fault_counts), "inFlight": self.in_flight,
                "maxInFlight": self.max_in_flight, "occupancy": list(self.occupancy),
                "startedMonotonic": self.started,
                **({"byProvider": dict(self.by_provider)} if self.endpoints.items else {}),
                **({"rateLimit": self.window.stats()} if self.window is not None else {})}

    async def sample_occupancy(self) -> None:
        """Every OCCUPANCY_EVERY_S, how many requests are open (received, not yet answered): what a client keeps in
        flight, seen from the provider's side (`occupancy` in the stats, with the requests received and answered
        so far)."""
        while True:
            self.occupancy.append((round(time.monotonic() - self.started, 3), self.in_flight, self.requests,
                                   self.completed))
            await asyncio.sleep(OCCUPANCY_EVERY_S)

    def _cost(self, ans: Answer, cfg: SimulatorConfig | None = None) -> float:
        cfg = cfg or self.cfg
        c = (ans.prompt_tokens * cfg.input_per_million + ans.completion_tokens * cfg.output_per_million) / MILLION
        return float(c)

    def _bill(self, usage: dict[str, Any], request: web.Request) -> None:
        """Bill exactly what the usage tells the client: `cost`, plus with BYOK what the provider
        charged the user's own key (usage accounting: cost_details.upstream_inference_cost); the
        generation's record says the same (`GET /generation?id=`)."""
        self.completed += 1
        self.billed += Decimal(str(usage["cost"]))
        self.credits += Decimal(str(usage["cost"]))
        upstream = usage["cost_details"]["upstream_inference_cost"] if usage["is_byok"] else None
        if upstream is not None:
            self.billed += Decimal(str(upstream))
            self.byok += Decimal(str(upstream))
        self._record_generation(request, usage["cost"], cancelled=False, usage=usage, upstream=upstream)

    def _record_generation(self, request: web.Request, cost: float, *, cancelled: bool,
                           usage: dict[str, Any] | None = None, upstream: float | None = None) -> None:
        gen = request.get(_GEN_ID)
        if gen is None or gen in self.generations:
            return
        if len(self.generations) >= GENERATIONS_KEPT:
            del self.generations[next(iter(self.generations))]
        endpoint = request.get(_ENDPOINT)
        self.generations[gen] = {
            "id": gen, "total_cost": cost, "usage": cost, "is_byok": upstream is not None,
            "upstream_inference_cost": upstream, "cancelled": cancelled,
            "streamed": request.get(_EARLY) is not None, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "provider_name": endpoint.name if endpoint is not None else PROVIDER,
            "tokens_prompt": (usage or {}).get("prompt_tokens", 0),
            "tokens_completion": (usage or {}).get("completion_tokens", 0),
            "finish_reason": None if cancelled else "stop"}

    async def generation(self, request: web.Request) -> web.StreamResponse:
        """GET /generation?id=: a finished generation's cost and tokens, as documented; 404 for one
        unknown or still running (OpenRouter stores a generation once it ends)."""
        if (denied := self._auth(request)) is not None:
            return denied
        doc = self.generations.get(request.query.get("id", ""))
        if doc is None:
            return web.Response(status=404, body=error_body(404, "Generation not found"),
                                content_type="application/json")
        return web.Response(body=orjson.dumps({"data": doc}), content_type="application/json")

    async def key(self, request: web.Request) -> web.StreamResponse:
        """GET /key: the key's `usage` (credits billed so far; BYOK's upstream part in `byok_usage`)."""
        if (denied := self._auth(request)) is not None:
            return denied
        used, byok = float(self.credits), float(self.byok)
        return web.Response(body=orjson.dumps({"data": {
            "label": "sk-or-v1-sim...", "limit": None, "limit_remaining": None, "limit_reset": None,
            "usage": used, "usage_daily": used, "usage_weekly": used, "usage_monthly": used,
            "byok_usage": byok, "byok_usage_daily": byok, "byok_usage_weekly": byok, "byok_usage_monthly": byok,
            "include_byok_in_limit": False, "is_free_tier": False, "is_management_key": False,
            "is_provisioning_key": False}}), content_type="application/json")

    def _usage(self, ans: Answer, byok: bool = False, cfg: SimulatorConfig | None = None) -> dict[str, Any]:
        cost = self._cost(ans, cfg)
        usage = {"prompt_tokens": ans.prompt_tokens, "completion_tokens": ans.completion_tokens,
                 "total_tokens": ans.prompt_tokens + ans.completion_tokens, "cost": cost,
                 "is_byok": False, "cost_details": {"upstream_inference_cost": None},
                 "prompt_tokens_details": {"cached_tokens": 0},
                 "completion_tokens_details": {"reasoning_tokens": ans.reasoning_tokens}}
        if byok:  # the provider bills the user's key the price; OpenRouter's credits only its fee
            usage.update(cost=round(cost * BYOK_FEE, 12), is_byok=True,
                         cost_details={"upstream_inference_cost": cost})
        return usage

    async def models(self, request: web.Request) -> web.StreamResponse:
        if (denied := self._auth(request)) is not None:
            return denied
        return web.Response(body=orjson.dumps({"object": "list", "data": [
            {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": PROVIDER}]}),
            content_type="application/json")

    async def endpoints_listing(self, request: web.Request) -> web.StreamResponse:
        """GET /models/{author}/{slug}/endpoints: the documented listing (404 for another model)."""
        if (denied := self._auth(request)) is not None:
            return denied
        model = f"{request.match_info['author']}/{request.match_info['slug']}"
        if self.cfg.model is not None and model != self.cfg.model:
            return web.Response(status=404, body=error_body(404, "Model not found"), content_type="application/json")
        return web.Response(body=orjson.dumps(self.endpoints.listing(model)), content_type="application/json")

    async def get_stats(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=orjson.dumps(self.stats()), content_type="application/json")

    async def post_reset(self, request: web.Request) -> web.StreamResponse:
        self.reset()
        return web.Response(body=orjson.dumps(self.stats()), content_type="application/json")

    def _auth(self, request: web.Request) -> web.Response | None:
        if self.cfg.api_key is None or request.headers.get("Authorization") == f"Bearer {self.cfg.api_key}":
            return None
        return web.Response(status=401, body=error_body(401, "No auth credentials found"),
                            content_type="application/json")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.generation_seq += 1
        request[_GEN_ID] = f"gen-{self.generation_seq}-{os.urandom(6).hex()}"
        try:
            return await self._chat(request)
        finally:
            self.in_flight -= 1
            # not billed (an error, a cut stream, a client that hung up): the record says so, at no cost
            self._record_generation(request, 0.0, cancelled=True)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if (denied := self._auth(request)) is not None:
            return denied
        if self.window is not None and (wait := self.window.admit()) is not None:
            status, body, headers = self.window.refusal(wait)
            return web.Response(status=status, body=body, headers=headers, content_type="application/json")
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as e:
            return web.Response(status=400, body=error_body(400, f"request body is not JSON: {e}"),
                                content_type="application/json")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            return web.Response(status=400, body=error_body(400, "messages: a non-empty array is required"),
                                content_type="application/json")
        if not isinstance(body.get("model"), str):
            return web.Response(status=400, body=error_body(400, "model: a string is required"),
                                content_type="application/json")
        endpoint = None
        if self.endpoints.items:  # several providers: route as OpenRouter does, answer as that one
            endpoint = self.endpoints.route(body)
            if endpoint is None:
                return web.Response(status=404, body=error_body(404, NO_ENDPOINT), content_type="application/json")
            self.by_provider[endpoint.tag] += 1
        cfg = endpoint.cfg if endpoint is not None else self.cfg
        fault = None
        if self.cfg.fault_rate and self.rng.random() < self.cfg.fault_rate:
            fault = self.rng.choice(self.faults)
            self.fault_counts[fault] += 1
        delay = cfg.draw_latency(self.latency_rng)
        if delay and body.get("stream") and endpoint is None and fault in (None, "leak", "byok"):
            # as OpenRouter streams: the head (and the generation's id) at once, the model's tokens later
            early = web.StreamResponse(headers={**_SSE_HEADERS, "X-Generation-Id": request[_GEN_ID]})
            await early.prepare(request)
            await early.write(_COMMENT + self._chunk(self._head(body, "chat.completion.chunk", request),
                                                     {"role": "assistant", "content": ""}))
            request[_EARLY] = early
        if delay:
            await asyncio.sleep(delay)
        if fault in HTTP_FAULTS:
            status, msg = HTTP_FAULTS[fault]
            meta: dict[str, Any] = {"provider_name": PROVIDER}
            if fault == "402-in-flight":  # the limits page's in-flight spending budget 402
                meta = {"reason": "in_flight_budget_exhausted", "limit_source": "openrouter_in_flight_budget",
                        "remedy_hint": "Retry after your in-flight requests settle (see the Retry-After header)."}
            elif fault == "403-moderation":  # the errors page's ModerationErrorMetadata
                meta = {"reasons": ["harassment"], "flagged_input": flagged(body["messages"]),
                        "provider_name": PROVIDER, "model_slug": body["model"]}
            retry = fault in ("429", "402-in-flight")
            headers = {"Retry-After": str(self.cfg.retry_after_s)} if retry else None
            return web.Response(status=status, body=error_body(status, msg, **meta),
                                headers=headers, content_type="application/json")
        if fault == "timeout":
            await asyncio.sleep(self.cfg.hang_s)  # cancelled when the client hangs up
            return web.Response(status=504, body=error_body(504, "simulated hang ended"),
                                content_type="application/json")
        ans = make_answer(body, cfg)
        counter = endpoint.counter if endpoint is not None else self.prompt_counter
        cut = None
        if endpoint is not None and (cut := endpoint.context_limit(body, ans)) is not None:
            if endpoint.too_long(ans):
                return web.Response(status=400, body=error_body(
                    400, f"This endpoint's maximum context length is {endpoint.spec.context_length} tokens. "
                    f"However, you requested about {ans.prompt_tokens} tokens.", provider_name=endpoint.name),
                    content_type="application/json")
            ans = make_answer(cut, cfg)  # the answer as far as its context window lets it go
        if cfg.answer_model and counter is not None:
            ans = await asyncio.to_thread(model_answer, counter, cut or body, ans, cfg)
        if self.cfg.chat_format == "kimi-k2.5" and ans.tool_calls:
            ans = replace(ans, tool_calls=kimi_call_ids(body, ans.tool_calls))
        if counter is not None:
            counted = await asyncio.to_thread(counter, body, ans)
            ans = replace(ans, prompt_tokens=ans.prompt_tokens if counted is None else counted)
        if counter is not None:  # a tokenizer's count: off the loop; without one a few arithmetic steps, here
            ans = await asyncio.to_thread(count_completion, counter, cut or body, ans, cfg)
        else:
            ans = count_completion(None, cut or body, ans, cfg)
        if endpoint is not None:
            ans = endpoint.degrade(body, ans)
        if fault in ("leak", "length-empty"):
            ans = apply_content_fault(ans, fault, body, completion_limit(body, cfg))
        request[_ENDPOINT] = endpoint
        if body.get("stream"):
            return await self._stream(request, body, ans, fault)
        return await self._plain(request, body, ans, fault)

    def _head(self, body: dict[str, Any], obj: str, request: web.Request) -> dict[str, Any]:
        endpoint = request.get(_ENDPOINT)
        return {"id": request[_GEN_ID], "provider": endpoint.name if endpoint is not None else PROVIDER,
                "model": body["model"], "object": obj, "created": int(time.time())}

    @staticmethod
    def _chunk(head: dict[str, Any], delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        c = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                  "native_finish_reason": finish, "logprobs": None}], **extra}
        return b"data: " + orjson.dumps(c) + b"\n\n"

    def _usage_of(self, request: web.Request, ans: Answer, byok: bool) -> dict[str, Any]:
        endpoint = request.get(_ENDPOINT)
        return self._usage(ans, byok, endpoint.cfg if endpoint is not None else None)

    async def _plain(self, request: web.Request, body: dict[str, Any], ans: Answer,
                     fault: str | None) -> web.StreamResponse:
        if fault == "200-error":
            return web.Response(body=error_body(502, "Provider returned error (simulated)",
                                                 provider_name=PROVIDER), content_type="application/json")
        if fault == "malformed-json":
            return web.Response(body=orjson.dumps(self._head(body, "chat.completion", request))[:-1]
                                + b', "choices": [{"message": {"content": "unterminated',
                                content_type="application/json")
        if fault == "empty-choices":
            empty = {**self._head(body, "chat.completion", request), "choices": []}
            return web.Response(body=orjson.dumps(empty), content_type="application/json")
        usage = self._usage_of(request, ans, fault == "byok")
        message: dict[str, Any] = {"role": "assistant", "content": ans.content, "refusal": None,
                                   "reasoning": ans.reasoning}
        if ans.reasoning_details is not None:
            message["reasoning_details"] = ans.reasoning_details
        if ans.tool_calls:
            message["tool_calls"] = ans.tool_calls
        out = {**self._head(body, "chat.completion", request),
               "choices": [{"index": 0, "logprobs": None, "finish_reason": ans.finish_reason,
                            "native_finish_reason": ans.finish_reason, "message": message}],
               "usage": usage}
        data = orjson.dumps(out)
        if fault == "stream-cut":  # the body stops half-way; the connection closes
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.content_length = len(data)
            await resp.prepare(request)
            await resp.write(data[: len(data) // 2])
            _hang_up(request)
            return resp
        self._bill(usage, request)
        return web.Response(body=data, content_type="application/json", headers={"X-Generation-Id": request[_GEN_ID]})

    async def _stream(self, request: web.Request, body: dict[str, Any], ans: Answer,
                      fault: str | None) -> web.StreamResponse:
        head = self._head(body, "chat.completion.chunk", request)

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
            return self._chunk(head, delta, finish, **extra)

        early: web.StreamResponse | None = request.get(_EARLY)
        parts: list[bytes] = [] if early is not None else [_COMMENT, chunk({"role": "assistant", "content": ""})]
        for p in _pieces(ans.reasoning or ""):
            parts.append(chunk({"role": "assistant", "content": "", "reasoning": p}))
        if ans.reasoning_details is not None:
            parts.append(chunk({"role": "assistant", "content": "", "reasoning_details": ans.reasoning_details}))
        parts.append(_COMMENT)
        for p in _pieces(ans.content or ""):
            parts.append(chunk({"role": "assistant", "content": p}))
        for i, call in enumerate(ans.tool_calls):
            fn = call["function"]
            parts.append(chunk({"role": "assistant", "content": None, "tool_calls": [
                {"index": i, "id": call["id"], "type": "function",
                 "function": {"name": fn["name"], "arguments": ""}}]}))
            for p in _pieces(fn["arguments"]):
                parts.append(chunk({"role": "assistant", "content": None, "tool_calls": [
                    {"index": i, "function": {"arguments": p}}]}))
        if fault is None or fault in ("leak", "length-empty", "byok"):
            # the whole stream in one write: at thousands of requests/s the simulator must not be
            # what is measured (clients see it split anyway; the faults below write in pieces)
            usage = self._usage_of(request, ans, fault == "byok")
            parts.append(chunk({}, ans.finish_reason, usage=usage))
            parts.append(_DONE)
            if early is not None:
                await early.write(b"".join(parts))
                await early.write_eof()
                self._bill(usage, request)
                return early
            self._bill(usage, request)
            return web.Response(body=b"".join(parts), headers={**_SSE_HEADERS, "X-Generation-Id": request[_GEN_ID]})
        resp = web.StreamResponse(headers={**_SSE_HEADERS, "X-Generation-Id": request[_GEN_ID]})
        await resp.prepare(request)
        half = max(1, len(parts) // 2)
        if fault == "stream-cut":
            await resp.write(b"".join(parts[:half]))
            _hang_up(request)
            return resp
        if fault == "200-error":
            parts[half:] = [chunk({"content": ""}, "error", error={
                "code": 502, "message": "Provider disconnected (simulated)",
                "metadata": {"provider_name": PROVIDER}})]
        elif fault == "malformed-json":
            parts[half:] = [b'data: {"id": "' + request[_GEN_ID].encode() + b'", "choices": [{"delta": {"cont\n\n',
                            _DONE]
        else:  # empty-choices
            parts = [_COMMENT, b"data: " + orjson.dumps({**head, "choices": []}) + b"\n\n", _DONE]
        await resp.write(b"".join(parts[:half]))
        await resp.write(b"".join(parts[half:]))
        await resp.write_eof()
        return resp


_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_PIECE_SIZES = (17, 31, 8, 45, 23, 12, 38, 27)


def _pieces(text: str) -> list[str]:
    """Deterministic uneven pieces of a streamed text."""
    out, i, k = [], 0, 0
    while i < len(text):
        n = _PIECE_SIZES[k % len(_PIECE_SIZES)]
        out.append(text[i:i + n])
        i, k = i + n, k + 1
    return out


def _hang_up(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.close()


class SimulatorServer:
    """An in-process simulator on the running event loop."""

    def __init__(self, sim: Simulator, runner: web.AppRunner, base_url: str):
        self._sim = sim
        self._runner = runner
        self.base_url = base_url
        self.config = sim.cfg
        self._sampler = asyncio.ensure_future(sim.sample_occupancy())

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1].split("/", 1)[0])

    async def stats(self) -> dict[str, Any]:
        return self._sim.stats()

    def reset(self) -> None:
        self._sim.reset()

    def warm(self) -> None:
        """Simulator.warm, for a background thread: a failure is left to the request that needs the load, which
        reports it to the client."""
        with contextlib.suppress(Exception):
            self._sim.warm()

    async def close(self) -> None:
        self._sampler.cancel()
        await self._runner.cleanup()

    async def __aenter__(self) -> SimulatorServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def build_app(sim: Simulator) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", sim.chat)
    app.router.add_post("/chat/completions", sim.chat)
    app.router.add_get("/v1/models", sim.models)
    app.router.add_get("/models", sim.models)
    app.router.add_get("/v1/models/{author}/{slug}/endpoints", sim.endpoints_listing)
    app.router.add_get("/models/{author}/{slug}/endpoints", sim.endpoints_listing)
    app.router.add_get("/v1/generation", sim.generation)
    app.router.add_get("/generation", sim.generation)
    app.router.add_get("/v1/key", sim.key)
    app.router.add_get("/key", sim.key)
    app.router.add_get("/sim/stats", sim.get_stats)
    app.router.add_post("/sim/reset", sim.post_reset)
    return app


async def start_simulator(config: SimulatorConfig | None = None, host: str = "127.0.0.1",
                          port: int = 0) -> SimulatorServer:
    """Serve on host:port (0 = a free port); handlers are cancelled when their client hangs up."""
    sim = Simulator(config or SimulatorConfig())
    runner = web.AppRunner(build_app(sim), handler_cancellation=True, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=8192)
    await site.start()
    bound = runner.addresses[0][1]
    url_host = f"[{host}]" if ":" in host else host
    return SimulatorServer(sim, runner, f"http://{url_host}:{bound}/v1")
