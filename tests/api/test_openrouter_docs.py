"""OpenRouter as its own documentation describes it: each test serves a documented response shape
from an aiohttp server on 127.0.0.1 and runs the generation stage against it (inline workers), then
reads what eyrie recorded, retried, failed or stopped on.

Pages quoted (OpenRouterTeam/docs): api_reference/limits.mdx ("In-flight spending budget"),
api_reference/errors-and-debugging.mdx ("Moderation errors", "Guardrail errors", "Mid-stream
errors", "Typed error codes"), guides/features/guardrails/sensitive-info.mdx ("Error Responses"),
cookbook/administration/usage-accounting.mdx and api_reference/overview.mdx (`is_byok`,
`cost_details.upstream_inference_cost`), guides/best-practices/reasoning-tokens.mdx ("Reasoning
Details API Shape", effort levels), guides/routing/provider-selection.mdx (the `provider` fields),
openapi.yaml's GET /models/{author}/{slug}/endpoints (PublicEndpoint, NotFoundResponse).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

sys.path.insert(0, str(Path(__file__).parents[1]))
from fault_helpers import assert_exactly_once, persisted, progress, run_inline, spec_doc, write_rows, write_spec
from loopback_app import serve

from eyrie.jobs.contract.manifest import finalize_manifest
from eyrie.jobs.spec import SpecError, load_spec

# (status, headers, body, content type) for one chat request; `n` counts this prompt's requests
Reply = tuple[int, dict[str, str], bytes, str]
Answer = Callable[[dict[str, Any], int], Reply]

USAGE = {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25, "cost": 0.0001, "is_byok": False,
         "cost_details": {"upstream_inference_cost": None}}


class DocProvider:
    """A provider answering with `answer(body, n)` on 127.0.0.1, in a thread with its own event loop
    so that a whole run (which owns its own loop) can talk to it. Records every request."""

    def __init__(self, answer: Answer):
        self.answer = answer
        self.asked: dict[str, list[float]] = defaultdict(list)  # prompt -> request times
        self.bodies: list[dict[str, Any]] = []
        self.base_url = ""

    async def _chat(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        prompt = body["messages"][-1]["content"]
        self.asked[prompt].append(time.monotonic())
        self.bodies.append(body)
        status, headers, data, ctype = self.answer(body, len(self.asked[prompt]))
        return web.Response(status=status, headers=headers, body=data, content_type=ctype)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "test/model"}]})

    @contextmanager
    def running(self) -> Iterator[DocProvider]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        with serve(app) as self.base_url:
            yield self


def sse(*chunks: dict[str, Any]) -> bytes:
    return b": OPENROUTER PROCESSING\n\n" + b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) \
        + b"data: [DONE]\n\n"


def chunk(delta: dict[str, Any] | None, finish: str | None = None, native: str | None = None,
          **extra: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish,
                                         "native_finish_reason": native}]
    return {"id": "gen-1", "object": "chat.completion.chunk", "created": 1, "model": "test/model",
            "provider": "Doc", "choices": choices, **extra}


def streamed(content: str = "Fine.", usage: dict[str, Any] = USAGE, native: str = "stop",
             reasoning_details: list[list[dict[str, Any]]] = ()) -> Reply:
    parts = [chunk({"role": "assistant", "content": "", "reasoning_details": rd}) for rd in reasoning_details]
    parts += [chunk({"content": content}), chunk({}, "stop", native), chunk(None, usage=usage)]
    return 200, {}, sse(*parts), "text/event-stream"


def error(status: int, message: str, headers: dict[str, str] | None = None, **metadata: Any) -> Reply:
    err: dict[str, Any] = {"code": status, "message": message}
    if metadata:
        err["metadata"] = metadata
    return status, headers or {}, orjson.dumps({"error": err}), "application/json"


def prompts(tmp_path: Path, texts: list[str]) -> Path:
    return write_rows(tmp_path / f"p-{time.time_ns()}.jsonl",
                      [{"messages": [{"role": "user", "content": t}]} for t in texts])


def run(tmp_path: Path, monkeypatch: Any, provider: DocProvider, texts: list[str], **kw: Any) -> tuple[Any, Any]:
    doc = spec_doc(prompts(tmp_path, texts), f"file://{tmp_path}/out", provider.base_url, **kw)
    return run_inline(write_spec(tmp_path, doc), monkeypatch)


# ------------------------------------------------------------------------------ 1. 402 in flight


IN_FLIGHT = {"reason": "in_flight_budget_exhausted", "limit_source": "openrouter_in_flight_budget",
             "remedy_hint": "Retry after your in-flight requests settle (see the Retry-After header). Adding "
                            "credits at https://openrouter.ai/settings/credits raises your in-flight budget, "
                            "up to a capped ceiling."}
IN_FLIGHT_MESSAGE = ("This request would exceed your available credits given your current in-flight requests. "
                     "Retry after in-flight requests settle, or add credits.")


@pytest.mark.integration
def test_in_flight_budget_402_is_retried_after_its_retry_after(tmp_path, monkeypatch):
    """limits.mdx, "In-flight spending budget": a 402 with `reason: in_flight_budget_exhausted` and
    `limit_source: openrouter_in_flight_budget` is transient and carries Retry-After. Each prompt's
    first request gets it: eyrie waits the Retry-After (1 s; its own backoff would be <= 0.5 s) and
    asks again; every sample is answered, the run is Done, nothing reads "add credits"."""

    def answer(body: dict[str, Any], n: int) -> Reply:
        if n == 1:
            return error(402, IN_FLIGHT_MESSAGE, {"Retry-After": "1"}, **IN_FLIGHT)
        return streamed()

    texts = [f"Question {i}." for i in range(4)]
    with DocProvider(answer).running() as p:
        result, store = run(tmp_path, monkeypatch, p, texts, concurrency=4, max_retries=3)
    assert result.outcome == "Done", result.message
    recs = persisted(store)
    assert_exactly_once(recs, range(4))
    assert all(r["status"] == "ok" and r["attempts"] == 2 for r in recs)
    for t in texts:
        first, second = p.asked[t]
        assert second - first >= 1.0  # Retry-After honoured
    prog = progress(store)
    assert prog["retries"] == 4 and prog["outcome"] == "Done" and not prog.get("failures")
    assert Decimal(prog["spentUSD"]) == 4 * Decimal("0.0001")


@pytest.mark.integration
@pytest.mark.parametrize(("metadata", "says"), [
    ({}, "the provider reports insufficient credits (HTTP 402): Insufficient credits.; add credits, then resume"),
    ({"limit_source": "openrouter_credits", "reason": "weight_exceeds_budget", "remedy_hint": "Lower max_tokens."},
     "larger than the account's whole in-flight budget (HTTP 402): Insufficient credits. (Lower max_tokens.); "
     "lower api.sampling.maxTokens or add credits, then resume"),
    ({"limit_source": "openrouter_key_limit"}, "the API key's credit limit is spent (HTTP 402)"),
], ids=["out-of-credits", "weight-exceeds-budget", "key-limit"])
def test_a_real_out_of_credits_402_stops_the_run(tmp_path, monkeypatch, metadata, says):
    """limits.mdx, "Handling 402 errors": every other 402 (no credits, a single request larger than
    the whole in-flight budget, a spent key limit) cannot succeed on retry: the run stops with
    InsufficientCredits and the documented next step; no sample is recorded, none is asked twice."""
    with DocProvider(lambda b, n: error(402, "Insufficient credits.", **metadata)).running() as p:
        result, store = run(tmp_path, monkeypatch, p, [f"Q{i}" for i in range(3)], concurrency=1)
    assert result.outcome == "InsufficientCredits"
    assert says in result.message
    assert persisted(store) == [] and all(len(t) == 1 for t in p.asked.values())


# ------------------------------------------------------------------------------ 2. 403 moderation


MODERATED = {"reasons": ["harassment", "hate"], "flagged_input": "You are all...worthless",
             "provider_name": "OpenAI", "model_slug": "openai/gpt-4o"}


@pytest.mark.integration
def test_a_moderated_prompt_fails_its_sample_and_the_run_goes_on(tmp_path, monkeypatch):
    """errors-and-debugging.mdx: `403: Forbidden (... guardrail block, or moderation flag)`; moderation
    metadata carries `reasons` and `flagged_input`; a guardrail content filter answers
    "Request blocked by content filter: [LABEL]" (sensitive-info.mdx) or "Request blocked: ..." with
    `patterns`. Each such prompt fails alone (recorded with its reason, never retried), the others
    are answered, the run is Done and counts the failures by reason in progress and the manifest; a
    resume does not send them again."""

    def answer(body: dict[str, Any], n: int) -> Reply:
        prompt = body["messages"][-1]["content"]
        if prompt == "moderated":
            return error(403, "Input flagged by moderation", **MODERATED)
        if prompt == "pii":
            return error(403, "Request blocked by content filter: Email address")
        if prompt == "injection":
            return error(403, "Request blocked: prompt injection patterns detected",
                         patterns=["ignore all previous instructions"])
        return streamed()

    texts = ["fine 1", "moderated", "fine 2", "pii", "injection", "fine 3"]
    with DocProvider(answer).running() as p:
        result, store = run(tmp_path, monkeypatch, p, texts)
        assert result.outcome == "Done", result.message
        by_row = assert_exactly_once(persisted(store), range(6))
        for row in (1, 3, 4):
            rec = by_row[row]
            assert (rec["status"], rec["attempts"], rec["costUSD"], rec["error"]["type"]) == ("failed", 1, "0",
                                                                                              "moderation")
            assert len(p.asked[texts[row]]) == 1  # not retried
        assert by_row[1]["error"]["details"] == MODERATED
        assert "the provider refused this prompt (reasons: harassment, hate): Input flagged by moderation" \
            in by_row[1]["error"]["message"]
        assert "Request blocked by content filter: Email address" in by_row[3]["error"]["message"]
        assert by_row[4]["error"]["details"] == {"patterns": ["ignore all previous instructions"]}
        assert all(by_row[r]["status"] == "ok" for r in (0, 2, 5))
        prog = progress(store)
        assert prog["samples"] == {"total": 6, "done": 3, "rejected": 0, "discarded": 0, "failed": 3}
        assert prog["failures"] == {"moderation": 3}
        manifest = finalize_manifest(load_spec(next(tmp_path.glob("spec-*.yaml"))).spec, store)
        assert manifest["failures"] == {"moderation": 3} and manifest["samples"]["failed"] == 3
        asked = sum(len(v) for v in p.asked.values())
        again, store = run(tmp_path, monkeypatch, p, texts)  # the resume: nothing is left to send
        assert again.outcome == "Done" and sum(len(v) for v in p.asked.values()) == asked


@pytest.mark.integration
@pytest.mark.parametrize(("metadata", "outcome", "says"), [
    ({}, "Failed", "rejected the request (HTTP 403): Forbidden: this key may not use this model; check "
                   "EYRIE_API_KEY or api.apiKeySecretRef and the key's permissions"),
    ({"limit_source": "openrouter_guardrail_budget", "scope": "api-key", "limit_usd": 5, "spend_usd": 5},
     "InsufficientCredits", "a spending limit set on the provider is spent (HTTP 403, openrouter_guardrail_budget)"),
], ids=["no-permission", "guardrail-budget"])
def test_a_403_without_moderation_metadata_stops_the_run(tmp_path, monkeypatch, metadata, outcome, says):
    """A 403 that is not about this prompt (a key without permission; a guardrail budget, which names
    its `limit_source`) would fail every prompt alike: the run stops at once, nothing is recorded."""
    with DocProvider(lambda b, n: error(403, "Forbidden: this key may not use this model", **metadata)).running() as p:
        result, store = run(tmp_path, monkeypatch, p, ["a", "b", "c"], concurrency=1)
    assert result.outcome == outcome and says in result.message
    assert persisted(store) == [] and sum(len(v) for v in p.asked.values()) == 1


# ------------------------------------------------------------------------------------- 3. BYOK


@pytest.mark.integration
def test_byok_spend_counts_the_upstream_cost_against_the_budget(tmp_path, monkeypatch):
    """usage-accounting.mdx: `cost` is what OpenRouter charged; `cost_details.upstream_inference_cost`
    what the upstream provider charged (with BYOK: the user's own key). eyrie settles each answer at
    their sum, so the budget sees the whole spend: at $0.00042 an answer a $0.005 budget stops the
    run after about a dozen answers (counting only the $0.00002 fee, all 40 would go through)."""
    byok = {**USAGE, "cost": 0.00002, "is_byok": True,
            "cost_details": {"upstream_inference_cost": 0.0004, "upstream_inference_prompt_cost": 0.0001,
                             "upstream_inference_completions_cost": 0.0003}}
    with DocProvider(lambda b, n: streamed(usage=byok)).running() as p:
        result, store = run(tmp_path, monkeypatch, p, [f"Q{i}" for i in range(40)], max_usd="0.005", concurrency=2)
    assert result.outcome == "BudgetExhausted", result.message
    recs = persisted(store)
    answered = sum(len(v) for v in p.asked.values())
    assert len(recs) == answered and 5 < answered < 15
    assert all(r["costUSD"] == "0.00042" for r in recs)
    spent = Decimal(progress(store)["spentUSD"])
    assert spent == answered * Decimal("0.00042") <= Decimal("0.005")


# --------------------------------------------------------------------------- 4. reasoning_details


@pytest.mark.integration
def test_reasoning_only_in_reasoning_details_is_read_kept_and_judged(tmp_path, monkeypatch):
    """reasoning-tokens.mdx, "Reasoning Details API Shape": streamed `delta.reasoning_details` items of
    type reasoning.text / reasoning.summary / reasoning.encrypted, no `reasoning` string. The text
    items become the record's reasoning (in order); the raw details are kept (streamed pieces of one
    item merged, the signature from the last piece); reconstruction rebuilds the text one and
    excludes the summarised and the encrypted one with that reason."""
    text = [[{"type": "reasoning.text", "text": "Let me think ", "signature": None, "id": "r1",
              "format": "anthropic-claude-v1", "index": 0}],
            [{"type": "reasoning.text", "text": "it through.", "signature": "sha256:abc", "id": "r1",
              "format": "anthropic-claude-v1", "index": 0}]]
    summary = [[{"type": "reasoning.summary", "summary": "Analyzed the question.", "id": "s1",
                 "format": "openai-responses-v1", "index": 0}]]
    encrypted = [[{"type": "reasoning.encrypted", "data": "[REDACTED]", "id": "e1",
                   "format": "anthropic-claude-v1", "index": 0}]]
    details = {"text": text, "summary": summary, "encrypted": encrypted}

    def answer(body: dict[str, Any], n: int) -> Reply:
        return streamed("The answer is 4.", native="end_turn",
                        reasoning_details=details[body["messages"][-1]["content"]])

    with DocProvider(answer).running() as p:
        result, store = run(tmp_path, monkeypatch, p, ["text", "summary", "encrypted"],
                            extra={"target.tokenizer": "bundled:deepseek-v4", "target.chatFormat": "deepseek-v4",
                                   "api.sampling.reasoning": {"effort": "high"}})
    assert result.outcome == "Done", result.message
    by_row = {r["row"]: r["response"] for r in persisted(store)}
    assert by_row[0]["reasoning"] == "Let me think it through."
    assert by_row[0]["reasoning_details"] == [{**text[1][0], "text": "Let me think it through."}]
    assert by_row[0]["native_finish_reason"] == "end_turn"
    assert by_row[1]["reasoning"] is None and by_row[1]["reasoning_details"] == summary[0]
    assert by_row[2]["reasoning"] is None and by_row[2]["reasoning_details"] == encrypted[0]

    from eyrie.jobs.reconstruct.samples import build_samples

    summary_ = build_samples(load_spec(next(tmp_path.glob("spec-*.yaml"))).spec, store)
    assert summary_.samples == 1
    assert dict(summary_.excluded) == {"reasoning_summarised": 1, "reasoning_encrypted": 1}


# ---------------------------------------------------------------------- 5. documented options


@pytest.mark.integration
def test_every_documented_routing_and_reasoning_option_is_sent_as_documented(tmp_path, monkeypatch):
    """provider-selection.mdx's field table and reasoning-tokens.mdx's `reasoning` object, written in
    the spec in camelCase, arrive snake_case, values as given; `extra` passes a field eyrie does not
    type yet; the answer's `native_finish_reason` is recorded."""
    provider = {"order": ["moonshotai", "deepinfra/turbo"], "allowFallbacks": False, "requireParameters": True,
                "dataCollection": "deny", "zdr": True, "enforceDistillableText": True, "only": ["moonshotai"],
                "ignore": ["azure"], "quantizations": ["fp8", "int4"],
                "sort": {"by": "throughput", "partition": "none"},
                "preferredMinThroughput": {"p50": 100, "p90": 50}, "preferredMaxLatency": 5,
                "maxPrice": {"prompt": "1", "completion": 2, "request": "0.01"}, "extra": {"future_field": {"a": 1}}}
    reasoning = {"effort": "none", "maxTokens": 512, "exclude": False, "summary": "auto", "context": "current_turn",
                 "mode": "standard"}
    with DocProvider(lambda b, n: streamed(native="end_turn")).running() as p:
        result, store = run(tmp_path, monkeypatch, p, ["hello"],
                            extra={"api.provider": provider, "api.sampling.reasoning": reasoning})
    assert result.outcome == "Done", result.message
    sent = p.bodies[0]
    assert sent["provider"] == {
        "order": ["moonshotai", "deepinfra/turbo"], "allow_fallbacks": False, "require_parameters": True,
        "data_collection": "deny", "zdr": True, "enforce_distillable_text": True, "only": ["moonshotai"],
        "ignore": ["azure"], "quantizations": ["fp8", "int4"], "sort": {"by": "throughput", "partition": "none"},
        "preferred_min_throughput": {"p50": 100.0, "p90": 50.0}, "preferred_max_latency": 5.0,
        "max_price": {"prompt": "1", "completion": "2", "request": "0.01"}, "future_field": {"a": 1}}
    assert sent["reasoning"] == {"effort": "none", "max_tokens": 512, "exclude": False, "summary": "auto",
                                 "context": "current_turn", "mode": "standard"}
    assert persisted(store)[0]["request"]["provider"] == sent["provider"]
    assert persisted(store)[0]["response"]["native_finish_reason"] == "end_turn"


