"""The provider probe's measures and verdict: probe records per endpoint -> pass/fail and why. Pure.

Every candidate endpoint answered the same prompts (`provider.only: [tag]`, no fallbacks). Per
endpoint this module counts what the records say and judges it against `ProbeThresholds`:

- answers, errors by reason, the `finish_reason` mix and the share cut by a length limit, latency
  p50/p95 (a whole answer, retries included);
- the tool-call rate, **trigger agreement** with the reference endpoint (MoonshotAI's
  K2-Vendor-Verifier measure: F1 of "answered with tool calls" over the prompts both answered, the
  reference's answers taken as the truth), **schema accuracy** (calls whose arguments validate
  against the declared schema: `tools.checks`, the same check every answer gets, counted in the
  `CallTally`) and the leak rate;
- the template variant its `usage.prompt_tokens` fit (decided by `reconstruct.variants`, passed in);
- reasoning as returned (full, summarised, encrypted, none), and the parameters the requests send
  that the listing says the endpoint does not support;
- spend per answer (`costUSD`: `usage.cost`, BYOK upstream cost included).

A measure that cannot be taken (no tool call by either side, no tokenizer) is reported as None and
not judged. Passing endpoints are ordered cheapest first (mean cost per answer): the order the run
routes them in.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from eyrie.jobs.api.endpoints import Endpoint
from eyrie.jobs.contract.calltally import CallTally
from eyrie.jobs.contract.records import Record
from eyrie.jobs.generate.budget.pricing import usd
from eyrie.jobs.reconstruct.reconstructor import opaque_reasoning
from eyrie.jobs.spec import ProbeThresholds, ProviderSpec
from eyrie.jobs.tools.checks import ResponseCheck

# Request fields the listing's `supported_parameters` speaks of (its documented Parameter enum);
# the others a body carries (model, messages, stream, usage, provider) are not endpoint features.
ENDPOINT_PARAMETERS = frozenset({
    "temperature", "top_p", "top_k", "min_p", "top_a", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "max_tokens", "max_completion_tokens", "logit_bias", "logprobs", "top_logprobs",
    "seed", "response_format", "structured_outputs", "stop", "tools", "tool_choice", "parallel_tool_calls",
    "include_reasoning", "reasoning", "reasoning_effort", "verbosity"})
# either name of a pair serves: OpenRouter maps one onto the other
EQUIVALENT = {"max_tokens": "max_completion_tokens", "max_completion_tokens": "max_tokens",
              "reasoning": "include_reasoning"}
REASONING_KINDS = ("full", "summarised", "encrypted", "none")


def _rate(n: int, d: int) -> float | None:
    return round(n / d, 6) if d else None


def _percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    s = sorted(values)
    return round(s[max(0, math.ceil(q * len(s)) - 1)], 3)


def reasoning_kind(response: Mapping[str, Any]) -> str:
    """How an answer returned its reasoning: full (the text), summarised, encrypted, or none."""
    opaque = opaque_reasoning(response.get("reasoning_details"))
    if opaque == "reasoning_encrypted":
        return "encrypted"
    if opaque == "reasoning_summarised":
        return "summarised"
    return "full" if response.get("reasoning") else "none"


def unsupported_parameters(body: Mapping[str, Any], endpoint: Endpoint) -> list[str]:
    """The endpoint features this request uses that the listing does not name (none when the
    listing does not say)."""
    listed = endpoint.supported_parameters
    if listed is None:
        return []
    have = set(listed)
    return sorted(k for k in body if k in ENDPOINT_PARAMETERS and k not in have and EQUIVALENT.get(k) not in have)


def trigger_f1(answered: Mapping[str, bool], reference: Mapping[str, bool]) -> tuple[float | None, int]:
    """F1 of "called a tool" against the reference's answers to the same prompts, and how many
    prompts both answered. None when neither called a tool on any of them (nothing to agree on)."""
    both = [sid for sid in answered if sid in reference]
    tp = sum(answered[s] and reference[s] for s in both)
    fp = sum(answered[s] and not reference[s] for s in both)
    fn = sum(reference[s] and not answered[s] for s in both)
    denominator = 2 * tp + fp + fn
    return (round(2 * tp / denominator, 6) if denominator else None), len(both)


@dataclass(frozen=True)
class Failure:
    """One measure outside its limit; `message` says it with both numbers."""

    measure: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"measure": self.measure, "message": self.message}


@dataclass
class Measures:
    """What one endpoint's probe records say, and the verdict."""

    endpoint: Endpoint
    sent: int = 0
    answers: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    finish: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    tools: dict[str, Any] = field(default_factory=dict)  # the answers' CallTally (tool_figures)
    called: dict[str, bool] = field(default_factory=dict)  # sample id -> answered with a tool call
    trigger_f1: float | None = None
    compared: int = 0
    template: dict[str, Any] | None = None  # reconstruct.variants' choice for it, None: not measured
    reasoning: Counter[str] = field(default_factory=Counter)
    unsupported: list[str] = field(default_factory=list)
    spent: Decimal = Decimal(0)
    reference: bool = False
    failures: list[Failure] = field(default_factory=list)

    @property
    def tag(self) -> str:
        return self.endpoint.tag

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def cost_per_answer(self) -> Decimal | None:
        return self.spent / self.answers if self.answers else None

    @property
    def schema_accuracy(self) -> float | None:
        calls = self.tools.get("calls", 0)
        return _rate(calls - self.tools.get("invalidCalls", 0), calls)

    @property
    def truncation_rate(self) -> float | None:
        return _rate(self.finish.get("length", 0), self.answers)

    @property
    def error_rate(self) -> float | None:
        return _rate(sum(self.errors.values()), self.sent)

    @property
    def opaque_reasoning_rate(self) -> float | None:
        return _rate(self.reasoning.get("summarised", 0) + self.reasoning.get("encrypted", 0), self.answers)

    def reason(self) -> str:
        return "; ".join(f.message for f in self.failures)

    def to_json(self) -> dict[str, Any]:
        cpa = self.cost_per_answer
        return {
            "tag": self.tag, "name": self.endpoint.provider_name, "passed": self.passed,
            "failures": [f.to_json() for f in self.failures], "reference": self.reference,
            "endpoint": self.endpoint.to_json(),
            "sent": self.sent, "answers": self.answers, "errors": dict(self.errors),
            "errorRate": self.error_rate, "finishReasons": dict(self.finish), "truncationRate": self.truncation_rate,
            "latencySeconds": {"p50": _percentile(self.latencies, 0.5), "p95": _percentile(self.latencies, 0.95)},
            "toolCallRate": self.tools.get("callRate"), "declaredPrompts": self.tools.get("declaredPrompts", 0),
            "calls": self.tools.get("calls", 0), "invalidCalls": self.tools.get("invalidCalls", 0),
            "schemaAccuracy": self.schema_accuracy, "leaks": self.tools.get("leaks", 0),
            "leakRate": self.tools.get("leakRate"), "triggerF1": self.trigger_f1, "comparedPrompts": self.compared,
            "template": self.template, "reasoning": {k: self.reasoning.get(k, 0) for k in REASONING_KINDS},
            "unsupportedParameters": self.unsupported, "spentUSD": usd(self.spent),
            "costPerAnswerUSD": usd(cpa) if cpa is not None else None,
        }


