"""Pure decisions: (spec, observed children, progress.json) -> (actions, status).

Nothing here talks to the API server, Ray or the store; `handlers.py` gathers an `Observation`,
calls `reconcile`, carries out the actions and patches the status. The rules:

- progress.json decides what happened; a child's status only says whether it still runs.
- an outcome whose `attempt` is not the current attempt is never acted on (its spend still counts).
- a suspended run resumes as a fresh attempt, and only once the previous attempt has stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from eyrie.jobs.contract.fidelity import status_fidelity
from eyrie.jobs.contract.progress import STOP_GRACE_SECONDS, Outcome, Progress
from eyrie.jobs.spec import DatasetGenerationSpec, SpecError

from . import children, conditions
from .conditions import FAILED, OUTPUT_REACHABLE, QUEUED, SECRETS_READY, SUCCEEDED, SUSPENDED

# outcome -> the Suspended condition's reason
STOP_REASONS = {Outcome.BUDGET_EXHAUSTED: "BudgetExceeded", Outcome.TOOL_SEMANTICS_DRIFT: "ToolSemanticsDrift",
                Outcome.INSUFFICIENT_CREDITS: "InsufficientCredits"}
USER_SUSPENDED = "SuspendedByUser"
TERMINAL_PHASES = ("Succeeded", "Failed")


ChildState = Literal["Queued", "Pending", "Running", "Succeeded", "Failed", "Stopped"]


@dataclass(frozen=True)
class GenerationChild:
    """One generation attempt as observed: a RayJob, or a submission to an existing Ray cluster."""

    attempt: str
    name: str
    state: ChildState
    reason: str = ""
    message: str = ""
    stop_requested_at: float | None = None

    @property
    def running(self) -> bool:
        return self.state in ("Queued", "Pending", "Running")


@dataclass(frozen=True)
class ExtractionChild:
    name: str
    suspended: bool
    kueue: bool
    succeeded: int = 0
    completions: int = 0
    failed: bool = False
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class Observation:
    name: str
    namespace: str
    generation: int | None
    labels: dict[str, str]
    spec: DatasetGenerationSpec
    status: dict[str, Any]
    now: str  # RFC 3339, for lastTransitionTime
    now_ts: float  # seconds, for grace periods
    configmap_data: dict[str, str] | None = None
    generation_children: tuple[GenerationChild, ...] = ()
    extraction: ExtractionChild | None = None
    missing_secrets: tuple[str, ...] = ()  # each message names the spec field and the Secret
    progress: Progress | None = None
    progress_error: str | None = None
    output_checked: bool = True  # False while the S3 credentials Secret is missing
    manifest_uri: str | None = None  # set when <output>/manifest.json exists
    report_uri: str | None = None  # set when <output>/report.html exists (`eyrie run` writes it as it ends)
    summaries_done: int = 0
    extraction_bytes: int = 0  # from the manifest once extraction is merged into it
    fidelity: dict[str, Any] | None = None  # the manifest's fidelity section, once it exists
    stop_grace: float = STOP_GRACE_SECONDS
    uid: str = ""  # metadata.uid: attempts are numbered per object, so outcomes carry it too


# ------------------------------------------------------------------------------------------ actions


@dataclass(frozen=True)
class ApplyConfigMap:
    body: dict[str, Any]


@dataclass(frozen=True)
class CreateGeneration:
    attempt: str
    body: dict[str, Any] | None  # the RayJob; None in Submit mode (the handler submits to Ray)


@dataclass(frozen=True)
class StopGeneration:
    """Ask Ray to stop the attempt's job gracefully (the child is deleted once it has stopped)."""

    attempt: str
    name: str


@dataclass(frozen=True)
class DeleteGeneration:
    attempt: str
    name: str


@dataclass(frozen=True)
class CreateExtraction:
    body: dict[str, Any]


@dataclass(frozen=True)
class SetExtractionSuspend:
    name: str
    suspend: bool


@dataclass(frozen=True)
class DeleteExtraction:
    name: str


@dataclass(frozen=True)
class SuspendSpec:
    """Set `spec.suspend: true` on the DatasetGeneration itself (budget or drift stop)."""


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class FinalizeManifest:
    """Every extraction pod has written its summary: merge them into manifest.json."""


Action = (ApplyConfigMap | CreateGeneration | StopGeneration | DeleteGeneration | CreateExtraction
          | SetExtractionSuspend | DeleteExtraction | SuspendSpec | Event | FinalizeManifest)


@dataclass
class Decision:
    actions: list[Action]
    status: dict[str, Any]
    suspended_reason: str | None = None  # set when this pass suspended the run (for metrics)


# ------------------------------------------------------------------------------------------ helpers


def next_attempt(attempt: str) -> str:
    return str(int(attempt) + 1)


