"""The simulated provider over real HTTP on 127.0.0.1: determinism, schema-valid tool calls, faults,
billing, concurrency, and the child-process runner (stopped by its PID)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

import aiohttp
import jsonschema
import orjson
import pytest

from eyrie.jobs.cli.simulate import simulate_main
from eyrie.jobs.simulator import (
    FAULTS,
    SimulatorBehaviour,
    SimulatorConfig,
    SimulatorConfigError,
    SimulatorProcess,
    SimulatorServer,
    make_answer,
    planned_calls,
    read_behaviour,
)
from eyrie.jobs.simulator.answers import declared_text_functions, kimi_markers, schema_value
from eyrie.jobs.simulator.config import SimulatedProvider
from eyrie.jobs.simulator.text import TextBehaviour, break_arguments
from eyrie.jobs.sources import iter_source
from eyrie.jobs.spec import DatasetGenerationSpec, SimulatorSpec
from eyrie.jobs.tools.declarations import normalize_tools, prepare_prompt

StartSim = Callable[..., Awaitable[SimulatorServer]]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 2},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
BOOKING = {
    "type": "function",
    "function": {
        "name": "book_trip",
        "parameters": {
            "type": "object",
            "properties": {
                "travellers": {
                    "type": "array", "minItems": 1, "maxItems": 4,
                    "items": {"type": "object",
                              "properties": {"name": {"type": "string"},
                                             "age": {"type": "integer", "minimum": 0, "exclusiveMaximum": 120},
                                             "email": {"type": "string", "format": "email"}},
                              "required": ["name", "age"], "additionalProperties": False},
                },
                "budget": {"type": "number", "exclusiveMinimum": 0, "maximum": 5000},
                "refundable": {"type": "boolean"},
                "date": {"type": "string", "format": "date"},
                "seats": {"type": "integer", "multipleOf": 2, "minimum": 2, "maximum": 9},
                "notes": {"type": ["string", "null"], "maxLength": 12},
                "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True},
                "address": {"type": "object",
                            "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
                            "required": ["zip"]},
                "mode": {"anyOf": [{"const": "air"}, {"type": "integer"}]},
            },
            "required": ["travellers", "budget", "refundable", "address", "mode", "seats"],
        },
    },
}
TOOLS = [WEATHER, BOOKING]


def body(i: int, **extra: Any) -> dict[str, Any]:
    return {"model": "acme/model", "messages": [{"role": "system", "content": "Be brief."},
                                                {"role": "user", "content": f"Question number {i}?"}], **extra}


async def post(session: aiohttp.ClientSession, sim: SimulatorServer, payload: Any) -> tuple[int, Any, Any]:
    async with session.post(sim.base_url + "/chat/completions", data=orjson.dumps(payload)) as r:
        raw = await r.read()
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            doc = raw
        return r.status, r.headers, doc


def stream_events(raw: bytes) -> tuple[list[dict[str, Any]], int, bool]:
    events, comments, done = [], 0, False
    for line in raw.decode().split("\n"):
        if line.startswith(":"):
            comments += 1
        elif line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            events.append(json.loads(line[6:]))
    return events, comments, done


# ------------------------------------------------------------------------------------ pure answers


def test_answers_are_deterministic_per_prompt_and_seed() -> None:
    cfg = SimulatorConfig()
    b = body(1, tools=TOOLS, reasoning={"effort": "high"})
    assert make_answer(b, cfg) == make_answer(json.loads(json.dumps(b)), cfg)
    assert make_answer(b, cfg) != make_answer(b, SimulatorConfig(seed=1))
    assert make_answer(b, cfg) != make_answer(body(2, tools=TOOLS, reasoning={"effort": "high"}), cfg)
    # the model name and temperature are not part of the prompt
    assert make_answer({**b, "model": "x", "temperature": 0.1}, cfg) == make_answer(b, cfg)


def test_tool_calls_validate_against_their_schemas_at_the_configured_rate() -> None:
    cfg = SimulatorConfig()
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    calls = parallel = 0
    for i in range(300):
        ans = make_answer(body(i, tools=TOOLS), cfg)
        if ans.tool_calls:
            calls += 1
            parallel += len(ans.tool_calls) == 2
            assert ans.finish_reason == "tool_calls"
            assert ans.content is None
            for tc in ans.tool_calls:
                assert tc["id"].startswith("call_") and len(tc["id"]) == 29
                assert tc["type"] == "function"
                jsonschema.validate(json.loads(tc["function"]["arguments"]), by_name[tc["function"]["name"]])
        else:
            assert ans.finish_reason == "stop" and ans.content
    assert 0.72 <= calls / 300 <= 0.88
    assert 0 < parallel < calls
    never = SimulatorConfig(tool_call_rate=0.0)
    assert all(not make_answer(body(i, tools=TOOLS), never).tool_calls for i in range(50))


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q", "undeclared"]},
    {"type": "object", "properties": {}},
    {"type": "object", "properties": {"n": {"type": "number", "minimum": -5.5, "maximum": -1.2}},
     "required": ["n"]},
    {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
     "properties": {"n": {"type": "integer", "minimum": 3, "exclusiveMinimum": True}}, "required": ["n"]},
    {"type": "object", "properties": {"a": {"allOf": [{"type": "object", "properties": {"x": {"type": "integer"}},
                                                     "required": ["x"]},
                                                    {"properties": {"y": {"type": "boolean"}}, "required": ["y"]}]}},
     "required": ["a"]},
    {"type": "object", "properties": {"d": {"type": "string", "format": "date-time"},
                                      "u": {"type": "string", "format": "uri"},
                                      "m": {"type": "array", "items": {"type": "array", "items": {"type": "null"}}}},
     "required": ["d", "u", "m"]},
    {"properties": {"deep": {"properties": {"deeper": {"properties": {"deepest": {"type": "integer"}},
                                                       "required": ["deepest"]}}, "required": ["deeper"]}},
     "required": ["deep"]},
])
def test_generated_arguments_validate(schema: dict[str, Any]) -> None:
    import random

    validator = jsonschema.validators.validator_for(schema)(schema)
    validator.check_schema(schema)
    for seed in range(40):
        validator.validate(schema_value(schema, random.Random(seed)))


def test_broken_arguments_never_validate() -> None:
    """One way to break a call (text calls and an endpoint's schemaErrorRate both use it): a required
    property present is left out, else the JSON is cut; arguments that are not JSON stay as written."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
              "required": ["a", "b"]}
    validator = jsonschema.Draft202012Validator(schema)
    assert break_arguments('{"a": 1, "b": "x"}', schema) == '{"b":"x"}'
    assert break_arguments('{"b": "x"}', schema) == "{}"  # "a" was missing already: "b" goes
    assert break_arguments('{"c": 1}', {"type": "object"}) == '{"c"'  # nothing required: cut in half
    assert break_arguments("not json", schema) == "not json"
    assert not validator.is_valid(orjson.loads(break_arguments('{"a": 1, "b": "x", "c": [1, 2]}', schema)))


