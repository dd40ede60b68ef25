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
from typing import Annotated, Any, Literal

import orjson
from pydantic import ConfigDict, Field, PlainSerializer, ValidationError, field_validator

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
    forecast_figures: dict[str, Any] | None = Field(default=None, alias="forecast")  # budget/forecast.py
    discarded: USD | None = Field(default=None, alias="discardedUSD")
    paid: USD | None = Field(default=None, alias="paidUSD")
    unrecorded: USD | None = Field(default=None, alias="unrecordedUSD")
    samples: SampleCounts = Field(default_factory=SampleCounts)
    tokens: TokenCounts = Field(default_factory=TokenCounts)
    tools: dict[str, Any] = Field(default_factory=dict)  # tools.gate.ToolGate.metrics
    failures: dict[str, int] = Field(default_factory=dict)  # failed samples by error type
    resend_on_resume: int = 0
    requests: int = 0  # this attempt's requests (retries included)
    retries: int = 0
    errors: dict[str, int] = Field(default_factory=dict)
    in_flight: int = 0
    coordinator_calls: int = 0
    template_variants: dict[str, Any] | None = None  # reconstruct.variants.VariantDetector.summary
    providers: ProvidersProgress | None = None
    probe: ProbeProgress | None = None  # the provider probe under way (stage probe)
    pilot: PilotProgress | None = None  # the pilot (stage pilot while it runs; kept by the stages after it)
    attempts: list[str] = Field(default_factory=list)
    fingerprint: dict[str, Any] | None = None  # the attempt's binding (driver.Resume.progress)
    resume: dict[str, Any] | None = None
    fingerprints: Any = None  # contract/tally.py, per fingerprint
    models: Any = None
    bad_rows: dict[str, Any] | None = None
    abandoned: dict[str, Any] | None = None  # requests stops left in flight (budget/inflight.py)
    agentic: dict[str, Any] | None = None  # sending/conversation.AgenticSummary
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
