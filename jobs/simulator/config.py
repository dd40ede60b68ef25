"""The simulator's configuration: what a spec's `api.simulator` says (the few fields of the public CRD: latency,
seed, which builtin model answers) and what a simulator config file says (the demo and test behaviours, faults
first: `SimulatorBehaviour`, whose schema is here and not in the v1alpha1 API), as the `SimulatorConfig` a server
runs on (JSON across the process boundary: `SimulatorProcess` hands it to `eyrie simulate`)."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from eyrie.jobs.errors import InputError
from eyrie.jobs.simulator.text import TextBehaviour, prompt_key, source_index
from eyrie.jobs.spec import (
    SIMULATOR_PRICING,
    USD,
    Model,
    ProviderTag,
    SimulatorSpec,
    SourceSpec,
    TargetSpec,
    parse_usd,
)

FaultName = Literal["429", "429-no-retry-after", "500", "502", "503", "402", "402-in-flight", "403-moderation",
                    "timeout", "stream-cut", "200-error", "malformed-json", "empty-choices", "length-empty", "leak",
                    "byok"]
FAULTS: tuple[str, ...] = get_args(FaultName)
# Drawn when fault_rate > 0 but no fault is named: every transient failure a client must survive
# quickly ("timeout" hangs until the client gives up, so it is only used when asked for).
DEFAULT_FAULTS: tuple[str, ...] = (
    "429", "500", "502", "503", "stream-cut", "200-error", "malformed-json", "empty-choices",
)
PROVIDER = "eyrie-simulator"
MODEL_ID = "eyrie/simulated"
MILLION = Decimal(1_000_000)
BYOK_FEE = 0.05  # OpenRouter's BYOK fee: a share of what the request would cost on its credits


class SimulatedTextFormats(Model):
    """Weights of the formats the simulated model writes its text calls in (relative; 0: never)."""

    glaive: float = Field(default=0, ge=0)
    """`<functioncall> {"name": ..., "arguments": '...'}` (glaive-function-calling-v2)."""
    hermes: float = Field(default=0, ge=0)
    """`<tool_call>{...}</tool_call>` (Hermes, Qwen)."""
    kimi: float = Field(default=0, ge=0)
    """Kimi K2's native call section."""
    deepseek: float = Field(default=0, ge=0)
    """DeepSeek-V3.1's native calls."""
    json_: float = Field(default=0, ge=0, alias="json")
    """A bare or fenced JSON object `{"name": ..., "arguments": {...}}`."""

    @model_validator(mode="after")
    def _some(self) -> SimulatedTextFormats:
        if not any(self.model_dump().values()):
            raise ValueError("at least one format needs a weight above 0")
        return self


class SimulatedTextCalls(Model):
    """How the simulated model answers a prompt whose functions are only described in its text
    (`tools.mode: text`, the text side of `eyrie audit`). A model does not call as often, or as
    well, from a description as from the API's `tools`; these say how much worse (docs/operating.md)."""

    call_rate: float = Field(default=0.6, ge=0, le=1)
    """Share of such prompts answered with a tool call written as text (structured: 0.8)."""
    formats: SimulatedTextFormats = Field(default_factory=lambda: SimulatedTextFormats(
        json=0.35, hermes=0.3, glaive=0.2, kimi=0.1, deepseek=0.05))  # type: ignore[call-arg]
    """The formats those calls are written in; default json 0.35, hermes 0.3, glaive 0.2, kimi 0.1,
    deepseek 0.05."""
    invalid_share: float = Field(default=0.15, ge=0, le=1)
    """Share of text calls that do not validate (a required argument left out; without one,
    arguments that are not JSON)."""
    prose_share: float = Field(default=0.5, ge=0, le=1)
    """Share of the answers without a call that name a declared function in prose."""
