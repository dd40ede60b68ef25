"""The tests' one independent provider (not eyrie's simulator): a fake of OpenRouter on 127.0.0.1.

It serves one model from one or more endpoints. `GET /v1/models/{author}/{slug}/endpoints` lists them
as OpenRouter's API reference documents them; `POST /v1/chat/completions` routes each request on
`provider.only`/`ignore`/`order`/`allow_fallbacks` (base-slug matching, as OpenRouter does) and the
chosen endpoint's `Behaviour` answers it by its script:

- `by_index` (the provider probe's tests): the prompt's index ("Probe question 3: ...") says what the
  endpoint does with it: call a tool, break the schema, leak markers, stop at a length limit, fail,
  summarise its reasoning, count the prompt a template's worth of tokens off.
- `by_case` (the audit's tests): a `case=NAME` word in the last user message picks the answer from
  `TEXT_ANSWERS` (the call written in a named text format) or, when the request declares `tools`,
  from `STRUCTURED_CALLS` (as `tool_calls`), so the expected counts per format are known by
  construction. `scripted()` is the audit's one-endpoint server.

Every answer leaves through one envelope (OpenRouter's chat.completion with `usage.cost`, BYOK's
`cost_details`, `finish_reason`/`native_finish_reason`) and is added to `billed`; every chat request,
answered or not, is appended to `log` with the endpoint that served it, so a test compares eyrie's
figures with what the fake was told and paid, count for count.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson
from aiohttp import web
from loopback_app import serve

# ------------------------------------------------------------------------- the audit's script
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
BMI = {"type": "function", "function": {
    "name": "calculate_bmi", "description": "Body Mass Index",
    "parameters": {"type": "object", "properties": {"weight": {"type": "number"}, "height": {"type": "number"}},
                   "required": ["weight", "height"]}}}
TOOLS = [WEATHER, BMI]


PARIS = {"city": "Paris"}
DS = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{args}\n```" \
     "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
KIMI = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{args}"
        "<|tool_call_end|><|tool_calls_section_end|>")

# case -> the text-mode answer's content
TEXT_ANSWERS: dict[str, str] = {
    "glaive": "<functioncall> {\"name\": \"get_weather\", \"arguments\": '{\"city\": \"Paris\"}'} <|endoftext|>",
    "glaive_obj": "<functioncall> {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
    "hermes": "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "hermes_two": ("<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>\n"
                   "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>"),
    "kimi": KIMI.format(args=json.dumps(PARIS)),
    "deepseek": DS.format(args=json.dumps(PARIS)),
    "json": json.dumps({"name": "get_weather", "arguments": PARIS}),
    "json_fenced": "Here is the call:\n```json\n" + json.dumps({"name": "get_weather", "arguments": PARIS}) + "\n```",
    "invalid": "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"kelvin\"}}</tool_call>",
    "hallucinated": "<tool_call>{\"name\": \"book_hotel\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>",
    "other_args": "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}}</tool_call>",
    "prose": "You could use get_weather with the city set to Paris to find out.",
    "none": "Paris is usually mild in spring; bring a light coat.",
}
CASES_IN_ORDER = list(TEXT_ANSWERS)
# case -> the structured answer's calls ((name, arguments) each; [] answers in words)
STRUCTURED_CALLS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    **{case: [("get_weather", PARIS)] for case in TEXT_ANSWERS},
    "hermes_two": [("get_weather", PARIS), ("get_weather", {"city": "Oslo"})],
    "none": [],
}
# the format each case's text answer is counted under (audit_stats.CATEGORIES)
CATEGORY = {"glaive": "glaive", "glaive_obj": "glaive", "hermes": "hermes", "hermes_two": "hermes", "kimi": "kimi",
            "deepseek": "deepseek", "json": "json", "json_fenced": "json", "invalid": "hermes",
            "hallucinated": "hermes", "other_args": "hermes", "prose": "prose only", "none": "no call"}

USAGE = {"text": (120, 40, Decimal("0.0004")), "structured": (90, 25, Decimal("0.0003"))}  # prompt, completion, cost

_CASE = re.compile(r"case=(\w+)")


def case_of(body: dict[str, Any]) -> str:
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    m = _CASE.search(str(users[-1].get("content"))) if users else None
    return m.group(1) if m else "none"


def text_message(case: str) -> dict[str, Any]:
    return {"role": "assistant", "content": TEXT_ANSWERS[case], "reasoning": "The user wants the weather."}


def structured_message(case: str) -> dict[str, Any]:
    calls = [{"id": f"call_{i}", "type": "function",
              "function": {"name": name, "arguments": json.dumps(args)}}
             for i, (name, args) in enumerate(STRUCTURED_CALLS[case])]
    msg: dict[str, Any] = {"role": "assistant", "content": None if calls else "It is mild in Paris.",
                           "reasoning": "Call the tool."}
    if calls:
        msg["tool_calls"] = calls
    return msg


# ---------------------------------------------------------------------- the probe's prompts
MODEL = "acme/model-x"
PROBE_TOOL = {"type": "function", "function": {
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
            row["tools"] = [PROBE_TOOL]
        out.append(row)
    return out


def index_of(body: dict[str, Any]) -> int:
    m = re.match(r"Probe question (\d+):", str(body["messages"][-1].get("content")))
    assert m, body["messages"][-1]
    return int(m.group(1))


# ---------------------------------------------------------------------------------- scripts
@dataclass(frozen=True)
class Reply:
    """One answer as a script writes it; the server wraps it in OpenRouter's envelope and bills `cost`."""

    message: dict[str, Any]
    finish: str
    prompt_tokens: int
    completion_tokens: int
    cost: Decimal


