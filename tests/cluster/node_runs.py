"""DatasetGenerations run in real pods on the node, shared by the node's end-to-end and fault tests
(test_node_e2e.py, test_node_faults.py): the operator from the Helm chart, KubeRay's head and worker pods from the
Ray worker image, the simulator as a Deployment (`eyrie simulate`, its own count of what it answered and billed at
/sim/stats), the host's MinIO as a Service, the API key and S3 credentials as Secrets. Each test module runs its
cluster in a namespace of its own."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from minio import Minio

from eyrie.jobs.store import S3Credentials, Store, open_store

from .conftest import API_KEY, Release
from .node import Node, images_archive
from .testbed import CONFIGMAPS, DSG, JOBS, PODS, RAYCLUSTERS, RAYJOBS, wait_for

VERSION = "0.1.0"
RAY_IMAGE = f"ghcr.io/eyrie-dev/eyrie-ray-worker:{VERSION}"
EXTRACTOR_IMAGE = f"ghcr.io/eyrie-dev/eyrie-extractor:{VERSION}-cpu"
PRICING = {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}
SIM_PORT = 8080
DEPLOYMENTS = ("apps", "v1", "deployments")


@dataclass
class Cluster:
    """The node with the operator and KubeRay, the simulator's Deployment and the host's MinIO as Services, in
    namespace `ns`."""

    node: Node
    release: Release
    s3: Any
    minio_endpoint: str  # as pods reach it
    ns: str

    @property
    def cp(self) -> Any:
        return self.node.cp

    def _sim(self) -> str:
        [pod] = [p for p in self.cp.list(PODS, self.ns, labelSelector="app=sim") if p["status"].get("podIP")]
        return f"http://{pod['status']['podIP']}:{SIM_PORT}"

    def sim_stats(self) -> dict[str, Any]:
        """The simulator's own count of what it answered and billed, read at its pod's address."""
        return httpx.get(f"{self._sim()}/sim/stats", timeout=10).json()

    def sim_reset(self) -> dict[str, Any]:
        """Its counters from zero (maxInFlight too): a test's figures are then its own."""
        return httpx.post(f"{self._sim()}/sim/reset", timeout=10).json()

    def store(self, bucket: str) -> Store:
        return open_store(f"s3://{bucket}/run", self.s3.endpoint, S3Credentials(self.s3.access_key,
                                                                                self.s3.secret_key))

    def status(self, name: str) -> dict[str, Any]:
        return (self.cp.get(DSG, self.ns, name) or {}).get("status") or {}

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        return next((c for c in self.status(name).get("conditions") or [] if c["type"] == type_), None)

    def phase_is(self, name: str, *phases: str) -> Any:
        return lambda: self.status(name).get("phase") in phases

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return self.cp.list(PODS, self.ns, labelSelector=selector)

    def events(self, name: str) -> list[dict[str, Any]]:
        return self.cp.events(self.ns, name)

    def diagnose(self, name: str) -> str:
        """What a failed wait shows: the object's status, its events, the pods and their last log lines."""
        lines = [f"status: {json.dumps(self.status(name))}"]
        lines += [f"event {e.get('reason')}: {e.get('message')}" for e in self.cp.events(self.ns, name)]
        for p in self.cp.list(PODS, self.ns):
            lines.append(f"pod {p['metadata']['name']}: {p['status'].get('phase')} "
                         f"{json.dumps(p['status'].get('containerStatuses'))[:600]}")
            lines.append(self.cp.kubectl("logs", "-n", self.ns, p["metadata"]["name"], "--all-containers",
                                         "--tail=30").stdout[-3000:])
        lines.append(f"operator: {self.release.log()[-3000:]}")
        return "\n".join(lines)

    def wait(self, name: str, what: str, fn: Any, timeout: float, every: float = 1) -> Any:
        try:
            return wait_for(what, fn, timeout=timeout, every=every)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.diagnose(name)}") from e


@contextmanager
def running_cluster(node: Node, release: Release, s3_server: Any, ns: str, latency_ms: int,
                    sim_image: str = RAY_IMAGE, sim_args: tuple[str, ...] = ()) -> Iterator[Cluster]:
    """The Ray worker image on the node, namespace `ns` with the Secrets, MinIO's Service and the simulator's
    Deployment answering each request after `latency_ms` (from `sim_image`, with `sim_args` more: the extractor
    image's torch serves a builtin model's answers); the namespace deleted on the way out."""
    node.import_image(images_archive("ray-worker"))
    cp = node.cp
    cp.ensure_namespace(ns)
    ip = node.host_service(ns, "minio", s3_server.port)
    assert ip
    cp.secret(ns, "provider", {"api-key": API_KEY})
    cp.secret(ns, "s3", {"accessKey": s3_server.access_key, "secretKey": s3_server.secret_key})
    labels = {"app": "sim"}
    cp.create(DEPLOYMENTS, ns, {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "sim"},
                                "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
                                    "metadata": {"labels": labels}, "spec": {"containers": [{
                                        "name": "sim", "image": sim_image,
                                        "command": ["eyrie", "simulate", "--host", "0.0.0.0", "--port",
                                                    str(SIM_PORT), "--latency-ms", str(latency_ms), *sim_args],
                                        "ports": [{"containerPort": SIM_PORT}],
                                        "readinessProbe": {"httpGet": {"path": "/sim/stats", "port": SIM_PORT},
                                                           "periodSeconds": 2}}]}}}})
    cp.create(("", "v1", "services"), ns, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "sim"},
                                           "spec": {"selector": labels, "ports": [{"port": SIM_PORT}]}})
    cp.kubectl("rollout", "status", "-n", ns, "deployment/sim", "--timeout=180s", check=True)
    try:
        yield Cluster(node, release, s3_server, f"http://minio.{ns}.svc:{s3_server.port}", ns)
    finally:
        cp.delete(("", "v1", "namespaces"), "", ns)


