"""Pure decisions: (spec, observed children, progress.json) -> (actions, status).

Nothing here talks to the API server, Ray or the store; `handlers.py` gathers an `Observation`,
calls `reconcile`, carries out the actions and patches the status. The rules:

- progress.json decides what happened; a child's status only says whether it still runs.
- an outcome whose `attempt` is not the current attempt is never acted on (its spend still counts).
- a suspended run resumes as a fresh attempt, and only once the previous attempt has stopped.
- with spec.pilot, no generation child starts before the pilot's verdict stands for the spec (pilot.json's key) and
  lets the run go on, and never beside a pilot Job that still runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from eyrie.jobs.contract.fidelity import status_fidelity
from eyrie.jobs.contract.fingerprint import ACCEPT_ANNOTATION, current_fields, diff, fingerprint
from eyrie.jobs.contract.money import brief, dollars
from eyrie.jobs.contract.progress import STOP_GRACE_SECONDS, Outcome, ProbeProgress, Progress, Stage
from eyrie.jobs.spec import DatasetGenerationSpec, SpecError

from . import children, conditions
from .conditions import (
    FAILED,
    OUTPUT_MATCHES_SPEC,
    OUTPUT_REACHABLE,
    PILOT_PASSED,
    PODS_HEALTHY,
    PROVIDERS_CHECKED,
    QUEUED,
    SECRETS_READY,
    SUCCEEDED,
    SUSPENDED,
)

# outcome -> the Suspended condition's reason
STOP_REASONS = {Outcome.BUDGET_EXHAUSTED: "BudgetExceeded", Outcome.TOOL_SEMANTICS_DRIFT: "ToolSemanticsDrift",
                Outcome.INSUFFICIENT_CREDITS: "InsufficientCredits", Outcome.TEMPLATE_MISMATCH: "TemplateMismatch",
                Outcome.FORECAST_OVER_BUDGET: "ForecastOverBudget", Outcome.NO_PROVIDER_PASSES: "NoProviderPasses"}
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
    suspended_by_other: bool = False  # suspended by Kueue (or another controller), not by eyrie


@dataclass(frozen=True)
class PilotChild:
    """The pilot Job as observed: which attempt and which settings (`key`) it runs for, and how it stands."""

    name: str
    attempt: str
    key: str
    active: bool = True
    succeeded: bool = False
    failed: bool = False
    reason: str = ""
    message: str = ""
    queued: bool = False  # suspended by Kueue (or another controller): it runs once admitted


@dataclass(frozen=True)
class PilotJudgement:
    """The output's pilot verdict (pilot.json), standing for the current spec's settings and judged for its own mode,
    policy and margin (contract/pilot.judge: the data plane's rule, one place)."""

    passed: bool  # the run's own option accepts no fewer tokens per step than the best alternative, less the margin
    proceed: bool  # generation goes on: passed, or policy report
    sentence: str  # what was compared, what each option costs and accepts: the condition's message
    own: str
    own_accepted: float
    best: str
    best_accepted: float
    patch: dict[str, Any]  # the spec merge patch that makes the best alternative the run's own


PodRole = Literal["generation", "extraction", "pilot"]


@dataclass(frozen=True)
class PodProblem:
    """Why a child's pod does not run, as its kubelet or the scheduler says (observed.pod_problems)."""

    reason: Literal["ImageNotPresent", "ImagePullFailed", "SecretNotFound", "ContainerConfigError", "OOMKilled",
                    "Unschedulable"]
    pod: str
    role: PodRole
    container: str = ""
    image: str = ""
    detail: str = ""  # the kubelet's or scheduler's message
    memory: str = ""  # the container's memory limit (OOMKilled)


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
    fingerprint_doc: dict[str, Any] | None = None  # <output>/fingerprint.json: what its answers were bought under
    accept_fingerprint: str | None = None  # annotation eyrie.dev/accept-fingerprint: a new fingerprint accepted
    stop_grace: float = STOP_GRACE_SECONDS
    uid: str = ""  # metadata.uid: attempts are numbered per object, so outcomes carry it too
    pod_problems: tuple[PodProblem, ...] = ()  # of the current generation child's and the extraction Job's pods
    pilot_key: str = ""  # the settings the current spec's pilot is for (with spec.pilot)
    pilot_job: PilotChild | None = None
    pilot: PilotJudgement | None = None  # the output's pilot verdict, when it stands for this spec


# ------------------------------------------------------------------------------------------ actions


@dataclass(frozen=True)
class ApplyConfigMap:
    body: dict[str, Any]


@dataclass(frozen=True)
class CreateGeneration:
    attempt: str
    body: dict[str, Any] | None  # the RayJob; None in Submit mode (the handler submits to Ray)
    accept_fingerprint: str | None = None  # passed to the job (EYRIE_ACCEPT_FINGERPRINT)


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
class CreatePilot:
    body: dict[str, Any]


@dataclass(frozen=True)
class DeletePilot:
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
          | SetExtractionSuspend | DeleteExtraction | CreatePilot | DeletePilot | SuspendSpec | Event
          | FinalizeManifest)


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
        # rounded for `kubectl get dsg` (up: never below the spend); progress.json keeps every digit
        "spentUSD": brief(p.spent) if p else st.get("spentUSD", "0"),
        "reservedUSD": brief(p.reserved) if p else st.get("reservedUSD", "0"),
    }
    if p and p.forecast is not None:
        out["forecastUSD"] = brief(p.forecast)
    elif "forecastUSD" in st:
        out["forecastUSD"] = st["forecastUSD"]
    if p:
        out["samples"] = p.samples.dump()
        out["tokens"] = p.tokens.dump()
        tools = p.tools
        out["tools"] = {"declaredPrompts": tools.declared_prompts or 0, "callRate": tools.call_rate or 0.0,
                        "invalidCalls": tools.invalid_calls or 0, "leaks": tools.leaks or 0}
    else:
        for key in ("samples", "tokens", "tools"):
            if key in st:
                out[key] = st[key]
    if p and p.endpoint_verdicts:
        out["providers"] = [e.dump() for e in p.endpoint_verdicts]
    elif "providers" in st:
        out["providers"] = st["providers"]
    if "retries" in st:
        out["retries"] = st["retries"]
    if p and (p.restarts or p.workers_lost):
        out["disruptions"] = {"attempt": p.attempt, "restarts": p.restarts, "workersLost": p.workers_lost}
    elif "disruptions" in st:
        out["disruptions"] = st["disruptions"]
    if obs.spec.pilot is not None:
        pilot = _pilot_status(obs, st.get("pilot"))
        if pilot:
            out["pilot"] = pilot
    if (fid := status_fidelity(obs.fidelity)) is not None:
        out["fidelity"] = fid
    if obs.spec.extraction.enabled:
        ext = obs.extraction
        out["extraction"] = {"shardsDone": max(obs.summaries_done, ext.succeeded if ext else 0),
                             "shardsTotal": children.extraction_count(obs.spec), "bytes": obs.extraction_bytes}
    return out