@pytest.mark.parametrize("effort", ["max", "xhigh", "high", "medium", "low", "minimal", "none"])
def test_each_documented_effort_is_accepted(tmp_path, effort):
    doc = spec_doc(tmp_path / "p.jsonl", f"file://{tmp_path}/o", "simulated",
                   extra={"api.sampling.reasoning": {"effort": effort}, "api.provider": {"sort": "exacto"}})
    spec = load_spec(write_spec(tmp_path, doc)).spec
    assert spec.api.sampling.reasoning.effort == effort


def test_undocumented_values_are_refused_with_the_field(tmp_path):
    doc = spec_doc(tmp_path / "p.jsonl", f"file://{tmp_path}/o", "simulated",
                   extra={"api.sampling.reasoning": {"effort": "ultra"},
                          "api.provider": {"sort": {"by": "cheapest"}, "extra": {"allow_fallbacks": True}}})
    with pytest.raises(SpecError) as e:
        load_spec(write_spec(tmp_path, doc))
    paths = [p for p, _ in e.value.problems]
    assert "spec.api.sampling.reasoning.effort" in paths and "spec.api.provider.extra" in paths
    assert any(p.startswith("spec.api.provider.sort") for p in paths)


# ------------------------------------------------------------------------ 6. mid-stream limits