def _counts(obs: Observation) -> dict[str, Any]:
    """The progress figures shown in status; spend is cumulative, so any attempt's numbers count."""
    st = obs.status
    p = obs.progress
    out: dict[str, Any] = {
        "spentUSD": str(p.spent) if p else st.get("spentUSD", "0"),
        "reservedUSD": str(p.reserved) if p else st.get("reservedUSD", "0"),
    }
    if p:
        out["samples"] = {k: p.samples.get(k, 0) for k in ("total", "done", "dropped", "failed")}
        out["tokens"] = {k: p.tokens.get(k, 0) for k in ("input", "output")}
        tools = p.tools
        out["tools"] = {"declaredPrompts": int(tools.get("declaredPrompts", 0)),
                        "callRate": float(tools.get("callRate", 0.0)),
                        "invalidCalls": int(tools.get("invalidCalls", 0)),
                        "leaks": int(tools.get("leaks", 0))}
    else:
        for key in ("samples", "tokens", "tools"):
            if key in st:
                out[key] = st[key]
    if (fid := status_fidelity(obs.fidelity)) is not None:
        out["fidelity"] = fid
    if obs.spec.extraction.enabled:
        ext = obs.extraction
        out["extraction"] = {"shardsDone": max(obs.summaries_done, ext.succeeded if ext else 0),
                             "shardsTotal": children.extraction_count(obs.spec), "bytes": obs.extraction_bytes}
    return out


def _budget_message(spent: Decimal, budget: Decimal) -> str:
    return (f"spent {spent} USD of the {budget} USD budget (spec.budget.maxUSD); raise "
            "spec.budget.maxUSD and set spec.suspend: false to resume")


class _Pass:
    """One reconcile pass: accumulates conditions and actions, then renders the status."""

    def __init__(self, obs: Observation):
        self.obs = obs
        self.actions: list[Action] = []
        self.conds: dict[str, dict[str, Any]] = {}
        self.suspended_reason: str | None = None
        self.prev = list(obs.status.get("conditions") or [])

    def cond(self, type_: str, ok: bool, reason: str, message: str = "") -> None:
        self.conds[type_] = conditions.make(type_, "True" if ok else "False", reason, message,
                                            self.obs.now, self.obs.generation)

    def status(self, phase: str, attempt: str) -> dict[str, Any]:
        out = {"phase": phase, "attempt": attempt, "observedGeneration": self.obs.generation,
               **_counts(self.obs),
               "conditions": conditions.merge(self.prev, list(self.conds.values()))}
        if self.obs.manifest_uri:
            out["outputManifest"] = self.obs.manifest_uri
        if self.obs.report_uri:
            out["outputReport"] = self.obs.report_uri
        return out


def invalid_spec(error: SpecError | children.ChildSpecError, status: dict[str, Any], generation: int | None,
                 now: str) -> dict[str, Any]:
    """A spec that cannot run: phase Failed, `Failed=True` reason PermanentError naming the fields."""
    if isinstance(error, SpecError):
        message = "; ".join(f"{path}: {msg}" for path, msg in error.problems)
    else:
        message = str(error)
    cond = conditions.make(FAILED, "True", "PermanentError", message, now, generation)
    return {"phase": "Failed", "observedGeneration": generation,
            "conditions": conditions.merge(list(status.get("conditions") or []), [cond])}


# ---------------------------------------------------------------------------------------- reconcile