def _budget_message(spent: Decimal, budget: Decimal) -> str:
    return (f"spent {dollars(spent)} of the {dollars(budget)} budget (spec.budget.maxUSD); raise "
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
    return _failed_status(conditions.make(FAILED, "True", "PermanentError", message, now, generation), status)


def child_rejected(message: str, status: dict[str, Any], generation: int | None, now: str) -> dict[str, Any]:
    """The API server (schema, CEL, an admission webhook) refused to create a child: the same body
    would be refused again, so the run fails (`Failed=True` reason ChildRejected) instead of retrying."""
    return _failed_status(conditions.make(FAILED, "True", "ChildRejected", message, now, generation), status)


def _failed_status(cond: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {"phase": "Failed", "observedGeneration": cond.get("observedGeneration"),
            "conditions": conditions.merge(list(status.get("conditions") or []), [cond])}


# ---------------------------------------------------------------------------------------- reconcile


def reconcile(obs: Observation) -> Decision:
    """Decide what to do for one DatasetGeneration; idempotent, so every pass may repeat it.

    One concern per step: a run that cannot start at all; the ConfigMap and readiness conditions;
    which attempt is current (older ones are stopped); generation Done -> extraction; a stop (user,
    budget, drift, credits); a resume; the generation child's state -> phase.
    """
    p = _Pass(obs)
    st = obs.status
    phase = st.get("phase")
    if phase in TERMINAL_PHASES:
        return Decision([], p.status(phase, st.get("attempt") or "1"))
    try:
        children.check_cluster_spec(obs.spec)
    except children.ChildSpecError as e:
        return Decision([Event("Warning", "PermanentError", str(e))],
                        invalid_spec(e, st, obs.generation, obs.now))

    _apply_configmap(p)
    can_start = _readiness(p)
    _providers(p)
    _pods(p)
    attempt, current = _current_attempt(p)
    prog = _progress_of(obs, attempt)
    _disruptions(p, prog)
    was_suspended = conditions.is_true(p.prev, SUSPENDED) and attempt == (st.get("attempt") or "1")

    if prog is not None and prog.outcome == Outcome.DONE:
        phase = _after_generation(p, obs, was_suspended)
        return Decision(p.actions, p.status(phase, attempt), p.suspended_reason)

    stop = _stop_reason(obs, prog)
    if obs.spec.suspend or (stop and (not was_suspended or stop.over_budget)):
        # Suspended (or about to be). A resume with the budget still spent lands here again and
        # re-suspends at once.
        return _suspend(p, current, attempt, stop, was_suspended)
    if was_suspended:
        refused = _pilot_refusal(p)
        if refused is not None:  # unsuspended with settings the pilot's verdict still fails: suspended again
            _pilot_condition(p, refused, event=False)
            return _suspend(p, current, attempt, _pilot_stop(p, refused), False)
        resumed = _resume(p, current, attempt)
        if resumed is None:
            return Decision(p.actions, p.status("Suspended", attempt))
        attempt, current, prog = resumed, [], None
    else:
        _not_suspended(p)
    child = current[0] if current else None
    piloting = prog is None or prog.stage == Stage.PILOT  # nothing generated beyond the pilot in this attempt
    if obs.spec.pilot is None and obs.pilot_job is not None and obs.pilot_job.active and child is None:
        # spec.pilot removed while its Job ran: it goes before the generation job starts (never both paying)
        p.actions.append(DeletePilot(obs.pilot_job.name))
        return Decision(p.actions, p.status("Pending", attempt))
    if child is None and piloting and obs.spec.pilot is not None:
        held = _pilot(p, attempt, prog, can_start)
        if held is not None:
            return held
    if prog is not None and prog.outcome == Outcome.FAILED:
        return _fail(p, attempt, "GenerationFailed", prog.message)
    return _generation(p, attempt, child, prog, can_start)


def _disruptions(p: _Pass, prog: Progress | None) -> None:
    """A Warning event each time the current attempt's job was disrupted and carried on (progress.json's counts
    rose above what the status last showed for that attempt): its driver lost with the Ray head and the job
    submitted again, or shard workers lost with their pods. What eyrie did is in the message."""
    if prog is None:
        return
    seen = p.obs.status.get("disruptions") or {}
    if seen.get("attempt") != prog.attempt:
        seen = {}
    again = "the requests it had in flight may be paid again (at most spec.api.maxConcurrency)"
    if prog.restarts > int(seen.get("restarts") or 0):
        p.actions.append(Event(
            "Warning", "GenerationRestarted",
            f"generation attempt {prog.attempt} started again ({prog.restarts} time(s) in all): its driver on the "
            f"Ray head ended without a word (the head pod deleted, evicted or out of memory) and KubeRay submitted "
            f"the job again to the new head, where it resumed from {p.obs.spec.output.uri}: nothing persisted is "
            f"requested again; {again}"))
    lost = prog.workers_lost - int(seen.get("workersLost") or 0)
    if lost > 0:
        p.actions.append(Event(
            "Warning", "WorkerLost",
            f"{lost} shard worker(s) of generation attempt {prog.attempt} lost ({prog.workers_lost} in all): its Ray "
            f"worker pod deleted, evicted or out of memory; its shards went back to the queue and new workers took "
            f"them on the Ray cluster's pods (KubeRay replaces a lost pod); nothing persisted is requested again; "
            f"{again.replace('it had', 'they had')}"))


def _providers(p: _Pass) -> None:
    """The provider probe's verdict (progress.json `providers`, any attempt's: it is reused until the
    probe changes): condition ProvidersChecked, and a Warning event the first time an endpoint is
    dropped (once: the next pass finds it dropped in the status it wrote)."""
    verdict = p.obs.progress.endpoint_verdicts if p.obs.progress else []
    if not verdict:
        return
    passing = [e.tag for e in verdict if e.passed]
    dropped = [e for e in verdict if not e.passed]
    known = {e.get("tag") for e in p.obs.status.get("providers") or [] if isinstance(e, dict) and not e.get("passed")}
    for e in dropped:
        if e.tag not in known:
            p.actions.append(Event("Warning", "ProviderDropped",
                                   f"provider {e.tag} dropped by the provider probe: {e.reason or 'failed'}"))
    why = "; ".join(f"{e.tag} ({e.reason or 'failed'})" for e in dropped)
    if passing:
        p.cond(PROVIDERS_CHECKED, True, "ProvidersPassed",
               f"generation routed to {', '.join(passing)} (cheapest first)" + (f"; dropped: {why}" if why else ""))
    else:
        p.cond(PROVIDERS_CHECKED, False, "NoProviderPasses", f"no endpoint passes spec.api.providerProbe: {why}")


def _apply_configmap(p: _Pass) -> None:
    """The resolved spec the jobs mount: (re)applied whenever it differs from what was applied."""
    desired = children.configmap(p.obs.name, p.obs.namespace, p.obs.spec)
    if p.obs.configmap_data != desired["data"]:
        p.actions.append(ApplyConfigMap(desired))


def _readiness(p: _Pass) -> bool:
    """SecretsReady and OutputReachable; True when an attempt may be started."""
    obs = p.obs
    if obs.missing_secrets:
        message = "; ".join(obs.missing_secrets)
        _warn_on_change(p, SECRETS_READY, "SecretNotFound", message)
        p.cond(SECRETS_READY, False, "SecretNotFound", message)
    else:
        p.cond(SECRETS_READY, True, "SecretsFound")
    prev = conditions.find(p.prev, OUTPUT_REACHABLE) or {}
    was_down = (prev.get("status"), prev.get("reason")) == ("False", "OutputUnreachable")
    if obs.progress_error:
        # one Warning when the store goes (its error's text changes from poll to poll: not on every message)
        if not was_down:
            p.actions.append(Event("Warning", "OutputUnreachable", obs.progress_error))
        p.cond(OUTPUT_REACHABLE, False, "OutputUnreachable", obs.progress_error)
    elif not obs.output_checked:
        p.conds[OUTPUT_REACHABLE] = conditions.make(
            OUTPUT_REACHABLE, "Unknown", "WaitingForCredentials",
            "spec.output.credentialsSecretRef: the Secret is needed to read the output", obs.now, obs.generation)
    else:
        if was_down:  # the condition turns True and forgets: the event keeps that the run waited, and how long
            p.actions.append(Event("Normal", "OutputReadable", f"{obs.spec.output.uri} is readable again "
                                   f"(unreachable since {prev.get('lastTransitionTime')})"))
        p.cond(OUTPUT_REACHABLE, True, "OutputReadable")
    return not obs.missing_secrets and not obs.progress_error


def _warn_on_change(p: _Pass, type_: str, reason: str, message: str) -> None:
    """A Warning event when condition `type_` turns False with this reason and message (not on every pass)."""
    prev = conditions.find(p.prev, type_) or {}
    if (prev.get("status"), prev.get("reason"), prev.get("message")) != ("False", reason, message):
        p.actions.append(Event("Warning", reason, message))


RECREATE = ("recreate the DatasetGeneration with the same spec.output.uri: what was paid for is read from there, "
            "not requested again")


def pod_advice(problem: PodProblem) -> str:
    """What a pod's problem is and what to do about it, naming the spec field to change."""
    where = f"pod {problem.pod}" + (f" container {problem.container}" if problem.container else "")
    image_field = "spec.extraction.image" if problem.role != "generation" else "spec.generation.ray.image"
    if problem.reason == "ImageNotPresent":
        return (f"{where}: image {problem.image} is not on its node and is never pulled (imagePullPolicy Never): "
                f"load it onto the node, or set {image_field} to an image the nodes have and {RECREATE}")
    if problem.reason == "ImagePullFailed":
        return (f"{where}: image {problem.image} cannot be pulled ({problem.detail}): push it to its registry or "
                f"let the pods pull it (imagePullSecrets); the kubelet keeps retrying. If {image_field} is wrong, "
                f"correct it and {RECREATE}")
    if problem.reason in ("SecretNotFound", "ContainerConfigError"):
        return f"{where}: {problem.detail}: create it in the DatasetGeneration's namespace; the kubelet retries"
    if problem.reason == "OOMKilled":
        if problem.role != "generation":
            field = "spec.extraction.memory (or lower spec.extraction.maxTokensPerBatch)"
        elif problem.container == "ray-worker":
            field = "spec.generation.ray.memoryPerWorker"
        else:
            field = "the memory of its node (the Ray head's limit is 2Gi)"
        return (f"{where} was killed out of memory at its limit of {problem.memory or 'its node'}: "
                f"raise {field}")
    fields = ("spec.extraction.gpusPerPod, spec.extraction.memory, spec.extraction.nodeSelector"
              if problem.role != "generation" else
              "spec.generation.ray.workers, cpusPerWorker, memoryPerWorker")
    return f"{where} cannot be scheduled ({problem.detail}): add node capacity, or ask for less ({fields})"


def _pods(p: _Pass) -> None:
    """PodsHealthy: False (and one Warning event) while a child's pod cannot run, saying why and what to do; True
    again once none has a problem. Absent until a problem was ever seen."""
    problems = p.obs.pod_problems
    prev = conditions.find(p.prev, PODS_HEALTHY)
    if not problems:
        if prev is not None and prev.get("status") == "False":
            p.cond(PODS_HEALTHY, True, "PodsRunning", "no pod of this run reports a problem")
        return
    seen: dict[tuple[str, str, str], PodProblem] = {}
    for problem in problems:  # one line per kind of problem, not per pod
        seen.setdefault((problem.reason, problem.image, problem.container), problem)
    lines = [pod_advice(x) for x in seen.values()]
    more = len(problems) - len(seen)
    message = "; ".join(lines) + (f" (and {more} more pods alike)" if more else "")
    _warn_on_change(p, PODS_HEALTHY, problems[0].reason, message)
    p.cond(PODS_HEALTHY, False, problems[0].reason, message)


def _current_attempt(p: _Pass) -> tuple[str, list[GenerationChild]]:
    """The recorded attempt, or a newer child's (created just before a restart); children of any
    other attempt are stopped."""
    attempt = p.obs.status.get("attempt") or "1"
    for child in p.obs.generation_children:
        if int(child.attempt) > int(attempt):
            attempt = child.attempt
    for child in p.obs.generation_children:
        if child.attempt != attempt:
            _stop(p, child)
    return attempt, [c for c in p.obs.generation_children if c.attempt == attempt]


def _progress_of(obs: Observation, attempt: str) -> Progress | None:
    """progress.json when it is this attempt's of this object: a deleted and recreated object with the
    same output.uri starts again at attempt 1 and must not act on its predecessor's outcome."""
    prog = obs.progress
    if prog is not None and prog.attempt == attempt and (prog.run_id or "") in ("", obs.uid):
        return prog
    return None


@dataclass(frozen=True)
class _Stop:
    reason: str
    message: str
    over_budget: bool


def _stop_reason(obs: Observation, prog: Progress | None) -> _Stop | None:
    """Why the run must stop, if it must: spend at the budget (any attempt's spend counts, the pilot's too), or
    the job's own stop outcome (budget, drift, credits; the pilot's job writes them too)."""
    spent = obs.progress.spent if obs.progress else Decimal(str(obs.status.get("spentUSD") or "0"))
    budget = obs.spec.budget.max_usd
    if spent >= budget:
        return _Stop("BudgetExceeded", _budget_message(spent, budget), True)
    outcome = prog.outcome if prog else None
    reason = STOP_REASONS.get(outcome or "")
    if reason == "BudgetExceeded":
        return _Stop(reason, _budget_message(spent, budget), False)
    if reason:
        return _Stop(reason, prog.message if prog and prog.message else f"the generation job stopped: {outcome}",
                     False)
    return None


def _suspend(p: _Pass, current: list[GenerationChild], attempt: str, stop: _Stop | None,
             was_suspended: bool) -> Decision:
    """Stop the attempt and record why; the operator's own stops also set spec.suspend."""
    spec = p.obs.spec
    if not spec.suspend:
        p.actions.append(SuspendSpec())
    if not was_suspended or not spec.suspend:
        reason = stop.reason if stop else USER_SUSPENDED
        message = stop.message if stop else "spec.suspend is true"
        p.cond(SUSPENDED, True, reason, message)
        p.actions.append(Event("Warning" if stop else "Normal", reason, message))
        p.suspended_reason = reason
    for child in current:
        _stop(p, child)
    job = p.obs.pilot_job
    if job is not None and job.active:
        # its answers are durable before their slots are freed: a resumed pilot asks only for what it lacks
        p.actions.append(DeletePilot(job.name))
    p.cond(QUEUED, False, "NotQueued")
    return Decision(p.actions, p.status("Suspended", attempt), p.suspended_reason)


def _resume(p: _Pass, current: list[GenerationChild], attempt: str) -> str | None:
    """Resumed by the user: once the stopped attempt is gone, the next attempt (None while waiting)."""
    if any(c.running for c in current):
        for child in current:
            _stop(p, child)
        p.cond(SUSPENDED, True, "Stopping", f"waiting for generation attempt {attempt} to stop")
        return None
    for child in current:
        p.actions.append(DeleteGeneration(child.attempt, child.name))
    attempt = next_attempt(attempt)
    p.cond(SUSPENDED, False, "Resumed", f"resumed as generation attempt {attempt}")
    p.actions.append(Event("Normal", "Resumed", f"resumed as generation attempt {attempt}"))
    return attempt


def _generation(p: _Pass, attempt: str, child: GenerationChild | None, prog: Progress | None,
                can_start: bool) -> Decision:
    """The generation child of the current attempt: create it, or read its state into the phase."""
    obs = p.obs
    if child is not None and prog is None and obs.progress_error:
        # the store is down, not the run: what a child's end means (Done, a stop, a failure to retry or not) is what
        # its job wrote, so nothing is decided on it until progress.json reads again; the phase stays (a child that
        # finished generating while extraction runs, or runs on, is no failure)
        return Decision(p.actions, p.status(obs.status.get("phase") or "Pending", attempt))
    accepted = _output_binding(p, running=child is not None and child.running)
    if child is None:
        p.cond(QUEUED, False, "NotQueued")
        if not can_start or accepted is False:
            return Decision(p.actions, p.status("Pending", attempt))
        if any(c.attempt != attempt and (c.running or obs.spec.generation.ray.mode == "RayJob")
               for c in obs.generation_children):
            # an earlier attempt's child is still there: never two jobs paying at once. A RayJob waits until it is
            # deleted (its cluster may still run); a submission to a user's Ray cluster is never deleted (Ray keeps
            # its record and logs), and once it has ended nothing of it runs or pays.
            return Decision(p.actions, p.status("Pending", attempt))
        accept = accepted if isinstance(accepted, str) else None
        body = None
        if obs.spec.generation.ray.mode == "RayJob":
            body = children.rayjob(obs.name, obs.namespace, obs.spec, attempt, obs.labels, obs.uid, accept)
        p.actions.append(CreateGeneration(attempt, body, accept))
        return Decision(p.actions, p.status("Pending", attempt))
    if child.state == "Failed":
        if _retryable(child, prog) and int(obs.status.get("retries") or 0) < GENERATION_RETRIES:
            return _retry(p, attempt, child)
        return _fail(p, attempt, child.reason or "GenerationJobFailed",
                     child.message or f"generation child {child.name} failed")
    if child.state in ("Succeeded", "Stopped"):
        return _fail(p, attempt, "GenerationEnded",
                     f"generation child {child.name} ended without reporting Done in progress.json "
                     f"(outcome for attempt {attempt}: {prog.outcome if prog else 'none'})")
    if child.state == "Queued":
        p.cond(QUEUED, True, "WaitingForAdmission", _waiting(obs, f"RayJob {child.name}"))
        return Decision(p.actions, p.status("Pending", attempt))
    p.cond(QUEUED, False, "Admitted")
    if prog is not None and prog.stage == Stage.PROBE and prog.probe is not None:
        p.cond(PROVIDERS_CHECKED, False, "Probing", probing_message(prog.probe))
        return Decision(p.actions, p.status("Canary", attempt))  # measuring before generation, as the canary
    gate = obs.spec.tools.gate
    in_canary = (prog is not None and prog.stage == "generate" and gate.enabled
                 and prog.samples.done < gate.canary_samples)
    phase = "Canary" if in_canary else "Generating" if prog is not None else "Pending"
    return Decision(p.actions, p.status(phase, attempt))


# ------------------------------------------------------------------------------------------- pilot

PILOT_FAILED = "PilotFailed"


def _pilot(p: _Pass, attempt: str, prog: Progress | None, can_start: bool) -> Decision | None:
    """Before the generation child of an attempt: the pilot (spec.pilot). None once its verdict stands for this spec
    and lets generation go (policy report, or require and passed); else the Decision that holds the run: the pilot
    Job created, waited for or failed, or the run suspended on a verdict that fails under `require`."""
    obs = p.obs
    verdict, job = obs.pilot, obs.pilot_job
    if job is not None and (job.attempt != attempt or job.key != obs.pilot_key) and (job.active or verdict is None):
        # another attempt's or other settings' Job: stopped, and gone before anything of this attempt starts
        # (never two pilots paying, nor a pilot beside the generation job); an ended one stays while a verdict stands
        if job.active or job.succeeded or job.failed:
            p.actions.append(DeletePilot(job.name))
        p.cond(PILOT_PASSED, False, "PilotRunning", f"waiting for the earlier pilot Job {job.name} to go")
        return Decision(p.actions, p.status("Pilot", attempt))
    if verdict is not None:
        _pilot_condition(p, verdict, event=verdict.proceed)  # else the suspension's event says it, and how to resume
        if job is not None and job.active:
            # its last writes (progress.json, the answers it hands the run) land before anything else happens
            return Decision(p.actions, p.status("Pilot", attempt))
        if verdict.proceed:
            return None
        return _suspend(p, [], attempt, _pilot_stop(p, verdict), False)
    if prog is not None and prog.outcome == Outcome.FAILED:
        return _pilot_failed(p, attempt, job, prog.message)
    if job is None:
        accepted = _output_binding(p, running=False)  # the pilot pays too: the generation job's rules
        if not can_start or accepted is False:
            return Decision(p.actions, p.status("Pending", attempt))
        body = children.pilot_job(obs.name, obs.namespace, obs.spec, attempt, obs.pilot_key, obs.labels, obs.uid,
                                  accepted if isinstance(accepted, str) else None)
        p.actions.append(CreatePilot(body))
        p.cond(PILOT_PASSED, False, "PilotRunning", f"pilot Job {body['metadata']['name']} created")
        return Decision(p.actions, p.status("Pilot", attempt))
    if job.failed:
        return _pilot_failed(p, attempt, job, "")
    if job.succeeded:
        # ended cleanly with no verdict for these settings (a stop it wrote, budget or credits, was acted on before)
        message = (f"pilot Job {job.name} completed without a verdict for these settings in {obs.spec.output.uri} "
                   f"(its outcome: {prog.outcome if prog else 'none'})")
        p.cond(PILOT_PASSED, False, "PilotIncomplete", message)
        return _fail(p, attempt, "PilotIncomplete", message)
    if job.queued:
        p.cond(QUEUED, True, "WaitingForAdmission", _waiting(obs, f"Job {job.name}"))
    else:
        p.cond(QUEUED, False, "Admitted")
    p.cond(PILOT_PASSED, False, "PilotRunning", _pilot_running(job, prog))
    return Decision(p.actions, p.status("Pilot", attempt))


def _pilot_running(job: PilotChild, prog: Progress | None) -> str:
    pilot = prog.pilot if prog is not None else None
    if pilot is None or not pilot.planned:
        return f"pilot Job {job.name} running; generation starts once its verdict is in"
    return (f"pilot Job {job.name} ({pilot.step}): {pilot.answers} of {pilot.planned} answers in, "
            f"{dollars(pilot.spent)} spent on the pilot; generation starts once its verdict is in")


def _pilot_failed(p: _Pass, attempt: str, job: PilotChild | None, said: str) -> Decision:
    """The pilot failed (its outcome Failed, its Job failed: a non-zero exit at once, other pod failures past its
    retries): the run fails with the reason, as a failed extraction does; what the pilot bought stays in the output,
    so recreating the run with the same output does not pay for it again."""
    obs = p.obs
    oom = next((x for x in obs.pod_problems if x.role == "pilot" and x.reason == "OOMKilled"), None)
    name = job.name if job is not None else children.pilot_name(obs.name)
    why = pod_advice(oom) if oom else said or (job.message if job is not None else "") or f"Job {name} failed"
    reason = "OOMKilled" if oom else "PilotJobFailed"
    message = f"pilot: {why}; what the pilot bought is kept in {obs.spec.output.uri}: {RECREATE}"
    p.cond(PILOT_PASSED, False, reason, message)
    return _fail(p, attempt, reason, message)


def _pilot_refusal(p: _Pass) -> PilotJudgement | None:
    """A run unsuspended with settings whose standing verdict still does not let it go on: that verdict (the run
    stays suspended; nothing is started)."""
    verdict = p.obs.pilot
    if p.obs.spec.suspend or verdict is None or verdict.proceed:
        return None
    return verdict


def _pilot_condition(p: _Pass, verdict: PilotJudgement, event: bool) -> None:
    """PilotPassed with the verdict's sentence, and (`event`) its event the first time it says so."""
    reason = "PilotPassed" if verdict.passed else PILOT_FAILED
    prev = conditions.find(p.prev, PILOT_PASSED) or {}
    if event and (prev.get("reason"), prev.get("message")) != (reason, verdict.sentence):
        p.actions.append(Event("Normal" if verdict.passed else "Warning", reason, verdict.sentence))
    p.cond(PILOT_PASSED, verdict.passed, reason, verdict.sentence)


def resume_command(name: str, namespace: str, patch: dict[str, Any]) -> str:
    """The `kubectl patch` line that unsuspends the run with `patch` merged into its spec."""
    body = json.dumps({"spec": {**patch, "suspend": False}}, separators=(",", ":"), sort_keys=True)
    return f"kubectl patch dsg {name} -n {namespace} --type merge -p '{body}'"


def _pilot_stop(p: _Pass, verdict: PilotJudgement) -> _Stop:
    """Suspended on the pilot's verdict (policy require): the sentence, and the two ways on."""
    obs = p.obs
    other = resume_command(obs.name, obs.namespace, verdict.patch)
    anyway = resume_command(obs.name, obs.namespace, {"pilot": {"policy": "report"}})
    message = (f"{verdict.sentence} Suspended before generating beyond the pilot (spec.pilot.policy: require). "
               f"Resume with {verdict.best} (the pilot's answers are not paid again): {other} ; or go on with "
               f"{verdict.own} as it is: {anyway}")
    return _Stop(PILOT_FAILED, message, False)


def _pilot_status(obs: Observation, prev: dict[str, Any] | None) -> dict[str, Any]:
    """status.pilot: the pilot's spend and answers (progress.json's `pilot`, kept by the stages after it), and its
    verdict's options and accepted lengths once it stands (the `kubectl get dsg` columns Accepted and AltAccepted)."""
    out = dict(prev or {})
    pilot = obs.progress.pilot if obs.progress is not None else None
    if pilot is not None:
        out.update({"spentUSD": brief(pilot.spent), "answers": pilot.answers, "planned": pilot.planned})
    v = obs.pilot
    if v is not None:
        out.update({"passed": v.passed, "runOption": v.own, "runAccepted": round(v.own_accepted, 3),
                    "bestOption": v.best, "bestAccepted": round(v.best_accepted, 3)})
    elif obs.progress is not None or not obs.progress_error:
        for key in ("passed", "runOption", "runAccepted", "bestOption", "bestAccepted"):
            out.pop(key, None)  # no verdict stands for these settings (yet)
    return out


# How many times a run's generation is retried as a new attempt after its RayJob failed with the job still running
# as far as the store knows (the head lost and KubeRay giving up on it, say): enough for a node's disruptions, few
# enough that a failure that repeats ends the run.
GENERATION_RETRIES = 2
# KubeRay's reasons for a failed RayJob that a retry would meet again: its own refusal, a cluster that never came up
# (an image, a pod that cannot be scheduled: PodsHealthy says which), a deadline the spec set
NOT_RETRIED = frozenset({"ChildRejected", "PreRunningDeadlineExceeded", "DeadlineExceeded"})


def _retryable(child: GenerationChild, prog: Progress | None) -> bool:
    """A failed RayJob whose job had started (this attempt's progress says Running) and never said how it ended: the
    infrastructure failed under a running job (its own failures write outcome Failed, a final GenerationFailed). A job
    that failed before it wrote any progress (an image, an entrypoint, memory at start) would fail the same way
    again: the run fails with KubeRay's reason."""
    return child.reason not in NOT_RETRIED and prog is not None and prog.outcome == Outcome.RUNNING


def _retry(p: _Pass, attempt: str, child: GenerationChild) -> Decision:
    """The operator owns the retry: the failed RayJob is deleted, and the next attempt's is created once it is gone
    (one job paying at a time); it resumes from the store like a resume does."""
    retries = int(p.obs.status.get("retries") or 0) + 1
    nxt = next_attempt(attempt)
    why = f"{child.reason or 'Failed'}" + (f": {child.message}" if child.message else "")
    message = (f"generation attempt {attempt} failed before its job said how it ended (RayJob {child.name}: {why}); "
               f"retried as attempt {nxt} ({retries} of {GENERATION_RETRIES}) once that RayJob is deleted, resuming "
               f"from {p.obs.spec.output.uri}: nothing persisted is requested again, the requests it had in flight may "
               f"be paid again (at most spec.api.maxConcurrency)")
    p.actions += [Event("Warning", "GenerationRetried", message), DeleteGeneration(child.attempt, child.name)]
    return Decision(p.actions, {**p.status("Pending", nxt), "retries": retries})


def probing_message(probe: ProbeProgress) -> str:
    """ProvidersChecked's message while spec.api.providerProbe runs (progress.json stage probe)."""
    return (f"probing {len(probe.endpoints)} endpoints ({', '.join(probe.endpoints)}): {probe.answers} of "
            f"{probe.planned} answers in, {dollars(probe.spent)} spent on the probe; generation starts "
            "on the endpoints that pass")


def _output_binding(p: _Pass, running: bool) -> bool | str:
    """OutputMatchesSpec: may a new attempt write into the output? False when the spec's fingerprint
    differs from the one the output's answers were bought under and the user has not accepted it
    (no child is created: a job would only refuse, exit 2, and fail); the accepted fingerprint's id
    (passed to the job) when they have; True when nothing changed. The running attempt, if any, goes
    on with the spec it started with."""
    obs = p.obs
    fp = fingerprint(obs.spec)
    stored = current_fields(obs.fingerprint_doc)
    changes = diff(stored, fp.fields) if stored is not None else []
    prog = obs.progress
    persisted = prog is None or prog.samples.finished > 0
    if not changes or not persisted:
        p.cond(OUTPUT_MATCHES_SPEC, True, "FingerprintMatches")
        return True
    what = "; ".join(f"spec.{c.describe()}" for c in changes)
    if obs.accept_fingerprint == fp.id:
        p.cond(OUTPUT_MATCHES_SPEC, True, "ChangeAccepted",
               f"accepted ({ACCEPT_ANNOTATION}={fp.id}): {what}; earlier answers keep fingerprint "
               f"{obs.fingerprint_doc.get('current') if obs.fingerprint_doc else None}, new ones are labelled {fp.id}")
        return fp.id
    message = (f"the output's answers were bought under another spec: {what}. "
               + ("The running attempt goes on with the spec it started with; a new attempt "
                  if running else "No new attempt ")
               + f"starts until you either restore those fields, write to a new output (a new DatasetGeneration "
               f"with another spec.output.uri), or keep the answers and label new ones with the new fingerprint: "
               f"kubectl annotate dsg {obs.name} {ACCEPT_ANNOTATION}={fp.id}")
    prev = conditions.find(p.prev, OUTPUT_MATCHES_SPEC)
    if not (prev and prev.get("status") == "False" and prev.get("message") == message):
        p.actions.append(Event("Warning", "SpecChanged", message))
    p.cond(OUTPUT_MATCHES_SPEC, False, "SpecChanged", message)
    return False


def _waiting(obs: Observation, child: str) -> str:
    """Which queue holds the child, so that the user knows whose quota to look at."""
    queue = obs.labels.get(children.QUEUE_NAME_LABEL)
    where = f"LocalQueue {queue}" if queue else "Kueue"
    return f"{child} waits for admission by {where} (kubectl get workloads -n {obs.namespace})"


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
    elif not child.running and p.obs.spec.generation.ray.mode != "RayJob":
        return  # an ended submission stays in the user's Ray cluster (its record and logs); nothing of it runs
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
    _output_binding(p, running=False)  # what the finished attempt recorded: its answers are bound to this spec now
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
    if spec.suspend:
        return _suspend_extraction(p, obs.extraction, was_suspended)
    if was_suspended:
        p.cond(SUSPENDED, False, "Resumed", "extraction resumed")
        p.actions.append(Event("Normal", "Resumed", "extraction resumed"))
    else:
        _not_suspended(p)
    return _extraction(p, obs.extraction)


def _suspend_extraction(p: _Pass, job: ExtractionChild | None, was_suspended: bool) -> str:
    """The user suspended the run during extraction: suspend the Job (a Kueue-managed one is deleted
    instead, since Kueue owns its suspend)."""
    if not was_suspended:
        p.cond(SUSPENDED, True, USER_SUSPENDED, "spec.suspend is true")
        p.actions.append(Event("Normal", USER_SUSPENDED, "spec.suspend is true"))
        p.suspended_reason = USER_SUSPENDED
    if job is not None and job.kueue:
        p.actions.append(DeleteExtraction(job.name))
    elif job is not None and not job.suspended:
        p.actions.append(SetExtractionSuspend(job.name, True))
    return "Suspended"


def _extraction(p: _Pass, job: ExtractionChild | None) -> str:
    """The extraction Job: create it, read its failure or completion, respect who suspended it."""
    obs, spec = p.obs, p.obs.spec
    if job is None:
        p.actions.append(CreateExtraction(children.extraction_job(obs.name, obs.namespace, spec, obs.labels)))
        return "Extracting"
    if job.failed:
        oom = next((x for x in obs.pod_problems if x.role == "extraction" and x.reason == "OOMKilled"), None)
        message = (f"extraction {pod_advice(oom)}; the generated data at {spec.output.uri} is kept: then "
                   f"{RECREATE}") if oom else job.message or f"Job {job.name} failed"
        p.cond(FAILED, True, "OOMKilled" if oom else job.reason or "ExtractionFailed", message)
        p.actions.append(Event("Warning", p.conds[FAILED]["reason"], message))
        return "Failed"
    if job.completions and job.succeeded >= job.completions:
        count = children.extraction_count(spec)
        message = (f"Job {job.name} completed but only {obs.summaries_done} of {count} pod summaries exist "
                   f"under {spec.output.uri}/hidden/")
        p.cond(FAILED, True, "ExtractionIncomplete", message)
        p.actions.append(Event("Warning", "ExtractionIncomplete", message))
        return "Failed"
    if job.suspended and job.kueue:
        p.cond(QUEUED, True, "WaitingForAdmission", _waiting(obs, f"Job {job.name}"))
    elif job.suspended and job.suspended_by_other:
        # Kueue's manageJobsWithoutQueueName (or another controller) holds it: lifting that
        # suspension would only have it suspended again, forever
        p.cond(QUEUED, True, "WaitingForAdmission",
               f"{job.name} was suspended by Kueue or another controller, not by eyrie; it runs once admitted")
    elif job.suspended:
        p.actions.append(SetExtractionSuspend(job.name, False))
    return "Extracting"
