"""Pure: children as the API server returns them -> what `reconcile` reads (`GenerationChild`,
`ExtractionChild`). Which status fields mean what is KubeRay's and the Job controller's contract."""

from __future__ import annotations

from typing import Any

from . import children
from .reconcile import ChildState, ExtractionChild, GenerationChild

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


def neighbour_attempts(attempt: str, resuming: bool) -> list[str]:
    """Attempts whose child may exist: the current one, the one before it (its deletion may still be
    pending) and, while a resume is in flight, the next (created just before a crash)."""
    n = int(attempt)
    return [str(a) for a in (n - 1, n, n + 1) if a >= 1 and (a <= n or resuming)]
