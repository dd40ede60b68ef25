"""The `DatasetGeneration` resource as pydantic models: the one source of truth for the spec.

The CRD (`eyrie crd`), the spec reference and every reader of a spec derive from these models, so a
field is added or renamed here and nowhere else. YAML uses camelCase; Python uses snake_case.
"""

from __future__ import annotations

import hashlib
import json
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_snake

from eyrie.jobs.errors import InputError
from eyrie.jobs.model import Model
from eyrie.jobs.status import EndpointVerdict, SampleCounts, TokenCounts

GROUP = "eyrie.dev"
VERSION = "v1alpha1"
KIND = "DatasetGeneration"
PLURAL = "datasetgenerations"
SHORT_NAME = "dsg"
API_VERSION = f"{GROUP}/{VERSION}"
SIMULATED = "simulated"


class SpecError(InputError, ValueError):
    """A spec that cannot run; the message names every offending field path."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        lines = [f"  {path}: {msg}" for path, msg in problems]
        super().__init__("invalid DatasetGeneration spec:\n" + "\n".join(lines))


def parse_usd(value: Any) -> Decimal:
    """Money is a decimal string in YAML ("100.00"); numbers are accepted for convenience."""
    if isinstance(value, Decimal):
        return value
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError("must be a decimal amount such as \"12.50\"")
    try:
        d = Decimal(str(value).strip())
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a decimal amount such as \"12.50\"") from None
    if not d.is_finite():
        raise ValueError("must be finite")
    return d


# Money is a decimal string in YAML and in the CRD (floats would round cents away).
MONEY_PATTERN = r"^[0-9]+(\.[0-9]+)?$"
USD = Annotated[
    Decimal,
    PlainSerializer(lambda d: str(d), return_type=str),
    WithJsonSchema({"type": "string", "pattern": MONEY_PATTERN}),
]


# A Kubernetes resource quantity (apimachinery's resource.Quantity, as KubeRay's CRD spells it), not
# negative: "4Gi", "512Mi", "1.5", "500m"; "4GB" is not one and the API server would refuse the child.
_DECIMAL = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY_PATTERN = rf"^{_DECIMAL}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{_DECIMAL}))?$"


def _quantity(value: str) -> str:
    if not re.fullmatch(QUANTITY_PATTERN, value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity such as 4Gi, 512Mi or 2 (GB is spelled G or Gi)")
    return value


Quantity = Annotated[str, AfterValidator(_quantity), WithJsonSchema({"type": "string", "pattern": QUANTITY_PATTERN})]


# ----------------------------------------------------------------------------------------- spec


class SourceSpec(Model):
    """One prompt set. Rows are read in file order; `limit` caps how many are taken."""

    name: str = Field(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$", description="Unique source name.")
    uri: str = Field(description="file://, s3:// or a local path (a relative one is taken next to the spec file) "
                     "to .jsonl, .jsonl.gz or .parquet.")
    format: Literal["openai", "sharegpt", "glaive"] = Field(
        default="openai", description="Row format: openai (messages [+ tools]), sharegpt, glaive."
    )
    limit: int | None = Field(default=None, ge=1, description="Take at most this many rows.")


class TargetSpec(Model):
    model: str = Field(description="Model id sent to the API.")
    tokenizer: str | None = Field(
        default=None,
        description="HF id, local path, s3:// folder or bundled:NAME (e.g. bundled:deepseek-v4). Without it "
        "the run stops after generation.",
    )
    chat_format: Literal["auto", "kimi-k2.5", "deepseek-v3", "deepseek-v4", "qwen3"] = Field(
        default="auto", description="auto = the tokenizer's chat template; or a named family."
    )
    template_variant: str | None = Field(default=None, min_length=1, max_length=64)
    """Pin the chat format's template variant (kimi-k2.5: current | release; deepseek-v3: vllm | card;
    qwen3: release | later). Unset: chosen per provider over the canary from its usage.prompt_tokens."""
    on_template_mismatch: Literal["stop", "flag", "exclude"] = "stop"
    """When a provider's usage.prompt_tokens fit no template variant of chatFormat over the canary (any
    chatFormat, auto and formats without variants included): stop the run (TemplateMismatch); flag: go
    on, its samples flagged template_mismatch; exclude: go on, its samples left out (counted as
    excluded, reason template_mismatch)."""
    trust_remote_code: bool = Field(default=False, description="Allow the tokenizer's remote code.")


class SecretKeyRef(Model):
    name: str = Field(description="Secret name (same namespace).")
    key: str = Field(default="api-key", description="Key inside the Secret.")


class ProviderSort(Model):
    """The object form of provider.sort (provider-selection guide, "Advanced Sorting with Partition")."""

    by: Literal["price", "throughput", "latency", "exacto"] | None = None
    """Rank providers by price, throughput, latency (or exacto)."""
    partition: Literal["model", "none"] | None = None
    """model (default): sort within each model, fallback models stay fallbacks; none: all endpoints together."""


class Percentiles(Model):
    """Percentile cutoffs of preferredMinThroughput (tokens/s) or preferredMaxLatency (seconds)."""

    p50: float | None = Field(default=None, ge=0)
    p75: float | None = Field(default=None, ge=0)
    p90: float | None = Field(default=None, ge=0)
    p99: float | None = Field(default=None, ge=0)


class MaxPrice(Model):
    """The highest provider prices accepted (USD per million tokens; per request, image, audio unit)."""

    prompt: USD | None = None
    completion: USD | None = None
    request: USD | None = None
    image: USD | None = None
    audio: USD | None = None

    _money = field_validator("prompt", "completion", "request", "image", "audio", mode="before")(
        lambda v: parse_usd(v) if v is not None else None
    )


class ProviderSpec(Model):
    """OpenRouter provider routing (provider-selection guide); sent as the request's `provider`
    object, snake_case on the wire. A field OpenRouter adds later goes into `extra`."""

    order: list[str] | None = None
    """Providers to try, in order (OpenRouter provider slugs)."""
    only: list[str] | None = None
    """Use only these providers."""
    ignore: list[str] | None = None
    """Never use these providers."""
    allow_fallbacks: bool | None = None
    """Allow providers outside `order` when those fail (false pins the provider)."""
    require_parameters: bool | None = None
    """Only providers that support every parameter sent (tools, reasoning)."""
    data_collection: Literal["allow", "deny"] | None = None
    """Whether providers that store or train on prompts may be used."""
    zdr: bool | None = None
    """Only Zero Data Retention endpoints."""
    enforce_distillable_text: bool | None = None
    """Only models whose authors allow text distillation (what a drafter's training data is)."""
    quantizations: list[str] | None = None
    """Accept only these quantizations (e.g. fp8, bf16; OpenRouter's list grows)."""
    sort: Literal["price", "throughput", "latency", "exacto"] | ProviderSort | None = None
    """Rank providers (no load balancing): a name, or {by, partition}."""
    preferred_min_throughput: float | Percentiles | None = None
    """Prefer endpoints at or above this throughput (tokens/s; a number is p50, or percentile cutoffs)."""
    preferred_max_latency: float | Percentiles | None = None
    """Prefer endpoints at or below this latency (seconds; a number is p50, or percentile cutoffs)."""
    max_price: MaxPrice | None = None
    """Refuse providers priced above these (the request fails rather than pay more)."""
    extra: dict[str, Any] | None = None
    """Other provider-routing fields, sent as given (snake_case, as OpenRouter documents them)."""

    @field_validator("extra")
    @classmethod
    def _not_typed(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        typed = {name for name in cls.model_fields if name != "extra"}
        clash = sorted(k for k in v or {} if k in typed or to_snake(k) in typed)
        if clash:
            raise ValueError(f"{', '.join(clash)}: typed fields of api.provider; set them there, not in extra")
        return v

    def wire(self) -> dict[str, Any]:
        out = super().wire()
        extra = out.pop("extra", None) or {}
        return {**out, **extra}


class ReasoningSpec(Model):
    """OpenRouter unified reasoning settings (reasoning-tokens guide); sent as the request's
    `reasoning` object, snake_case on the wire."""

    effort: Literal["max", "xhigh", "high", "medium", "low", "minimal", "none"] | None = None
    """Reasoning effort requested from the model; none turns reasoning off."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Reasoning token cap; reserved on top of sampling.maxTokens."""
    exclude: bool | None = None
    """Ask the provider not to return the reasoning (it is then missing from the data)."""
    enabled: bool | None = None
    """Turn reasoning on or off explicitly."""
    summary: Literal["auto", "concise", "detailed"] | None = None
    """Ask for a reasoning summary (a summary is not the reasoning: such samples are not reconstructed)."""
    context: Literal["auto", "all_turns", "current_turn"] | None = None
    """Which earlier turns' reasoning the model sees (where the model supports it)."""
    mode: Literal["standard", "pro"] | None = None
    """The model's pro reasoning variant, where offered."""


class SamplingSpec(Model):
    temperature: float | None = Field(default=None, ge=0, le=2)
    """Sampling temperature; omit to use the model's default."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Nucleus sampling; omit to use the model's default."""
    max_tokens: int = Field(default=4096, ge=1, description="Per response; the budget reserves this.")
    seed: int | None = None
    """Sampling seed, where the provider honours one."""
    reasoning: ReasoningSpec | None = None
    """OpenRouter reasoning settings, sent as `reasoning`."""


# An OpenRouter provider slug or endpoint tag: "moonshotai", "deepinfra/turbo", "google-vertex/us-east5".
PROVIDER_TAG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}(/[A-Za-z0-9][A-Za-z0-9._-]{0,63})?$"
ProviderTag = Annotated[str, Field(pattern=PROVIDER_TAG_PATTERN)]


class SimulatorSpec(Model):
    """Only for `baseUrl: simulated`: what the built-in simulator serves by default (a demo/test tool). Its faults
    and other demo and test behaviours are not part of this API: they are in a simulator config file (`config`),
    the one `eyrie simulate --config` reads (docs/operating.md)."""

    latency_ms: float = Field(default=0, ge=0)
    """Added latency per request."""
    seed: int = 0
    """Seed of the simulator's answers (and of its faults' draws, with a config file)."""
    answer_model: str | None = Field(default=None, pattern=r"^builtin:tiny-chat(-[a-z0-9]+)?$")
    """A builtin chat model whose answers the simulator serves, as a provider serving that model
    would: the prompt as target.chatFormat renders it with target.tokenizer (set both to the model's
    own: `builtin:tiny-chat` and `auto`), decoded (greedy at temperature 0, else sampled at the
    request's temperature, seeded per prompt), read back into reasoning (`<think>`), tool calls
    (`<tool_call>` JSON) and content, with usage.completion_tokens the tokens it generated. An
    impostor (`builtin:tiny-chat-seed1`, `-int8`, `-fp8`) serves another model under the same name,
    for fidelity to catch. Whether an answer calls a tool stays the simulator's own draw (its
    tool-call rate); the calls are the model's own when it writes valid calls of declared tools,
    else the scripted ones. Prompts whose functions are only described as text keep the scripted text calls
    (unless `answerModelCalls: model`)."""
    answer_model_calls: Literal["simulator", "model"] = "simulator"
    """With answerModel, who decides the tool calls. `simulator`: its tool-call rate (above). `model`:
    the answer is wholly the model's greedy (or sampled) decoding, as a provider serving it gives it:
    with the API's `tools`, its `<tool_call>` blocks read as a Hermes parser reads them (every block's
    JSON parsed: calls, not checked against the schemas; else the whole text is content); with the
    functions described only as text, its text as written, calls and all (the config file's `textCalls`
    unused), so `eyrie audit` measures what the model itself does in each mode."""
    config: str | None = Field(default=None, min_length=1, max_length=4096)
    """A simulator config file (YAML or JSON; a relative path is taken next to the spec file): the faults it
    injects, the endpoints it serves, the template variant it counts, how it answers text-declared functions,
    for demos and tests (docs/operating.md, `eyrie simulate --config`)."""


class ProbeThresholds(Model):
    """What a provider must measure over the probe to get the run's requests (defaults after
    MoonshotAI's K2-Vendor-Verifier); a measure that cannot be taken (no tool calls, no tokenizer)
    is reported and not judged."""

    min_trigger_f1: float = Field(default=0.73, ge=0, le=1)
    """Lowest F1 of "answered with tool calls" against the reference provider's answers to the same
    prompts (K2-Vendor-Verifier's threshold for thinking models)."""
    min_schema_accuracy: float = Field(default=0.95, ge=0, le=1)
    """Lowest share of tool calls whose arguments validate against the declared JSON Schema."""
    max_leak_rate: float = Field(default=0.0, ge=0, le=1)
    """Highest share of answers with leaked native tool-call markers."""
    require_template_fit: bool = True
    """usage.prompt_tokens must fit a template variant of target.chatFormat (or the pinned
    target.templateVariant) on 95% of the answers; needs target.tokenizer."""
    max_error_rate: float = Field(default=0.1, ge=0, le=1)
    """Highest share of probe requests that failed (retries spent, refused, no endpoint)."""
    max_truncation_rate: float = Field(default=0.1, ge=0, le=1)
    """Highest share of answers cut by a length limit (finish_reason length)."""
    max_opaque_reasoning_rate: float = Field(default=0.0, ge=0, le=1)
    """Highest share of answers whose reasoning came back summarised or encrypted (their samples
    cannot be rebuilt)."""
    require_parameters: bool = True
    """Every parameter the requests send (tools, reasoning, temperature, ...) must be among the
    endpoint's supported_parameters (for APIs that list them)."""
    max_latency_p95_seconds: float | None = Field(default=None, gt=0)
    """Highest 95th-percentile time for a whole answer; unset: shown, not judged."""


class ProviderProbeSpec(Model):
    """Before generation, the same first prompts go to every candidate endpoint of the target
    (`provider.only: [tag]`, no fallbacks) and are measured; generation is then routed only to the
    endpoints that pass, cheapest first. Paid from the budget; passing answers are kept as samples."""

    samples: int = Field(default=20, ge=1, le=10_000)
    """Prompts sent to each candidate: the first N the sources hold (tools structural, the spec's sampling)."""
    providers: list[ProviderTag] | None = Field(default=None, min_length=1)
    """Candidate endpoint tags (OpenRouter provider slugs, e.g. moonshotai, deepinfra/turbo); unset:
    every endpoint the listing names (within api.provider.only/ignore)."""
    reference: ProviderTag | None = None
    """The endpoint whose answers trigger agreement is measured against; unset: the model author's
    own provider when it is listed (else trigger agreement is not judged)."""
    thresholds: ProbeThresholds = Field(default_factory=ProbeThresholds)
    """What a provider must measure to pass."""

    @field_validator("providers")
    @classmethod
    def _unique(cls, v: list[str] | None) -> list[str] | None:
        dupes = sorted({p for p in v or [] if (v or []).count(p) > 1})
        if dupes:
            raise ValueError(f"{', '.join(dupes)} named twice")
        return v

    @field_validator("reference")
    @classmethod
    def _a_candidate(cls, v: str | None, info: ValidationInfo) -> str | None:
        named = info.data.get("providers")
        if v is not None and named is not None and v not in named:
            raise ValueError(f"{v} is not among providers ({', '.join(named)})")
        return v


class ApiSpec(Model):
    base_url: str = Field(
        description='OpenAI-compatible base URL, e.g. https://openrouter.ai/api/v1; "simulated" '
        "starts the built-in simulator on loopback."
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret with the API key (in cluster). Locally: env EYRIE_API_KEY."
    )
    provider: ProviderSpec | None = None
    """OpenRouter provider routing, sent as `provider`."""
    max_concurrency: int = Field(default=16, ge=1, le=100_000)
    """Requests in flight at once, over all workers."""
    requests_per_minute: int | None = Field(default=None, ge=1)
    """Request rate cap over all workers."""
    tokens_per_minute: int | None = Field(default=None, ge=1)
    """Prompt-token rate cap over all workers."""
    request_timeout_seconds: float = Field(default=600, gt=0)
    """Longest wait for one whole answer before it is retried."""
    max_retries: int = Field(default=8, ge=0, le=100)
    """Retries per request (429, 5xx, timeouts, broken streams); then the sample fails."""
    stream: bool = Field(default=True, description="Use SSE streaming (keeps long requests alive).")
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    """Sampling parameters sent with every request."""
    provider_probe: ProviderProbeSpec | None = None
    """Compare the target's providers on the same prompts before generation; route only to those that pass."""
    simulator: SimulatorSpec | None = None
    """Behaviour of the built-in simulator (only with baseUrl: simulated)."""
    headers: dict[str, str] | None = Field(
        default=None, description="Extra request headers (e.g. HTTP-Referer, X-Title). Not secrets."
    )


class GateSpec(Model):
    enabled: bool = True
    """Stop the run when tool semantics drift outside the limits below."""
    canary_samples: int = Field(default=200, ge=1)
    """Answers measured before judging; also the sliding window's size afterwards."""
    min_tool_call_rate: float = Field(default=0.10, ge=0, le=1)
    """Lowest share of answers to tool-declaring prompts that call a tool."""
    max_invalid_call_rate: float = Field(default=0.02, ge=0, le=1)
    """Highest share of tool calls that fail their schema."""
    max_leak_rate: float = Field(default=0.0, ge=0, le=1)
    """Highest share of answers with leaked native tool-call markers."""


class ToolsSpec(Model):
    mode: Literal["structured", "text", "audit"] = "structured"
    """structured: tools sent as the API's `tools`; text: only as prompt text; audit: A/B both first."""
    on_invalid_call: Literal["drop", "keep", "flag"] = "drop"
    """What to do with an answer whose tool call is invalid or leaked: drop, keep, flag."""
    gate: GateSpec = Field(default_factory=GateSpec)
    """The drift gate: stops a run whose tool semantics look wrong."""


class PricingSpec(Model):
    input_per_million: USD = Field(description="USD per million prompt tokens (decimal string).")
    output_per_million: USD = Field(description="USD per million completion tokens (decimal string).")

    _money = field_validator("input_per_million", "output_per_million", mode="before")(
        lambda v: parse_usd(v)
    )

    @field_validator("input_per_million", "output_per_million")
    @classmethod
    def _non_negative(cls, v: Decimal) -> Decimal:
        if v < 0:
            raise ValueError("must not be negative")
        return v


# What the built-in simulator bills unless budget.pricing says otherwise.
SIMULATOR_PRICING = PricingSpec(input_per_million=Decimal("0.60"), output_per_million=Decimal("2.50"))


class BudgetSpec(Model):
    max_usd: USD = Field(alias="maxUSD", description="Hard cap in USD (decimal string); spend never exceeds it.")
    pricing: PricingSpec | None = Field(
        default=None, description="Prices for reservations; required unless the API is simulated."
    )
    on_forecast_over: Literal["warn", "suspend"] = "warn"
    """When the canary's projected total spend (mean cost per answer x prompts left, plus what is
    spent) exceeds maxUSD: warn (show it in progress and status, go on) or suspend (stop before
    spending past the canary, reason ForecastOverBudget)."""

    _money = field_validator("max_usd", mode="before")(lambda v: parse_usd(v))

    @field_validator("max_usd")
    @classmethod
    def _positive(cls, v: Decimal) -> Decimal:
        if v <= 0:
            raise ValueError("must be greater than 0")
        return v


class RaySpec(Model):
    mode: Literal["RayJob", "Submit", "Local"] = "Local"
    """Local: ray.init() here; RayJob: a KubeRay RayJob; Submit: an existing cluster."""
    image: str | None = None
    """Ray image for RayJob mode (eyrie installed)."""
    address: str | None = Field(default=None, description="Ray dashboard address for Submit mode.")
    workers: int = Field(default=1, ge=1, le=1000)
    """Shard workers (Ray actors); concurrency and rate limits are split among them."""
    cpus_per_worker: float = Field(default=1, gt=0)
    """CPUs per worker pod (RayJob) or actor."""
    memory_per_worker: Quantity | None = Field(default=None, description="Kubernetes quantity, e.g. 4Gi.")
    pre_running_deadline_seconds: int = Field(default=1800, ge=1)
    """RayJob: a cluster not running after this many seconds fails the run (KubeRay >= 1.6)."""


class GenerationSpec(Model):
    shards: int = Field(default=4, ge=1, le=100_000)
    """Prompts are split into this many shards: contiguous row ranges, kept by later attempts."""
    part_records: int = Field(default=256, ge=1, description="Records per part file (a shard is compacted into parts).")
    turns: Literal["last", "all"] = "last"
    """last: answer each conversation's last user turn; all: regenerate every assistant turn in order
    (agentic conversations: the model's own earlier answers, the dataset's tool results spliced back)."""
    on_divergence: Literal["stop", "keepOriginal"] = "stop"
    """turns: all, when the model's tool calls differ from the dataset's: stop the conversation at that
    turn, or keep the dataset's turn and tool results and flag every later turn `diverged`."""
    max_turns: int = Field(default=32, ge=1, le=10_000)
    """turns: all: a conversation stops after this many regenerated turns (counted)."""
    answers: Literal["regenerate", "dataset"] = "regenerate"
    """regenerate: each prompt's answer is bought from the API; dataset: the row's own answer (its assistant
    turn right after the prompt's user turn) is taken as the answer: nothing is sent or paid, and it is
    checked, reconstructed and extracted as a bought one (what training on the dataset without
    regeneration means; `eyrie evaluate` compares drafters of both). turns: last only."""
    ray: RaySpec = Field(default_factory=RaySpec)
    """Where the shard workers run."""


class SamplesSpec(Model):
    multi_turn: Literal["perTurn", "packed"] = "perTurn"
    """turns: all: one sample per regenerated turn (its exact prompt, loss on its answer), or one per
    conversation with every turn's answer in the loss (only for chat formats that render earlier
    turns verbatim; refused otherwise)."""


class Toleration(Model):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class FidelitySpec(Model):
    enabled: bool = True
    """Score every answer under the target model in the extraction forward pass (one LM-head projection)."""
    min_top1_agreement: float | None = Field(default=None, ge=0, le=1)
    """Floor on top-1 agreement (share of tokens that are the model's argmax) over the text the model wrote:
    its reasoning and content (a tool call's tokens are rebuilt from the parsed call by the chat template and
    agree more easily), all answer tokens where there are none; samples under it are flagged or excluded,
    providers under it get a Warning event."""
    on_low: Literal["flag", "exclude"] = "flag"
    """flag: kept and marked in the fidelity files; exclude: also kept out of the hidden-state index and
    the SpecForge export (what training reads)."""


class ExtractionSpec(Model):
    enabled: bool = False
    """Run hidden-state extraction after generation."""
    engine: Literal["sglang", "transformers"] = "transformers"
    """sglang (GPU pods) or transformers (CPU/GPU, the reference)."""
    model: str | None = Field(default=None, description="Model to run; defaults to target.tokenizer.")
    image: str | None = None
    """Extractor image (SGLang + eyrie) for the extraction Job."""
    layers: Literal["auto"] | list[int] | str = Field(
        default="auto", description="auto = the family's EAGLE-3 convention; explicit layer ids (HF "
        "output_hidden_states indices); or specforge:<path or s3:// URI of a SpecForge draft config json>, "
        "whose eagle_aux_hidden_state_layer_ids (+1) are captured, so the data matches what SpecForge serves."
    )
    dtype: Literal["bfloat16", "float16", "float32", "float8"] = "bfloat16"
    """Storage dtype; float8 stores e4m3 with a per-token scale."""
    gpus_per_pod: int = Field(default=1, ge=0)
    """GPUs per extraction pod (tensor parallel size)."""
    memory: Quantity | None = Field(default=None, description="Memory of each extraction pod (request and limit), "
                                    "a Kubernetes quantity, e.g. 64Gi; unset: the namespace's default.")
    pods: int = Field(default=1, ge=1, le=100_000)
    """Extraction pods running at once (an Indexed Job's bound with per-index retries)."""
    max_tokens_per_batch: int | None = Field(default=None, ge=1)
    """Token budget of one forward batch (a longer sample runs alone). Unset: the transformers backend
    sizes it from the model and the device's free memory (8192 on the CPU, 2048-32768 on a GPU), the
    sglang backend uses 16384."""
    attention: Literal["auto", "sdpa", "flex", "flash", "padded"] = "auto"
    """transformers backend: how a batch of mixed lengths runs. `auto`, `sdpa`, `flex`, `flash` pack its
    samples end to end in one row, each attending only to itself (no padding computed): `sdpa` once per
    sample, `flex` flex attention with a document mask, `flash` FlashAttention's varlen kernel (CUDA,
    the flash_attn package); `auto` is flash when installed, else sdpa. `padded` pads to the longest
    sample with a mask (also what models with sliding windows or softcapping always get)."""
    shard_bytes: int = Field(default=1 << 30, ge=1 << 16, description="Target bytes per hidden shard.")
    device: str | None = Field(default=None, description="transformers backend: cpu, cuda (default: auto).")
    node_selector: dict[str, str] | None = None
    """Node selector of extraction pods."""
    tolerations: list[Toleration] | None = None
    """Tolerations of extraction pods."""
    trust_remote_code: bool = False
    """Allow the model's remote code when loading it."""
    fidelity: FidelitySpec = Field(default_factory=FidelitySpec)
    """Scores of the answers under the target model (DESIGN §7): the API's behaviour against native."""

    @field_validator("layers")
    @classmethod
    def _layers(cls, v: Any) -> Any:
        if isinstance(v, str) and v != "auto" and not (v.startswith("specforge:") and len(v) > len("specforge:")):
            raise ValueError("must be auto, a list of layer ids, or specforge:<path or s3:// URI of a SpecForge "
                             "draft config json>")
        return v


# The pilot's defaults (contract/pilot.py and `eyrie evaluate` read them from here: the spec sits below the contract)
MIN_TRAIN = 5  # samples a drafter needs at least besides the held-out set (`eyrie evaluate`'s floor too)
STEPS = 300  # each pilot drafter's training steps by default (`eyrie evaluate`'s default)
TOKENS_PER_STEP = 256  # loss tokens per step by default (`eyrie evaluate`'s default)
MAX_MARGIN = 7.0  # a drafter of 7 draft positions accepts at most 7 tokens per step more than another


def default_heldout(samples: int) -> int:
    """`eyrie evaluate`'s held-out size for an output of `samples`: a fifth, at least 1, at most 500."""
    return max(1, min(500, samples // 5))


class PilotTraining(Model):
    """The budget of each pilot drafter (the same for every option, as `eyrie evaluate` gives its drafters)."""

    steps: int = Field(default=STEPS, ge=1, le=100_000)
    """Training steps per drafter (`eyrie evaluate --steps`)."""
    tokens_per_step: int = Field(default=TOKENS_PER_STEP, ge=1, le=1_000_000)
    """Loss tokens per step, exact (`eyrie evaluate --tokens-per-step`)."""


class PilotSpec(Model):
    """Before the money goes: buy a small slice of the run (both tools modes, and/or take the sources' own
    answers), extract it, train one small EAGLE-3 drafter per option with SpecForge's code and compare their
    accepted tokens per step on the target's own structured answers held out (`eyrie pilot`, docs/operating.md).
    Its answers are paid from budget.maxUSD (shown apart as pilotUSD); the run's own mode's answers are kept
    as the run's samples, never bought twice. Needs extraction.enabled."""

    prompts: int | None = Field(default=None, ge=1, le=100_000)
    """Tool-declaring prompts of the sources in the pilot (a seeded random sample, as `eyrie audit` picks);
    unset: tools.gate.canarySamples."""
    heldout: int | None = Field(default=None, ge=1, le=100_000)
    """Of those, the prompts whose structured answers are the serving traffic every drafter is measured on
    (never trained on); unset: a fifth of the prompts, at most 500."""
    compare: list[Literal["otherMode", "datasetAnswers"]] = Field(default_factory=lambda: ["otherMode"],
                                                                 min_length=1, max_length=2)
    """What the run's own data (its tools mode, regenerated) is compared with: otherMode (the other tools
    mode, bought for the same prompts), datasetAnswers (the sources' own answers, as generation.answers:
    dataset takes them: "should I regenerate the data I already have?")."""
    training: PilotTraining = Field(default_factory=PilotTraining)
    """Each drafter's training budget."""
    seed: int = Field(default=0, ge=0)
    """Seed of the prompts' sample, the held-out choice, the training order and the drafters' weights."""
    policy: Literal["report", "require"] = "report"
    """report: record the verdict and go on; require: suspend the run with the verdict (outcome PilotFailed)
    unless the drafter of the run's own data accepts no fewer tokens per step than the best alternative's,
    less `margin`."""
    margin: float = Field(default=0.0, ge=0, lt=MAX_MARGIN)
    """Accepted tokens per step the run's own drafter may fall short of the best alternative's and still pass
    (0 <= margin < 7: a drafter accepts at most 7 draft tokens per step more than another)."""

    @field_validator("compare")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"{', '.join(sorted({x for x in v if v.count(x) > 1}))} named twice")
        return v


class CredentialsRef(Model):
    name: str = Field(description="Secret with the S3 credentials.")
    access_key_key: str = Field(default="accessKey", description="Key holding the access key.")
    secret_key_key: str = Field(default="secretKey", description="Key holding the secret key.")


class OutputSpec(Model):
    uri: str = Field(description="s3://bucket/prefix, file:///path, or a local path (a relative one is "
                     "taken next to the spec file, like sources).")
    endpoint: str | None = Field(default=None, description="S3 endpoint, e.g. http://minio.minio.svc:9000.")
    region: str | None = None
    """S3 region, where the store needs one."""
    credentials_secret_ref: CredentialsRef | None = None
    """Secret with the S3 credentials (in cluster); locally EYRIE_S3_ACCESS_KEY/SECRET_KEY."""

    @field_validator("uri")
    @classmethod
    def _scheme(cls, v: str) -> str:
        if "://" in v and not v.startswith(("file://", "s3://")):
            raise ValueError("must be s3://bucket/prefix or file:///path")
        if v.startswith("s3://") and len(v) <= len("s3://"):
            raise ValueError("s3:// URI needs a bucket")
        return v


class DatasetGenerationSpec(Model):
    suspend: bool = Field(default=False, description="Like batch/v1 Job; set by the operator on budget/drift stops.")
    sources: list[SourceSpec] = Field(min_length=1)
    """Prompt sets, read in order."""
    target: TargetSpec
    """The model whose answers, tokens and hidden states are collected."""
    api: ApiSpec
    """The OpenAI-compatible API serving the target model."""
    tools: ToolsSpec = Field(default_factory=ToolsSpec)
    """How tools are declared and checked."""
    budget: BudgetSpec
    """The hard spending cap."""
    generation: GenerationSpec = Field(default_factory=GenerationSpec)
    """Sharding and workers of the generation job."""
    samples: SamplesSpec = Field(default_factory=SamplesSpec)
    """How generation records become training samples."""
    extraction: ExtractionSpec = Field(default_factory=ExtractionSpec)
    """Hidden-state extraction."""
    output: OutputSpec
    """Where everything is written."""
    pilot: PilotSpec | None = None
    """Measure the decision before the money goes: drafters trained on a small slice of each option (`eyrie
    pilot`); with policy require the run suspends when its own data's drafter is worse."""

    @model_validator(mode="after")
    def _cross_field(self) -> DatasetGenerationSpec:
        names = [s.name for s in self.sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"sources: duplicate source names {dupes}")
        if self.budget.pricing is None and self.api.base_url != SIMULATED:
            raise ValueError("budget.pricing: required for a real API (reservations need prices)")
        self._check_one_answer_fits()
        if self.api.base_url == SIMULATED and self.generation.ray.mode != "Local":
            raise ValueError(
                f"api.baseUrl: simulated cannot run with generation.ray.mode {self.generation.ray.mode}: the "
                "simulator listens on the driver's loopback, which Ray workers in a cluster never reach; use "
                "generation.ray.mode Local, or a provider's URL")
        sim = self.api.simulator
        if sim is not None and sim.answer_model and not self.target.tokenizer:
            raise ValueError("api.simulator.answerModel: needs target.tokenizer (the model's own: "
                             "builtin:tiny-chat) to render the prompts it answers")
        workers = self.generation.ray.workers
        for name, limit in (("maxConcurrency", self.api.max_concurrency),
                            ("requestsPerMinute", self.api.requests_per_minute),
                            ("tokensPerMinute", self.api.tokens_per_minute)):
            if limit is not None and limit < workers:  # the workers split it exactly: none may get zero
                raise ValueError(f"api.{name}: {limit} is below generation.ray.workers ({workers}), which share it; "
                                 "raise it or lower the workers")
        if self.generation.answers == "dataset" and self.generation.turns != "last":
            raise ValueError("generation.answers: dataset takes each row's answer to its prompt (turns: last); "
                             "with turns: all the later turns' answers are the model's own by definition")
        if self.generation.ray.mode == "Submit" and not self.generation.ray.address:
            raise ValueError("generation.ray.address: required when generation.ray.mode is Submit")
        if self.extraction.enabled and not (self.extraction.model or self.target.tokenizer):
            raise ValueError("extraction.model: required when extraction is enabled (or set target.tokenizer)")
        if self.extraction.enabled and not self.target.tokenizer:
            raise ValueError("target.tokenizer: extraction needs reconstructed samples, which need a tokenizer")
        if self.pilot is not None:
            self._check_pilot(self.pilot)
        return self

    def reserved_output_tokens(self) -> int:
        """The output tokens a request reserves: `maxTokens`, plus the reasoning cap on top of it."""
        s = self.api.sampling
        return s.max_tokens + (s.reasoning.max_tokens if s.reasoning and s.reasoning.max_tokens else 0)

    def _check_one_answer_fits(self) -> None:
        """A budget that cannot pay the output alone of one answer's worst case can never send a request:
        refused here, before anything runs. What the prompt's tokens add is known only per prompt: the
        run checks that before its first wait (the coordinator's first lease)."""
        if (self.budget.pricing is None and self.api.base_url != SIMULATED) or (
                self.generation.answers == "dataset" and self.pilot is None):
            return  # refused for its missing prices; or nothing is bought
        price = self.effective_pricing().output_per_million
        tokens = self.reserved_output_tokens()
        output = price * tokens / Decimal(1_000_000)
        if output > self.budget.max_usd:
            fits = int(self.budget.max_usd * Decimal(1_000_000) / price) if price else tokens
            raise ValueError(
                f"budget.maxUSD: ${self.budget.max_usd} cannot pay for one answer: each request reserves "
                f"{tokens:,} output tokens (api.sampling.maxTokens"
                f"{' + reasoning.maxTokens' if tokens != self.api.sampling.max_tokens else ''}) x "
                f"${price} per million = ${output.normalize():f} before its prompt; lower api.sampling.maxTokens "
                f"({fits:,} would take the whole budget, leaving nothing for the prompt) or raise budget.maxUSD")

    def _check_pilot(self, pilot: PilotSpec) -> None:
        """What a pilot needs that its own fields cannot say (ValueError "field: why", as `_cross_field`)."""
        if not self.extraction.enabled:
            raise ValueError("pilot: its drafters train on the target's hidden states: set extraction.enabled: true "
                             "(and extraction.model or target.tokenizer), or remove pilot")
        if self.generation.answers == "dataset":
            raise ValueError("pilot: with generation.answers: dataset nothing is bought to pilot; to ask whether "
                             "regenerating pays, set generation.answers: regenerate and pilot.compare: "
                             "[datasetAnswers]")
        if self.generation.turns != "last":
            raise ValueError("pilot: compares answers to single prompts (generation.turns: last)")
        n, held = self.pilot_prompts(), self.pilot_heldout()
        limits = [s.limit for s in self.sources]
        if all(x is not None for x in limits) and n > sum(limits):  # type: ignore[arg-type]
            raise ValueError(f"pilot.prompts: {n:,} (unset: tools.gate.canarySamples) is more than the sources' "
                             f"limits allow ({sum(limits):,} rows, not all of them declaring tools); lower "  # type: ignore[arg-type]
                             "pilot.prompts")
        if held >= n:
            raise ValueError(f"pilot.heldout: {held:,} held out of {n:,} pilot prompts leaves none to train on")
        if n - held < MIN_TRAIN:
            raise ValueError(f"pilot.prompts: {n:,} prompts with {held:,} held out leave {n - held:,} to train each "
                             f"drafter on; at least {MIN_TRAIN} are needed: raise pilot.prompts to "
                             f"{held + MIN_TRAIN:,}" + (" or lower pilot.heldout" if held > 1 else ""))

    def pilot_prompts(self) -> int:
        """The pilot's prompts: pilot.prompts, else tools.gate.canarySamples."""
        assert self.pilot is not None
        return self.pilot.prompts or self.tools.gate.canary_samples

    def pilot_heldout(self) -> int:
        """The pilot's held-out prompts: pilot.heldout, else `eyrie evaluate`'s default for that many."""
        assert self.pilot is not None
        return self.pilot.heldout or default_heldout(self.pilot_prompts())

    def effective_pricing(self) -> PricingSpec:
        """The prices reservations use: `budget.pricing`, or the simulator's own price list when the
        provider is the simulator and the spec names none (the spec itself is never rewritten)."""
        if self.budget.pricing is not None:
            return self.budget.pricing
        assert self.api.base_url == SIMULATED  # the validator refuses a real API without prices
        return SIMULATOR_PRICING

    def spec_hash(self) -> str:
        """Hash of what determines the data (not suspend/budget), recorded in the manifest."""
        d = self.dump()
        for k in ("suspend", "budget"):
            d.pop(k, None)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------------------- status


class Condition(Model):
    type: str
    """Condition type (Ready, Suspended, Succeeded, Failed, ...)."""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown."""
    reason: str
    """One-word reason, e.g. BudgetExceeded."""
    message: str = ""
    """What happened and what to do, for people."""
    last_transition_time: str
    observed_generation: int | None = None


class ToolMetrics(Model):
    declared_prompts: int = 0
    call_rate: float = 0.0
    invalid_calls: int = 0
    leaks: int = 0


class ExtractionStatus(Model):
    shards_done: int = 0
    shards_total: int = 0
    bytes: int = 0


class DisruptionStatus(Model):
    """What the attempt's generation job lived through (progress.json's `restarts` and `workersLost`); each rise is
    also a Warning event (`GenerationRestarted`, `WorkerLost`)."""

    attempt: str = ""
    restarts: int = 0
    """Times its job started again after its driver was lost with the Ray head (KubeRay submitted it again)."""
    workers_lost: int = 0
    """Its shard workers lost with their Ray pods (their shards requeued, new workers started)."""


class FidelityStatus(Model):
    samples: int = 0
    top1_agreement: float | None = None
    """Share of all completion tokens that are the target model's argmax (manifest fidelity.overall)."""
    mean_nll: float | None = Field(default=None, alias="meanNLL")
    by_provider: dict[str, float | None] | None = None
    """Top-1 agreement per provider."""
    below_floor: list[str] | None = None
    """Providers under extraction.fidelity.minTop1Agreement."""


Phase = Literal["Pending", "Pilot", "Canary", "Generating", "Extracting", "Succeeded", "Suspended", "Failed"]


class PilotStatus(Model):
    """The pilot (spec.pilot): what it spent and, once its verdict is in, the drafters' accepted length per step
    (condition PilotPassed has the verdict's sentence)."""

    spent_usd: str | None = Field(default=None, alias="spentUSD")
    """What the pilot's answers cost (part of spentUSD, paid once)."""
    answers: int = 0
    """Pilot answers bought so far."""
    planned: int = 0
    """Pilot answers it will buy (each option's prompts)."""
    passed: bool | None = None
    """Whether the run's own option accepts no fewer tokens per step than the best alternative, within the margin."""
    run_option: str | None = None
    """The option the run generates with (e.g. text, structured, dataset)."""
    run_accepted: float | None = None
    """Tokens accepted per step by the drafter trained on the run's own option."""
    best_option: str | None = None
    """The best alternative the pilot measured."""
    best_accepted: float | None = None
    """Tokens accepted per step by the drafter trained on the best alternative."""


class DatasetGenerationStatus(Model):
    phase: Phase | None = None
    conditions: list[Condition] = Field(default_factory=list)
    spent_usd: str | None = Field(default=None, alias="spentUSD")
    reserved_usd: str | None = Field(default=None, alias="reservedUSD")
    forecast_usd: str | None = Field(default=None, alias="forecastUSD")
    """Projected total spend once the canary is measured (mean cost per answer); see progress.json's forecast."""
    samples: SampleCounts | None = None
    tokens: TokenCounts | None = None
    tools: ToolMetrics | None = None
    extraction: ExtractionStatus | None = None
    fidelity: FidelityStatus | None = None
    providers: list[EndpointVerdict] | None = None
    """The provider probe's verdict per endpoint, passing ones first, cheapest first."""
    pilot: PilotStatus | None = None
    """The pilot's spend and verdict (spec.pilot)."""
    disruptions: DisruptionStatus | None = None
    """Present once the current attempt's job was disrupted and carried on."""
    retries: int | None = None
    """Attempts the operator started after a RayJob failed with its job still running (a Warning event
    `GenerationRetried` each); at most 2, then the run fails."""
    output_manifest: str | None = None
    """Where the dataset manifest is, once written."""
    output_report: str | None = None
    """Where the run's report page is (`eyrie report` rebuilds it with later stages)."""
    attempt: str | None = None
    observed_generation: int | None = None


# aliases that to_camel would get wrong ("maxUSD", "spentUSD") are set explicitly above; pydantic
# applies an explicit alias to both validation and serialization.


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str | None = None
    namespace: str | None = None


class DatasetGeneration(Model):
    api_version: Literal["eyrie.dev/v1alpha1"] = API_VERSION
    kind: Literal["DatasetGeneration"] = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: DatasetGenerationSpec
    status: DatasetGenerationStatus | None = None


# ---------------------------------------------------------------------------------------- loading


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(root)"


def _problems(err: ValidationError, prefix: str) -> list[tuple[str, str]]:
    problems = []
    for e in err.errors():
        loc = [p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        # a model-level validator reports "path: message" in its text; lift the path out (the spec's own
        # validator sits at `spec` in a whole resource)
        if loc in ([], ["spec"]) and msg.startswith("Value error, ") and ": " in msg:
            path, _, rest = msg.removeprefix("Value error, ").partition(": ")
            base = ".".join(p for p in (prefix, *loc) if p)
            problems.append((f"{base}.{path}" if base else path, rest))
            continue
        msg = msg.removeprefix("Value error, ")
        full = _loc(tuple(loc))
        problems.append((f"{prefix}.{full}" if prefix and full != "(root)" else (prefix or full), msg))
    return problems


def parse_spec(doc: Any) -> DatasetGeneration:
    """Accept a full resource (apiVersion/kind/spec) or a bare spec mapping; raise SpecError."""
    if not isinstance(doc, dict):
        raise SpecError([("(root)", "must be a mapping (a DatasetGeneration resource or its spec)")])
    if "spec" in doc or "kind" in doc or "apiVersion" in doc:
        problems: list[tuple[str, str]] = []
        if doc.get("kind", KIND) != KIND:
            problems.append(("kind", f"must be {KIND}"))
        if doc.get("apiVersion", API_VERSION) != API_VERSION:
            problems.append(("apiVersion", f"must be {API_VERSION}"))
        if problems:
            raise SpecError(problems)
        try:
            return DatasetGeneration.model_validate(doc)
        except ValidationError as e:
            raise SpecError(_problems(e, "")) from None
    try:
        return DatasetGeneration(spec=DatasetGenerationSpec.model_validate(doc))
    except ValidationError as e:
        raise SpecError(_problems(e, "spec")) from None


def load_spec(path: str | Path) -> DatasetGeneration:
    """Read a YAML/JSON file holding one DatasetGeneration (or its spec)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise SpecError([("(file)", f"cannot read {p}: {e.strerror}")]) from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise SpecError([("(file)", f"{p} is not valid YAML: {e}")]) from None
    if len(docs) != 1:
        raise SpecError([("(file)", f"{p} must hold exactly one document, found {len(docs)}")])
    dg = parse_spec(docs[0])
    if dg.metadata.name is None:
        dg.metadata.name = p.stem
    # a relative source or output path means "next to the spec file", wherever eyrie runs from:
    # `cd examples && eyrie run x.yaml` and `eyrie run examples/x.yaml` read and write the same files
    for src in dg.spec.sources:
        if "://" not in src.uri and not Path(src.uri).is_absolute():
            src.uri = str((p.parent / src.uri).resolve())
    out = dg.spec.output
    if "://" not in out.uri and not Path(out.uri).expanduser().is_absolute():
        out.uri = str((p.parent / out.uri).resolve())
    sim = dg.spec.api.simulator
    if sim is not None and sim.config is not None and not Path(sim.config).expanduser().is_absolute():
        sim.config = str((p.parent / sim.config).resolve())
    ex = dg.spec.extraction
    if isinstance(ex.layers, str) and ex.layers.startswith("specforge:"):
        ref = ex.layers.removeprefix("specforge:")
        if "://" not in ref and not Path(ref).is_absolute():
            ex.layers = f"specforge:{(p.parent / ref).resolve()}"
    return dg
