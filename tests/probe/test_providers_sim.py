"""The simulator's several providers of one model (issue 26): the endpoint listing in OpenRouter's
documented shape, OpenRouter's routing over `provider.only`/`ignore`/`order`, each endpoint's own
behaviour; the probe's pure measures (trigger F1, routing blocks, limits); and the quickstart
example whose probe drops two of four endpoints."""

from __future__ import annotations

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from eyrie.jobs.api.endpoints import parse_listing
from eyrie.jobs.generate.probe.verdict import limits_failure, routing, trigger_f1
from eyrie.jobs.spec import ProviderSpec

ROOT = Path(__file__).resolve().parents[2]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# PublicEndpoint's required fields (OpenRouter's OpenAPI, components.schemas.PublicEndpoint.required)
REQUIRED = {"name", "model_id", "model_name", "context_length", "pricing", "provider_name", "tag", "quantization",
            "max_completion_tokens", "max_prompt_tokens", "supported_parameters", "uptime_last_30m",
            "uptime_last_5m", "uptime_last_1d", "supports_implicit_caching", "latency_last_30m",
            "throughput_last_30m"}

FOUR = [{"tag": "acme", "name": "Acme", "input_per_million": "0.60", "output_per_million": "2.50",
         "tool_call_rate": 1.0},
        {"tag": "acme/turbo", "name": "Acme", "quantization": "fp8", "input_per_million": "0.40",
         "output_per_million": "1.00", "schema_error_rate": 1.0, "tool_call_rate": 1.0},
        {"tag": "cheap", "name": "Cheap", "input_per_million": "0.10", "output_per_million": "0.20",
         "tool_call_rate": 0.0, "reasoning": "summarised", "latency_ms": 150},
        {"tag": "small", "name": "Small", "input_per_million": "0.30", "output_per_million": "0.90",
         "context_length": 120, "template_variant": None, "reasoning": "encrypted"}]


def body(content: str = "Weather in Oslo?", **kw: Any) -> dict[str, Any]:
    return {"model": "acme/model", "messages": [{"role": "user", "content": content}], "tools": [WEATHER],
            "max_tokens": 512, "reasoning": {"effort": "high"}, "stream": False, **kw}