@pytest.mark.integration
def test_a_mid_stream_length_error_fails_the_sample_without_a_retry(tmp_path, monkeypatch):
    """errors-and-debugging.mdx, "Mid-stream errors": once tokens are sent, an error arrives as a chunk
    with a top-level `error` (its `metadata.error_type` typed) and `finish_reason: "error"`; "token
    limit hit during generation" is a documented cause (`max_tokens_exceeded`,
    `context_length_exceeded`). Such a sample fails at once with the reason (a retry meets the same
    limit and may be paid again); when the error comes with usage, that cost is settled and recorded.
    A mid-stream provider disconnect is still retried."""

    def midstream(error_type: str, code: int, message: str, **extra: Any) -> Reply:
        return 200, {}, sse(chunk({"role": "assistant", "content": "The first part of"}),
                            chunk({"content": ""}, "error", error={"code": code, "message": message,
                                                                   "metadata": {"error_type": error_type}},
                                  **extra)), "text/event-stream"

    def answer(body: dict[str, Any], n: int) -> Reply:
        prompt = body["messages"][-1]["content"]
        if prompt == "long":  # reported with usage: it was billed, and is counted
            return midstream("max_tokens_exceeded", 400, "Generation stopped: max_tokens reached",
                             usage={**USAGE, "completion_tokens": 256, "cost": 0.0003})
        if prompt == "huge":
            return midstream("context_length_exceeded", 400, "This model's maximum context length is 8192 tokens")
        if prompt == "flaky" and n == 1:
            return midstream("provider_unavailable", 502, "Provider disconnected mid-stream")
        return streamed()

    texts = ["long", "huge", "flaky", "fine"]
    with DocProvider(answer).running() as p:
        result, store = run(tmp_path, monkeypatch, p, texts)
    assert result.outcome == "Done", result.message
    by_row = assert_exactly_once(persisted(store), range(4))
    for row, etype in ((0, "max_tokens_exceeded"), (1, "context_length_exceeded")):
        rec = by_row[row]
        assert (rec["status"], rec["attempts"], rec["error"]["type"]) == ("failed", 1, "length-limit")
        assert rec["error"]["details"] == {"error_type": etype}
        assert "not retried" in rec["error"]["message"] and len(p.asked[texts[row]]) == 1
    assert (by_row[2]["status"], by_row[2]["attempts"]) == ("ok", 2) and len(p.asked["flaky"]) == 2
    assert (by_row[0]["costUSD"], by_row[0]["usage"]["completion_tokens"]) == ("0.0003", 256)
    assert (by_row[1]["costUSD"], by_row[1]["usage"]) == ("0", None)  # nothing reported, nothing counted
    prog = progress(store)
    assert prog["failures"] == {"length-limit": 2} and prog["samples"]["failed"] == 2
    assert Decimal(prog["spentUSD"]) == Decimal("0.0003") + 2 * Decimal("0.0001")


