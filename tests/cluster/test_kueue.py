"""Kueue for real: the Kueue v0.17 controller with its webhooks (tests/cluster/testbed.py), a ResourceFlavor, a
ClusterQueue and a LocalQueue. A DatasetGeneration labelled `kueue.x-k8s.io/queue-name` has each child held by Kueue
while the queue lacks the quota for it, and admitted (unsuspended by Kueue, never by eyrie) once the quota is there;
KubeRay and the Job controller then run what Kueue admitted."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from eyrie.jobs.contract import layout
from eyrie.jobs.store import open_store

from .conftest import API_KEY, NS, condition, dsg, empty_namespace, status_of, write_pod_summary
from .test_e2e import file_spec, phase_is, write_progress
from .test_e2e_children import more_passes
from .testbed import (
    CLUSTERQUEUES,
    DSG,
    JOBS,
    KUEUE_API,
    LOCALQUEUES,
    PODS,
    RAYCLUSTERS,
    RAYJOBS,
    RESOURCEFLAVORS,
    WORKLOADS,
    ControlPlane,
    KubeRay,
    Kueue,
    wait_for,
)

QUEUE = "gpu-queue"
CQ = "eyrie-test"
FLAVOR = "default-flavor"
API = "/".join(KUEUE_API)


@pytest.fixture(scope="module")
def kueue(control_plane: ControlPlane, kuberay: KubeRay, tmp_path_factory: pytest.TempPathFactory,
          request: pytest.FixtureRequest) -> Iterator[Kueue]:
    """Kueue after KubeRay's CRDs, so that its RayJob and RayCluster integrations start at once."""
    t0 = time.monotonic()
    kq = Kueue.start(control_plane, tmp_path_factory.mktemp("kueue"))
    sys.stderr.write(f"\ntestbed: Kueue ready in {time.monotonic() - t0:.1f}s\n")
    failed = request.session.testsfailed
    try:
        yield kq
    finally:
        if request.session.testsfailed > failed:
            sys.stderr.write(f"--- kueue log\n{kq.log()}\n")
        kq.stop(control_plane)


def quota(cpu: str, memory: str, gpus: str) -> list[dict[str, Any]]:
    return [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [{"name": FLAVOR, "resources": [
        {"name": "cpu", "nominalQuota": cpu}, {"name": "memory", "nominalQuota": memory},
        {"name": "nvidia.com/gpu", "nominalQuota": gpus}]}]}]


@pytest.fixture
def queues(cluster: ControlPlane, kueue: Kueue) -> Iterator[None]:
    """A ClusterQueue with no quota at all, and the LocalQueue the DatasetGeneration names. Afterwards the run is
    deleted first (the garbage collector takes its children, and their Workloads with them), then the queues, while
    Kueue still runs to drop its finalizers."""
    cluster.create(RESOURCEFLAVORS, "", {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}})
    cluster.create(CLUSTERQUEUES, "", {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": CQ},
                                       "spec": {"namespaceSelector": {}, "resourceGroups": quota("0", "0", "0")}})
    cluster.create(LOCALQUEUES, NS, {"apiVersion": API, "kind": "LocalQueue", "metadata": {"name": QUEUE},
                                     "spec": {"clusterQueue": CQ}})
    try:
        yield
    finally:
        empty_namespace(cluster, NS)
        wait_for("the Workloads garbage-collected", lambda: cluster.list(WORKLOADS, NS) == [], timeout=60)
        for res, ns, name in ((LOCALQUEUES, NS, QUEUE), (CLUSTERQUEUES, "", CQ), (RESOURCEFLAVORS, "", FLAVOR)):
            cluster.delete(res, ns, name)
            wait_for(f"{name} deleted", lambda r=res, n=ns, m=name: cluster.get(r, n, m) is None, timeout=30)


def workload_of(cluster: ControlPlane, kind: str, name: str) -> dict[str, Any] | None:
    for w in cluster.list(WORKLOADS, NS):
        if any((r["kind"], r["name"]) == (kind, name) for r in w["metadata"].get("ownerReferences") or []):
            return w
    return None


