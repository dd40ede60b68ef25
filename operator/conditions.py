"""Status conditions: the truth behind `status.phase`, written as one whole list each time.

A condition keeps its `lastTransitionTime` while its status stays the same, so `kubectl describe`
shows when a state began rather than when the operator last looked.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

# Condition types this operator writes (one place, so tests and docs use the same words).
SECRETS_READY = "SecretsReady"
OUTPUT_REACHABLE = "OutputReachable"
OUTPUT_MATCHES_SPEC = "OutputMatchesSpec"  # the output's answers were bought under this spec's fingerprint
QUEUED = "Queued"
SUSPENDED = "Suspended"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
PROVIDERS_CHECKED = "ProvidersChecked"  # spec.api.providerProbe judged the target's endpoints
PILOT_PASSED = "PilotPassed"  # spec.pilot: the verdict's sentence (reason PilotPassed, PilotFailed, PilotRunning...)
PODS_HEALTHY = "PodsHealthy"  # written once a child's pod has shown a problem (image, Secret, memory, scheduling)

ConditionStatus = Literal["True", "False", "Unknown"]


def make(type_: str, status: ConditionStatus, reason: str, message: str, now: str,
         observed_generation: int | None) -> dict[str, Any]:
    """One condition as the API stores it (camelCase keys)."""
    cond: dict[str, Any] = {"type": type_, "status": status, "reason": reason, "message": message,
                            "lastTransitionTime": now}
    if observed_generation is not None:
        cond["observedGeneration"] = observed_generation
    return cond


def find(conditions: Iterable[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    for cond in conditions:
        if cond.get("type") == type_:
            return cond
    return None


def is_true(conditions: Iterable[dict[str, Any]], type_: str) -> bool:
    cond = find(conditions, type_)
    return cond is not None and cond.get("status") == "True"


def merge(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The new list, each entry keeping the old `lastTransitionTime` when its status did not change.

    Types absent from `new` are kept as they were (a condition is set False, never silently dropped),
    and the order is stable: old types first, new ones appended.
    """
    by_type = {c["type"]: c for c in new}
    out: list[dict[str, Any]] = []
    for cond in old:
        fresh = by_type.pop(cond["type"], None)
        if fresh is None:
            out.append(cond)
        elif fresh["status"] == cond.get("status") and cond.get("lastTransitionTime"):
            out.append({**fresh, "lastTransitionTime": cond["lastTransitionTime"]})
        else:
            out.append(fresh)
    out.extend(by_type.values())
    return out
