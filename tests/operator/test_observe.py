"""How children's status becomes the pure reconcile inputs (`operator/observed.py`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from eyrie.jobs.contract.fingerprint import pilot_key
from eyrie.jobs.contract.layout import summary_key
from eyrie.jobs.contract.pilot import PilotVerdict
from eyrie.jobs.spec import parse_spec
from eyrie.operator.observed import (
    job_child,
    neighbour_attempts,
    pilot_child,
    pilot_judgement,
    pod_problems,
    rayjob_child,
)


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
    ({"jobDeploymentStatus": "ValidationFailed"}, False, "Failed"),
    ({"jobDeploymentStatus": "Failed", "reason": "PreRunningDeadlineExceeded"}, False, "Failed"),
])
def test_rayjob_states(status: dict[str, Any], suspend: bool, state: str) -> None:
    child = rayjob_child(rayjob(status, suspend))
    assert (child.attempt, child.name, child.state) == ("2", "dg-gen-2", state)


def test_rayjob_stop_request_and_reason() -> None:
    child = rayjob_child(rayjob({"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded",
                                  "message": "too slow"}, stop="1000.5"))
    assert (child.reason, child.message, child.stop_requested_at) == ("DeadlineExceeded", "too slow", 1000.5)


def testjob_child() -> None:
    job = {"metadata": {"name": "dg-extract", "labels": {"kueue.x-k8s.io/queue-name": "q"}},
           "spec": {"suspend": True, "completions": 4},
           "status": {"succeeded": 3, "conditions": [
               {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "12 failures"}]}}
    c = job_child(job)
    assert (c.name, c.suspended, c.kueue, c.succeeded, c.completions) == ("dg-extract", True, True, 3, 4)
    assert (c.failed, c.reason, c.message) == (True, "BackoffLimitExceeded", "12 failures")
    plain = job_child({"metadata": {"name": "j"}, "spec": {}, "status": {}})
    assert (plain.suspended, plain.kueue, plain.failed, plain.succeeded) == (False, False, False, 0)


def testneighbour_attempts() -> None:
    assert neighbour_attempts("1", resuming=False) == ["1"]
    assert neighbour_attempts("1", resuming=True) == ["1", "2"]
    assert neighbour_attempts("4", resuming=False) == ["3", "4"]


def test_summary_key_matches_the_extraction_stage() -> None:
    assert summary_key(1, 4) == "hidden/summary-00001-of-00004.json"


def test_kuberays_refusal_is_child_rejected_with_its_message() -> None:
    msg = "The RayJob metadata is invalid: RayJob name should be no more than 47 characters"
    child = rayjob_child(rayjob({"jobDeploymentStatus": "ValidationFailed", "reason": "ValidationFailed",
                                 "message": msg}))
    assert (child.state, child.reason) == ("Failed", "ChildRejected")
    assert child.message == f"KubeRay rejected RayJob dg-gen-2: {msg}"


def test_a_pre_running_deadline_keeps_kuberays_reason() -> None:
    child = rayjob_child(rayjob({"jobDeploymentStatus": "Failed", "reason": "PreRunningDeadlineExceeded",
                                 "message": "RayJob did not reach Running within 1800 seconds"}))
    assert (child.state, child.reason) == ("Failed", "PreRunningDeadlineExceeded")
    assert "1800 seconds" in child.message


@pytest.mark.parametrize(("labels", "annotations", "by_other"), [
    ({}, {}, True),  # Kueue's manageJobsWithoutQueueName suspended it: not eyrie's to lift
    ({}, {"eyrie.dev/suspended": "true"}, False),  # eyrie suspended it (spec.suspend)
    ({"kueue.x-k8s.io/queue-name": "q"}, {}, False),  # queue-labelled: `kueue` says it already
])
def test_who_suspended_the_job(labels: dict[str, str], annotations: dict[str, str], by_other: bool) -> None:
    doc = {"metadata": {"name": "j", "labels": labels, "annotations": annotations},
           "spec": {"suspend": True}, "status": {}}
    assert job_child(doc).suspended_by_other is by_other
    doc["spec"]["suspend"] = False
    assert job_child(doc).suspended_by_other is False


def pod(name: str, statuses: list[dict[str, Any]] = (), conditions: list[dict[str, Any]] = (),
        memory: str | None = None, deleting: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "extract", "image": "ghcr.io/x/extractor:1"}
    if memory:
        container["resources"] = {"limits": {"memory": memory}}
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"containers": [container]},
            "status": {"conditions": list(conditions), "containerStatuses": list(statuses)}}


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    return {"name": "extract", "image": "ghcr.io/x/extractor:1", "state": {"waiting": {"reason": reason,
                                                                                      "message": message}}}


@pytest.mark.parametrize(("p", "want"), [
    (pod("ok", [{"name": "extract", "state": {"running": {}}}]), []),
    (pod("creating", [waiting("ContainerCreating")]), []),
    (pod("never", [waiting("ErrImageNeverPull", 'Container image "ghcr.io/x/extractor:1" is not present')]),
     [("ImageNotPresent", "never", "extract", "ghcr.io/x/extractor:1")]),
    (pod("pull", [waiting("ImagePullBackOff", "Back-off pulling image")]),
     [("ImagePullFailed", "pull", "extract", "ghcr.io/x/extractor:1")]),
    (pod("pull2", [waiting("ErrImagePull", "dial tcp: network is unreachable")]),
     [("ImagePullFailed", "pull2", "extract", "ghcr.io/x/extractor:1")]),
    (pod("secret", [waiting("CreateContainerConfigError", 'secret "s3" not found')]),
     [("SecretNotFound", "secret", "extract", "ghcr.io/x/extractor:1")]),
    (pod("key", [waiting("CreateContainerConfigError", "couldn't find key secretKey in Secret e2e/s3")]),
     [("SecretNotFound", "key", "extract", "ghcr.io/x/extractor:1")]),
    (pod("cm", [waiting("CreateContainerConfigError", 'configmap "x" not found')]),
     [("ContainerConfigError", "cm", "extract", "ghcr.io/x/extractor:1")]),
    (pod("oom", [{"name": "extract", "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}],
         memory="64Mi"), [("OOMKilled", "oom", "extract", "ghcr.io/x/extractor:1")]),
    (pod("oom-before", [{"name": "extract", "state": {"running": {}},
                         "lastState": {"terminated": {"reason": "OOMKilled"}}}]),
     [("OOMKilled", "oom-before", "extract", "ghcr.io/x/extractor:1")]),
    (pod("failed", [{"name": "extract", "state": {"terminated": {"reason": "Error", "exitCode": 1}}}]), []),
    (pod("pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                 "message": "0/1 nodes are available: 1 Insufficient cpu."}]),
     [("Unschedulable", "pending", "", "")]),
    (pod("gone", [waiting("ErrImageNeverPull")], deleting=True), []),
])
def test_pod_problems(p: dict[str, Any], want: list[tuple[str, str, str, str]]) -> None:
    got = pod_problems([p], "extraction")
    assert [(x.reason, x.pod, x.container, x.image) for x in got] == want
    assert all(x.role == "extraction" for x in got)


def test_pod_problems_keep_the_kubelets_words_and_the_memory_limit() -> None:
    [oom] = pod_problems([pod("a", [{"name": "extract", "state": {"terminated": {"reason": "OOMKilled"}}}],
                              memory="64Mi")], "extraction")
    assert oom.memory == "64Mi"
    [secret] = pod_problems([pod("b", [waiting("CreateContainerConfigError", 'secret "s3" not found')])],
                            "generation")
    assert (secret.detail, secret.role) == ('secret "s3" not found', "generation")


def test_a_failing_pull_reads_the_same_at_err_image_pull_and_at_back_off() -> None:
    """The kubelet alternates the two at each retry; the condition and its event must not change with them."""
    error = ('failed to pull and unpack image "ghcr.io/x/extractor:1": failed to resolve reference '
             '"ghcr.io/x/extractor:1": dial tcp: lookup ghcr.io: network is unreachable')
    pulled = pod_problems([pod("p", [waiting("ErrImagePull", error)])], "extraction")
    back_off = f'Back-off pulling image "ghcr.io/x/extractor:1": ErrImagePull: {error}'
    backoff = pod_problems([pod("p", [waiting("ImagePullBackOff", back_off)])], "extraction")
    assert pulled == backoff and pulled[0].detail == error


def test_pilot_job_states_and_what_it_runs_for() -> None:
    def doc(conds: list[dict[str, Any]], **meta: Any) -> dict[str, Any]:
        return {"metadata": {"name": "dg-pilot", "annotations": {"eyrie.dev/attempt": "2",
                                                                 "eyrie.dev/pilot-key": "k"}, **meta},
                "spec": {"suspend": False}, "status": {"conditions": conds}}

    running = pilot_child(doc([]))
    assert (running.name, running.attempt, running.key, running.active) == ("dg-pilot", "2", "k", True)
    done = pilot_child(doc([{"type": "Complete", "status": "True"}]))
    assert (done.active, done.succeeded, done.failed) == (False, True, False)
    failed = pilot_child(doc([{"type": "FailureTarget", "status": "True"},
                              {"type": "Failed", "status": "True", "reason": "PodFailurePolicy",
                               "message": "exit code 10"}]))
    assert (failed.active, failed.failed, failed.reason, failed.message) == (False, True, "PodFailurePolicy",
                                                                            "exit code 10")
    going = pilot_child(doc([], deletionTimestamp="2026-01-01T00:00:00Z"))
    assert (going.active, going.succeeded, going.failed) == (False, False, False)


def _verdict(key: str, own: str = "text", best: str = "structured", passed: bool = False) -> PilotVerdict:
    def opt(option: str, value: float) -> dict[str, Any]:
        return {"option": option, "own": option == own, "acceptedLength": {"value": value, "low": value - 0.3,
                                                                            "high": value + 0.3},
                "switch": json.dumps({"spec": {"tools": {"mode": option}}})}
    return PilotVerdict.model_validate({
        "key": key, "policy": "require", "margin": 0.0, "passed": passed, "proceed": passed,
        "sentence": "the run's own data accepts fewer tokens per step", "own": own, "bestAlternative": best,
        "options": [opt(own, 3.1), opt(best, 5.9)], "prompts": 20, "heldout": 4, "spentUSD": "0.1",
        "evaluation": "evaluation.json"})


def test_a_pilot_verdict_counts_only_for_the_settings_it_was_decided_for() -> None:
    sp = parse_spec({"sources": [{"name": "s", "uri": "s3://p/s.jsonl", "format": "glaive"}],
                     "target": {"model": "m", "tokenizer": "t"}, "budget": {"maxUSD": "1", "pricing": {
                         "inputPerMillion": "1", "outputPerMillion": "1"}},
                     "api": {"baseUrl": "https://x/v1"}, "tools": {"mode": "text"},
                     "extraction": {"enabled": True, "image": "x"}, "pilot": {"policy": "require", "prompts": 20},
                     "output": {"uri": "s3://o/r"}}).spec
    judged = pilot_judgement(_verdict(pilot_key(sp)), sp)
    assert judged is not None
    assert (judged.passed, judged.proceed, judged.own, judged.own_accepted, judged.best, judged.best_accepted) == (
        False, False, "text", 3.1, "structured", 5.9)
    assert judged.patch == {"tools": {"mode": "structured"}}  # the spec part of the best option's switch
    assert judged.sentence == "the run's own data accepts fewer tokens per step"
    assert pilot_judgement(_verdict("another-key"), sp) is None  # decided for other settings: the pilot runs again
    assert pilot_judgement(None, sp) is None
    other = sp.model_copy(update={"tools": sp.tools.model_copy(update={"mode": "structured"})})
    assert pilot_judgement(_verdict(pilot_key(sp)), other) is None  # the data plane's key: the mode is in it