def tool_figures(t: CallTally) -> dict[str, Any]:
    """The tool side of one endpoint's answers (rates None where their denominator is empty)."""
    return {"answers": t.answers, "declaredPrompts": t.declared, "callRate": _rate(t.called, t.declared),
            "calls": t.calls, "invalidCalls": t.invalid, "leaks": t.leaked, "leakRate": _rate(t.leaked, t.answers)}


def measure(endpoint: Endpoint, recs: Iterable[Record]) -> Measures:
    """Count one endpoint's probe records (no judgment yet)."""
    m = Measures(endpoint)
    tally = CallTally()
    unsupported: set[str] = set()
    for r in recs:
        m.sent += 1
        m.spent += Decimal(r.get("costUSD") or "0")
        if r.get("request"):
            unsupported.update(unsupported_parameters(r["request"], endpoint))
        if r.get("status") != "ok":
            m.errors[str((r.get("error") or {}).get("type") or r.get("status"))] += 1
            continue
        m.answers += 1
        resp = r.get("response") or {}
        m.finish[str(resp.get("finish_reason") or "none")] += 1
        if isinstance(r.get("latencyS"), (int, float)):
            m.latencies.append(float(r["latencyS"]))
        m.reasoning[reasoning_kind(resp)] += 1
        check = ResponseCheck.from_record(r["checks"])
        tally.add(check.declared, check.called, len(check.calls), check.invalid_calls, check.leaked)
        m.called[r["sample_id"]] = check.called
    m.tools = tool_figures(tally)
    m.unsupported = sorted(unsupported)
    return m


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}" if x >= 0.01 or x == 0 else f"{x:.4f}"


