"""progress.json (DESIGN §3): the live state of a run, written by the data plane, read by the operator.

One model for both sides: `Outcome` and `Stage` are the closed sets of strings the document holds,
`write_progress` writes it, `parse_progress` reads it back strictly (the operator decides on it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any

import orjson

from eyrie.jobs.contract.layout import PROGRESS
from eyrie.jobs.errors import EyrieError
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


class Stage(StrEnum):
    PROBE = "probe"  # spec.api.providerProbe under way: nothing generated yet (`probe` says how far)
    GENERATE = "generate"
    SAMPLES = "samples"
    EXTRACT = "extract"
    DONE = "done"


class ProgressError(EyrieError):
    """progress.json exists but cannot be understood; the message names the field."""


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Progress:
    attempt: str
    outcome: Outcome
    message: str = ""
    spent: Decimal = Decimal(0)
    reserved: Decimal = Decimal(0)
    samples: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    tools: dict[str, Any] = field(default_factory=dict)
    stage: str = Stage.GENERATE
    run_id: str = ""  # the DatasetGeneration's uid the job ran for ("" from a local run)
    forecast: Decimal | None = None  # projected total spend, once the canary is measured
    providers: list[dict[str, Any]] = field(default_factory=list)  # the provider probe's verdict per endpoint
    probe: ProbeProgress | None = None  # the provider probe under way (stage probe)
    # disruptions of this attempt, cumulative: its job started again after its driver ended without a word (the
    # Ray head lost; KubeRay submitted it again), and its shard workers lost (their Ray pods gone)
    restarts: int = 0
    workers_lost: int = 0


@dataclass(frozen=True)
class ProbeProgress:
    """progress.json's `probe` while the provider probe runs (generate/probe/run.py writes it): the
    endpoints probed, the answers durable of those its verdict needs, what the probe has cost."""

    endpoints: tuple[str, ...]
    answers: int
    planned: int
    spent: Decimal


def _money(doc: dict[str, Any], key: str) -> Decimal:
    try:
        return Decimal(str(doc.get(key, "0")))
    except InvalidOperation:
        raise ProgressError(f"progress.json: {key} {doc.get(key)!r} is not a decimal amount") from None


def parse_progress(doc: Any) -> Progress:
    """Read the generation job's progress document; unknown keys are ignored."""
    if not isinstance(doc, dict):
        raise ProgressError("progress.json: must be a JSON object")
    try:
        outcome = Outcome(doc.get("outcome"))
    except ValueError:
        raise ProgressError(f"progress.json: outcome {doc.get('outcome')!r} is not one of "
                            f"{', '.join(Outcome)}") from None
    return Progress(
        attempt=str(doc.get("attempt", "")), outcome=outcome, message=str(doc.get("message", "")),
        spent=_money(doc, "spentUSD"), reserved=_money(doc, "reservedUSD"),
        samples={k: int(v) for k, v in (doc.get("samples") or {}).items()},
        tokens={k: int(v) for k, v in (doc.get("tokens") or {}).items()},
        tools=dict(doc.get("tools") or {}), stage=str(doc.get("stage", Stage.GENERATE)),
        run_id=str(doc.get("runId") or ""),
        forecast=_money(doc, "forecastUSD") if doc.get("forecastUSD") is not None else None,
        providers=_providers(doc), probe=_probe(doc),
        restarts=_count(doc, "restarts"), workers_lost=_count(doc, "workersLost"),
    )


def _count(doc: dict[str, Any], key: str) -> int:
    value = doc.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProgressError(f"progress.json: {key} must be a count (a whole number >= 0), not {value!r}")
    return value


def _probe(doc: dict[str, Any]) -> ProbeProgress | None:
    section = doc.get("probe")
    if section is None:
        return None
    ok = (isinstance(section, dict) and isinstance(section.get("endpoints"), list)
          and all(isinstance(t, str) for t in section["endpoints"])
          and all(isinstance(section.get(k), int) for k in ("answers", "answersPlanned")))
    if not ok:
        raise ProgressError("progress.json: probe must be {endpoints: [tag, ...], answers, answersPlanned, spentUSD}")
    return ProbeProgress(tuple(section["endpoints"]), section["answers"], section["answersPlanned"],
                         _money(section, "spentUSD"))


def _providers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """progress.json's `providers.endpoints` (generate/probe/run.py writes it), each entry checked."""
    section = doc.get("providers")
    if section is None:
        return []
    entries = section.get("endpoints") if isinstance(section, dict) else None
    ok = isinstance(entries, list) and all(
        isinstance(e, dict) and isinstance(e.get("tag"), str) and isinstance(e.get("passed"), bool) for e in entries)
    if not ok:
        raise ProgressError("progress.json: providers.endpoints must be a list of {tag, passed, ...}")
    return [{k: e[k] for k in ("tag", "name", "passed", "reason", "costPerAnswerUSD") if e.get(k) is not None}
            for e in entries]


def read_progress(store: Store) -> dict | None:
    """The raw document (None before the first write)."""
    try:
        return orjson.loads(store.get(PROGRESS))
    except NotFound:
        return None


def write_progress(store: Store, snapshot: dict, attempt: str, stage: Stage, run_id: str | None = None,
                   **extra: Any) -> dict:
    """`run_id`: the DatasetGeneration's uid the operator passed (EYRIE_RUN_ID), so a recreated
    object with the same output never acts on its predecessor's outcome."""
    ids = {"runId": run_id} if run_id else {}
    doc = {"attempt": attempt, **ids, "stage": str(stage), **snapshot, **extra, "updatedAt": now_iso()}
    store.put(PROGRESS, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return doc


def mark_stage(store: Store, stage: Stage) -> dict | None:
    """Move a finished generation's progress.json on to `stage` (the extraction pods' last step),
    keeping everything else the job wrote; None when there is none, or its outcome is not Done."""
    doc = read_progress(store)
    if doc is None or doc.get("outcome") != Outcome.DONE:
        return None
    doc.update(stage=str(stage), updatedAt=now_iso())
    store.put(PROGRESS, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return doc