def reconcile(obs: Observation) -> Decision:
    """Decide what to do for one DatasetGeneration; idempotent, so every pass may repeat it."""
    p = _Pass(obs)
    spec = obs.spec
    st = obs.status
    phase = st.get("phase")
    if phase in TERMINAL_PHASES:
        return Decision([], p.status(phase, st.get("attempt") or "1"))
    try:
        children.check_cluster_spec(spec)
    except children.ChildSpecError as e:
        return Decision([Event("Warning", "PermanentError", str(e))],
                        invalid_spec(e, st, obs.generation, obs.now))

    desired_cm = children.configmap(obs.name, obs.namespace, spec)
    if obs.configmap_data != desired_cm["data"]:
        p.actions.append(ApplyConfigMap(desired_cm))

    if obs.missing_secrets:
        p.cond(SECRETS_READY, False, "SecretNotFound", "; ".join(obs.missing_secrets))
    else:
        p.cond(SECRETS_READY, True, "SecretsFound")
    if obs.progress_error:
        p.cond(OUTPUT_REACHABLE, False, "OutputUnreachable", obs.progress_error)
    elif not obs.output_checked:
        p.conds[OUTPUT_REACHABLE] = conditions.make(
            OUTPUT_REACHABLE, "Unknown", "WaitingForCredentials",
            "spec.output.credentialsSecretRef: the Secret is needed to read the output", obs.now, obs.generation)
    else:
        p.cond(OUTPUT_REACHABLE, True, "OutputReadable")
    can_start = not obs.missing_secrets and not obs.progress_error

    # The current attempt: the recorded one, or a newer child created just before a restart.
    attempt = st.get("attempt") or "1"
    for child in obs.generation_children:
        if int(child.attempt) > int(attempt):
            attempt = child.attempt
    current = [c for c in obs.generation_children if c.attempt == attempt]
    stale = [c for c in obs.generation_children if c.attempt != attempt]
    for child in stale:
        _stop(p, child)

    # an outcome counts only for this attempt of this object: a deleted and recreated object with
    # the same output.uri starts again at attempt 1 and must not act on its predecessor's outcome
    prog = obs.progress if (obs.progress and obs.progress.attempt == attempt
                            and obs.progress.run_id in ("", obs.uid)) else None
    outcome = prog.outcome if prog else None
    spent = obs.progress.spent if obs.progress else Decimal(str(st.get("spentUSD") or "0"))
    was_suspended = conditions.is_true(p.prev, SUSPENDED) and attempt == (st.get("attempt") or "1")

    if outcome == Outcome.DONE:
        phase = _after_generation(p, obs, was_suspended)
        return Decision(p.actions, p.status(phase, attempt), p.suspended_reason)

    stop_reason = STOP_REASONS.get(outcome or "")
    over_budget = spent >= spec.budget.max_usd
    if over_budget:
        stop_reason, stop_message = "BudgetExceeded", _budget_message(spent, spec.budget.max_usd)
    elif stop_reason == "BudgetExceeded":
        stop_message = _budget_message(spent, spec.budget.max_usd)
    elif stop_reason:
        stop_message = prog.message if prog and prog.message else f"the generation job stopped: {outcome}"

    if spec.suspend or (stop_reason and not was_suspended) or (stop_reason and over_budget):
        # Suspended (or about to be): stop the attempt, record why. A resume with the budget still
        # spent lands here again and re-suspends at once.
        if not spec.suspend:
            p.actions.append(SuspendSpec())
        if not was_suspended or not spec.suspend:
            reason = stop_reason or USER_SUSPENDED
            message = stop_message if stop_reason else "spec.suspend is true"
            p.cond(SUSPENDED, True, reason, message)
            p.actions.append(Event("Warning" if stop_reason else "Normal", reason, message))
            p.suspended_reason = reason
        for child in current:
            _stop(p, child)
        p.cond(QUEUED, False, "NotQueued")
        return Decision(p.actions, p.status("Suspended", attempt), p.suspended_reason)

    if was_suspended:
        # Resumed by the user. Wait until the stopped attempt is gone, then start a fresh one.
        if any(c.running for c in current):
            for child in current:
                _stop(p, child)
            p.cond(SUSPENDED, True, "Stopping", f"waiting for generation attempt {attempt} to stop")
            return Decision(p.actions, p.status("Suspended", attempt))
        for child in current:
            p.actions.append(DeleteGeneration(child.attempt, child.name))
        attempt = next_attempt(attempt)
        current, prog, outcome = [], None, None
        p.cond(SUSPENDED, False, "Resumed", f"resumed as generation attempt {attempt}")
        p.actions.append(Event("Normal", "Resumed", f"resumed as generation attempt {attempt}"))
    else:
        _not_suspended(p)

    if outcome == "Failed":
        return _fail(p, attempt, "GenerationFailed", prog.message if prog else "")

    child = current[0] if current else None
    if child is None:
        p.cond(QUEUED, False, "NotQueued")
        if not can_start:
            return Decision(p.actions, p.status("Pending", attempt))
        body = None
        if spec.generation.ray.mode == "RayJob":
            body = children.rayjob(obs.name, obs.namespace, spec, attempt, obs.labels, obs.uid)
        p.actions.append(CreateGeneration(attempt, body))
        return Decision(p.actions, p.status("Pending", attempt))
    if child.state == "Failed":
        return _fail(p, attempt, child.reason or "GenerationJobFailed",
                     child.message or f"generation child {child.name} failed")
    if child.state in ("Succeeded", "Stopped"):
        return _fail(p, attempt, "GenerationEnded",
                     f"generation child {child.name} ended without reporting Done in progress.json "
                     f"(outcome for attempt {attempt}: {outcome or 'none'})")
    if child.state == "Queued":
        p.cond(QUEUED, True, "WaitingForAdmission", f"{child.name} waits for Kueue admission")
        return Decision(p.actions, p.status("Pending", attempt))
    p.cond(QUEUED, False, "Admitted")
    gate = spec.tools.gate
    in_canary = (prog is not None and prog.stage == "generate" and gate.enabled
                 and prog.samples.get("done", 0) < gate.canary_samples)
    phase = "Canary" if in_canary else "Generating" if prog is not None else "Pending"
    return Decision(p.actions, p.status(phase, attempt))