def test_reasoning_only_when_asked_and_lengths_bounded_by_max_tokens() -> None:
    cfg = SimulatorConfig()
    plain = make_answer(body(3), cfg)
    assert plain.reasoning is None and plain.reasoning_tokens == 0
    for effort in ({"effort": "high"}, {"max_tokens": 100}):
        assert make_answer(body(3, reasoning=effort), cfg).reasoning
    assert make_answer(body(3, reasoning={"effort": "high", "exclude": True}), cfg).reasoning is None
    assert make_answer(body(3, reasoning={"enabled": False}), cfg).reasoning is None
    for i in range(40):
        short = make_answer(body(i, reasoning={"effort": "low"}, max_tokens=8), cfg)
        assert short.completion_tokens <= 8
        assert len(short.reasoning or "") + len(short.content or "") <= 32
        assert short.finish_reason == "length"
    capped = [make_answer(body(i, reasoning={"effort": "high"}), SimulatorConfig(max_completion_tokens=40))
              for i in range(40)]
    assert max(a.completion_tokens for a in capped) == 40
    assert any(not a.content.isascii() for a in
               (make_answer(body(i), cfg) for i in range(40)) if a.content)


def test_usage_counts_characters_over_four() -> None:
    b = body(7, tools=TOOLS, reasoning={"effort": "high"})
    ans = make_answer(b, SimulatorConfig())
    prompt_chars = len("Be brief.") + len("Question number 7?") + len(orjson.dumps(TOOLS))
    assert ans.prompt_tokens == math.ceil(prompt_chars / 4)
    out = len(ans.reasoning or "") + len(ans.content or "") + sum(
        len(t["function"]["arguments"]) for t in ans.tool_calls)
    assert ans.completion_tokens == math.ceil(out / 4)
    assert ans.reasoning_tokens == math.ceil(len(ans.reasoning or "") / 4)


GLAIVE_SYSTEM = (
    "SYSTEM: You are a helpful assistant with access to the following functions. Use them if required -\n"
    '{\n    "name": "convert_currency",\n    "description": "Convert money",\n    "parameters": {\n'
    '        "type": "object",\n        "properties": {\n            "amount": {"type": "number"},\n'
    '            "from": {"type": "string", "enum": ["USD", "EUR"]}\n        },\n'
    '        "required": ["amount", "from"]\n    }\n}\n\n'
    '{"name": "noop", "parameters": {"type": "object", "properties": {}}}'
)


