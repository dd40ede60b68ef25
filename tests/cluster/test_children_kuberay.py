"""eyrie's children against the real API server, Job controller and KubeRay operator: the names
derived from hostile DatasetGeneration names are accepted (KubeRay does not answer ValidationFailed;
the Indexed Job's pods are created, so their hostnames are valid), and what KubeRay answers for a
name it refuses is read as ChildRejected with KubeRay's own message."""

from __future__ import annotations

from typing import Any

import pytest

from eyrie.jobs.spec import DatasetGenerationSpec, parse_spec
from eyrie.operator import children
from eyrie.operator.observed import rayjob_child

from .testbed import ControlPlane, KubeRay, wait_for

NS = "children"
RAYJOBS = ("ray.io", "v1", "rayjobs")
JOBS = ("batch", "v1", "jobs")
PODS = ("", "v1", "pods")
CONFIGMAPS = ("", "v1", "configmaps")
HOSTILE = ["2026-08.kimi-k2.5-" + "long" * 15, "x" * 253, "llama3.1-70b-run"]


def spec(**extraction: Any) -> DatasetGenerationSpec:
    return parse_spec({"spec": {
        "sources": [{"name": "s", "uri": "s3://prompts/s.jsonl"}], "target": {"model": "m", "tokenizer": "t"},
        "api": {"baseUrl": "https://openrouter.ai/api/v1", "apiKeySecretRef": {"name": "openrouter"}},
        "budget": {"maxUSD": "10", "pricing": {"inputPerMillion": "0.6", "outputPerMillion": "2.5"}},
        "generation": {"ray": {"mode": "RayJob", "image": "ray:1", "workers": 2, "memoryPerWorker": "512Mi"}},
        "extraction": {"enabled": True, "image": "sgl:1", "gpusPerPod": 0, **extraction},
        "output": {"uri": "s3://out/run", "endpoint": "http://minio:9000", "credentialsSecretRef": {"name": "minio"}},
    }}).spec


def _deploy_status(cp: ControlPlane, name: str) -> str:
    return ((cp.get(RAYJOBS, NS, name) or {}).get("status") or {}).get("jobDeploymentStatus", "")


@pytest.mark.parametrize("name", HOSTILE, ids=["digit-dot-78", "x253", "dots"])
def test_children_of_hostile_names_are_accepted(control_plane: ControlPlane, kuberay: KubeRay, name: str) -> None:
    cp = control_plane
    cp.ensure_namespace(NS)
    sp = spec(pods=2)
    cp.create(CONFIGMAPS, NS, children.configmap(name, NS, sp))
    rj = children.rayjob(name, NS, sp, "1", {"team": "x"})
    cp.create(RAYJOBS, NS, rj)
    rj_name = rj["metadata"]["name"]
    # KubeRay validates, then creates the RayCluster (nothing runs pods here, so it stays Initializing)
    state = wait_for(f"KubeRay to take up RayJob {rj_name}", lambda: _deploy_status(cp, rj_name), timeout=60)
    assert state != "ValidationFailed", (cp.get(RAYJOBS, NS, rj_name) or {}).get("status")
    job = children.extraction_job(name, NS, sp)
    cp.create(JOBS, NS, job)
    job_name = job["metadata"]["name"]
    pods = wait_for(f"the Job controller to create the pods of {job_name}", lambda: len(
        cp.list(PODS, NS, labelSelector=f"batch.kubernetes.io/job-name={job_name}")) == 2 and cp.list(
        PODS, NS, labelSelector=f"batch.kubernetes.io/job-name={job_name}"), timeout=60)
    assert sorted(p["spec"]["hostname"] for p in pods) == [f"{job_name}-0", f"{job_name}-1"]


def test_a_name_kuberay_refuses_reads_as_child_rejected(control_plane: ControlPlane, kuberay: KubeRay) -> None:
    cp = control_plane
    cp.ensure_namespace(NS)
    rj = children.rayjob("dg", NS, spec(), "1")
    rj["metadata"]["name"] = "a" * 42 + "-gen-1"  # 48: the name eyrie used to derive for a 42-character name
    cp.create(RAYJOBS, NS, rj)
    wait_for("ValidationFailed", lambda: _deploy_status(cp, rj["metadata"]["name"]) == "ValidationFailed",
             timeout=60)
    child = rayjob_child(cp.get(RAYJOBS, NS, rj["metadata"]["name"]) or {})
    assert (child.state, child.reason) == ("Failed", "ChildRejected")
    assert "47" in child.message and child.message.startswith(f"KubeRay rejected RayJob {'a' * 42}-gen-1: ")