def fidelity_events(section: dict[str, Any] | None) -> list[Event]:
    """A Warning per provider whose answers the target model scores under extraction.fidelity's floor
    (posted once: the pass that turns the run Succeeded; terminal phases are not reconciled again)."""
    if not section:
        return []
    floor = section.get("minTop1Agreement")
    by = section.get("byProvider") or {}
    excluded = section.get("onLow") == "exclude"
    out = []
    for name in section.get("belowFloor") or ():
        g = by.get(name) or {}
        out.append(Event("Warning", "LowFidelity",
                         f"provider {name}: top-1 agreement {g.get('top1Agreement')} with the target model is under "
                         f"spec.extraction.fidelity.minTop1Agreement {floor} ({g.get('lowSamples', 0)} of "
                         f"{g.get('samples', 0)} samples low" + (", excluded from training" if excluded else "")
                         + "); it may serve another model, quantization or template"))
    return out


def _not_suspended(p: _Pass) -> None:
    """Suspended=False; a previous False (e.g. reason Resumed) is kept so the history stays readable."""
    prev = conditions.find(p.prev, SUSPENDED)
    if prev is None:
        p.cond(SUSPENDED, False, "NotSuspended")
    elif prev.get("status") == "True":
        p.cond(SUSPENDED, False, "Resumed", "running again")


def _stop(p: _Pass, child: GenerationChild) -> None:
    """Graceful first: ask Ray to stop; delete once stopped or after the grace period."""
    if child.running and child.stop_requested_at is None:
        p.actions.append(StopGeneration(child.attempt, child.name))
    elif not child.running or p.obs.now_ts - (child.stop_requested_at or 0) > p.obs.stop_grace:
        p.actions.append(DeleteGeneration(child.attempt, child.name))


def _fail(p: _Pass, attempt: str, reason: str, message: str) -> Decision:
    p.cond(FAILED, True, reason, message)
    p.actions.append(Event("Warning", reason, message))
    return Decision(p.actions, p.status("Failed", attempt))


def _after_generation(p: _Pass, obs: Observation, was_suspended: bool) -> str:
    """Generation is Done: extraction (if enabled), then Succeeded once the manifest exists."""
    spec = obs.spec
    p.cond(QUEUED, False, "NotQueued")
    if obs.manifest_uri:
        _not_suspended(p)
        where = f"dataset manifest at {obs.manifest_uri}" + (f", report at {obs.report_uri}" if obs.report_uri else "")
        p.cond(SUCCEEDED, True, "ManifestWritten", where)
        p.actions.append(Event("Normal", "Succeeded", where))
        p.actions.extend(fidelity_events(obs.fidelity))
        return "Succeeded"
    if not spec.extraction.enabled:
        _not_suspended(p)
        p.actions.append(FinalizeManifest())
        return "Generating"
    if obs.summaries_done >= children.extraction_count(spec):
        p.actions.append(FinalizeManifest())
        return "Extracting"
    job = obs.extraction
    if spec.suspend:
        if not was_suspended:
            p.cond(SUSPENDED, True, USER_SUSPENDED, "spec.suspend is true")
            p.actions.append(Event("Normal", USER_SUSPENDED, "spec.suspend is true"))
            p.suspended_reason = USER_SUSPENDED
        if job is not None and job.kueue:
            p.actions.append(DeleteExtraction(job.name))  # Kueue owns its suspend; remove it instead
        elif job is not None and not job.suspended:
            p.actions.append(SetExtractionSuspend(job.name, True))
        return "Suspended"
    if was_suspended:
        p.cond(SUSPENDED, False, "Resumed", "extraction resumed")
        p.actions.append(Event("Normal", "Resumed", "extraction resumed"))
    else:
        _not_suspended(p)
    if job is None:
        p.actions.append(CreateExtraction(children.extraction_job(obs.name, obs.namespace, spec, obs.labels)))
        return "Extracting"
    if job.failed:
        p.cond(FAILED, True, job.reason or "ExtractionFailed", job.message or f"Job {job.name} failed")
        p.actions.append(Event("Warning", job.reason or "ExtractionFailed",
                               job.message or f"Job {job.name} failed"))
        return "Failed"
    if job.completions and job.succeeded >= job.completions:
        count = children.extraction_count(spec)
        message = (f"Job {job.name} completed but only {obs.summaries_done} of {count} pod summaries exist "
                   f"under {spec.output.uri}/hidden/")
        p.cond(FAILED, True, "ExtractionIncomplete", message)
        p.actions.append(Event("Warning", "ExtractionIncomplete", message))
        return "Failed"
    if job.suspended and job.kueue:
        p.cond(QUEUED, True, "WaitingForAdmission", f"{job.name} waits for Kueue admission")
    elif job.suspended:
        p.actions.append(SetExtractionSuspend(job.name, False))
    return "Extracting"