def test_text_declared_functions_are_called_as_text_at_their_rates_and_formats() -> None:
    """Functions described only in the prompt: no structured calls; calls written in the content in
    the configured format mix, a share of them invalid, some answers naming a function in prose.
    The content is checked here by hand per format, not with eyrie's reader."""
    msgs = [{"role": "system", "content": GLAIVE_SYSTEM}, {"role": "user", "content": "x"}]
    fns = declared_text_functions(msgs)
    assert [f["name"] for f in fns] == ["convert_currency", "noop"]
    params = {f["name"]: f["parameters"] for f in fns}
    cfg = SimulatorConfig(text_calls=TextBehaviour(0.5, {"kimi": 1, "hermes": 1, "glaive": 2}, 0.2, 0.5))
    answered: Counter[str] = Counter()
    calls = invalid = prose = 0
    for i in range(400):
        b = {"model": "m", "messages": [msgs[0], {"role": "user", "content": f"convert {i} dollars"}]}
        ans = make_answer(b, cfg)
        content = ans.content or ""
        assert not ans.tool_calls  # no structured calls without structured tools
        plan = ans.text
        assert plan is not None and plan.source is None
        if plan.format is None:
            assert ("I could use convert_currency" in content or "I could use noop" in content) == plan.prose
            prose += plan.prose
            continue
        answered[plan.format] += 1
        for j, c in enumerate(plan.calls):
            calls += 1
            invalid += not c.valid
            if plan.format == "kimi":
                assert (f"<|tool_call_begin|>functions.{c.name}:{j}<|tool_call_argument_begin|>{c.arguments}"
                        "<|tool_call_end|>") in content
                assert content.startswith("<|tool_calls_section_begin|>")
            elif plan.format == "glaive":
                assert content == f"<functioncall> {{\"name\": \"{c.name}\", \"arguments\": '{c.arguments}'}}"
            else:
                block = f'<tool_call>\n{{"name": "{c.name}", "arguments": ' + (
                    c.arguments if c.valid else json.dumps(c.arguments)) + "}\n</tool_call>"
                assert block in content
            try:
                jsonschema.validate(json.loads(c.arguments), params[c.name])
                ok = True
            except (ValueError, jsonschema.ValidationError):
                ok = False
            assert ok == c.valid, c
        # the calls are those it makes when the same functions are sent as `tools` (the modes can agree)
        tools = normalize_tools(fns)
        structured = make_answer({**b, "messages": [{"role": "user", "content": f"convert {i} dollars"}],
                                  "tools": tools}, SimulatorConfig(tool_call_rate=1.0))
        made = [(c["function"]["name"], c["function"]["arguments"]) for c in structured.tool_calls]
        assert len(plan.calls) == (1 if plan.format == "glaive" else len(made))  # glaive: one call a turn
        assert [(c.name, c.arguments) for c in plan.calls if c.valid] == \
            [m for m, c in zip(made, plan.calls, strict=False) if c.valid]
    n = sum(answered.values())
    assert 0.42 <= n / 400 <= 0.58
    assert 0.4 <= answered["glaive"] / n <= 0.6 and answered["kimi"] and answered["hermes"]
    assert 0.12 <= invalid / calls <= 0.28
    assert 0.4 <= prose / (400 - n) <= 0.6
    assert kimi_markers([("a", "{}"), ("b", '{"x":1}')]) == (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>{}"
        "<|tool_call_end|><|tool_call_begin|>functions.b:1<|tool_call_argument_begin|>{\"x\":1}"
        "<|tool_call_end|><|tool_calls_section_end|>")


