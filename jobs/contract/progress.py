"""progress.json (DESIGN §3): the live state of a run, written by the data plane, read by the operator.

One model for every side: `Progress` is the document (the driver writes it with `write_progress`; the CLI,
the report and the operator read it with `parse_progress`/`load_progress`, strictly: the operator decides on
it), `SampleCounts` the one definition of what became of the prompts (the status's too), `Outcome` and
`Stage` the closed sets of strings it holds.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

import orjson
from pydantic import (
    ConfigDict,
    Field,
    PlainSerializer,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
)

from eyrie.jobs.contract.layout import PROGRESS
from eyrie.jobs.contract.money import usd
from eyrie.jobs.errors import EyrieError
from eyrie.jobs.model import Model
from eyrie.jobs.status import EndpointVerdict, SampleCounts, TokenCounts
from eyrie.jobs.store import NotFound, Store

STOP_GRACE_SECONDS = 120.0  # after a graceful stop request, a still-running job is ended anyway


class Outcome(StrEnum):
    RUNNING = "Running"
    DONE = "Done"
    BUDGET_EXHAUSTED = "BudgetExhausted"
    TOOL_SEMANTICS_DRIFT = "ToolSemanticsDrift"
    INSUFFICIENT_CREDITS = "InsufficientCredits"
    TEMPLATE_MISMATCH = "TemplateMismatch"  # no template variant gives the provider's prompt_tokens
    FAILED = "Failed"
    STOPPED = "Stopped"  # a signal (Ray stop_job, Ctrl-C) asked the run to stop; resumable
    FORECAST_OVER_BUDGET = "ForecastOverBudget"  # the canary's forecast exceeds maxUSD (onForecastOver: suspend)
    NO_PROVIDER_PASSES = "NoProviderPasses"  # the provider probe passed no endpoint: nothing generated
    PILOT_PASSED = "PilotPassed"  # stage pilot: the verdict lets the run go on (pilot.json); generation may start
    PILOT_FAILED = "PilotFailed"  # stage pilot, policy require: the run's own data is worse; suspend (resumable)


class Stage(StrEnum):
    PILOT = "pilot"  # spec.pilot under way or decided (`pilot` says how far): nothing generated beyond it
    PROBE = "probe"  # spec.api.providerProbe under way: nothing generated yet (`probe` says how far)
    GENERATE = "generate"
    SAMPLES = "samples"
    EXTRACT = "extract"
    DONE = "done"


class ProgressError(EyrieError):
    """progress.json exists but cannot be understood; the message names the field."""


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


USD = Annotated[Decimal, PlainSerializer(usd, return_type=str, when_used="json")]  # full precision, as text
Count = Annotated[int, Field(ge=0, strict=True)]


class ProvidersProgress(Model):
    """progress.json's `providers`: the provider probe's verdict (generate/probe/run.py `progress_section`)."""

    passing: list[str] = Field(default_factory=list)
    reference: str | None = None
    spent_usd: str | None = Field(default=None, alias="spentUSD")
    endpoints: list[EndpointVerdict]


class ProbeProgress(Model):
    """progress.json's `probe` while the provider probe runs (generate/probe/run.py writes it): the
    endpoints probed, the answers durable of those its verdict needs, what the probe has cost."""

    endpoints: list[str]
    answers: Count
    planned: Count = Field(alias="answersPlanned")
    requests: Count = 0
    spent: USD = Field(default=Decimal(0), alias="spentUSD")


class PilotProgress(Model):
    """progress.json's `pilot` (the pilot stage writes it, jobs/pilot/run.py): how far it is, what it cost, and
    once decided the verdict (pilot.json holds the whole of it)."""

    model_config = ConfigDict(extra="allow")
    step: Literal["buy", "samples", "extract", "train", "decided"]
    """buy: its answers being bought; samples, extract: its slices built; train: its drafters trained;
    decided: pilot.json written."""
    prompts: Count = 0
    answers: Count = 0
    """Answers the pilot holds of those it needs (every option's)."""
    planned: Count = Field(default=0, alias="answersPlanned")
    spent: USD = Field(default=Decimal(0), alias="spentUSD")
    passed: bool | None = None
    proceed: bool | None = None
    verdict: str | None = None
    """The verdict sentence, once decided."""


class Section(Model):
    """A progress.json section. Its `NULLS` are keys its writer always writes, null included: the document is
    dumped without None (`Progress.to_json`), so they are put back as null and a document reads back as written."""

    NULLS: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _with_nulls(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        out = handler(self)
        if not self.NULLS or not info.exclude_none or not isinstance(out, dict):
            return out
        kept: dict[str, Any] = {}
        for name, f in type(self).model_fields.items():
            key = (f.serialization_alias or name) if info.by_alias else name
            if key in out:
                kept[key] = out.pop(key)
            elif name in self.NULLS and getattr(self, name) is None:
                kept[key] = None
        return {**kept, **out}  # what is left: keys another writer added


class PerTool(Model):
    calls: Count = 0
    invalid: Count = 0


class ToolFigures(Model):
    """progress.json's `tools`: the tool gate's cumulative counts (`tools.gate.ToolGate.metrics`; the operator
    shows the first four). Empty ({}) in a document written before the coordinator counted (the probe's, the
    pilot's): every figure is None then."""

    declared_prompts: Count | None = None
    call_rate: float | None = None
    invalid_calls: Count | None = None
    leaks: Count | None = None
    answers: Count | None = None
    calls: Count | None = None
    per_tool: dict[str, PerTool] | None = None


class CanaryForecast(Model):
    """The projection as it stood when the canary was measured (what a suspend judged)."""

    mean: USD = Field(alias="meanUSD")
    p90: USD = Field(alias="p90USD")
    answers: Count
    hidden_state_bytes: Count | None = None


class ForecastFigures(Model):
    """progress.json's `forecast` (budget/forecast.py), once the canary is measured: the projected total at the
    mean and the p90 cost per answer, what it was measured on, and the hidden states' projected bytes once known."""

    mean: USD = Field(alias="meanUSD")
    p90: USD = Field(alias="p90USD")
    per_answer_mean: USD = Field(alias="perAnswerMeanUSD")
    per_answer_p90: USD = Field(alias="perAnswerP90USD")
    answers: Count
    prompts_left: Count
    tokens: Count = 0
    hidden_state_bytes: Count | None = None
    at_canary: CanaryForecast | None = None


class VariantChoice(Section):
    """A provider's template variant (`reconstruct.variants.Choice`), `final` once its canary is measured."""

    NULLS = frozenset({"thinking"})
    variant: str
    how: str = ""
    """detected | pinned | unreported | mismatch"""
    answers: Count = 0
    fits: list[str] = Field(default_factory=list)
    thinking: bool | None = None
    """The thinking reading of the answers that did not say; None when every answer said."""
    unsaid: Count = 0
    message: str | None = None
    final: bool | None = None


class TemplateVariants(Section):
    """progress.json's `templateVariants` (`reconstruct.variants.VariantDetector.summary`): the format, its pin,
    and the variant chosen per provider (the samples stage rebuilds each provider's records with it)."""

    NULLS = frozenset({"pinned"})
    format: str | None = None
    variants: list[str] = Field(default_factory=list)
    pinned: str | None = None
    canary: Count | None = None
    on_mismatch: str | None = None
    by_provider: dict[str, VariantChoice] = Field(default_factory=dict)


class BoundFingerprint(Section):
    """progress.json's `fingerprint`: the attempt's binding to the output (contract/fingerprint.py): its id, the
    one before it (null on a new output) and the changed fields the user accepted."""

    NULLS = frozenset({"previous"})
    id: str
    previous: str | None = None
    accepted: list[str] | None = None


class ResumeFigures(Model):
    """progress.json's `resume`: the attempt's number, the answers reused from earlier attempts and their cost;
    once it ended, what it paid and for how many requests."""

    attempt: Annotated[int, Field(ge=1, strict=True)]
    reused_answers: Count = 0
    reused: USD = Field(default=Decimal(0), alias="reusedUSD")
    paid: USD | None = Field(default=None, alias="paidUSD")
    requests: Count | None = None


class SamplingSeen(Model):
    request: dict[str, Any]
    """The sampling parameters and provider routing the requests carried, as sent."""
    records: Count


class FingerprintTally(Model):
    """progress.json's `fingerprints` entry (and the manifest's): one fingerprint's records (`contract.tally`)."""

    records: Count = 0
    done: Count = 0
    rejected: Count = 0
    discarded: Count = 0
    failed: Count = 0
    paid: USD = Field(default=Decimal(0), alias="paidUSD")
    discarded_usd: USD = Field(default=Decimal(0), alias="discardedUSD")
    attempts: list[str] = Field(default_factory=list)
    models: dict[str, int] = Field(default_factory=dict)
    sampling: list[SamplingSeen] = Field(default_factory=list)


class BadRow(Section):
    """One row never sent (bad data): where it is (1-based, as editors count lines) and why; also a line of
    `samples/bad_rows.jsonl`."""

    NULLS = frozenset({"source", "row", "error", "reason"})
    source: str | None = None
    row: int | None = None
    error: str | None = None
    reason: str | None = None
    turn: int | None = None


class BadRows(Model):
    """progress.json's `badRows`: how many rows were never sent, the first few, and the file listing them all."""

    count: Count
    first: list[BadRow] = Field(default_factory=list)
    file: str


class AbandonedFigures(Model):
    """progress.json's `abandoned` (budget/inflight.py `AbandonedTotals`): requests stops left in flight, what is
    booked for them, by what is known, and how many this attempt booked or reconciled."""

    requests: Count
    booked: USD = Field(alias="bookedUSD")
    reconciled: Count = 0
    reconciled_usd: USD = Field(default=Decimal(0), alias="reconciledUSD")
    unreconciled: Count = 0
    up_to: USD = Field(default=Decimal(0), alias="upToUSD")
    this_attempt: Count = 0
    key_usage_rose: USD | None = Field(default=None, alias="keyUsageRoseUSD")
    """The provider's own key usage over the attempt (GET /key), after a stop that abandoned requests."""


class AgenticFigures(Model):
    """progress.json's `agentic` (generation.turns: all; `sending.conversation.AgenticSummary`): the
    conversations, their turns, divergences by kind and how each ended."""

    conversations: Count = 0
    turns_regenerated: Count = 0
    turns_failed: Count = 0
    spliced_tool_results: Count = 0
    diverged: dict[str, int] = Field(default_factory=dict)
    ended: dict[str, int] = Field(default_factory=dict)
    dropped_turns: Count = 0


class Progress(Model):
    """progress.json: the whole document, as the driver writes it (`write_progress`) and the CLI, the report and
    the operator read it (`parse_progress`). Keys another writer adds are kept (`model_extra`), never dropped."""

    model_config = ConfigDict(extra="allow")

    attempt: str
    run_id: str | None = None  # the DatasetGeneration's uid the job ran for (None from a local run)
    stage: Stage = Stage.GENERATE
    outcome: Outcome
    message: str = ""
    spent: USD = Field(default=Decimal(0), alias="spentUSD")
    reserved: USD = Field(default=Decimal(0), alias="reservedUSD")
    max_usd: USD | None = Field(default=None, alias="maxUSD")
    audit: USD | None = Field(default=None, alias="auditUSD")  # part of the spend, paid by `eyrie audit`
    pilot_usd: USD | None = Field(default=None, alias="pilotUSD")  # part of the spend, the pilot's answers
    price_factor: USD | None = None
    forecast: USD | None = Field(default=None, alias="forecastUSD")  # projected total, once the canary is measured
    forecast_figures: ForecastFigures | None = Field(default=None, alias="forecast")
    discarded: USD | None = Field(default=None, alias="discardedUSD")
    paid: USD | None = Field(default=None, alias="paidUSD")
    unrecorded: USD | None = Field(default=None, alias="unrecordedUSD")
    samples: SampleCounts = Field(default_factory=SampleCounts)
    tokens: TokenCounts = Field(default_factory=TokenCounts)
    tools: ToolFigures = Field(default_factory=ToolFigures)
    failures: dict[str, int] = Field(default_factory=dict)  # failed samples by error type
    resend_on_resume: int = 0
    requests: int = 0  # this attempt's requests (retries included)
    retries: int = 0
    errors: dict[str, int] = Field(default_factory=dict)
    in_flight: int = 0
    coordinator_calls: int = 0
    template_variants: TemplateVariants | None = None
    providers: ProvidersProgress | None = None
    probe: ProbeProgress | None = None  # the provider probe under way (stage probe)
    pilot: PilotProgress | None = None  # the pilot (stage pilot while it runs; kept by the stages after it)
    attempts: list[str] = Field(default_factory=list)
    fingerprint: BoundFingerprint | None = None
    resume: ResumeFigures | None = None
    fingerprints: dict[str, FingerprintTally] | None = None
    models: dict[str, int] | None = None  # answers per model the requests named
    bad_rows: BadRows | None = None
    abandoned: AbandonedFigures | None = None
    agentic: AgenticFigures | None = None
    # disruptions of this attempt, cumulative: its job started again after its driver ended without a word (the
    # Ray head lost; KubeRay submitted it again), and its shard workers lost (their Ray pods gone)
    restarts: Count = 0
    workers_lost: Count = 0
    updated_at: str | None = None

    @field_validator("attempt", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) else v

    @property
    def endpoint_verdicts(self) -> list[EndpointVerdict]:
        return self.providers.endpoints if self.providers else []

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class RunFigures(Model):
    """The run coordinator's figures (generate/budget/coordinator.py `snapshot`): the part of progress.json it
    knows, typed as `Progress` types them (same names, same types), so the driver takes them in as they are. Plain
    data: it crosses back from the coordinator's Ray actor pickled."""

    outcome: Outcome
    message: str = ""
    spent: USD
    reserved: USD
    max_usd: USD
    audit: USD
    price_factor: USD
    forecast: USD | None = None
    forecast_figures: ForecastFigures | None = None
    discarded: USD
    samples: SampleCounts
    tokens: TokenCounts
    tools: ToolFigures
    failures: dict[str, int]
    resend_on_resume: int
    requests: int
    retries: int
    errors: dict[str, int]
    in_flight: int
    coordinator_calls: int
    template_variants: TemplateVariants | None = None


# what a malformed section is told, by the first key of the error's location
_SHAPES = {
    "probe": "probe must be {endpoints: [tag, ...], answers, answersPlanned, spentUSD}",
    "providers": "providers.endpoints must be a list of {tag, passed, ...}",
    "pilot": "pilot must be {step: buy|samples|extract|train|decided, answers, answersPlanned, spentUSD, ...}",
}


def parse_progress(doc: Any) -> Progress:
    """Read the generation job's progress document strictly (the operator decides on it); keys it does not
    know are kept aside. ProgressError names the field."""
    if not isinstance(doc, dict):
        raise ProgressError("progress.json: must be a JSON object")
    try:
        return Progress.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        key = str(err["loc"][0]) if err["loc"] else "(document)"
        value = doc.get(key)
        if key in _SHAPES:
            why = _SHAPES[key]
        elif key == "outcome":
            why = f"outcome {value!r} is not one of {', '.join(Outcome)}"
        elif key in ("restarts", "workersLost"):
            why = f"{key} must be a count (a whole number >= 0), not {value!r}"
        elif key.endswith(("USD", "Factor")):
            why = f"{key} {value!r} is not a decimal amount"
        else:
            why = f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}"
        raise ProgressError(f"progress.json: {why}") from None


def _read_raw(store: Store) -> dict | None:
    """The raw document (None before the first write): read only by `load_progress`."""
    try:
        return orjson.loads(store.get(PROGRESS))
    except NotFound:
        return None


def load_progress(store: Store) -> Progress | None:
    """The document, typed (None before the first write)."""
    doc = _read_raw(store)
    return None if doc is None else parse_progress(doc)


def write_progress(store: Store, progress: Progress) -> Progress:
    """Write `progress` as progress.json, stamped now. Its `run_id` is the DatasetGeneration's uid the operator
    passed (EYRIE_RUN_ID), so a recreated object with the same output never acts on its predecessor's outcome."""
    progress = progress.model_copy(update={"updated_at": now_iso()})
    store.put(PROGRESS, orjson.dumps(progress.to_json(), option=orjson.OPT_INDENT_2))
    return progress


def mark_stage(store: Store, stage: Stage) -> Progress | None:
    """Move a finished generation's progress.json on to `stage` (the extraction pods' last step),
    keeping everything else the job wrote; None when there is none, or its outcome is not Done."""
    progress = load_progress(store)
    if progress is None or progress.outcome != Outcome.DONE:
        return None
    return write_progress(store, progress.model_copy(update={"stage": stage}))