class SimulatedProvider(Model):
    """One endpoint the simulator serves for the model (`providers` of a simulator config file): the endpoint
    listing names it, requests route to it on `provider.only`/`order`, and it answers with its own
    faults, so a local run shows the provider probe keeping some and dropping others."""

    tag: ProviderTag
    """Its endpoint tag (what `provider.only` names), e.g. moonshotai or fastinfra/fp8."""
    name: str | None = Field(default=None, max_length=128)
    """Its provider name (the listing's provider_name, the answers' `provider`); default: the tag."""
    quantization: str | None = Field(default=None, max_length=32)
    """Quantization the listing reports (fp8, bf16, int4, ...)."""
    context_length: int = Field(default=131072, ge=16)
    """Context window: a prompt plus answer longer than this is cut (finish_reason length)."""
    max_completion_tokens: int | None = Field(default=None, ge=1)
    """Longest answer the listing reports; unset: the context window."""
    input_per_million: USD | None = None
    """Its price per million prompt tokens (default: the simulator's)."""
    output_per_million: USD | None = None
    """Its price per million completion tokens (default: the simulator's)."""
    latency_ms: float | None = Field(default=None, ge=0)
    """Added latency per request (default: the simulator's latency)."""
    tool_call_rate: float | None = Field(default=None, ge=0, le=1)
    """Share of tool-declaring prompts answered with calls (default: the simulator's 0.8)."""
    schema_error_rate: float = Field(default=0, ge=0, le=1)
    """Share of its tool calls whose arguments break the declared schema (a required field dropped)."""
    leak_rate: float = Field(default=0, ge=0, le=1)
    """Share of its tool-calling answers whose calls come back as raw markers in the content."""
    template_variant: str | None = Field(default=None, min_length=1, max_length=64)
    """The template variant whose length it reports as usage.prompt_tokens (with target.tokenizer;
    `unknown` for one eyrie does not know; default: the config file's templateVariant)."""
    reasoning: Literal["full", "summarised", "encrypted", "none"] = "full"
    """How it returns reasoning: as written, only a summary, encrypted, or not at all."""
    supported_parameters: list[str] | None = None
    """What the listing says it supports (default: every parameter the simulator honours)."""

    _money = field_validator("input_per_million", "output_per_million", mode="before")(
        lambda v: parse_usd(v) if v is not None else None
    )


class SimulatedRateLimit(Model):
    """A request limit the simulator enforces, as a provider counting a sliding window does: past `requests` in any
    `windowSeconds`, a request is answered 429 with Retry-After (until the oldest leaves the window)."""

    requests: int = Field(ge=1)
    """Requests accepted in any window."""
    window_seconds: float = Field(default=60, gt=0, le=3600)
    """The window's length (a provider's "per minute": 60)."""


class SimulatedLatency(Model):
    """How long each answer takes, drawn per request (seeded) between `minSeconds` and `maxSeconds`: a real target's
    spread (a thinking model answers in seconds to minutes), where `api.simulator.latencyMs` is one fixed delay."""

    min_seconds: float = Field(ge=0, le=3600)
    max_seconds: float = Field(ge=0, le=3600)
    distribution: Literal["uniform", "logUniform"] = "uniform"
    """uniform in [min, max]; logUniform: uniform in log(latency), as many short answers as long ones per decade."""

    @model_validator(mode="after")
    def _ordered(self) -> SimulatedLatency:
        if self.max_seconds < self.min_seconds:
            raise ValueError(f"maxSeconds {self.max_seconds} is below minSeconds {self.min_seconds}")
        if self.distribution == "logUniform" and self.min_seconds <= 0:
            raise ValueError("logUniform needs minSeconds above 0")
        return self


