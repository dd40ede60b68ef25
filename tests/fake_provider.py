"""An independent fake provider for the audit's tests (not the simulator): an OpenAI-compatible
/chat/completions on 127.0.0.1 that answers each prompt exactly as the test scripted it, in text
mode with the call written in a named format, in structured mode as `tool_calls`. It counts the
requests and what it billed, so a test can say "nothing was paid twice".

A prompt picks its script with a `case=NAME` word in its last user message; `CASES` maps a name to
(what the text-mode answer says, what the structured answer calls). `TEXT_ANSWERS` writes each case
in text the way the model families write calls, so the expected counts per format are known by
construction.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from aiohttp import web

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


def completion(body: dict[str, Any], n: int) -> dict[str, Any]:
    mode = "structured" if body.get("tools") else "text"
    case = case_of(body)
    prompt, out, cost = USAGE[mode]
    msg = structured_message(case) if mode == "structured" else text_message(case)
    return {"id": f"gen-fake-{n}", "object": "chat.completion", "model": body.get("model"), "provider": "FakeCo",
            "choices": [{"index": 0, "finish_reason": "tool_calls" if msg.get("tool_calls") else "stop",
                         "message": msg}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out,
                      "cost": float(cost)}}


@dataclass
class FakeProvider:
    """Started with `with FakeProvider() as fake:`; `fake.base_url`, `fake.requests`, `fake.billed`.
    `refuse=True`: every chat request is answered 500 and counted (a provider that must not be called)."""

    refuse: bool = False
    requests: int = 0
    billed: Decimal = Decimal(0)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    base_url: str = ""

    def __enter__(self) -> FakeProvider:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def chat(request: web.Request) -> web.Response:
            body = await request.json()
            self.requests += 1
            self.bodies.append(body)
            if self.refuse:
                return web.json_response({"error": {"code": 500, "message": "this provider must not be called"}},
                                         status=500)
            doc = completion(body, self.requests)
            self.billed += Decimal(str(doc["usage"]["cost"]))
            return web.json_response(doc)

        async def models(request: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": "fake/model", "object": "model"}]})

        async def serve() -> None:
            app = web.Application()
            app.router.add_post("/v1/chat/completions", chat)
            app.router.add_get("/v1/models", models)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.base_url = f"http://127.0.0.1:{port}/v1"
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(serve())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="fake-provider", daemon=True)
        self._thread.start()
        assert ready.wait(10), "the fake provider did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