def judge(m: Measures, t: ProbeThresholds) -> None:
    """Fill `m.failures` with every measure outside its threshold (each message names the spec field)."""
    fails = m.failures
    fails.clear()
    if m.answers == 0:
        errors = ", ".join(f"{k} {n}" for k, n in sorted(m.errors.items())) or "nothing sent"
        fails.append(Failure("answers", f"no answer to {m.sent} probe requests ({errors})"))
        return
    if m.error_rate is not None and m.error_rate > t.max_error_rate:
        fails.append(Failure("errorRate", f"error rate {_fmt(m.error_rate)} > maxErrorRate {_fmt(t.max_error_rate)} "
                             f"({', '.join(f'{k} {n}' for k, n in sorted(m.errors.items()))})"))
    if m.trigger_f1 is not None and m.trigger_f1 < t.min_trigger_f1:
        fails.append(Failure("triggerF1", f"trigger F1 {_fmt(m.trigger_f1)} < minTriggerF1 {_fmt(t.min_trigger_f1)} "
                             f"against the reference over {m.compared} prompts"))
    acc = m.schema_accuracy
    if acc is not None and acc < t.min_schema_accuracy:
        fails.append(Failure("schemaAccuracy", f"schema accuracy {_fmt(acc)} < minSchemaAccuracy "
                             f"{_fmt(t.min_schema_accuracy)} ({m.tools['invalidCalls']} of {m.tools['calls']} "
                             "calls invalid)"))
    leak = m.tools.get("leakRate") or 0.0
    if leak > t.max_leak_rate:
        fails.append(Failure("leakRate", f"leak rate {_fmt(leak)} > maxLeakRate {_fmt(t.max_leak_rate)} "
                             f"({m.tools.get('leaks', 0)} answers with raw tool-call markers)"))
    if t.require_template_fit and m.template is not None:
        how, fits, variant = m.template.get("how"), m.template.get("fits") or [], m.template.get("variant")
        if how == "mismatch":
            fails.append(Failure("templateFit", "usage.prompt_tokens fits no template variant (requireTemplateFit)"))
        elif how == "unreported":
            fails.append(Failure("templateFit", "reports no usage.prompt_tokens: its template cannot be checked "
                                 "(requireTemplateFit)"))
        elif how == "pinned" and variant not in fits:
            fails.append(Failure("templateFit", f"usage.prompt_tokens does not fit the pinned template variant "
                                 f"{variant} (requireTemplateFit)"))
    trunc = m.truncation_rate or 0.0
    if trunc > t.max_truncation_rate:
        fails.append(Failure("truncationRate", f"truncation rate {_fmt(trunc)} > maxTruncationRate "
                             f"{_fmt(t.max_truncation_rate)} ({m.finish.get('length', 0)} answers cut by a "
                             "length limit)"))
    opaque = m.opaque_reasoning_rate or 0.0
    if opaque > t.max_opaque_reasoning_rate:
        fails.append(Failure("reasoning", f"reasoning summarised or encrypted on {_fmt(opaque)} of answers > "
                             f"maxOpaqueReasoningRate {_fmt(t.max_opaque_reasoning_rate)}"))
    if t.require_parameters and m.unsupported:
        fails.append(Failure("parameters", f"does not support {', '.join(m.unsupported)} (requireParameters)"))
    p95 = _percentile(m.latencies, 0.95)
    if t.max_latency_p95_seconds is not None and p95 is not None and p95 > t.max_latency_p95_seconds:
        fails.append(Failure("latency", f"latency p95 {p95:.2f} s > maxLatencyP95Seconds "
                             f"{t.max_latency_p95_seconds:g}"))