def test_text_behaviour_per_source_is_recognised_by_the_prompt(tmp_path) -> None:
    """A simulator config file's textCallsBySource: the simulator knows a source's prompts by their last user
    message, so one source's prompts can be called as glaive does and another's never."""
    system = "SYSTEM: " + GLAIVE_SYSTEM.removeprefix("SYSTEM: ")
    g = tmp_path / "g.jsonl"
    g.write_text("".join(json.dumps({"system": system, "chat": f"USER: convert {i} USD\n\n\nASSISTANT: ok"}) + "\n"
                         for i in range(30)))
    o = tmp_path / "o.jsonl"
    o.write_text("".join(json.dumps({"messages": [{"role": "system", "content": GLAIVE_SYSTEM.removeprefix("SYSTEM: ")},
                                                  {"role": "user", "content": f"other {i}"}]}) + "\n"
                         for i in range(30)))
    doc = {"sources": [{"name": "glaive", "uri": str(g), "format": "glaive"}, {"name": "other", "uri": str(o)}],
           "target": {"model": "m"}, "budget": {"maxUSD": "1"}, "output": {"uri": str(tmp_path / "out")},
           "api": {"baseUrl": "simulated", "simulator": {"config": str(tmp_path / "sim.yaml")}}}
    (tmp_path / "sim.yaml").write_text(json.dumps({
        "textCalls": {"callRate": 0, "proseShare": 0},
        "textCallsBySource": {"glaive": {"callRate": 1, "formats": {"glaive": 1}, "invalidShare": 0}}}))
    spec = DatasetGenerationSpec.model_validate(doc)
    cfg = SimulatorConfig.from_json(SimulatorConfig.from_spec(spec.api.simulator, spec.target, spec.sources).to_json())
    assert [s["name"] for s in cfg.text_sources] == ["glaive"]  # only the sources named are read
    seen: Counter[tuple[str, str | None, str | None, bool]] = Counter()
    for src in spec.sources:
        for p in iter_source(src):
            prepared = prepare_prompt(p, "text")
            plan = make_answer({"model": "m", "messages": prepared.messages}, cfg).text
            seen[(src.name, plan.source, plan.format, all(c.valid for c in plan.calls))] += 1
    assert seen == {("glaive", "glaive", "glaive", True): 30, ("other", None, None, True): 30}
    # a source the file names that the spec does not have is refused when the run starts the simulator, before
    # anything is sent (pipeline.provider); a bad weight when the file is read
    (tmp_path / "sim.yaml").write_text(json.dumps({"textCallsBySource": {"nope": {}}}))
    with pytest.raises(SimulatorConfigError, match=r"sim\.yaml: textCallsBySource: no source named nope \(sources: "
                                                   r"glaive, other\)"):
        SimulatorConfig.from_spec(spec.api.simulator, spec.target, spec.sources)
    (tmp_path / "sim.yaml").write_text(json.dumps({"textCalls": {"formats": {"json": 0}}}))
    with pytest.raises(SimulatorConfigError, match=r"sim\.yaml: textCalls\.formats: .*at least one format"):
        read_behaviour(tmp_path / "sim.yaml")


def test_config_from_spec_json_round_trip_and_validation(tmp_path) -> None:
    (tmp_path / "faults.yaml").write_text("faultRate: 0.25\nfaults: ['429', leak]\n")
    spec = SimulatorSpec(latencyMs=5, seed=9, config=str(tmp_path / "faults.yaml"))
    cfg = SimulatorConfig.from_spec(spec)
    assert (cfg.latency_ms, cfg.fault_rate, cfg.faults, cfg.seed) == (5, 0.25, ["429", "leak"], 9)
    assert SimulatorConfig.from_spec(None) == SimulatorConfig()
    back = SimulatorConfig.from_json(cfg.to_json())
    assert back == cfg and back.input_per_million == Decimal("0.60")
    assert set(FAULTS) == {"429", "429-no-retry-after", "500", "502", "503", "402", "402-in-flight",
                           "403-moderation", "timeout", "stream-cut", "200-error", "malformed-json",
                           "empty-choices", "length-empty", "leak", "byok"}
    with pytest.raises(ValueError, match=r"unknown \['404'\]"):
        SimulatorConfig(faults=["404"])
    with pytest.raises(ValueError, match=r"fault_rate: 1\.5"):
        SimulatorConfig(fault_rate=1.5)
    with pytest.raises(ValueError, match=r"unknown fields \['bogus'\]"):
        SimulatorConfig.from_json('{"bogus": 1}')


# --------------------------------------------------------------------------------------- over HTTP