@pytest.mark.parametrize(("types", "reason"), [
    ([], None), (["reasoning.text"], None), (["reasoning.summary", "reasoning.text"], None),
    (["reasoning.summary"], "reasoning_summarised"), (["reasoning.encrypted"], "reasoning_encrypted"),
    (["reasoning.text", "reasoning.encrypted", "reasoning.text"], "reasoning_encrypted"),
])
def test_which_reasoning_details_can_be_rebuilt(types, reason):
    """A summary beside the text (the guide's non-streaming example) leaves the text to rebuild; any
    encrypted item hides part of what the model wrote."""
    from eyrie.jobs.reconstruct.reconstructor import opaque_reasoning

    assert opaque_reasoning([{"type": t} for t in types]) == reason
    assert opaque_reasoning(None) is None


# ------------------------------------------------------------------------ 7. the endpoint listing

# api-reference/endpoints/list-endpoints (openapi.yaml, GET /models/{author}/{slug}/endpoints): the
# documented 200 example, and the documented NotFoundResponse.
LISTED = {"data": {
    "architecture": {"input_modalities": ["text"], "instruct_type": "chatml", "modality": "text->text",
                     "output_modalities": ["text"], "tokenizer": "GPT"},
    "created": 1692901234, "description": "GPT-4 is a large multimodal model that can solve difficult problems with "
                                          "greater accuracy.",
    "endpoints": [{"context_length": 8192, "latency_last_30m": {"p50": 0.25, "p75": 0.35, "p90": 0.48, "p99": 0.85},
                   "max_completion_tokens": 4096, "max_prompt_tokens": 8192, "model_id": "openai/gpt-4",
                   "model_name": "GPT-4", "name": "OpenAI: GPT-4",
                   "pricing": {"completion": "0.00006", "image": "0", "prompt": "0.00003", "request": "0"},
                   "provider_name": "OpenAI", "quantization": "fp16", "status": 0,
                   "supported_parameters": ["temperature", "top_p", "max_tokens", "frequency_penalty",
                                            "presence_penalty"],
                   "supports_implicit_caching": True, "tag": "openai",
                   "throughput_last_30m": {"p50": 45.2, "p75": 38.5, "p90": 28.3, "p99": 15.1},
                   "uptime_last_1d": 99.8, "uptime_last_30m": 99.5, "uptime_last_5m": 100}],
    "id": "openai/gpt-4", "name": "GPT-4"}}
