"""An independent multi-provider fake of OpenRouter for the provider-probe tests (not the simulator):
it lists endpoints as OpenRouter's API reference documents them, routes each chat request on
`provider.only`/`order` (base-slug matching), and answers each prompt exactly as the test told that
endpoint to: which prompts it calls a tool on, which calls break the schema, which answers leak
markers, are cut by a length limit, fail, return summarised reasoning, or report a prompt length off
by a template's worth of tokens. It logs every request, so a test compares eyrie's measures with
what it was told, count for count, and sees where every request went.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson
from aiohttp import web
from loopback_app import serve

MODEL = "acme/model-x"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                   "required": ["city"], "additionalProperties": False}}}
MARKERS = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
           '{"city": "Oslo"}<|tool_call_end|><|tool_calls_section_end|>')


def question(i: int) -> str:
    return f"Probe question {i}: what is the weather like?"


def rows(n: int, tools: bool = True) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        row: dict[str, Any] = {"messages": [{"role": "user", "content": question(i)}]}
        if tools:
            row["tools"] = [WEATHER]
        out.append(row)
    return out


def index_of(body: dict[str, Any]) -> int:
    m = re.match(r"Probe question (\d+):", str(body["messages"][-1].get("content")))
    assert m, body["messages"][-1]
    return int(m.group(1))


@dataclass
class Behaviour:
    """What one endpoint does, per prompt index (sets of indices)."""

    tag: str
    name: str = ""
    calls: set[int] = field(default_factory=set)  # answered with a get_weather call
    invalid: set[int] = field(default_factory=set)  # of those, the call lacks the required "city"
    leaks: set[int] = field(default_factory=set)  # content carries raw tool-call markers (no structured call)
    length: set[int] = field(default_factory=set)  # finish_reason length
    errors: set[int] = field(default_factory=set)  # HTTP 400 (never retried): the sample fails
    reasoning: str = "full"  # full | summarised | encrypted | none
    cost: Decimal = Decimal("0.001")  # usage.cost of every answer
    byok_upstream: Decimal | None = None  # with the user's own key: cost is OpenRouter's fee, this the provider's
    prompt_tokens: Callable[[dict[str, Any]], int] | None = None  # usage.prompt_tokens (default 20)
    prompt_offset: int = 0  # added to prompt_tokens: another template revision
    supported: tuple[str, ...] = ("max_tokens", "temperature", "top_p", "tools", "tool_choice", "reasoning",
                                  "include_reasoning", "seed")
    quantization: str | None = "bf16"
    context_length: int = 131072
    max_completion_tokens: int | None = 16384
    per_million: tuple[str, str] = ("0.5", "2.0")
    latency_s: float = 0.0


class ProviderFake:
    """OpenRouter with several endpoints of MODEL, on 127.0.0.1 in a thread of its own."""

    def __init__(self, behaviours: list[Behaviour], model: str = MODEL, listing: bool = True):
        self.by_tag = {b.tag: b for b in behaviours}
        self.has_listing = listing  # False: an API without an endpoint listing (vLLM, SGLang)
        self.model = model
        self.log: list[tuple[str | None, dict[str, Any]]] = []  # (endpoint served, body) per chat request
        self.listings = 0
        self.billed = Decimal(0)
        self.base_url = ""
        self._lock = threading.Lock()

    # ---------------------------------------------------------------------------------- routing
    @staticmethod
    def _match(tag: str, slugs: Any) -> bool:
        return any(tag == s or tag.startswith(s + "/") for s in slugs or [])

    def route(self, body: dict[str, Any]) -> Behaviour | None:
        p = body.get("provider") or {}
        eps = list(self.by_tag.values())
        if "only" in p:
            eps = [b for b in eps if self._match(b.tag, p["only"])]
        if "ignore" in p:
            eps = [b for b in eps if not self._match(b.tag, p["ignore"])]
        order = [b for s in p.get("order") or [] for b in eps if self._match(b.tag, [s])]
        if p.get("allow_fallbacks") is False and p.get("order"):
            eps = order
        else:
            eps = order + [b for b in eps if b not in order]
        return eps[0] if eps else None

    def served(self) -> Counter[str | None]:
        return Counter(tag for tag, _ in self.log)

    def probe_requests(self) -> list[tuple[str | None, dict[str, Any]]]:
        """Requests pinned to one endpoint (`only` names one tag): the probe's."""
        return [(t, b) for t, b in self.log if len((b.get("provider") or {}).get("only") or []) == 1]

    def generation_requests(self) -> list[tuple[str | None, dict[str, Any]]]:
        return [(t, b) for t, b in self.log if len((b.get("provider") or {}).get("only") or []) != 1]

    # --------------------------------------------------------------------------------- answers
    def answer(self, b: Behaviour, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        i = index_of(body)
        if i in b.errors:
            return 400, {"error": {"code": 400, "message": f"{b.tag} cannot serve this (fake)"}}
        msg: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
        finish = "stop"
        if i in b.calls and body.get("tools"):
            args = {"unit": "c"} if i in b.invalid else {"city": "Oslo", "unit": "c"}
            msg["tool_calls"] = [{"id": f"call_{i}", "type": "function",
                                  "function": {"name": "get_weather", "arguments": orjson.dumps(args).decode()}}]
            finish = "tool_calls"
        elif i in b.leaks:
            msg["content"] = "Calling the tool. " + MARKERS
        else:
            msg["content"] = f"Answer {i} from {b.tag}."
        if i in b.length:
            finish = "length"
        if body.get("reasoning"):
            text = f"Thinking about question {i}."
            if b.reasoning == "full":
                msg["reasoning"] = text
            elif b.reasoning == "summarised":
                msg["reasoning"] = None
                msg["reasoning_details"] = [{"type": "reasoning.summary", "summary": "Thought.", "id": "s",
                                             "format": "unknown", "index": 0}]
            elif b.reasoning == "encrypted":
                msg["reasoning"] = None
                msg["reasoning_details"] = [{"type": "reasoning.encrypted", "data": "opaque", "id": "e",
                                             "format": "unknown", "index": 0}]
        prompt = (b.prompt_tokens(body) if b.prompt_tokens else 20) + b.prompt_offset
        usage = {"prompt_tokens": prompt, "completion_tokens": 12, "total_tokens": prompt + 12,
                 "cost": float(b.cost), "is_byok": False, "cost_details": {"upstream_inference_cost": None},
                 "completion_tokens_details": {"reasoning_tokens": 0}}
        if b.byok_upstream is not None:  # usage accounting: is_byok, cost_details.upstream_inference_cost
            usage.update(is_byok=True, cost_details={"upstream_inference_cost": float(b.byok_upstream)})
        with self._lock:
            self.billed += b.cost + (b.byok_upstream or 0)
        return 200, {"id": f"gen-{b.tag}-{i}", "provider": b.name or b.tag, "model": body["model"],
                     "object": "chat.completion", "created": 1,
                     "choices": [{"index": 0, "finish_reason": finish, "native_finish_reason": finish,
                                  "message": msg}], "usage": usage}

    def listing(self) -> dict[str, Any]:
        eps = []
        for b in self.by_tag.values():
            pin, pout = (Decimal(x) / 1_000_000 for x in b.per_million)
            eps.append({"name": f"{b.name or b.tag} | {self.model}", "model_id": self.model, "model_name": "Model X",
                        "context_length": b.context_length, "pricing": {"prompt": str(pin), "completion": str(pout),
                                                                        "request": "0", "image": "0"},
                        "provider_name": b.name or b.tag, "tag": b.tag, "quantization": b.quantization,
                        "max_completion_tokens": b.max_completion_tokens, "max_prompt_tokens": None,
                        "supported_parameters": list(b.supported), "status": 0, "uptime_last_30m": 99.5,
                        "uptime_last_5m": 100, "uptime_last_1d": 99.8, "supports_implicit_caching": False,
                        "latency_last_30m": {"p50": 0.2, "p75": 0.3, "p90": 0.4, "p99": 0.8},
                        "throughput_last_30m": {"p50": 40, "p75": 35, "p90": 30, "p99": 20}})
        return {"data": {"id": self.model, "name": "Model X", "created": 1, "description": "fake",
                         "architecture": {"tokenizer": "Other", "instruct_type": None, "modality": "text->text",
                                          "input_modalities": ["text"], "output_modalities": ["text"]},
                         "endpoints": eps}}

    # ---------------------------------------------------------------------------------- server
    async def _chat(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        b = self.route(body)
        with self._lock:
            self.log.append((b.tag if b else None, body))
        if b is None:
            return web.json_response({"error": {"code": 404, "message": "No allowed providers are available for "
                                                "the selected model."}}, status=404)
        if b.latency_s:
            await asyncio.sleep(b.latency_s)
        status, doc = self.answer(b, body)
        return web.json_response(doc, status=status)

    async def _endpoints(self, request: web.Request) -> web.Response:
        self.listings += 1
        model = f"{request.match_info['author']}/{request.match_info['slug']}"
        if model != self.model:
            return web.json_response({"error": {"code": 404, "message": "Resource not found"}}, status=404)
        return web.json_response(self.listing())

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": self.model}]})

    @contextmanager
    def running(self) -> Iterator[ProviderFake]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        if self.has_listing:
            app.router.add_get("/v1/models/{author}/{slug}/endpoints", self._endpoints)
        with serve(app) as self.base_url:
            yield self


def wait_for(pred: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.05)