async def test_plain_answer_shape_usage_cost_and_billing(start_sim: StartSim) -> None:
    sim = await start_sim(input_per_million=Decimal("1.00"), output_per_million=Decimal("3.00"))
    b = body(11, tools=TOOLS, reasoning={"effort": "high"})
    async with aiohttp.ClientSession() as s:
        status, headers, doc = await post(s, sim, b)
        status2, _, doc2 = await post(s, sim, b)
        async with s.get(sim.base_url + "/models") as r:
            models = await r.json()
        async with s.get(sim.base_url + "/generation", params={"id": doc["id"]}) as r:
            generation = (await r.json())["data"]
        async with s.get(sim.base_url + "/generation", params={"id": "gen-never"}) as r:
            missing = r.status
        async with s.get(sim.base_url + "/key") as r:
            key = (await r.json())["data"]
    assert status == status2 == 200
    ans = make_answer(b, sim.config)
    # every generation has an id of its own (the answer is the prompt's), in the body and the header
    assert doc["id"].startswith("gen-") and doc["id"] != doc2["id"] and headers["X-Generation-Id"] == doc["id"]
    assert (doc["provider"], doc["model"], doc["object"]) == ("eyrie-simulator", "acme/model", "chat.completion")
    msg = doc["choices"][0]["message"]
    assert msg["reasoning"] == ans.reasoning
    assert msg.get("tool_calls", []) == ans.tool_calls
    assert doc["choices"][0]["finish_reason"] == ans.finish_reason
    u = doc["usage"]
    assert u["prompt_tokens"] == ans.prompt_tokens and u["completion_tokens"] == ans.completion_tokens
    assert u["total_tokens"] == ans.prompt_tokens + ans.completion_tokens
    assert u["completion_tokens_details"] == {"reasoning_tokens": ans.reasoning_tokens}
    expected = (ans.prompt_tokens * Decimal(1) + ans.completion_tokens * Decimal(3)) / Decimal(1_000_000)
    assert Decimal(str(u["cost"])) == expected
    assert {k: v for k, v in doc2.items() if k not in ("created", "id")} == \
        {k: v for k, v in doc.items() if k not in ("created", "id")}
    # GET /generation and /key as OpenRouter documents them: the generation's cost, the key's usage
    assert generation["total_cost"] == u["cost"] and generation["cancelled"] is False and missing == 404
    assert (generation["tokens_prompt"], generation["tokens_completion"]) == (ans.prompt_tokens, ans.completion_tokens)
    assert Decimal(str(key["usage"])) == 2 * Decimal(str(u["cost"])) and key["limit"] is None
    stats = await sim.stats()
    occupancy, started = stats.pop("occupancy"), stats.pop("startedMonotonic")
    assert stats == {"requests": 2, "completed": 2, "billedUSD": str(2 * expected), "faults": {},
                     "inFlight": 0, "maxInFlight": 1}
    # the provider-side samples: (seconds since start, open, received, answered), in time order, never more open
    # than received nor more answered than received
    assert occupancy and isinstance(started, float)
    assert [t for t, *_ in occupancy] == sorted(t for t, *_ in occupancy)
    assert all(0 <= open_ <= received <= 2 and done <= received for _, open_, received, done in occupancy)
    assert models["data"][0]["id"] == "eyrie/simulated"


async def test_stream_has_comments_deltas_usage_and_done(start_sim: StartSim) -> None:
    sim = await start_sim()
    # find a prompt that makes two parallel calls, so arguments stream per index
    candidates = (body(i, tools=TOOLS, reasoning={"effort": "high"}) for i in range(200))
    b = next(c for c in candidates if len(make_answer(c, sim.config).tool_calls) == 2)
    async with aiohttp.ClientSession() as s:
        _, _, plain = await post(s, sim, b)
        async with s.post(sim.base_url + "/chat/completions", data=orjson.dumps({**b, "stream": True})) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            raw = await r.read()
    events, comments, done = stream_events(raw)
    assert done and comments == 2
    assert all(e["object"] == "chat.completion.chunk" and e["id"] == events[0]["id"] != plain["id"] for e in events)
    reasoning = "".join(e["choices"][0]["delta"].get("reasoning") or "" for e in events)
    args: dict[int, str] = {}
    for e in events:
        for tc in e["choices"][0]["delta"].get("tool_calls") or []:
            args[tc["index"]] = args.get(tc["index"], "") + tc["function"]["arguments"]
    msg = plain["choices"][0]["message"]
    assert reasoning == msg["reasoning"]
    assert [args[0], args[1]] == [tc["function"]["arguments"] for tc in msg["tool_calls"]]
    assert sum(len(e["choices"][0]["delta"].get("tool_calls") or []) for e in events) > 2
    last = events[-1]
    assert last["choices"][0]["finish_reason"] == "tool_calls"
    assert last["usage"] == plain["usage"]