NOT_FOUND = {"error": {"code": 404, "message": "Resource not found"}}


@contextmanager
def listing_server(routes: dict[str, tuple[int, Any]]) -> Iterator[str]:
    """GET paths -> (status, JSON body) on 127.0.0.1; unknown paths answer 404 {"detail": "Not Found"}."""

    async def handle(request: web.Request) -> web.Response:
        status, doc = routes.get(request.path, (404, {"detail": "Not Found"}))
        return web.json_response(doc, status=status)

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    with serve(app) as url:
        yield url


async def _listing(base_url: str, model: str):
    from eyrie.jobs.api import ChatClient
    from eyrie.jobs.api.endpoints import list_endpoints

    async with ChatClient(base_url, "k", timeout=10, max_retries=0, max_concurrency=1) as client:
        return await list_endpoints(client, model)


@pytest.mark.integration
def test_the_documented_endpoint_listing_is_read_field_for_field():
    """list-endpoints: `data.endpoints[]` with name, provider_name, tag, quantization, context_length,
    max_completion_tokens, max_prompt_tokens, pricing (USD per token, strings), supported_parameters,
    status, uptime. eyrie reads each (prices per million tokens, the unit budget.pricing uses)."""
    with listing_server({"/v1/models/openai/gpt-4/endpoints": (200, LISTED)}) as url:
        listing = asyncio.run(_listing(url, "openai/gpt-4"))
    assert listing.listed and listing.tags() == ["openai"]
    e = listing.get("openai")
    assert (e.provider_name, e.name, e.quantization, e.context_length, e.max_completion_tokens,
            e.max_prompt_tokens) == ("OpenAI", "OpenAI: GPT-4", "fp16", 8192, 4096, 8192)
    assert (e.prompt_per_million, e.completion_per_million) == (Decimal("30"), Decimal("60"))
    assert e.supported_parameters == ("temperature", "top_p", "max_tokens", "frequency_penalty", "presence_penalty")
    assert (e.status, e.uptime_last_30m) == (0, 99.5)


