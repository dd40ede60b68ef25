"""Several providers of one model, as OpenRouter routes between them: each endpoint answers with its own config
(prices, latency, tool-call rate, template variant) and its own faults on a completed answer (arguments that break
the schema, leaked calls, reasoning summarised, encrypted or withheld), is listed at
/models/{author}/{slug}/endpoints, and is chosen by the provider-selection guide's rules."""

from __future__ import annotations

import hashlib
import random
import threading
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from eyrie.jobs.simulator.answers import Answer, PromptCounter, completion_limit, tool_functions
from eyrie.jobs.simulator.config import MILLION, PROVIDER, SimulatedProvider, SimulatorConfig
from eyrie.jobs.simulator.faults import apply_content_fault
from eyrie.jobs.simulator.text import break_arguments

# What the simulator honours or accepts; an endpoint's listing names these unless told otherwise.
SUPPORTED_PARAMETERS = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "tools",
                        "tool_choice", "reasoning", "include_reasoning", "reasoning_effort", "stop")
NO_ENDPOINT = "No allowed providers are available for the selected model."


def _slug_matches(tag: str, slugs: Any) -> bool:
    """OpenRouter's base-slug matching: "deepinfra" names deepinfra and deepinfra/turbo."""
    return isinstance(slugs, list) and any(isinstance(s, str) and (tag == s or tag.startswith(s + "/"))
                                           for s in slugs)