async def test_http_faults_shapes_and_nothing_billed(start_sim: StartSim) -> None:
    cases = {"429": 429, "429-no-retry-after": 429, "500": 500, "502": 502, "503": 503, "402": 402,
             "402-in-flight": 402, "403-moderation": 403}
    async with aiohttp.ClientSession() as s:
        for fault, code in cases.items():
            sim = await start_sim(fault_rate=1.0, faults=[fault], retry_after_s=1)
            for stream in (False, True):
                status, headers, doc = await post(s, sim, body(1, stream=stream))
                assert status == code
                assert doc["error"]["code"] == code
                assert headers.get("Retry-After") == ("1" if fault in ("429", "402-in-flight") else None)
            meta = doc["error"]["metadata"]
            if fault == "402":
                assert "Insufficient credits" in doc["error"]["message"]
            if fault == "402-in-flight":  # OpenRouter's limits page, "In-flight spending budget"
                assert (meta["reason"], meta["limit_source"]) == ("in_flight_budget_exhausted",
                                                                  "openrouter_in_flight_budget")
            if fault == "403-moderation":  # the errors page's ModerationErrorMetadata
                assert meta == {"reasons": ["harassment"], "flagged_input": "Question number 1?",
                                "provider_name": "eyrie-simulator", "model_slug": "acme/model"}
            stats = await sim.stats()
            assert (stats["requests"], stats["completed"], stats["billedUSD"], stats["faults"]) == \
                (2, 0, "0", {fault: 2})


async def test_body_faults_plain_and_streaming(start_sim: StartSim) -> None:
    async with aiohttp.ClientSession() as s:
        sim = await start_sim(fault_rate=1.0, faults=["200-error"])
        status, _, doc = await post(s, sim, body(1))
        assert status == 200 and doc["error"]["code"] == 502
        async with s.post(sim.base_url + "/chat/completions", data=orjson.dumps(body(1, stream=True))) as r:
            events, _, done = stream_events(await r.read())
        assert not done and events[-1]["error"]["code"] == 502
        assert events[-1]["choices"][0]["finish_reason"] == "error"

        sim = await start_sim(fault_rate=1.0, faults=["malformed-json"])
        status, _, doc = await post(s, sim, body(1))
        assert status == 200 and isinstance(doc, bytes)

        sim = await start_sim(fault_rate=1.0, faults=["empty-choices"])
        _, _, doc = await post(s, sim, body(1))
        assert doc["choices"] == [] and "usage" not in doc

        sim = await start_sim(fault_rate=1.0, faults=["stream-cut"])
        for stream in (False, True):
            with pytest.raises(aiohttp.ClientPayloadError):
                await post(s, sim, body(1, stream=stream))
        assert (await sim.stats())["completed"] == 0


async def test_completing_faults_leak_and_length_empty_are_billed(start_sim: StartSim) -> None:
    async with aiohttp.ClientSession() as s:
        sim = await start_sim(fault_rate=1.0, faults=["leak"])
        b = body(2, tools=TOOLS)
        _, _, doc = await post(s, sim, b)
        msg = doc["choices"][0]["message"]
        assert "tool_calls" not in msg and doc["choices"][0]["finish_reason"] == "stop"
        calls = make_answer(b, sim.config).tool_calls
        assert calls
        assert msg["content"].endswith(kimi_markers([(c["function"]["name"], c["function"]["arguments"])
                                                      for c in calls]))
        assert Decimal((await sim.stats())["billedUSD"]) == Decimal(str(doc["usage"]["cost"]))

        sim = await start_sim(fault_rate=1.0, faults=["byok"])  # billed: the fee plus the upstream cost
        for stream in (False, True):
            if stream:
                async with s.post(sim.base_url + "/chat/completions", data=orjson.dumps(body(3, stream=True))) as r:
                    u = stream_events(await r.read())[0][-1]["usage"]
            else:
                u = (await post(s, sim, body(3)))[2]["usage"]
            upstream = u["cost_details"]["upstream_inference_cost"]
            assert u["is_byok"] is True and Decimal(str(u["cost"])) == Decimal(str(upstream)) * Decimal("0.05")
        assert Decimal((await sim.stats())["billedUSD"]) == 2 * (Decimal(str(u["cost"])) + Decimal(str(upstream)))

        sim = await start_sim(fault_rate=1.0, faults=["length-empty"])
        _, _, doc = await post(s, sim, body(2, max_tokens=64))
        choice = doc["choices"][0]
        assert (choice["finish_reason"], choice["message"]["content"]) == ("length", "")
        assert doc["usage"]["completion_tokens"] == 64


async def test_fault_draws_are_seeded_and_reset(start_sim: StartSim) -> None:
    async def sequence(sim: SimulatorServer) -> list[int]:
        async with aiohttp.ClientSession() as s:
            return [(await post(s, sim, body(0)))[0] for _ in range(30)]

    a = await start_sim(fault_rate=0.5, faults=["500", "503"], seed=4)
    b = await start_sim(fault_rate=0.5, faults=["500", "503"], seed=4)
    first = await sequence(a)
    assert first == await sequence(b)
    assert set(first) == {200, 500, 503}
    a.reset()
    assert (await a.stats())["requests"] == 0
    assert await sequence(a) == first
    async with aiohttp.ClientSession() as s, s.post(a.base_url.removesuffix("/v1") + "/sim/reset") as r:
        assert (await r.json())["requests"] == 0