@dataclass(frozen=True)
class Failure:
    """An HTTP error answered instead (OpenRouter's `{"error": {"code", "message"}}` body)."""

    status: int
    message: str


def by_index(b: Behaviour, body: dict[str, Any]) -> Reply | Failure:
    """The probe's script: what `b` does with the prompt's index (its sets of indices)."""
    i = index_of(body)
    if i in b.errors:
        return Failure(400, f"{b.tag} cannot serve this (fake)")
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
    return Reply(msg, finish, prompt, 12, b.cost)


def by_case(b: Behaviour, body: dict[str, Any]) -> Reply:
    """The audit's script: the `case=NAME` answer, as text or as `tool_calls` as the request asks;
    tokens and cost per mode from `USAGE` (`b`'s per-index sets and cost do not apply)."""
    mode = "structured" if body.get("tools") else "text"
    case = case_of(body)
    prompt, out, cost = USAGE[mode]
    msg = structured_message(case) if mode == "structured" else text_message(case)
    return Reply(msg, "tool_calls" if msg.get("tool_calls") else "stop", prompt, out, cost)


@dataclass
class Behaviour:
    """What one endpoint does: its script, and for `by_index` the prompts (sets of indices) it treats
    each way; its listing entry; its cost and latency."""

    tag: str
    name: str = ""
    script: Callable[[Behaviour, dict[str, Any]], Reply | Failure] = by_index
    refuse: bool = False  # every chat request answered 500 (a provider that must not be called)
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


# ----------------------------------------------------------------------------------- server
class FakeOpenRouter:
    """OpenRouter serving `model` from the endpoints `behaviours` describe; `with fake.running():`
    serves it on 127.0.0.1 (loopback_app) and stops it on exit."""

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

    # ------------------------------------------------------------------------------ the log
    def served(self) -> Counter[str | None]:
        return Counter(tag for tag, _ in self.log)

    def bodies(self) -> list[dict[str, Any]]:
        return [body for _, body in self.log]

    def probe_requests(self) -> list[tuple[str | None, dict[str, Any]]]:
        """Requests pinned to one endpoint (`only` names one tag): the probe's."""
        return [(t, b) for t, b in self.log if len((b.get("provider") or {}).get("only") or []) == 1]

    def generation_requests(self) -> list[tuple[str | None, dict[str, Any]]]:
        return [(t, b) for t, b in self.log if len((b.get("provider") or {}).get("only") or []) != 1]

    # --------------------------------------------------------------------------------- answers
    def answer(self, b: Behaviour, body: dict[str, Any], n: int) -> tuple[int, dict[str, Any]]:
        """The `n`th request's answer by `b`: its script's reply in OpenRouter's envelope, billed."""
        got = Failure(500, "this provider must not be called") if b.refuse else b.script(b, body)
        if isinstance(got, Failure):
            return got.status, error(got.status, got.message)
        usage = {"prompt_tokens": got.prompt_tokens, "completion_tokens": got.completion_tokens,
                 "total_tokens": got.prompt_tokens + got.completion_tokens, "cost": float(got.cost),
                 "is_byok": False, "cost_details": {"upstream_inference_cost": None},
                 "completion_tokens_details": {"reasoning_tokens": 0}}
        if b.byok_upstream is not None:  # usage accounting: is_byok, cost_details.upstream_inference_cost
            usage.update(is_byok=True, cost_details={"upstream_inference_cost": float(b.byok_upstream)})
        with self._lock:
            self.billed += got.cost + (b.byok_upstream or 0)
        return 200, {"id": f"gen-{b.tag}-{n}", "provider": b.name or b.tag, "model": body.get("model"),
                     "object": "chat.completion", "created": 1,
                     "choices": [{"index": 0, "finish_reason": got.finish, "native_finish_reason": got.finish,
                                  "message": got.message}], "usage": usage}

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
            n = len(self.log)
        if b is None:
            return web.json_response(error(404, "No allowed providers are available for the selected model."),
                                     status=404)
        if b.latency_s:
            await asyncio.sleep(b.latency_s)
        status, doc = self.answer(b, body, n)
        return web.json_response(doc, status=status)

    async def _endpoints(self, request: web.Request) -> web.Response:
        self.listings += 1
        model = f"{request.match_info['author']}/{request.match_info['slug']}"
        if model != self.model:
            return web.json_response(error(404, "Resource not found"), status=404)
        return web.json_response(self.listing())

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    @contextmanager
    def running(self) -> Iterator[FakeOpenRouter]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        if self.has_listing:
            app.router.add_get("/v1/models/{author}/{slug}/endpoints", self._endpoints)
        with serve(app) as self.base_url:
            yield self


def error(code: int, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def scripted(refuse: bool = False) -> FakeOpenRouter:
    """The audit's provider: one endpoint (FakeCo) of `fake/model` answering by `case=NAME`;
    `refuse=True` answers every chat request 500 (a provider that must not be called)."""
    return FakeOpenRouter([Behaviour("fakeco", "FakeCo", script=by_case, refuse=refuse)], model="fake/model")