@dataclass
class SimEndpoint:
    """One provider endpoint: its own answers (a SimulatorConfig of its own) and its own faults."""

    spec: SimulatedProvider
    cfg: SimulatorConfig
    counter: PromptCounter | None = None

    @property
    def tag(self) -> str:
        return self.spec.tag

    @property
    def name(self) -> str:
        return self.spec.name or self.spec.tag

    @property
    def parameters(self) -> tuple[str, ...]:
        listed = self.spec.supported_parameters
        return tuple(listed) if listed is not None else SUPPORTED_PARAMETERS

    def price(self) -> Decimal:
        return self.cfg.input_per_million + self.cfg.output_per_million

    def listing_entry(self, model: str) -> dict[str, Any]:
        """Its PublicEndpoint object, as OpenRouter's API reference documents it (prices per token)."""
        p = self.spec
        per_token = {"prompt": format((self.cfg.input_per_million / MILLION).normalize(), "f"),
                     "completion": format((self.cfg.output_per_million / MILLION).normalize(), "f"),
                     "request": "0", "image": "0"}
        return {"name": f"{self.name} | {model}", "model_id": model, "model_name": model,
                "context_length": p.context_length, "pricing": per_token, "provider_name": self.name,
                "tag": p.tag, "quantization": p.quantization,
                "max_completion_tokens": p.max_completion_tokens, "max_prompt_tokens": None,
                "supported_parameters": list(self.parameters), "status": 0, "uptime_last_30m": 100.0,
                "uptime_last_5m": 100.0, "uptime_last_1d": 100.0, "supports_implicit_caching": False,
                "latency_last_30m": None, "throughput_last_30m": None}

    def context_limit(self, body: dict[str, Any], ans: Answer) -> dict[str, Any] | None:
        """The request body cut to the completion its context window leaves (None: it fits);
        a prompt that fills the window is refused before (`too_long`)."""
        room = self.spec.context_length - ans.prompt_tokens
        cap = min(x for x in (room, self.spec.max_completion_tokens) if x is not None)
        if ans.completion_tokens <= cap:
            return None
        return {**body, "max_tokens": max(1, cap), "max_completion_tokens": max(1, cap)}

    def too_long(self, ans: Answer) -> bool:
        return ans.prompt_tokens >= self.spec.context_length

    def degrade(self, body: dict[str, Any], ans: Answer) -> Answer:
        """Its faults on a completed answer: tool calls whose arguments break the schema, calls
        leaked as raw markers, reasoning summarised or encrypted or withheld. Deterministic per
        (answer, endpoint)."""
        p = self.spec
        rng = random.Random(hashlib.sha256(f"{ans.gen_id}/{p.tag}/{self.cfg.seed}".encode()).digest())
        if ans.tool_calls and p.schema_error_rate:
            fns = {f.get("name"): f for f in tool_functions(body.get("tools"))}
            ans = replace(ans, tool_calls=[_break_arguments(c, fns) if rng.random() < p.schema_error_rate else c
                                           for c in ans.tool_calls])
        if ans.tool_calls and p.leak_rate and rng.random() < p.leak_rate:
            ans = apply_content_fault(ans, "leak", body, completion_limit(body, self.cfg))
        if ans.reasoning and p.reasoning != "full":
            text, details = ans.reasoning, None
            if p.reasoning == "summarised":
                details = [{"type": "reasoning.summary", "summary": "Summary: " + text[: max(8, len(text) // 5)],
                            "id": f"rs-{ans.gen_id}", "format": "unknown", "index": 0}]
            elif p.reasoning == "encrypted":
                data = hashlib.sha256(text.encode()).hexdigest()
                details = [{"type": "reasoning.encrypted", "data": data, "id": f"re-{ans.gen_id}",
                            "format": "unknown", "index": 0}]
            ans = replace(ans, reasoning=None, reasoning_details=details)
        return ans


def _break_arguments(call: dict[str, Any], fns: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    """The call with arguments that break its function's schema (`text.break_arguments`)."""
    fn = call["function"]
    broken = break_arguments(fn["arguments"], fns.get(fn["name"], {}).get("parameters"))
    return {**call, "function": {**fn, "arguments": broken}}


class SimEndpoints:
    """The endpoints of the model and OpenRouter's routing over them (provider-selection guide):
    `only`/`ignore` with base-slug matching, `quantizations`, `require_parameters`, then `order`
    (with `allow_fallbacks: false` nothing outside it), else the cheapest first."""

    def __init__(self, cfg: SimulatorConfig):
        self.cfg = cfg
        self.items: list[SimEndpoint] = []
        for raw in cfg.providers:
            p = SimulatedProvider.model_validate(raw)
            own = replace(
                cfg, providers=[],
                latency_ms=p.latency_ms if p.latency_ms is not None else cfg.latency_ms,
                tool_call_rate=p.tool_call_rate if p.tool_call_rate is not None else cfg.tool_call_rate,
                template_variant=p.template_variant if p.template_variant is not None else cfg.template_variant,
                input_per_million=p.input_per_million if p.input_per_million is not None else cfg.input_per_million,
                output_per_million=(p.output_per_million if p.output_per_million is not None
                                    else cfg.output_per_million))
            self.items.append(SimEndpoint(p, own, PromptCounter(own) if own.tokenizer else None))
        # load the tokenizer in the background now: a probe measures each endpoint's latency, and
        # the first answers must not carry the load
        for e in self.items:
            if e.counter is not None:
                threading.Thread(target=e.counter.load, daemon=True, name=f"sim-load-{e.tag}").start()

    def route(self, body: dict[str, Any]) -> SimEndpoint | None:
        """The endpoint that serves `body` (None: none may: OpenRouter's 404)."""
        prov = body.get("provider") if isinstance(body.get("provider"), dict) else {}
        eps = list(self.items)
        if "only" in prov:
            eps = [e for e in eps if _slug_matches(e.tag, prov["only"])]
        if "ignore" in prov:
            eps = [e for e in eps if not _slug_matches(e.tag, prov["ignore"])]
        if isinstance(prov.get("quantizations"), list):
            eps = [e for e in eps if e.spec.quantization in prov["quantizations"]]
        if prov.get("require_parameters"):
            sent = {k for k in body if k in SUPPORTED_PARAMETERS}
            eps = [e for e in eps if sent <= set(e.parameters)]
        order = prov.get("order") if isinstance(prov.get("order"), list) else []
        ordered = [e for slug in order for e in eps if _slug_matches(e.tag, [slug])]
        if order and prov.get("allow_fallbacks") is False:
            eps = ordered
        else:
            eps = ordered + sorted((e for e in eps if e not in ordered), key=lambda e: (e.price(), e.tag))
        return eps[0] if eps else None

    def listed(self) -> list[SimEndpoint]:
        """What the listing names: the configured endpoints, or the simulator itself."""
        return self.items or [SimEndpoint(SimulatedProvider(tag=PROVIDER), self.cfg)]

    def listing(self, model: str) -> dict[str, Any]:
        return {"data": {"id": model, "name": model, "created": 0, "description": "simulated (eyrie simulator)",
                         "architecture": {"tokenizer": "Other", "instruct_type": None, "modality": "text->text",
                                          "input_modalities": ["text"], "output_modalities": ["text"]},
                         "endpoints": [e.listing_entry(model) for e in self.listed()]}}


