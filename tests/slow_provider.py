"""An independent slow fake provider for the money-after-a-stop tests (not the simulator): an
OpenAI-compatible /chat/completions on 127.0.0.1 that answers every request after `latency_s` and
bills it in full once that time has passed, whether or not the client is still there to read the
answer (a provider that does not stop on a cancelled request: the worst case for the bill). By
default it has no `GET /generation` (so nothing can be reconciled: eyrie must keep the bound); with
`generations` it names each generation in an `X-Generation-Id` header sent before the answer and says
what a generation cost once it is billed (OpenRouter's `GET /generation?id=`, `total_cost`; 404
before), and what the key was billed in all (`GET /key`, `usage`). It counts what it received,
answered, billed and was asked.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal

import orjson
from aiohttp import web
from loopback_app import serve

MILLION = Decimal(1_000_000)


@dataclass
class SlowProvider:
    latency_s: float
    prompt_tokens: int = 20
    completion_tokens: int = 100
    input_per_million: Decimal = Decimal("0.60")
    output_per_million: Decimal = Decimal("2.50")
    received: int = 0
    billed_count: int = 0
    open: int = 0
    billed: Decimal = Decimal(0)
    generations: bool = False
    costs: dict[str, Decimal] = field(default_factory=dict)  # generation id -> its cost, once billed
    lookups: int = 0  # GET /generation requests
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def cost(self) -> Decimal:
        tokens = self.prompt_tokens * self.input_per_million + self.completion_tokens * self.output_per_million
        return tokens / MILLION

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        with self._lock:
            self.received += 1
            self.open += 1
            gen = f"gen-slow-{self.received}"
        early = None
        if self.generations:  # the id goes out before the answer, as OpenRouter's header does
            early = web.StreamResponse(headers={"X-Generation-Id": gen, "Content-Type": "application/json"})
            await early.prepare(request)
        try:
            await asyncio.sleep(self.latency_s)  # aiohttp does not cancel a handler whose client left
        finally:
            with self._lock:
                self.open -= 1
                self.billed_count += 1
                self.billed += self.cost
                self.costs[gen] = self.cost
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                 "total_tokens": self.prompt_tokens + self.completion_tokens, "cost": float(self.cost)}
        doc = {"id": gen, "object": "chat.completion", "model": body.get("model"),
               "choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "A slow answer."}}], "usage": usage}
        if early is None:
            return web.Response(body=orjson.dumps(doc), content_type="application/json")
        try:
            await early.write(orjson.dumps(doc))
            await early.write_eof()
        except (ConnectionResetError, RuntimeError):  # the client left: billed all the same
            pass
        return early

    async def generation(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            self.lookups += 1
            cost = self.costs.get(request.query.get("id", ""))
        if cost is None:
            return web.json_response({"error": {"code": 404, "message": "Generation not found"}}, status=404)
        return web.json_response({"data": {"id": request.query["id"], "total_cost": float(cost)}})

    async def key(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            return web.json_response({"data": {"label": "slow", "usage": float(self.billed)}})

    async def models(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=orjson.dumps({"object": "list", "data": [{"id": "test/model"}]}),
                            content_type="application/json")

    def settled(self, timeout: float = 30) -> Decimal:
        """The bill once every request it received has been answered (and billed)."""
        import time

        deadline = time.time() + timeout
        while self.open and time.time() < deadline:
            time.sleep(0.05)
        assert not self.open, "the slow provider still answers"
        return self.billed


@contextmanager
def slow_provider(latency_s: float, generations: bool = False) -> Iterator[tuple[SlowProvider, str]]:
    """(the provider, its base URL) while it is served; `generations`: it names and prices each
    generation (the module docstring)."""
    p = SlowProvider(latency_s, generations=generations)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", p.chat)
    app.router.add_get("/v1/models", p.models)
    if generations:
        app.router.add_get("/v1/generation", p.generation)
        app.router.add_get("/v1/key", p.key)
    with serve(app) as url:
        yield p, url
