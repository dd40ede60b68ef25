"""End to end (the real `eyrie operator` process, the emulated API server): children a real cluster
accepts whatever the DatasetGeneration's name and labels, a refused or KubeRay-rejected child ends
the run once instead of looping, and a Job suspended by Kueue is left to Kueue."""

from __future__ import annotations

import time
from typing import Any

from eyrie.operator import children

from .conftest import API_KEY, NS, condition, dsg, status_of, wait_for
from .kube import CONFIGMAPS, DSG, JOBS, RAYJOBS
from .test_e2e import file_spec, phase_is, write_progress

# 78 characters, a leading digit, a dot: over KubeRay's 47 and the Job's 63, not a DNS-1035 label
HOSTILE = "2026-08.kimi-k2.5-" + "long" * 15
USER_LABELS = {"team": "research", "app.kubernetes.io/name": "mine"}
OURS = {"app.kubernetes.io/managed-by", "eyrie.dev/dataset", "eyrie.dev/role"}


def _labels(doc: dict[str, Any]) -> set[str]:
    return set(doc["metadata"].get("labels") or {})


def test_hostile_name_user_labels_and_a_kueue_suspension_left_to_kueue(cluster, operator, player, tmp_path):
    out = tmp_path / "out"
    cluster.secret(NS, "provider", {"api-key": API_KEY})
    spec = file_spec(out, extraction={"enabled": True, "image": "eyrie-sglang:test", "pods": 2, "gpusPerPod": 1})
    cluster.create(DSG, NS, dsg(HOSTILE, spec, USER_LABELS))

    rj_name = children.generation_name(HOSTILE, "1")
    assert len(rj_name) <= 47 and rj_name[0].isalpha()
    rj = player.rayjob(rj_name)
    assert _labels(rj) == OURS
    assert rj["metadata"]["labels"]["eyrie.dev/dataset"] == children.dataset_label(HOSTILE)
    assert rj["metadata"]["annotations"]["eyrie.dev/dataset-name"] == HOSTILE
    assert rj["metadata"]["ownerReferences"][0]["name"] == HOSTILE
    cm = cluster.get(CONFIGMAPS, NS, children.configmap_name(HOSTILE))
    assert cm is not None and _labels(cm) == OURS
    head = rj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["volumes"][0]["configMap"]["name"] == cm["metadata"]["name"]

    cluster.patch(RAYJOBS, NS, rj_name, {"status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}},
                  sub="status")
    write_progress(out, "1", "Done", 100, "1.00", stage="done")
    job_name = children.extraction_name(HOSTILE)
    job = wait_for("extraction Job", lambda: cluster.get(JOBS, NS, job_name))
    assert len(f"{job_name}-1") <= 63
    assert _labels(job) == _labels(job["spec"]["template"]) == OURS
    assert job["spec"]["suspend"] is False

    # Kueue (manageJobsWithoutQueueName) suspends the unlabelled Job: eyrie must not lift it
    cluster.patch(JOBS, NS, job_name, {"spec": {"suspend": True}})
    wait_for("Queued", lambda: (condition(cluster, HOSTILE, "Queued") or {}).get("status") == "True")
    assert "not by eyrie" in condition(cluster, HOSTILE, "Queued")["message"]
    time.sleep(2)  # four polls
    assert cluster.get(JOBS, NS, job_name)["spec"]["suspend"] is True
    assert status_of(cluster, HOSTILE)["phase"] == "Extracting"

    # the user's own suspend and resume: eyrie lifts only the suspension it made
    cluster.patch(JOBS, NS, job_name, {"spec": {"suspend": False}})  # Kueue admits
    cluster.patch(DSG, NS, HOSTILE, {"spec": {"suspend": True}})
    wait_for("Job suspended by eyrie", lambda: (cluster.get(JOBS, NS, job_name) or {}).get("metadata", {})
             .get("annotations", {}).get("eyrie.dev/suspended") == "true")
    assert cluster.get(JOBS, NS, job_name)["spec"]["suspend"] is True
    cluster.patch(DSG, NS, HOSTILE, {"spec": {"suspend": False}})
    wait_for("Job resumed by eyrie", lambda: cluster.get(JOBS, NS, job_name)["spec"]["suspend"] is False)
    assert "eyrie.dev/suspended" not in (cluster.get(JOBS, NS, job_name)["metadata"].get("annotations") or {})


def test_kuberay_validation_failed_and_a_pre_running_deadline_end_the_run_once(cluster, operator, player, tmp_path):
    cluster.secret(NS, "provider", {"api-key": API_KEY})
    cluster.create(DSG, NS, dsg("vf", file_spec(tmp_path / "a")))
    cluster.create(DSG, NS, dsg("slow", file_spec(tmp_path / "b")))
    player.rayjob("vf-gen-1")
    message = "The RayJob metadata is invalid: RayJob name should be no more than 47 characters"
    cluster.patch(RAYJOBS, NS, "vf-gen-1", {"status": {"jobDeploymentStatus": "ValidationFailed",
                                                       "reason": "ValidationFailed", "message": message}},
                  sub="status")
    wait_for("vf Failed", phase_is(cluster, "vf", "Failed"))
    cond = condition(cluster, "vf", "Failed")
    assert (cond["reason"], cond["message"]) == ("ChildRejected", f"KubeRay rejected RayJob vf-gen-1: {message}")

    assert player.rayjob("slow-gen-1")["spec"]["preRunningDeadlineSeconds"] == 1800
    cluster.patch(RAYJOBS, NS, "slow-gen-1", {"status": {
        "jobDeploymentStatus": "Failed", "reason": "PreRunningDeadlineExceeded",
        "message": "RayJob did not reach Running within 1800 seconds"}}, sub="status")
    wait_for("slow Failed", phase_is(cluster, "slow", "Failed"))
    assert condition(cluster, "slow", "Failed")["reason"] == "PreRunningDeadlineExceeded"

    time.sleep(2)  # four more polls: no second event, no new attempt
    assert [e["reason"] for e in cluster.events(NS, "vf") if e["type"] == "Warning"] == ["ChildRejected"]
    assert cluster.get(RAYJOBS, NS, "vf-gen-2") is None and cluster.get(RAYJOBS, NS, "slow-gen-2") is None


def test_a_create_the_api_server_refuses_fails_the_run_with_its_message(cluster, operator, player, tmp_path):
    assert cluster.emulator is not None
    cluster.emulator.refuse[("rayjobs", "nope-gen-1")] = "spec.rayClusterSpec: Forbidden: not on this cluster"
    cluster.secret(NS, "provider", {"api-key": API_KEY})
    cluster.create(DSG, NS, dsg("nope", file_spec(tmp_path / "a")))
    wait_for("nope Failed", phase_is(cluster, "nope", "Failed"))
    cond = condition(cluster, "nope", "Failed")
    assert cond["reason"] == "ChildRejected"
    assert cond["message"] == ('the API server refused RayJob nope-gen-1: admission webhook "test.webhook" denied '
                               "the request: spec.rayClusterSpec: Forbidden: not on this cluster")
    creates = lambda: sum(1 for c in cluster.emulator.calls if c[2:] == ("rayjobs", "create"))  # noqa: E731
    before = creates()
    time.sleep(2)  # four more polls: no retry loop, one event
    assert creates() == before == 1
    assert [e["reason"] for e in cluster.events(NS, "nope") if e["type"] == "Warning"] == ["ChildRejected"]