def wl_condition(w: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return next((c for c in ((w or {}).get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def held(cluster: ControlPlane, kind: str, name: str) -> dict[str, Any] | None:
    """Kueue has the child's Workload, tried to reserve quota for it, and could not."""
    w = workload_of(cluster, kind, name)
    c = wl_condition(w, "QuotaReserved")
    return w if c.get("status") == "False" and c.get("reason") == "Pending" else None


def admitted(cluster: ControlPlane, res: tuple[str, str, str], kind: str, name: str) -> dict[str, Any] | None:
    """Kueue admitted the child's Workload and unsuspended the child (a RayJob's `suspend: false` is omitted)."""
    w = workload_of(cluster, kind, name)
    child = cluster.get(res, NS, name)
    ok = wl_condition(w, "Admitted").get("status") == "True" and child is not None and not child["spec"].get("suspend")
    return w if ok else None


def queued(cluster: ControlPlane, name: str) -> dict[str, Any] | None:
    c = condition(cluster, name, "Queued")
    return c if (c or {}).get("status") == "True" else None


def test_kueue_webhooks_suspend_a_queued_job_and_refuse_a_rayjob_that_keeps_its_cluster(cluster, queues):
    """Kueue's own admission webhooks are live in the API server (dry runs: nothing is stored)."""
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "probe", "labels": {"kueue.x-k8s.io/queue-name": QUEUE}},
           "spec": {"suspend": False, "template": {"spec": {"restartPolicy": "Never", "containers": [
               {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}]}}}}
    assert cluster.create(JOBS, NS, job, dry_run=True)["spec"]["suspend"] is True  # Kueue's mutating webhook
    rayjob = {"apiVersion": "ray.io/v1", "kind": "RayJob",
              "metadata": {"name": "probe", "labels": {"kueue.x-k8s.io/queue-name": QUEUE}},
              "spec": {"entrypoint": "python -c 1", "shutdownAfterJobFinishes": False, "rayClusterSpec": {
                  "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [
                      {"name": "ray-head", "image": "rayproject/ray"}]}}}}}}
    with pytest.raises(httpx.HTTPStatusError) as refused:
        cluster.create(RAYJOBS, NS, rayjob, dry_run=True)
    assert refused.value.response.status_code == 403
    assert "vrayjob.kb.io" in str(refused.value) and "spec.shutdownAfterJobFinishes" in str(refused.value)