async def test_requests_without_valid_body_or_key_are_rejected(start_sim: StartSim) -> None:
    sim = await start_sim(api_key="sim-key")
    async with aiohttp.ClientSession() as s:
        status, _, doc = await post(s, sim, body(1))
        assert status == 401 and doc["error"]["message"] == "No auth credentials found"
        s.headers["Authorization"] = "Bearer sim-key"
        assert (await post(s, sim, body(1)))[0] == 200
        status, _, doc = await post(s, sim, {"model": "m", "messages": []})
        assert status == 400 and "messages" in doc["error"]["message"]
        status, _, doc = await post(s, sim, {"messages": [{"role": "user", "content": "x"}]})
        assert status == 400 and "model" in doc["error"]["message"]


async def test_thousands_of_concurrent_requests_and_latency(start_sim: StartSim) -> None:
    """All 1,500 are held at once for the simulated latency (throughput is benchmarks/inflight.py's)."""
    sim = await start_sim(latency_ms=500)
    conn = aiohttp.TCPConnector(limit=0)
    t0 = time.monotonic()
    async with aiohttp.ClientSession(connector=conn) as s:
        results = await asyncio.gather(*(post(s, sim, body(i)) for i in range(1500)))
    elapsed = time.monotonic() - t0
    assert all(r[0] == 200 for r in results)
    stats = await sim.stats()
    assert stats["maxInFlight"] == 1500 and stats["completed"] == 1500
    assert elapsed >= 0.5


async def test_timeout_fault_hangs_until_the_client_leaves(start_sim: StartSim) -> None:
    sim = await start_sim(fault_rate=1.0, faults=["timeout"])
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.3)) as s:
        t0 = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await post(s, sim, body(1))
        assert time.monotonic() - t0 < 1.0
    for _ in range(50):  # the handler is cancelled once the connection is gone
        if (await sim.stats())["inFlight"] == 0:
            break
        await asyncio.sleep(0.02)
    assert (await sim.stats())["inFlight"] == 0


# -------------------------------------------------------------------------------- process runner


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.integration
def test_simulator_process_serves_and_is_stopped_by_pid() -> None:
    import httpx

    cfg = SimulatorConfig(seed=3, output_per_million=Decimal("4"))
    with SimulatorProcess(cfg) as proc:
        assert proc.base_url.startswith("http://127.0.0.1:") and proc.base_url.endswith("/v1")
        pid = proc.pid
        assert not _gone(pid)
        r = httpx.post(proc.base_url + "/chat/completions", json=body(5), timeout=10, trust_env=False)
        assert r.status_code == 200
        assert r.json()["id"] == r.headers["X-Generation-Id"] and r.json()["id"].startswith("gen-")
        stats = proc.stats()
        assert stats["completed"] == 1 and Decimal(stats["billedUSD"]) == Decimal(str(r.json()["usage"]["cost"]))
    assert _gone(pid)