class SimulatorBehaviour(Model):
    """A simulator config file (`api.simulator.config`, `eyrie simulate --config`): the provider's behaviours for
    demos and tests, faults first. Not part of the v1alpha1 API: a DatasetGeneration names the file, never these."""

    fault_rate: float = Field(default=0, ge=0, le=1)
    """Share of requests that fail."""
    faults: list[FaultName] = Field(default_factory=list)
    """Faults drawn at faultRate (all transient ones when empty): HTTP errors (402-in-flight is
    OpenRouter's transient in-flight-budget 402, 403-moderation a flagged prompt), hangs, broken
    streams and bodies, leaked tool-call markers, and byok (usage as billed with the user's own
    provider key: OpenRouter's fee plus upstream_inference_cost)."""
    divergence_rate: float = Field(default=0, ge=0, le=1)
    """Share of tool-calling turns where the simulated model calls another tool, with other
    arguments or not at all (agentic sources, `generation.turns: all`)."""
    template_variant: str | None = Field(default=None, min_length=1, max_length=64)
    """The template variant whose prompt length the simulator reports as usage.prompt_tokens (with
    target.tokenizer; default: the format's first); `unknown` serves one eyrie does not know."""
    default_thinking: bool | None = None
    """Whether the simulated model thinks when the request does not say (no `reasoning`): unset,
    the template's default with no reasoning returned; false, a provider that silently serves the
    model with thinking off (prompt tokens counted as the template renders it with thinking off);
    true, one that thinks and returns the reasoning."""
    completion_token_drift: float = Field(default=0, ge=0, le=1)
    """Each answer's usage.completion_tokens off by up to this share of the true count (a seeded draw per answer in
    [-share, +share]), as a provider counting with another tokenizer does. 0: with target.tokenizer the count is
    exact (the tokens the answer is rebuilt into), so the completion-token gap reads 0; without one, a quarter of
    its characters."""
    text_calls: SimulatedTextCalls = Field(default_factory=SimulatedTextCalls)
    """How the simulated model answers prompts whose functions are described only as text."""
    text_calls_by_source: dict[str, SimulatedTextCalls] = Field(default_factory=dict)
    """The same, per source name (its prompts are recognised by their last user message); sources
    not named get `textCalls`."""
    providers: list[SimulatedProvider] = Field(default_factory=list, max_length=64)
    """Endpoints of the model, each with its own behaviour, routed on provider.only/order and listed
    at /models/{author}/{slug}/endpoints; empty: one endpoint, eyrie-simulator."""
    rate_limit: SimulatedRateLimit | None = None
    """A request limit over a sliding window (429 with Retry-After past it); unset: none."""
    latency: SimulatedLatency | None = None
    """Each answer's latency drawn from a range (replaces api.simulator.latencyMs); unset: latencyMs."""

    @field_validator("providers")
    @classmethod
    def _unique_tags(cls, v: list[SimulatedProvider]) -> list[SimulatedProvider]:
        tags = [p.tag for p in v]
        dupes = sorted({t for t in tags if tags.count(t) > 1})
        if dupes:
            raise ValueError(f"tags {', '.join(dupes)} named twice")
        return v


class SimulatorConfigError(InputError, ValueError):
    """A simulator config file that cannot be read, or that names what the spec does not have."""


def read_behaviour(path: str | Path, source_names: Sequence[str] | None = None) -> SimulatorBehaviour:
    """The simulator config file at `path` (YAML or JSON), checked; with `source_names` (the spec's), every source
    its textCallsBySource names must be one of them. Errors name the file and the field."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except OSError as e:
        raise SimulatorConfigError(f"simulator config {p}: cannot read it: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise SimulatorConfigError(f"simulator config {p}: not YAML or JSON: {e}") from None
    try:
        behaviour = SimulatorBehaviour.model_validate(doc or {})
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "(file)"
        raise SimulatorConfigError(f"simulator config {p}: {where}: {err['msg']}") from None
    if source_names is not None and (unknown := sorted(set(behaviour.text_calls_by_source) - set(source_names))):
        raise SimulatorConfigError(f"simulator config {p}: textCallsBySource: no source named {', '.join(unknown)} "
                                   f"(sources: {', '.join(source_names)})")
    return behaviour


def text_behaviour(spec: SimulatedTextCalls | None = None) -> TextBehaviour:
    """A file's textCalls as the answers use them (SimulatedTextCalls' defaults are the simulator's)."""
    spec = spec or SimulatedTextCalls()
    formats = {k: v for k, v in spec.formats.model_dump(by_alias=True).items() if v}
    return TextBehaviour(spec.call_rate, formats, spec.invalid_share, spec.prose_share)


def rate_limit(behaviour: SimulatorBehaviour) -> dict[str, Any]:
    """A file's rateLimit and latency as SimulatorConfig's fields."""
    r, lat = behaviour.rate_limit, behaviour.latency
    return {"rate_limit_requests": r.requests if r else None, "rate_limit_window_s": r.window_seconds if r else 60.0,
            **({"latency_range_s": (lat.min_seconds, lat.max_seconds), "latency_distribution": lat.distribution}
               if lat else {})}


def check_providers(providers: list[dict[str, Any]]) -> None:
    """Each entry must be a SimulatedProvider (the file's own model checks it), tags unique."""
    tags = []
    for i, p in enumerate(providers):
        try:
            tags.append(SimulatedProvider.model_validate(p).tag)
        except ValidationError as e:
            raise ValueError(f"simulator providers[{i}]: {e.errors()[0]['msg']}") from None
    if len(set(tags)) != len(tags):
        raise ValueError(f"simulator providers: tags must be unique, got {tags}")


