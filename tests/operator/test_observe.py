"""How the handlers read children's status into the pure reconcile inputs."""

from __future__ import annotations

from typing import Any

import pytest

from eyrie.jobs.contract.layout import summary_key
from eyrie.operator.handlers import _job_child, _neighbour_attempts, _rayjob_child


def rayjob(status: dict[str, Any], suspend: bool = False, stop: str | None = None) -> dict[str, Any]:
    ann = {"eyrie.dev/attempt": "2"}
    if stop:
        ann["eyrie.dev/stop-requested-at"] = stop
    return {"metadata": {"name": "dg-gen-2", "annotations": ann}, "spec": {"suspend": suspend}, "status": status}


@pytest.mark.parametrize(("status", "suspend", "state"), [
    ({}, False, "Pending"),
    ({}, True, "Queued"),
    ({"jobDeploymentStatus": "Suspended"}, True, "Queued"),
    ({"jobDeploymentStatus": "Initializing"}, False, "Pending"),
    ({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}, False, "Running"),
    ({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}, False, "Succeeded"),
    ({"jobDeploymentStatus": "Complete", "jobStatus": "FAILED"}, False, "Failed"),
    ({"jobDeploymentStatus": "Failed"}, False, "Failed"),
    ({"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED"}, False, "Stopped"),
])
def test_rayjob_states(status: dict[str, Any], suspend: bool, state: str) -> None:
    child = _rayjob_child(rayjob(status, suspend))
    assert (child.attempt, child.name, child.state) == ("2", "dg-gen-2", state)


def test_rayjob_stop_request_and_reason() -> None:
    child = _rayjob_child(rayjob({"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded",
                                  "message": "too slow"}, stop="1000.5"))
    assert (child.reason, child.message, child.stop_requested_at) == ("DeadlineExceeded", "too slow", 1000.5)


def test_job_child() -> None:
    job = {"metadata": {"name": "dg-extract", "labels": {"kueue.x-k8s.io/queue-name": "q"}},
           "spec": {"suspend": True, "completions": 4},
           "status": {"succeeded": 3, "conditions": [
               {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "12 failures"}]}}
    c = _job_child(job)
    assert (c.name, c.suspended, c.kueue, c.succeeded, c.completions) == ("dg-extract", True, True, 3, 4)
    assert (c.failed, c.reason, c.message) == (True, "BackoffLimitExceeded", "12 failures")
    plain = _job_child({"metadata": {"name": "j"}, "spec": {}, "status": {}})
    assert (plain.suspended, plain.kueue, plain.failed, plain.succeeded) == (False, False, False, 0)


def test_neighbour_attempts() -> None:
    assert _neighbour_attempts("1", resuming=False) == ["1"]
    assert _neighbour_attempts("1", resuming=True) == ["1", "2"]
    assert _neighbour_attempts("4", resuming=False) == ["3", "4"]


def test_summary_key_matches_the_extraction_stage() -> None:
    assert summary_key(1, 4) == "hidden/summary-00001-of-00004.json"