async def chat(sim: Any, b: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(trust_env=False) as c:
        return await c.post(sim.base_url + "/chat/completions", json=b, timeout=30)


async def test_the_listing_has_openrouters_documented_shape(start_sim) -> None:
    sim = await start_sim(providers=FOUR, model="acme/model")
    async with httpx.AsyncClient(trust_env=False) as c:
        r = await c.get(sim.base_url + "/models/acme/model/endpoints")
        missing = await c.get(sim.base_url + "/models/acme/other/endpoints")
    doc = r.json()
    assert doc["data"]["id"] == "acme/model"
    assert [e["tag"] for e in doc["data"]["endpoints"]] == [p["tag"] for p in FOUR]
    for e in doc["data"]["endpoints"]:
        assert set(e) >= REQUIRED, REQUIRED - set(e)
    acme = doc["data"]["endpoints"][0]
    assert acme["pricing"]["prompt"] == "0.0000006"  # USD per token, a plain decimal string
    assert "tools" in acme["supported_parameters"] and acme["provider_name"] == "Acme"
    listing = parse_listing(doc, "acme/model")
    assert listing.get("cheap").prompt_per_million == Decimal("0.1") and listing.get("small").context_length == 120
    assert missing.status_code == 404 and missing.json()["error"]["code"] == 404


async def test_routing_follows_only_ignore_order_and_base_slugs(start_sim) -> None:
    sim = await start_sim(providers=FOUR)

    async def served(provider: dict[str, Any]) -> str | int:
        r = await chat(sim, body(provider=provider))
        return r.json()["provider"] if r.status_code == 200 else r.status_code

    assert await served({"only": ["cheap"]}) == "Cheap"
    assert await served({"only": ["acme"], "ignore": ["acme/turbo"], "order": ["acme/turbo", "acme"]}) == "Acme"
    assert (await chat(sim, body(provider={"only": ["acme/turbo"]}))).json()["choices"][0]["message"][
        "tool_calls"][0]["function"]["arguments"] == "{}"  # acme/turbo breaks every call's schema
    assert await served({"order": ["small", "cheap"], "allow_fallbacks": False}) == "Small"
    assert await served({"only": ["nosuch"]}) == 404  # no allowed provider: OpenRouter's 404
    assert await served({"quantizations": ["fp8"]}) == "Acme"  # acme/turbo, the one fp8 endpoint
    assert await served({}) == "Cheap"  # no preference: the cheapest
    stats = await sim.stats()
    assert stats["byProvider"] == {"cheap": 2, "acme": 1, "acme/turbo": 2, "small": 1}


async def test_each_endpoint_answers_with_its_own_behaviour(start_sim) -> None:
    sim = await start_sim(providers=FOUR)
    ref = (await chat(sim, body(provider={"only": ["acme"]}))).json()
    cheap = (await chat(sim, body(provider={"only": ["cheap"]}))).json()
    small = await chat(sim, body(provider={"only": ["small"]}))
    msg, cmsg = ref["choices"][0]["message"], cheap["choices"][0]["message"]
    assert msg["tool_calls"] and msg["reasoning"]
    assert not cmsg.get("tool_calls")  # tool_call_rate 0: never calls
    assert cmsg["reasoning"] is None and cmsg["reasoning_details"][0]["type"] == "reasoning.summary"
    # its own prices: usage.cost at 0.10/0.20 per million, below the reference's
    assert cheap["usage"]["cost"] < ref["usage"]["cost"]
    # a context of 120 tokens: the answer is cut where the window ends
    assert small.status_code == 200 and small.json()["choices"][0]["finish_reason"] == "length"
    assert small.json()["choices"][0]["message"]["reasoning_details"][0]["type"] == "reasoning.encrypted"
    long = await chat(sim, body("x" * 2000, provider={"only": ["small"]}))
    assert long.status_code == 400 and "maximum context length is 120" in long.json()["error"]["message"]


async def test_endpoint_latency_and_stream(start_sim) -> None:
    import time

    sim = await start_sim(providers=FOUR)
    t0 = time.monotonic()
    r = await chat(sim, body(provider={"only": ["cheap"]}, stream=True))
    assert time.monotonic() - t0 >= 0.15 and r.headers["content-type"].startswith("text/event-stream")
    assert b'"reasoning_details"' in r.content and b'"provider":"Cheap"' in r.content


def test_bad_simulated_providers_are_refused_naming_them() -> None:
    from eyrie.jobs.simulator import SimulatorConfig

    with pytest.raises(ValueError, match=r"providers\[0\]"):
        SimulatorConfig(providers=[{"tag": "has space"}])
    with pytest.raises(ValueError, match="unique"):
        SimulatorConfig(providers=[{"tag": "a"}, {"tag": "a"}])


# ------------------------------------------------------------------------------- pure measures


@pytest.mark.parametrize(("answered", "reference", "f1", "compared"), [
    ({"a": True, "b": True}, {"a": True, "b": True}, 1.0, 2),
    ({"a": True, "b": False, "c": True}, {"a": True, "b": True, "c": False}, 0.5, 3),  # tp 1, fn 1, fp 1
    ({"a": False, "b": False}, {"a": True, "b": True}, 0.0, 2),
    ({"a": False}, {"a": False}, None, 1),  # neither called: nothing to agree on, not judged
    ({"a": True, "x": True}, {"a": True}, 1.0, 1),  # only prompts both answered count
], ids=["same", "half", "never", "no-calls", "unanswered"])
def test_trigger_f1(answered, reference, f1, compared) -> None:
    assert trigger_f1(answered, reference) == (f1, compared)


def test_routing_pins_passing_endpoints_keeping_the_users_other_fields() -> None:
    base = ProviderSpec(require_parameters=True, ignore=["azure"], data_collection="deny", order=["x"])
    block = routing(base, ["deepinfra", "acme"], ["acme", "deepinfra", "deepinfra/turbo", "other"])
    assert block.wire() == {"order": ["deepinfra", "acme"], "only": ["deepinfra", "acme"], "ignore":
                            ["azure", "deepinfra/turbo"], "allow_fallbacks": False, "require_parameters": True,
                            "data_collection": "deny"}


def test_limits_the_listing_states_are_judged_without_a_request() -> None:
    from eyrie.jobs.api.endpoints import Endpoint

    assert limits_failure(Endpoint("a", "A", max_completion_tokens=4096), 8192).measure == "completionLimit"
    assert limits_failure(Endpoint("a", "A", context_length=8192), 8192).measure == "contextLength"
    assert limits_failure(Endpoint("a", "A", context_length=131072, max_completion_tokens=16384), 8192) is None


# ------------------------------------------------------------------------------ the quickstart


@pytest.mark.integration
def test_the_quickstart_providers_example_drops_two_of_four(tmp_path) -> None:
    """`eyrie providers examples/quickstart-providers.yaml`: fastinfra/fp8 on schema accuracy, legacy on
    trigger agreement, template fit and reasoning; slowcloud and deepseek pass, the cheaper first."""
    env = {**os.environ, "EYRIE_NO_RAY": "1"}
    cmd = [sys.executable, "-m", "eyrie.jobs.cli", "providers", str(ROOT / "examples/quickstart-providers.yaml"),
           "--json", str(tmp_path / "probe.json")]
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    doc = orjson.loads((tmp_path / "probe.json").read_bytes())
    failing = {c["tag"]: {f["measure"] for f in c["failures"]} for c in doc["candidates"] if not c["passed"]}
    assert failing == {"fastinfra/fp8": {"schemaAccuracy"}, "legacy": {"triggerF1", "templateFit", "reasoning"}}
    assert doc["passing"] == ["slowcloud", "deepseek"] and doc["reference"] == "deepseek"
    c = {x["tag"]: x for x in doc["candidates"]}
    assert c["slowcloud"]["latencySeconds"]["p50"] > c["deepseek"]["latencySeconds"]["p50"]  # its latency
    assert c["legacy"]["toolCallRate"] < c["deepseek"]["toolCallRate"]
    assert "order: [slowcloud, deepseek]" in run.stdout
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0 and "spent $0.00 on 0 requests (stored probe reused)" in again.stderr