def limits_failure(endpoint: Endpoint, max_tokens: int) -> Failure | None:
    """An endpoint the listing says cannot give an answer as long as api.sampling.maxTokens: OpenRouter
    routes no such request to it, so it is judged without being sent anything."""
    cap = endpoint.max_completion_tokens
    if cap is not None and cap < max_tokens:
        return Failure("completionLimit", f"max_completion_tokens {cap} < api.sampling.maxTokens {max_tokens}: "
                       "no request is routed to it")
    ctx = endpoint.context_length
    if ctx is not None and ctx <= max_tokens:
        return Failure("contextLength", f"context_length {ctx} <= api.sampling.maxTokens {max_tokens}")
    return None


@dataclass
class ProviderVerdict:
    """The probe's result over every candidate; `measures` passing first, cheapest first."""

    measures: list[Measures]
    reference: str | None

    @property
    def passing(self) -> list[str]:
        return [m.tag for m in self.measures if m.passed]

    @property
    def failing(self) -> list[Measures]:
        return [m for m in self.measures if not m.passed]

    def why_none(self) -> str:
        return "no provider passes the probe: " + "; ".join(f"{m.tag}: {m.reason()}" for m in self.measures)


def _order_key(m: Measures) -> tuple[int, Decimal, str]:
    cpa = m.cost_per_answer
    return (0 if m.passed else 1, cpa if cpa is not None else Decimal("Infinity"), m.tag)


def decide(measures: list[Measures], reference: str | None, thresholds: ProbeThresholds,
           templates: Mapping[str, dict[str, Any] | None],
           pre_failed: Mapping[str, Failure] | None = None) -> ProviderVerdict:
    """Trigger agreement against the reference, every threshold, then the order (passing, cheapest
    first). `templates`: each endpoint's template choice (absent: not measured); `pre_failed`: endpoints
    judged from the listing alone (never sent)."""
    ref = next((m for m in measures if m.tag == reference), None)
    for m in measures:
        m.reference = m.tag == reference
        m.template = templates.get(m.tag)
        if ref is not None and ref.answers:
            m.trigger_f1, m.compared = trigger_f1(m.called, ref.called)
        judge(m, thresholds)
        if pre_failed and m.tag in pre_failed:
            m.failures.insert(0, pre_failed[m.tag])
    return ProviderVerdict(sorted(measures, key=_order_key), reference)


def routing(base: ProviderSpec | None, passing: Sequence[str], listed: Sequence[str]) -> ProviderSpec:
    """The `api.provider` block that sends requests only to `passing`, cheapest first, no fallbacks.
    A passing base slug ("deepinfra") would also match its variants ("deepinfra/turbo", OpenRouter's
    base-slug matching), so listed variants that did not pass are ignored explicitly."""
    keep = base.model_copy(deep=True) if base is not None else ProviderSpec()
    ignore = [t for t in listed if t not in passing and any(t.startswith(p + "/") for p in passing)]
    merged_ignore = sorted(set(keep.ignore or []) | set(ignore)) or None
    return keep.model_copy(update={"only": list(passing), "order": list(passing), "allow_fallbacks": False,
                                   "ignore": merged_ignore})


def probe_routing(base: ProviderSpec | None, tag: str, listed: Sequence[str]) -> ProviderSpec:
    """The block that pins one probe request to exactly one endpoint."""
    return routing(base, [tag], listed)
