"""The operator's Kubernetes client (`eyrie.operator.kube`) against an API server: every kind and verb
the operator uses, JSON back, 404/409 as answers rather than errors, merge patches, the status
subresource. `test_kube_floor.py` runs this file again under the client's floor version."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config

from eyrie.operator.kube import Kind, Kube, KubeError

from .kube import CONFIGMAPS, DSG, JOBS, RAYJOBS, Cluster

NS = "default"


@pytest.fixture
async def kube(cluster: Cluster, tmp_path: Path) -> AsyncIterator[Kube]:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(cluster.kubeconfig(tmp_path / "kubeconfig")),
                                  client_configuration=cfg)
    k = Kube(client.ApiClient(cfg))
    try:
        yield k
    finally:
        await k.close()


def _cm(name: str, data: dict[str, str]) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"a": "b"}}, "data": data}


@pytest.mark.integration
async def test_configmap_get_create_patch(kube: Kube, cluster: Cluster) -> None:
    assert await kube.get(Kind.CONFIGMAP, NS, "dg-spec") is None
    assert await kube.create(Kind.CONFIGMAP, NS, _cm("dg-spec", {"spec.yaml": "one"})) is True
    assert await kube.create(Kind.CONFIGMAP, NS, _cm("dg-spec", {"spec.yaml": "two"})) is False  # exists
    got = await kube.get(Kind.CONFIGMAP, NS, "dg-spec")
    assert got is not None and got["data"] == {"spec.yaml": "one"} and got["metadata"]["labels"] == {"a": "b"}
    await kube.patch(Kind.CONFIGMAP, NS, "dg-spec", {"data": {"spec.yaml": "two"}})
    assert (cluster.get(CONFIGMAPS, NS, "dg-spec") or {})["data"] == {"spec.yaml": "two"}


@pytest.mark.integration
async def test_secret_data_comes_back_base64(kube: Kube, cluster: Cluster) -> None:
    cluster.secret(NS, "creds", {"api-key": "sk-1"})
    doc = await kube.get(Kind.SECRET, NS, "creds")
    assert doc is not None and base64.b64decode(doc["data"]["api-key"]) == b"sk-1"


@pytest.mark.integration
async def test_job_create_patch_delete(kube: Kube, cluster: Cluster) -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "dg-x"},
           "spec": {"suspend": True, "completions": 2, "completionMode": "Indexed",
                    "template": {"spec": {"restartPolicy": "Never",
                                          "containers": [{"name": "c", "image": "i"}]}}}}
    assert await kube.create(Kind.JOB, NS, job)
    await kube.patch(Kind.JOB, NS, "dg-x", {"spec": {"suspend": False}})
    got = await kube.get(Kind.JOB, NS, "dg-x")
    assert got is not None and got["spec"]["suspend"] is False and got["spec"]["completions"] == 2
    await kube.delete(Kind.JOB, NS, "dg-x")
    await kube.delete(Kind.JOB, NS, "dg-x")  # already gone is fine
    assert cluster.get(JOBS, NS, "dg-x") is None


@pytest.mark.integration
async def test_rayjob_is_json_with_unknown_fields_kept(kube: Kube, cluster: Cluster) -> None:
    rj = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "g-1", "annotations": {"x": "1"}},
          "spec": {"entrypoint": "eyrie run", "preRunningDeadlineSeconds": 600}}
    assert await kube.create(Kind.RAYJOB, NS, rj)
    await kube.patch(Kind.RAYJOB, NS, "g-1", {"metadata": {"annotations": {"y": "2"}}})
    cluster.patch(RAYJOBS, NS, "g-1", {"status": {"jobDeploymentStatus": "ValidationFailed"}}, sub="status")
    got = await kube.get(Kind.RAYJOB, NS, "g-1")
    assert got is not None
    assert got["metadata"]["annotations"] == {"x": "1", "y": "2"}  # a merge patch, not a replacement
    assert got["spec"]["preRunningDeadlineSeconds"] == 600
    assert got["status"]["jobDeploymentStatus"] == "ValidationFailed"
    await kube.delete(Kind.RAYJOB, NS, "g-1")
    assert cluster.get(RAYJOBS, NS, "g-1") is None


@pytest.mark.integration
async def test_dataset_spec_and_status_patches(kube: Kube, cluster: Cluster) -> None:
    cluster.create(DSG, NS, {"apiVersion": "eyrie.dev/v1alpha1", "kind": "DatasetGeneration",
                             "metadata": {"name": "dg"}, "spec": {"suspend": False}})
    await kube.patch(Kind.DATASET, NS, "dg", {"status": {"phase": "Pending", "attempt": "1"}}, status=True)
    await kube.patch(Kind.DATASET, NS, "dg", {"spec": {"suspend": True}})
    got = await kube.get(Kind.DATASET, NS, "dg")
    assert got is not None and got["spec"]["suspend"] is True
    assert got["status"] == {"phase": "Pending", "attempt": "1"}


@pytest.mark.integration
async def test_errors_name_the_request_and_the_servers_message(kube: Kube) -> None:
    with pytest.raises(KubeError) as e:
        await kube.patch(Kind.JOB, NS, "missing", {"spec": {"suspend": True}})
    assert e.value.status == 404 and str(e.value).startswith("patch jobs/missing: 404")
    assert not e.value.rejected


@pytest.mark.parametrize(("status", "detail", "rejected"), [
    (422, 'RayJob.ray.io "x" is invalid: spec.rayClusterSpec...: Invalid value: "4GB"', True),
    (400, 'admission webhook "vrayjob.kb.io" denied the request: RayJob name should be no more than 47', True),
    (403, 'admission webhook "v.kueue.x-k8s.io" denied the request: forbidden', True),
    (403, 'jobs.batch is forbidden: User "system:serviceaccount:eyrie:eyrie" cannot create', False),
    (500, "etcdserver: request timed out", False),
    (429, "too many requests", False),
])
def test_rejected_means_the_object_itself_was_refused(status: int, detail: str, rejected: bool) -> None:
    assert KubeError("create", Kind.RAYJOB, "x", status, detail).rejected is rejected
