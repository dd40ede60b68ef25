"""The operator's Kubernetes client (`eyrie.operator.kube`, kubernetes_asyncio) against the real API
server, as the operator's own ServiceAccount (the chart's RBAC): each kind and verb it uses, merge
patches on built-in and custom kinds, the status subresource, and a refusal of the object itself
(schema, CEL) read as `rejected`, while one for lack of permission is not."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client, config

from eyrie.operator import handlers
from eyrie.operator.kube import Kind, Kube, KubeError

from .conftest import Installed
from .testbed import DSG, REPO, ControlPlane, KubeRay

NS = "kube-client"
RAYJOBS = ("ray.io", "v1", "rayjobs")
JOBS = ("batch", "v1", "jobs")


@pytest.fixture
async def kube(control_plane: ControlPlane, chart: Installed, kuberay: KubeRay, tmp_path: Path) -> AsyncIterator[Kube]:
    control_plane.ensure_namespace(NS)
    cfg = client.Configuration()
    path = control_plane.kubeconfig(tmp_path / "operator.kubeconfig", token=chart.token, namespace=NS)
    await config.load_kube_config(config_file=str(path), client_configuration=cfg)
    k = Kube(client.ApiClient(cfg))
    try:
        yield k
    finally:
        await k.close()


def _job(name: str) -> dict[str, object]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"suspend": True, "completions": 2, "parallelism": 2, "completionMode": "Indexed",
                     "template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "c", "image": "busybox"}]}}}}


async def test_each_call_the_operator_makes(kube: Kube, control_plane: ControlPlane) -> None:
    cp = control_plane
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dg-spec"}, "data": {"spec.yaml": "a"}}
    assert await kube.get(Kind.CONFIGMAP, NS, "dg-spec") is None
    assert await kube.create(Kind.CONFIGMAP, NS, cm) is True
    assert await kube.create(Kind.CONFIGMAP, NS, cm) is False
    await kube.patch(Kind.CONFIGMAP, NS, "dg-spec", {"data": {"spec.yaml": "b"}})
    assert (await kube.get(Kind.CONFIGMAP, NS, "dg-spec") or {})["data"] == {"spec.yaml": "b"}

    cp.secret(NS, "creds", {"api-key": "sk-1"})
    assert base64.b64decode((await kube.get(Kind.SECRET, NS, "creds") or {})["data"]["api-key"]) == b"sk-1"

    assert await kube.create(Kind.JOB, NS, _job("dg-extract"))
    await kube.patch(Kind.JOB, NS, "dg-extract", {"metadata": {"annotations": {"eyrie.dev/suspended": None}},
                                                  "spec": {"suspend": False}})
    job = await kube.get(Kind.JOB, NS, "dg-extract")
    assert job is not None and job["spec"]["suspend"] is False and job["spec"]["completionMode"] == "Indexed"
    pods: list[dict[str, object]] = []
    for _ in range(150):  # the Job controller creates its pods; the operator lists them by the Job's label
        pods = await kube.pods(NS, "batch.kubernetes.io/job-name=dg-extract")
        if len(pods) == 2:
            break
        await asyncio.sleep(0.2)
    assert sorted(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] for p in pods) == ["0", "1"]
    await kube.delete(Kind.JOB, NS, "dg-extract")
    await kube.delete(Kind.JOB, NS, "never-was")

    quickstart = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    cp.create(DSG, NS, {**quickstart, "metadata": {"name": "dg"}})
    await kube.patch(Kind.DATASET, NS, "dg", {"status": {"phase": "Pending", "attempt": "1"}}, status=True)
    await kube.patch(Kind.DATASET, NS, "dg", {"spec": {"suspend": True}})
    got = await kube.get(Kind.DATASET, NS, "dg")
    assert got is not None and got["spec"]["suspend"] is True and got["status"]["phase"] == "Pending"


async def test_a_refused_object_is_rejected_and_a_forbidden_call_is_not(kube: Kube) -> None:
    rj = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "bad-gen-1"},
          "spec": {"entrypoint": "x", "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {}, "template": {
              "spec": {"containers": [{"name": "h", "image": "ray", "resources": {"limits": {"memory": "4GB"}}}]}}}}}}
    with pytest.raises(KubeError) as e:
        await kube.create(Kind.RAYJOB, NS, rj)
    assert e.value.status == 422 and e.value.rejected and "4GB" in e.value.detail
    with pytest.raises(KubeError) as e:  # the chart grants no `create` on DatasetGenerations
        await kube.create(Kind.DATASET, NS, {"apiVersion": "eyrie.dev/v1alpha1", "kind": "DatasetGeneration",
                                             "metadata": {"name": "x"}, "spec": {}})
    assert e.value.status == 403 and not e.value.rejected


async def test_a_new_object_is_announced_pending_unless_it_was_written_since(kube: Kube,
                                                                             control_plane: ControlPlane) -> None:
    quickstart = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    control_plane.create(DSG, NS, {**quickstart, "metadata": {"name": "fresh"}})
    seen = (await kube.get(Kind.DATASET, NS, "fresh") or {})["metadata"]
    await handlers._announce(kube, seen)
    assert (await kube.get(Kind.DATASET, NS, "fresh") or {})["status"] == {"phase": "Pending"}

    control_plane.create(DSG, NS, {**quickstart, "metadata": {"name": "raced"}})
    stale = (await kube.get(Kind.DATASET, NS, "raced") or {})["metadata"]
    await kube.patch(Kind.DATASET, NS, "raced", {"status": {"phase": "Generating", "attempt": "1"}}, status=True)
    await handlers._announce(kube, stale)  # a pass wrote since kopf's copy: the server refuses it, quietly
    assert (await kube.get(Kind.DATASET, NS, "raced") or {})["status"] == {"phase": "Generating", "attempt": "1"}