def bucket_with_prompts(cluster: Cluster, n: int) -> str:
    name = f"e2e{time.time_ns()}"
    client = Minio(f"127.0.0.1:{cluster.s3.port}", access_key=cluster.s3.access_key,
                   secret_key=cluster.s3.secret_key, secure=False)
    client.make_bucket(name)
    body = "".join(json.dumps({"messages": [{"role": "user", "content": f"Question {i}: explain {i * 7}."}]}) + "\n"
                   for i in range(n)).encode()
    client.put_object(name, "prompts.jsonl", io.BytesIO(body), len(body))
    return name


def spec(cluster: Cluster, bucket: str, max_usd: str = "5.00", **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "sources": [{"name": "p", "uri": f"s3://{bucket}/prompts.jsonl", "format": "openai"}],
        "target": {"model": "test/model", "tokenizer": "bundled:deepseek-v4", "chatFormat": "deepseek-v4"},
        "api": {"baseUrl": f"http://sim.{cluster.ns}.svc:{SIM_PORT}/v1",
                "apiKeySecretRef": {"name": "provider", "key": "api-key"},
                "maxConcurrency": 4, "maxRetries": 4, "requestTimeoutSeconds": 10, "sampling": {"maxTokens": 256}},
        "tools": {"gate": {"enabled": False}},
        "budget": {"maxUSD": max_usd, "pricing": PRICING},
        "generation": {"shards": 2, "ray": {"mode": "RayJob", "image": RAY_IMAGE, "workers": 1,
                                            "cpusPerWorker": 0.25}},
        "output": {"uri": f"s3://{bucket}/run", "endpoint": cluster.minio_endpoint,
                   "credentialsSecretRef": {"name": "s3"}},
    }
    out.update(extra)
    return out


def eyrie_pods(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    """Every pod a DatasetGeneration's children made: its Ray clusters' (KubeRay labels each with ray.io/cluster,
    the RayCluster it named after the RayJob, NAME-gen-ATTEMPT-xxxxx), KubeRay's submitter's and the extraction
    Job's (the Job controller's batch.kubernetes.io/job-name)."""
    def ours(pod: dict[str, Any]) -> bool:
        labels = pod["metadata"].get("labels") or {}
        return (labels.get("ray.io/cluster", "").startswith(f"{name}-gen-")
                or labels.get("batch.kubernetes.io/job-name", "").startswith(f"{name}-"))
    return [p for p in cluster.cp.list(PODS, cluster.ns) if ours(p)]


def ray_pod(cluster: Cluster, name: str, node_type: str) -> dict[str, Any] | None:
    """The run's live Ray pod of `node_type` (head, worker) that runs, if any."""
    return next((p for p in eyrie_pods(cluster, name)
                 if (p["metadata"].get("labels") or {}).get("ray.io/node-type") == node_type
                 and not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") == "Running"), None)


def children_of(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    """The run's RayJobs, RayClusters, Jobs and ConfigMaps (by their names, NAME-...)."""
    return [d for res in (RAYJOBS, RAYCLUSTERS, JOBS, CONFIGMAPS) for d in cluster.cp.list(res, cluster.ns)
            if d["metadata"]["name"].startswith(f"{name}-")]


def delete_and_wait(cluster: Cluster, name: str) -> None:
    """`kubectl delete dsg`: the operator lets it go, the garbage collector takes every child and pod."""
    cluster.cp.kubectl("delete", "dsg", name, "-n", cluster.ns, "--wait=true", "--timeout=120s", check=True)
    cluster.wait(name, "every pod and child gone", lambda: not eyrie_pods(cluster, name) and not children_of(
        cluster, name), timeout=240)


def delete_every_run(cluster: Cluster) -> None:
    """What a test that failed midway left: its Ray pods (kept ttlSecondsAfterFinished after a success) would hold
    the node's CPUs from the next test's."""
    for doc in cluster.cp.list(DSG, cluster.ns):
        delete_and_wait(cluster, doc["metadata"]["name"])
