"""Pure: children as the API server returns them -> what `reconcile` reads (`GenerationChild`,
`ExtractionChild`). Which status fields mean what is KubeRay's and the Job controller's contract."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from eyrie.jobs.contract.fingerprint import pilot_key
from eyrie.jobs.contract.pilot import PilotVerdict
from eyrie.jobs.spec import DatasetGenerationSpec

from . import children
from .reconcile import (
    ChildState,
    ExtractionChild,
    GenerationChild,
    PilotChild,
    PilotJudgement,
    PodProblem,
    PodRole,
)

# Ray's job states (JobSubmissionClient.get_job_status) -> a child's state
RAY_STATES: dict[str, ChildState] = {"PENDING": "Pending", "RUNNING": "Running", "SUCCEEDED": "Succeeded",
                                     "FAILED": "Failed", "STOPPED": "Stopped"}
# KubeRay's jobDeploymentStatus while a suspended RayJob waits (Kueue admits it by unsuspending)
_WAITING = ("", "New", "Suspended", "Suspending")


def _rayjob_state(suspend: bool, deploy: str, job: str) -> ChildState:
    if suspend and deploy in _WAITING:
        return "Queued"
    if deploy in ("Failed", "ValidationFailed") or job == "FAILED":
        return "Failed"
    if job == "STOPPED":
        return "Stopped"
    if deploy == "Complete" or job == "SUCCEEDED":
        return "Succeeded"
    if job == "RUNNING":
        return "Running"
    return "Pending"


def rayjob_child(doc: dict[str, Any]) -> GenerationChild:
    """A RayJob. KubeRay's own refusal (`ValidationFailed`: its Go checks of name and spec) is reason
    `ChildRejected` with KubeRay's message; other failures keep KubeRay's reason (e.g.
    `PreRunningDeadlineExceeded`, `DeadlineExceeded`, `AppFailed`)."""
    meta = doc.get("metadata") or {}
    ann = meta.get("annotations") or {}
    st = doc.get("status") or {}
    name = meta.get("name", "")
    deploy, job = st.get("jobDeploymentStatus", ""), st.get("jobStatus", "")
    reason, message = st.get("reason", ""), st.get("message", "")
    if deploy == "ValidationFailed":
        reason, message = "ChildRejected", f"KubeRay rejected RayJob {name}: {message or 'ValidationFailed'}"
    stop = ann.get(children.STOP_ANNOTATION)
    return GenerationChild(attempt=ann.get(children.ATTEMPT_ANNOTATION, "0"), name=name,
                           state=_rayjob_state(bool((doc.get("spec") or {}).get("suspend")), deploy, job),
                           reason=reason, message=message, stop_requested_at=float(stop) if stop else None)


def submission_child(attempt: str, submission_id: str, ray_status: str,
                     stop_requested_at: float | None) -> GenerationChild:
    """A job submitted to an existing Ray cluster (Submit mode)."""
    return GenerationChild(attempt, submission_id, RAY_STATES.get(ray_status, "Pending"),
                           stop_requested_at=stop_requested_at)


def job_child(doc: dict[str, Any]) -> ExtractionChild:
    """The extraction Job. A suspension eyrie did not make (no `eyrie.dev/suspended` annotation on a
    Job without a queue label: Kueue's manageJobsWithoutQueueName) is someone else's to lift."""
    meta = doc.get("metadata") or {}
    spec = doc.get("spec") or {}
    st = doc.get("status") or {}
    kueue = bool(children.kueue_labels(meta.get("labels")))
    suspended = bool(spec.get("suspend"))
    ours = (meta.get("annotations") or {}).get(children.SUSPENDED_ANNOTATION) == "true"
    failed = next((c for c in st.get("conditions") or []
                   if c.get("type") == "Failed" and c.get("status") == "True"), None)
    return ExtractionChild(
        name=meta["name"], suspended=suspended, kueue=kueue, succeeded=int(st.get("succeeded") or 0),
        completions=int(spec.get("completions") or 0), failed=failed is not None,
        reason=(failed or {}).get("reason", ""), message=(failed or {}).get("message", ""),
        suspended_by_other=suspended and not kueue and not ours)


def pilot_child(doc: dict[str, Any]) -> PilotChild:
    """The pilot Job: the attempt and settings it runs for (its annotations), whether it still runs, how it
    ended (the Job controller's Complete/Failed conditions), whether a queue holds it (suspended)."""
    meta = doc.get("metadata") or {}
    ann = meta.get("annotations") or {}
    st = doc.get("status") or {}

    def ended(type_: str) -> dict[str, Any] | None:
        return next((c for c in st.get("conditions") or [] if c.get("type") == type_ and c.get("status") == "True"),
                    None)

    failed, complete = ended("Failed"), ended("Complete")
    return PilotChild(
        name=meta.get("name", ""), attempt=ann.get(children.ATTEMPT_ANNOTATION, "0"),
        key=ann.get(children.PILOT_KEY_ANNOTATION, ""),
        active=failed is None and complete is None and not meta.get("deletionTimestamp"),
        succeeded=complete is not None, failed=failed is not None,
        reason=(failed or {}).get("reason", ""), message=(failed or {}).get("message", ""),
        queued=bool((doc.get("spec") or {}).get("suspend")))


def pilot_judgement(verdict: PilotVerdict | None, spec: DatasetGenerationSpec) -> PilotJudgement | None:
    """pilot.json as the operator decides on it: None unless it was decided for this spec's settings (its key is
    `pilot_key(spec)`: the data plane's rule of when the pilot must run again); the run's own option and the best
    alternative with their accepted lengths, and the spec patch that makes the alternative the run's own."""
    if verdict is None or spec.pilot is None or verdict.key != pilot_key(spec):
        return None
    by = {o.option: o for o in verdict.options}
    own, best = by.get(verdict.own), by.get(verdict.best_alternative)
    patch: dict[str, Any] = {}
    if best is not None and best.switch:
        doc = json.loads(best.switch)
        patch = doc.get("spec", doc) if isinstance(doc, dict) else {}
    return PilotJudgement(
        passed=verdict.passed, proceed=verdict.proceed, sentence=verdict.sentence, own=str(verdict.own),
        own_accepted=own.accepted_length.value if own else float("nan"), best=str(verdict.best_alternative),
        best_accepted=best.accepted_length.value if best else float("nan"), patch=patch)


def neighbour_attempts(attempt: str, resuming: bool) -> list[str]:
    """Attempts whose child may exist: the current one, the one before it (its deletion may still be
    pending) and, while a resume is in flight, the next (created just before a crash)."""
    n = int(attempt)
    return [str(a) for a in (n - 1, n, n + 1) if a >= 1 and (a <= n or resuming)]


# a container's waiting reason (the kubelet's) -> PodProblem.reason
_CONTAINER_WAITING = {"ErrImageNeverPull": "ImageNotPresent", "ErrImagePull": "ImagePullFailed",
            "ImagePullBackOff": "ImagePullFailed", "InvalidImageName": "ImagePullFailed",
            "CreateContainerConfigError": "ContainerConfigError"}
# The kubelet alternates a failing pull's words at each retry: ErrImagePull's error, then ImagePullBackOff's
# 'Back-off pulling image "X": ErrImagePull: <the same error>'. Read without that prefix both say the same, so the
# condition's message (and its Warning event) changes when the problem does, not at every retry.
_BACK_OFF = re.compile(r'^Back-off pulling image "[^"]*": (?:ErrImagePull: )?')


def pod_problems(pods: Iterable[dict[str, Any]], role: PodRole) -> tuple[PodProblem, ...]:
    """What keeps a child's pods from running, in the words of the scheduler (PodScheduled=False, Unschedulable) and
    the kubelet (a container waiting on its image or its config, a container OOMKilled now or before its restart).
    A missing Secret or key of a container's env is `SecretNotFound`; pods being deleted are passed over."""
    out: list[PodProblem] = []
    for pod in pods:
        meta, spec, st = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            continue
        name = meta.get("name", "")
        for cond in st.get("conditions") or []:
            if (cond.get("type"), cond.get("status"), cond.get("reason")) == ("PodScheduled", "False",
                                                                              "Unschedulable"):
                out.append(PodProblem("Unschedulable", name, role, detail=cond.get("message", "")))
        declared = {c.get("name"): c for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])}
        for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
            container = declared.get(cs.get("name"), {})
            image = container.get("image") or cs.get("image", "")
            waiting = (cs.get("state") or {}).get("waiting") or {}
            reason = _CONTAINER_WAITING.get(waiting.get("reason", ""))
            detail = _BACK_OFF.sub("", waiting.get("message", ""))
            if reason == "ContainerConfigError" and "secret" in detail.lower():
                reason = "SecretNotFound"
            if reason:
                out.append(PodProblem(reason, name, role, cs.get("name", ""), image, detail))  # type: ignore[arg-type]
            ended = [(cs.get(k) or {}).get("terminated") or {} for k in ("state", "lastState")]
            if any(t.get("reason") == "OOMKilled" for t in ended):
                limit = ((container.get("resources") or {}).get("limits") or {}).get("memory", "")
                out.append(PodProblem("OOMKilled", name, role, cs.get("name", ""), image, memory=str(limit)))
    return tuple(out)