@pytest.mark.integration
def test_a_model_the_listing_does_not_know_and_an_api_without_a_listing():
    """The documented 404 NotFoundResponse is "no such model": an input error before anything is paid.
    A server without the route (vLLM, SGLang: FastAPI's {"detail": "Not Found"}) is the one endpoint it is."""
    from eyrie.jobs.api.endpoints import ModelNotListed

    with listing_server({"/v1/models/openai/gpt-5/endpoints": (404, NOT_FOUND)}) as url:
        with pytest.raises(ModelNotListed) as e:
            asyncio.run(_listing(url, "openai/gpt-5"))
        assert e.value.exit_code == 2 and "does not know 'openai/gpt-5' (HTTP 404: Resource not found)" in str(e.value)
        single = asyncio.run(_listing(url, "meta/llama"))
    assert not single.listed and len(single.endpoints) == 1 and single.endpoints[0].tag.startswith("127.0.0.1:")


def test_a_listing_that_is_not_the_documented_shape_names_the_field():
    from eyrie.jobs.api.endpoints import ListingError, parse_listing

    bad = {"data": {"endpoints": [{**LISTED["data"]["endpoints"][0], "tag": None}]}}
    with pytest.raises(ListingError, match=r"data\.endpoints\[0\]\.tag"):
        parse_listing(bad, "openai/gpt-4")
    with pytest.raises(ListingError, match=r"pricing\.prompt"):
        parse_listing({"data": {"endpoints": [{**LISTED["data"]["endpoints"][0],
                                               "pricing": {"prompt": "cheap"}}]}}, "openai/gpt-4")