def test_kueue_holds_each_child_until_the_queue_has_quota_then_admits_it(cluster, queues, operator, player,
                                                                         tmp_path):
    out = tmp_path / "out"
    cluster.secret(NS, "provider", {"api-key": API_KEY})
    spec = file_spec(out, extraction={"enabled": True, "image": "eyrie-sglang:test", "pods": 2, "gpusPerPod": 8,
                                      "nodeSelector": {"nvidia.com/gpu.product": "H200"},
                                      "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]})
    cluster.create(DSG, NS, dsg("kq", spec, {"kueue.x-k8s.io/queue-name": QUEUE}))

    # no quota: the RayJob (created suspended, passed by Kueue's webhooks) is held, its Workload pending
    rj = player.rayjob("kq-gen-1")
    assert rj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == QUEUE and rj["spec"]["suspend"] is True
    w = wait_for("Kueue to hold the RayJob's Workload", lambda: held(cluster, "RayJob", "kq-gen-1"), timeout=60)
    assert w["spec"]["queueName"] == QUEUE
    assert "insufficient quota" in wl_condition(w, "QuotaReserved")["message"], w["status"]
    assert wl_condition(w, "Admitted").get("status") != "True" and not w["status"].get("admission")
    c = wait_for("Queued", lambda: queued(cluster, "kq"))
    assert c["reason"] == "WaitingForAdmission"
    assert c["message"] == f"RayJob kq-gen-1 waits for admission by LocalQueue {QUEUE} (kubectl get workloads -n {NS})"
    more_passes(operator, 3)  # eyrie, too, leaves the suspension alone
    assert status_of(cluster, "kq")["phase"] == "Pending"
    assert cluster.get(RAYJOBS, NS, "kq-gen-1")["spec"]["suspend"] is True
    assert cluster.list(RAYCLUSTERS, NS) == []

    # quota for the generation cluster, not yet for 2 x 8 GPUs: Kueue admits the RayJob, KubeRay creates its cluster
    cluster.patch(CLUSTERQUEUES, "", CQ, {"spec": {"resourceGroups": quota("64", "256Gi", "8")}})
    w = wait_for("Kueue to admit the RayJob", lambda: admitted(cluster, RAYJOBS, "RayJob", "kq-gen-1"), timeout=60)
    assert w["status"]["admission"]["clusterQueue"] == CQ
    # Kueue's write (its own copy of KubeRay's types) kept what eyrie wrote
    assert cluster.get(RAYJOBS, NS, "kq-gen-1")["spec"]["preRunningDeadlineSeconds"] == 1800
    player.accepted("kq-gen-1")
    write_progress(out, "1", "Running", 30, "0.30")
    wait_for("Canary", phase_is(cluster, "kq", "Canary"))
    assert condition(cluster, "kq", "Queued")["reason"] == "Admitted"
    assert not cluster.get(RAYJOBS, NS, "kq-gen-1")["spec"].get("suspend")  # eyrie never fought Kueue

    # generation ends: the extraction Job is created suspended and held for its 16 GPUs
    write_progress(out, "1", "Done", 100, "1.00", stage="done")
    cluster.patch(RAYJOBS, NS, "kq-gen-1", {"status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}},
                  sub="status")
    job = wait_for("extraction Job", lambda: cluster.get(JOBS, NS, "kq-extract"))
    s = job["spec"]
    assert (s["completionMode"], s["completions"], s["parallelism"], s["suspend"]) == ("Indexed", 2, 2, True)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == QUEUE
    assert job["metadata"]["ownerReferences"][0]["name"] == "kq"
    w = wait_for("Kueue to hold the Job's Workload", lambda: held(cluster, "Job", "kq-extract"), timeout=60)
    assert "nvidia.com/gpu" in wl_condition(w, "QuotaReserved")["message"], w["status"]
    c = wait_for("Queued for the Job", lambda: (queued(cluster, "kq") or {}).get("message", "").startswith(
        "Job kq-extract"))
    assert status_of(cluster, "kq")["phase"] == "Extracting"
    more_passes(operator, 3)
    assert cluster.get(JOBS, NS, "kq-extract")["spec"]["suspend"] is True
    assert cluster.list(PODS, NS, labelSelector="batch.kubernetes.io/job-name=kq-extract") == []

    # 16 GPUs: Kueue admits the Job, the Job controller creates its pods, the run completes
    cluster.patch(CLUSTERQUEUES, "", CQ, {"spec": {"resourceGroups": quota("64", "256Gi", "16")}})
    wait_for("Kueue to admit the Job", lambda: admitted(cluster, JOBS, "Job", "kq-extract"), timeout=60)
    pod = player.pods("kq-extract", 2)[0]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "H200"}
    for i in range(2):  # each pod writes its summary when its share is done
        write_pod_summary(out, i, 2, shard=i, samples=50, tokens=5000, nbytes=1000)
    player.complete_job("kq-extract")
    wait_for("Succeeded", phase_is(cluster, "kq", "Succeeded"))
    st = status_of(cluster, "kq")
    assert st["extraction"] == {"shardsDone": 2, "shardsTotal": 2, "bytes": 2000}
    assert st["outputManifest"] == f"file://{out}/manifest.json"
    assert condition(cluster, "kq", "Queued")["status"] == "False"
    manifest = json.loads(open_store(f"file://{out}").get(layout.MANIFEST))
    assert manifest["extraction"]["samples"] == 100 and manifest["extraction"]["pods"] == 2
    wait_for("Kueue to finish the Job's Workload",
             lambda: wl_condition(workload_of(cluster, "Job", "kq-extract"), "Finished").get("status") == "True")
    metrics = operator.metrics()
    assert 'eyrie_datasetgenerations{phase="Succeeded"} 1.0' in metrics
    assert 'eyrie_spent_usd{name="kq",namespace="default"} 1.0' in metrics
    assert 'eyrie_samples{name="kq",namespace="default",state="done"} 100.0' in metrics
