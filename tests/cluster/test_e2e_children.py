"""End to end against the real control plane (the real `eyrie operator` process with the chart's token, KubeRay,
the Job controller): children a real cluster accepts whatever the DatasetGeneration's name and labels, a refused
or KubeRay-rejected child ends the run once instead of looping, and a Job suspended by Kueue is left to Kueue."""

from __future__ import annotations

from typing import Any

from eyrie.operator import children

from .conftest import API_KEY, NS, OperatorProcess, condition, dsg, status_of, wait_for
from .test_e2e import file_spec, phase_is, write_progress
from .testbed import CONFIGMAPS, DSG, JOBS, RAYJOBS, ControlPlane, api_path

# 78 characters, a leading digit, a dot: over KubeRay's 47 and the Job's 63, not a DNS-1035 label
HOSTILE = "2026-08.kimi-k2.5-" + "long" * 15
USER_LABELS = {"team": "research", "app.kubernetes.io/name": "mine"}
OURS = {"app.kubernetes.io/managed-by", "eyrie.dev/dataset", "eyrie.dev/role"}


def _labels(doc: dict[str, Any]) -> set[str]:
    return set(doc["metadata"].get("labels") or {})


def more_passes(operator: OperatorProcess, n: int) -> None:
    """Wait for n more reconcile passes: what the operator would do again (a second event, a new attempt, lifting
    a suspension), it has had the chance to do by then."""
    start = operator.reconciles()
    wait_for(f"{n} more reconcile passes", lambda: operator.reconciles() >= start + n, timeout=60)


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
    # beside ours, only what the API server adds to every Job and its pod template
    job_labels = {"batch.kubernetes.io/controller-uid", "batch.kubernetes.io/job-name", "controller-uid", "job-name"}
    assert _labels(job) - job_labels == _labels(job["spec"]["template"]) - job_labels == OURS
    assert job["spec"]["suspend"] is False

    # Kueue (manageJobsWithoutQueueName) suspends the unlabelled Job: eyrie must not lift it
    cluster.patch(JOBS, NS, job_name, {"spec": {"suspend": True}})
    wait_for("Queued", lambda: (condition(cluster, HOSTILE, "Queued") or {}).get("status") == "True")
    assert "not by eyrie" in condition(cluster, HOSTILE, "Queued")["message"]
    more_passes(operator, 4)
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

    # eyrie sets it and KubeRay's CRD (v1.6.0 on, the pinned version) keeps it: an older schema would prune it
    assert player.rayjob("slow-gen-1")["spec"]["preRunningDeadlineSeconds"] == 1800
    cluster.patch(RAYJOBS, NS, "slow-gen-1", {"status": {
        "jobDeploymentStatus": "Failed", "reason": "PreRunningDeadlineExceeded",
        "message": "RayJob did not reach Running within 1800 seconds"}}, sub="status")
    wait_for("slow Failed", phase_is(cluster, "slow", "Failed"))
    assert condition(cluster, "slow", "Failed")["reason"] == "PreRunningDeadlineExceeded"

    more_passes(operator, 8)  # four of each: no second event, no new attempt
    assert [e["reason"] for e in cluster.events(NS, "vf") if e["type"] == "Warning"] == ["ChildRejected"]
    assert cluster.get(RAYJOBS, NS, "vf-gen-2") is None and cluster.get(RAYJOBS, NS, "slow-gen-2") is None


def refuse_rayjob(cluster: ControlPlane, name: str, message: str) -> None:
    """A ValidatingAdmissionPolicy (the built-in CEL admission) that refuses one RayJob by name, as a cluster's
    policy would; returns once the server enforces it (a dry-run create is refused)."""
    admission = ("admissionregistration.k8s.io", "v1")
    cluster.create((*admission, "validatingadmissionpolicies"), "", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "refuse-rayjob"},
        "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [{
            "apiGroups": ["ray.io"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["rayjobs"]}]},
            "validations": [{"expression": f"object.metadata.name != '{name}'", "message": message}]}})
    cluster.create((*admission, "validatingadmissionpolicybindings"), "", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "refuse-rayjob"}, "spec": {"policyName": "refuse-rayjob", "validationActions": ["Deny"]}})
    probe = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": name}, "spec": {"entrypoint": "x"}}
    assert cluster.api is not None
    api = cluster.api
    wait_for("the policy enforced", lambda: api.post(api_path(*RAYJOBS, NS), params={"dryRun": "All"},
                                                     json=probe).status_code == 422, timeout=60)


def test_a_create_the_api_server_refuses_fails_the_run_with_its_message(cluster, operator, player, tmp_path):
    message = "spec.rayClusterSpec: Forbidden: not on this cluster"
    refuse_rayjob(cluster, "nope-gen-1", message)
    try:
        cluster.secret(NS, "provider", {"api-key": API_KEY})
        cluster.create(DSG, NS, dsg("nope", file_spec(tmp_path / "a")))
        wait_for("nope Failed", phase_is(cluster, "nope", "Failed"))
        cond = condition(cluster, "nope", "Failed")
        assert cond["reason"] == "ChildRejected"
        assert cond["message"].startswith("the API server refused RayJob nope-gen-1: ")
        assert "denied request: " + message in cond["message"], cond["message"]
        more_passes(operator, 4)  # no retry loop: one event, no RayJob
        assert [e["reason"] for e in cluster.events(NS, "nope") if e["type"] == "Warning"] == ["ChildRejected"]
        assert cluster.get(RAYJOBS, NS, "nope-gen-1") is None
    finally:
        admission = ("admissionregistration.k8s.io", "v1")
        cluster.delete((*admission, "validatingadmissionpolicybindings"), "", "refuse-rayjob")
        cluster.delete((*admission, "validatingadmissionpolicies"), "", "refuse-rayjob")