@dataclass
class SimulatorConfig:
    """Behaviour of the simulated provider; prices are USD per million tokens."""

    latency_ms: float = 0
    fault_rate: float = 0
    faults: list[str] = field(default_factory=list)
    seed: int = 0
    input_per_million: Decimal = SIMULATOR_PRICING.input_per_million
    output_per_million: Decimal = SIMULATOR_PRICING.output_per_million
    tool_call_rate: float = 0.8
    divergence_rate: float = 0.0  # tool-calling turns answered with another call, other arguments or none
    completion_token_drift: float = 0.0  # a fault: usage.completion_tokens off by up to this share of the count
    answer_model: str | None = None  # a builtin chat model whose decoded answers are served (model_answer)
    answer_model_calls: str = "simulator"  # who decides its calls: "simulator" (tool_call_rate) or "model"
    # text mode (functions described in the prompt): what the model does, per source (text.py)
    text_calls: TextBehaviour = field(default_factory=lambda: text_behaviour())
    text_calls_by_source: dict[str, TextBehaviour] = field(default_factory=dict)
    text_sources: list[dict[str, Any]] = field(default_factory=list)  # SourceSpec dumps, to recognise their prompts
    sources_endpoint: str | None = None
    max_completion_tokens: int = 512
    retry_after_s: int = 1  # the Retry-After header of the "429" fault
    hang_s: float = 3600.0  # how long the "timeout" fault holds a request (until the client leaves)
    api_key: str | None = None  # when set, requests must carry `Authorization: Bearer <api_key>`
    # With a tokenizer, usage.prompt_tokens is the length of the prompt `chat_format` renders with
    # `template_variant` (None: the format's default; "unknown": one eyrie does not know), as a real
    # provider counts it, and usage.completion_tokens the length of the answer as that format renders
    # it (the tokens a model wrote to give this answer); without one, a quarter of the characters.
    tokenizer: str | None = None
    chat_format: str = "auto"
    template_variant: str | None = None
    # Thinking when the request does not say: None the template's default (no reasoning returned),
    # False off (counted so), True on (reasoning returned).
    default_thinking: bool | None = None
    # Several endpoints of the model (SimulatedProvider fields, snake_case), routed on provider.only/
    # order and listed at /models/{author}/{slug}/endpoints; empty: one endpoint that ignores routing.
    providers: list[dict[str, Any]] = field(default_factory=list)
    model: str | None = None  # the model the listing knows (None: any)
    rate_limit_requests: int | None = None  # 429 past this many requests in any rate_limit_window_s (None: no limit)
    rate_limit_window_s: float = 60.0
    latency_range_s: tuple[float, float] | None = None  # each answer's latency drawn from it (None: latency_ms)
    latency_distribution: str = "uniform"  # uniform | logUniform

    def __post_init__(self) -> None:
        self.input_per_million = Decimal(str(self.input_per_million))
        self.output_per_million = Decimal(str(self.output_per_million))
        unknown = [f for f in self.faults if f not in FAULTS]
        if unknown:
            raise ValueError(f"simulator faults: unknown {unknown}; known: {list(FAULTS)}")
        self.text_calls = TextBehaviour.of(self.text_calls)
        self.text_calls_by_source = {k: TextBehaviour.of(v) for k, v in self.text_calls_by_source.items()}
        for name in ("fault_rate", "tool_call_rate", "divergence_rate", "completion_token_drift"):
            v = getattr(self, name)
            if not 0 <= v <= 1:
                raise ValueError(f"simulator {name}: {v} is not a probability in [0, 1]")
        if self.latency_ms < 0 or self.max_completion_tokens < 1 or self.retry_after_s < 0:
            raise ValueError("simulator latency_ms, retry_after_s must be >= 0, max_completion_tokens >= 1")
        if (self.rate_limit_requests is not None and self.rate_limit_requests < 1) or self.rate_limit_window_s <= 0:
            raise ValueError("simulator rate_limit_requests must be >= 1 and rate_limit_window_s > 0")
        if self.latency_range_s is not None:
            self.latency_range_s = (float(self.latency_range_s[0]), float(self.latency_range_s[1]))
            lo, hi = self.latency_range_s
            if not 0 <= lo <= hi or self.latency_distribution not in ("uniform", "logUniform") or (
                    self.latency_distribution == "logUniform" and lo <= 0):
                raise ValueError(f"simulator latency_range_s {self.latency_range_s} ({self.latency_distribution}): "
                                 "needs 0 <= min <= max (min > 0 for logUniform)")
        if self.answer_model_calls not in ("simulator", "model"):
            raise ValueError(f"simulator answer_model_calls: {self.answer_model_calls!r} is not simulator or model")
        check_providers(self.providers)

    @classmethod
    def from_spec(cls, sim: SimulatorSpec | None, target: TargetSpec | None = None,
                  sources: Sequence[SourceSpec] = (), endpoint: str | None = None) -> SimulatorConfig:
        """What `api.simulator` says (latency, seed, the answer model) and the config file it names (the demo and
        test behaviours), read and checked against the spec's sources."""
        behaviour = SimulatorBehaviour() if sim is None or sim.config is None else read_behaviour(
            sim.config, [s.name for s in sources])
        counts = {} if target is None or not target.tokenizer else {
            "tokenizer": target.tokenizer, "chat_format": target.chat_format,
            "template_variant": behaviour.template_variant}
        if target is not None:
            counts["model"] = target.model
        by_source = {k: text_behaviour(v) for k, v in behaviour.text_calls_by_source.items()}
        text = {"text_calls": text_behaviour(behaviour.text_calls), "text_calls_by_source": by_source,
                "text_sources": [s.dump() for s in sources if s.name in by_source], "sources_endpoint": endpoint}
        own = {} if sim is None else {"latency_ms": sim.latency_ms, "seed": sim.seed, "answer_model": sim.answer_model,
                                      "answer_model_calls": sim.answer_model_calls}
        return cls(fault_rate=behaviour.fault_rate, faults=list(behaviour.faults),
                   divergence_rate=behaviour.divergence_rate, default_thinking=behaviour.default_thinking,
                   completion_token_drift=behaviour.completion_token_drift,
                   providers=[p.wire() for p in behaviour.providers], **rate_limit(behaviour), **own, **text,
                   **counts)

    def with_behaviour(self, behaviour: SimulatorBehaviour) -> SimulatorConfig:
        """This config with a config file's behaviours (`eyrie simulate --config`): what the file says replaces them."""
        return replace(self, fault_rate=behaviour.fault_rate, faults=list(behaviour.faults),
                       divergence_rate=behaviour.divergence_rate, default_thinking=behaviour.default_thinking,
                       completion_token_drift=behaviour.completion_token_drift,
                       template_variant=behaviour.template_variant,
                       text_calls=text_behaviour(behaviour.text_calls),
                       text_calls_by_source={k: text_behaviour(v) for k, v in behaviour.text_calls_by_source.items()},
                       providers=[p.wire() for p in behaviour.providers], **rate_limit(behaviour))

    def draw_latency(self, rng: random.Random) -> float:
        """One answer's latency in seconds: latency_ms, or a draw from latency_range_s."""
        if self.latency_range_s is None:
            return self.latency_ms / 1000
        lo, hi = self.latency_range_s
        if self.latency_distribution == "logUniform":
            return math.exp(rng.uniform(math.log(lo), math.log(hi)))
        return rng.uniform(lo, hi)

    def text_behaviour(self, messages: list[Any]) -> tuple[TextBehaviour, str | None]:
        """The text-mode behaviour for this prompt, and the source it was recognised as (None: none
        named in text_calls_by_source holds it)."""
        if not self.text_sources:
            return self.text_calls, None
        index = source_index(json.dumps(self.text_sources, sort_keys=True), self.sources_endpoint)
        source = index.get(prompt_key(messages) or b"")
        return self.text_calls_by_source.get(source, self.text_calls) if source else self.text_calls, source

    def to_json(self) -> str:
        d = asdict(self)
        d["input_per_million"] = str(self.input_per_million)
        d["output_per_million"] = str(self.output_per_million)
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> SimulatorConfig:
        d = json.loads(text)
        if not isinstance(d, dict):
            raise ValueError("simulator config JSON must be an object")
        known = set(cls.__dataclass_fields__)
        extra = sorted(set(d) - known)
        if extra:
            raise ValueError(f"simulator config JSON: unknown fields {extra}; known: {sorted(known)}")
        return cls(**d)