@pytest.mark.integration
def test_simulator_process_exits_when_its_parent_is_killed(tmp_path: Any) -> None:
    script = ("import time\nfrom eyrie.jobs.simulator import SimulatorProcess\n"
              "p = SimulatorProcess().start()\nprint(p.pid, flush=True)\ntime.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert not _gone(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(child)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        parent.stdout.close()  # type: ignore[union-attr]


def test_cli_help_says_it_is_a_simulator_and_rejects_bad_faults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        simulate_main(["--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "SIMULATED" in out and "demos and tests" in out and "127.0.0.1" in out
    with pytest.raises(SystemExit) as e:
        simulate_main(["--fault", "418"])
    assert e.value.code == 2
    assert simulate_main(["--fault-rate", "2"]) == 2
    assert "fault_rate: 2.0 is not a probability" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.parametrize("how", ["flags", "config file"])
def test_cli_process_prints_its_url_and_stops_on_sigterm(tmp_path, how) -> None:
    """`eyrie simulate` with its faults as flags or in a simulator config file (what `api.simulator.config` names)."""
    (tmp_path / "sim.yaml").write_text("faultRate: 1\nfaults: ['500']\n")
    faults = ["--fault", "500", "--fault-rate", "1"] if how == "flags" else ["--config", str(tmp_path / "sim.yaml")]
    proc = subprocess.Popen([sys.executable, "-m", "eyrie.jobs.cli", "simulate", "--port", "0", *faults],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "a demo/test tool" in line and "listening on http://127.0.0.1:" in line
        import httpx

        url = line.rsplit(" ", 1)[1].strip()
        r = httpx.post(url + "/chat/completions", json=body(1), timeout=10, trust_env=False)
        assert r.status_code == 500
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]


def test_a_bad_simulator_config_file_is_refused_naming_the_file_and_the_field(tmp_path, capsys) -> None:
    (tmp_path / "sim.yaml").write_text("faultRate: 2\n")
    assert simulate_main(["--config", str(tmp_path / "sim.yaml")]) == 2
    assert f"eyrie simulate: simulator config {tmp_path / 'sim.yaml'}: faultRate: " in capsys.readouterr().err
    (tmp_path / "sim.yaml").write_text("faults: ['404']\n")
    assert simulate_main(["--config", str(tmp_path / "sim.yaml")]) == 2
    assert "faults.0:" in capsys.readouterr().err
    assert simulate_main(["--config", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read it" in capsys.readouterr().err


def test_agentic_turns_call_as_planned_answer_after_results_and_diverge_at_the_rate() -> None:
    cfg = SimulatorConfig(tool_call_rate=1.0)
    tools = [WEATHER, BOOKING]
    user = {"role": "user", "content": "Weather in Oslo, then book?"}
    plan = planned_calls([user], tools, cfg)
    assert plan and all(name in ("get_weather", "book_trip") for name, _a in plan)
    # the calls depend on the tools and the last user message, not on what came before it
    earlier = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
               {"role": "assistant", "content": "hello", "reasoning": "r"}, user]
    ans = make_answer({"model": "m", "messages": earlier, "tools": tools}, cfg)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in ans.tool_calls] == plan
    after = [*earlier, {"role": "assistant", "content": None, "tool_calls": ans.tool_calls},
             *({"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in ans.tool_calls)]
    final = make_answer({"model": "m", "messages": after, "tools": tools}, cfg)
    assert not final.tool_calls and final.content and final.finish_reason == "stop"
    assert planned_calls(after, tools, cfg) == []
    diverging = SimulatorConfig(tool_call_rate=1.0, divergence_rate=0.3)
    n, left = 400, 0
    for i in range(n):
        msgs = [{"role": "user", "content": f"question {i}"}]
        planned = planned_calls(msgs, tools, diverging)
        got = make_answer({"model": "m", "messages": msgs, "tools": tools}, diverging).tool_calls
        left += [(c["function"]["name"], c["function"]["arguments"]) for c in got] != planned
    assert 0.2 * n < left < 0.4 * n
    with pytest.raises(ValueError, match="divergence_rate"):
        SimulatorConfig(divergence_rate=1.5)
    assert SimulatorConfig().with_behaviour(SimulatorBehaviour(divergenceRate=0.25)).divergence_rate == 0.25


def test_the_public_crd_holds_only_the_simulators_defaults_and_no_fault_or_demo_behaviour():
    """v1alpha1 keeps what a user chooses for the embedded default (latency, seed, which builtin model answers) and
    the name of a simulator config file; the faults and other demo and test behaviours are that file's
    (SimulatorBehaviour), named nowhere in the CRD."""
    from pathlib import Path

    import yaml

    crd_file = Path(__file__).resolve().parents[2] / "crds" / "datasetgenerations.eyrie.dev.yaml"
    crd = yaml.safe_load(crd_file.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    sim = spec["properties"]["api"]["properties"]["simulator"]
    assert set(sim["properties"]) == {"latencyMs", "seed", "answerModel", "answerModelCalls", "config"}

    def names(schema: Any) -> set[str]:
        if isinstance(schema, dict):
            return set(schema.get("properties") or {}) | {n for v in schema.values() for n in names(v)}
        return {n for v in schema for n in names(v)} if isinstance(schema, list) else set()
    behaviours = set(SimulatorBehaviour.model_json_schema(by_alias=True)["properties"])
    assert behaviours >= {"faultRate", "faults", "providers", "divergenceRate", "completionTokenDrift"}
    endpoint = set(SimulatedProvider.model_json_schema(by_alias=True)["properties"])
    assert not (behaviours | endpoint - {"latencyMs"}) & names(sim)  # an endpoint has a latency of its own too
    # nowhere else either (target.templateVariant and providerProbe.providers are the run's own, not the simulator's)
    elsewhere = (behaviours | {"schemaErrorRate", "leakRate", "toolCallRate"}) - {"templateVariant", "providers"}
    assert not elsewhere & names(spec), elsewhere & names(spec)
    assert not set(FAULTS) & set(json.dumps(spec).split('"'))  # no fault's name as an enum value
