"""End to end with every pod real (issue 28 items 4 and 5): on the real node, the operator installed by Helm runs as
its Deployment's pod, KubeRay (deployed as its release deploys it) creates the head and worker pods of each RayJob
from the Ray worker image, the simulator runs as a Deployment (`eyrie simulate`) behind a Service, the host's MinIO
is reached through a Service, the API key and S3 credentials are Secrets, and the extraction Job's Indexed pods run
the CPU extractor image (builtin:tiny-llama: a random-weight 4-layer Llama each pod builds, no download). Nothing
here writes a status: KubeRay, the Job controller, the kubelet and eyrie's operator do; the tests only apply, patch
and delete what a user would.

Covered: kubectl apply -> generation in the Ray pods -> the RayJob SUCCEEDED (KubeRay's word from the head's
dashboard) -> extraction pods writing hidden states and fidelity to MinIO -> `kubectl get dsg` Succeeded, the
manifest listing every shard, the report status.outputReport names with its extraction and fidelity sections;
an OOMKilled extraction failing the run with the limit to raise, then recreated paying nothing twice; budget
exhausted -> spec.suspend, the Ray pods gone, Suspended/BudgetExceeded, raised -> resumed, every prompt paid once
(counted by the simulator); a missing Secret and an image on no node, each a condition and Warning events;
kubectl delete taking every pod and child; helm uninstall keeping the CRD and the user's objects."""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import httpx
import pytest
from minio import Minio

from eyrie.jobs.contract import layout, records
from eyrie.jobs.contract.money import brief, dollars
from eyrie.jobs.extract import shards as shards_
from eyrie.jobs.store import S3Credentials, Store, open_store

from .conftest import API_KEY, Release, dsg
from .node import Node, images_archive
from .testbed import CONFIGMAPS, DSG, JOBS, PODS, RAYCLUSTERS, RAYJOBS, wait_for

NS = "e2e"
VERSION = "0.1.0"
RAY_IMAGE = f"ghcr.io/eyrie-dev/eyrie-ray-worker:{VERSION}"
EXTRACTOR_IMAGE = f"ghcr.io/eyrie-dev/eyrie-extractor:{VERSION}-cpu"
PRICING = {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}
SIM_PORT = 8080
DEPLOYMENTS = ("apps", "v1", "deployments")


@dataclass
class Cluster:
    """The node with the operator and KubeRay, the simulator's Deployment and the host's MinIO as Services."""

    node: Node
    release: Release
    s3: Any
    minio_endpoint: str  # as pods reach it

    @property
    def cp(self) -> Any:
        return self.node.cp

    def sim_stats(self) -> dict[str, Any]:
        """The simulator's own count of what it answered and billed, read at its pod's address."""
        [pod] = [p for p in self.cp.list(PODS, NS, labelSelector="app=sim") if p["status"].get("podIP")]
        return httpx.get(f"http://{pod['status']['podIP']}:{SIM_PORT}/sim/stats", timeout=10).json()

    def store(self, bucket: str) -> Store:
        return open_store(f"s3://{bucket}/run", self.s3.endpoint, S3Credentials(self.s3.access_key,
                                                                                self.s3.secret_key))

    def status(self, name: str) -> dict[str, Any]:
        return (self.cp.get(DSG, NS, name) or {}).get("status") or {}

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        return next((c for c in self.status(name).get("conditions") or [] if c["type"] == type_), None)

    def phase_is(self, name: str, *phases: str) -> Any:
        return lambda: self.status(name).get("phase") in phases

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return self.cp.list(PODS, NS, labelSelector=selector)

    def diagnose(self, name: str) -> str:
        """What a failed wait shows: the object's status, its events, the pods and their last log lines."""
        lines = [f"status: {json.dumps(self.status(name))}"]
        lines += [f"event {e.get('reason')}: {e.get('message')}" for e in self.cp.events(NS, name)]
        for p in self.cp.list(PODS, NS):
            lines.append(f"pod {p['metadata']['name']}: {p['status'].get('phase')} "
                         f"{json.dumps(p['status'].get('containerStatuses'))[:600]}")
            lines.append(self.cp.kubectl("logs", "-n", NS, p["metadata"]["name"], "--all-containers",
                                         "--tail=30").stdout[-3000:])
        lines.append(f"operator: {self.release.log()[-3000:]}")
        return "\n".join(lines)

    def wait(self, name: str, what: str, fn: Any, timeout: float) -> Any:
        try:
            return wait_for(what, fn, timeout=timeout, every=1)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.diagnose(name)}") from e


@pytest.fixture(scope="module")
def cluster(node_kuberay: Node, release: Release, s3_server: Any) -> Iterator[Cluster]:
    node = node_kuberay
    node.import_image(images_archive("ray-worker"))
    cp = node.cp
    cp.ensure_namespace(NS)
    ip = node.host_service(NS, "minio", s3_server.port)
    assert ip
    cp.secret(NS, "provider", {"api-key": API_KEY})
    cp.secret(NS, "s3", {"accessKey": s3_server.access_key, "secretKey": s3_server.secret_key})
    labels = {"app": "sim"}
    cp.create(DEPLOYMENTS, NS, {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "sim"},
                                "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
                                    "metadata": {"labels": labels}, "spec": {"containers": [{
                                        "name": "sim", "image": RAY_IMAGE,
                                        "command": ["eyrie", "simulate", "--host", "0.0.0.0", "--port",
                                                    str(SIM_PORT), "--latency-ms", "20"],
                                        "ports": [{"containerPort": SIM_PORT}],
                                        "readinessProbe": {"httpGet": {"path": "/sim/stats", "port": SIM_PORT},
                                                           "periodSeconds": 2}}]}}}})
    cp.create(("", "v1", "services"), NS, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "sim"},
                                           "spec": {"selector": labels, "ports": [{"port": SIM_PORT}]}})
    cp.kubectl("rollout", "status", "-n", NS, "deployment/sim", "--timeout=180s", check=True)
    yield Cluster(node, release, s3_server, f"http://minio.{NS}.svc:{s3_server.port}")
    cp.delete(("", "v1", "namespaces"), "", NS)


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
        "api": {"baseUrl": f"http://sim.{NS}.svc:{SIM_PORT}/v1", "apiKeySecretRef": {"name": "provider",
                                                                                     "key": "api-key"},
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
    return [p for p in cluster.cp.list(PODS, NS) if ours(p)]


def delete_and_wait(cluster: Cluster, name: str) -> None:
    """`kubectl delete dsg`: the operator lets it go, the garbage collector takes every child and pod."""
    cluster.cp.kubectl("delete", "dsg", name, "-n", NS, "--wait=true", "--timeout=120s", check=True)
    cluster.wait(name, "every pod and child gone", lambda: not eyrie_pods(cluster, name) and not [
        d for res in (RAYJOBS, RAYCLUSTERS, JOBS, CONFIGMAPS) for d in cluster.cp.list(res, NS)
        if d["metadata"]["name"].startswith(f"{name}-")], timeout=240)


@pytest.fixture(autouse=True)
def nothing_left(cluster: Cluster) -> Iterator[None]:
    """A test that failed midway leaves no run behind: its Ray pods (kept ttlSecondsAfterFinished after a success)
    would hold the node's CPUs from the next test's."""
    yield
    for doc in cluster.cp.list(DSG, NS):
        delete_and_wait(cluster, doc["metadata"]["name"])


def test_a_run_in_real_pods_oomkilled_extraction_then_recreated_to_succeeded_paying_nothing_twice(
        cluster: Cluster) -> None:
    """Generation in the Ray pods; the first extraction's pods get too little memory and are OOMKilled, which
    fails the run naming the limit; deleting it removes every pod; the same spec with the memory raised, applied
    again, pays the provider nothing more and ends Succeeded with its manifest and report."""
    cp, n = cluster.cp, 8
    cluster.node.import_image(images_archive("extractor-cpu"))
    bucket = bucket_with_prompts(cluster, n)
    extraction = {"enabled": True, "engine": "transformers", "model": "builtin:tiny-llama", "image": EXTRACTOR_IMAGE,
                  "pods": 2, "gpusPerPod": 0, "device": "cpu", "dtype": "float32"}
    before = cluster.sim_stats()
    cp.create(DSG, NS, dsg("full", spec(cluster, bucket, extraction={**extraction, "memory": "48Mi"})))
    cluster.wait("full", "a head and a worker pod from the Ray worker image", lambda: {
        p["metadata"]["labels"].get("ray.io/node-type") for p in eyrie_pods(cluster, "full")
        if p["spec"]["containers"][0]["image"] == RAY_IMAGE} >= {"head", "worker"}, timeout=180)
    cluster.wait("full", "Failed", cluster.phase_is("full", "Failed", "Succeeded"), timeout=900)
    failed = cluster.condition("full", "Failed")
    assert failed is not None and failed["reason"] == "OOMKilled", cluster.diagnose("full")
    assert "out of memory at its limit of 48Mi: raise spec.extraction.memory" in failed["message"]
    assert f"s3://{bucket}/run is kept" in failed["message"] and "same spec.output.uri" in failed["message"]
    assert ("Warning", "OOMKilled") in {(e["type"], e["reason"]) for e in cp.events(NS, "full")}
    rj = cp.get(RAYJOBS, NS, "full-gen-1")
    assert rj["status"]["jobStatus"] == "SUCCEEDED"  # KubeRay's word, read from the head's dashboard
    owner = rj["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "DatasetGeneration", "full", cp.get(DSG, NS, "full")["metadata"]["uid"], True)
    # the API key stays in its Secret: not in the spec the pods mount, not in the status
    assert API_KEY not in json.dumps(cp.get(CONFIGMAPS, NS, "full-spec")) and API_KEY not in json.dumps(
        cluster.status("full"))
    paid = cluster.sim_stats()
    assert paid["completed"] - before["completed"] == n
    billed = Decimal(paid["billedUSD"]) - Decimal(before["billedUSD"])
    spent = Decimal(cluster.status("full")["spentUSD"])
    assert spent == Decimal(brief(billed)) and billed > 0  # the status shows at most 6 decimals, rounded up
    assert Decimal(json.loads(cluster.store(bucket).get(layout.PROGRESS))["spentUSD"]) == billed
    delete_and_wait(cluster, "full")

    cp.kubectl("apply", "-f", "-", stdin=json.dumps(dsg("full", spec(cluster, bucket, extraction=extraction))),
               namespace=NS, check=True)  # what a user runs: kubectl apply
    cluster.wait("full", "Succeeded", cluster.phase_is("full", "Succeeded", "Failed"), timeout=900)
    st = cluster.status("full")
    assert st["phase"] == "Succeeded", cluster.diagnose("full")
    assert cp.kubectl("get", "dsg", "full", "-n", NS, "--no-headers", check=True).stdout.split()[:2] == [
        "full", "Succeeded"]
    after = cluster.sim_stats()
    assert after["completed"] == paid["completed"] and after["billedUSD"] == paid["billedUSD"]  # nothing paid twice
    assert Decimal(st["spentUSD"]) == spent and st["samples"]["done"] == n
    # the Job controller counts the pods' ends on its own time: the operator may have read the pods' summaries first
    cluster.wait("full", "the extraction Job's 2 pods succeeded", lambda: (
        cp.get(JOBS, NS, "full-extract").get("status") or {}).get("succeeded") == 2, timeout=60)
    succeeded = cluster.condition("full", "Succeeded")
    assert succeeded is not None and succeeded["status"] == "True"
    assert "Succeeded" in [e["reason"] for e in cp.events(NS, "full")]
    assert 'eyrie_datasetgenerations{phase="Succeeded"} 1.0' in cluster.release.metrics()
    extract_pods = [p for p in eyrie_pods(cluster, "full") if p["metadata"]["labels"].get(
        "batch.kubernetes.io/job-name") == "full-extract"]
    assert {p["spec"]["containers"][0]["image"] for p in extract_pods} == {EXTRACTOR_IMAGE}
    assert {p["status"]["phase"] for p in extract_pods} == {"Succeeded"}
    store = cluster.store(bucket)
    manifest = json.loads(store.get(layout.MANIFEST))
    assert st["outputManifest"] == store.url(layout.MANIFEST)
    # every shard the pods wrote, listed: both generation shards' parts and samples, each hidden-state file the
    # extraction pods wrote, both shards' fidelity scores
    files, shards = manifest["files"], [0, 1]  # spec.generation.shards: 2
    assert sorted({layout.parse_part_key(k)[0] for k in files["generations"]}) == shards
    assert sorted(files["samples"]) == [layout.samples_key(s) for s in shards]
    assert sorted(files["fidelity"]) == [layout.fidelity_key(s) for s in shards] == sorted(store.list("fidelity/"))
    hidden = sorted(k for k in store.list(f"{layout.HIDDEN}/") if "summary-" not in k)
    assert sorted(files["hidden"]) == hidden
    assert {shards_.index_key(s) for s in shards} | {shards_.part_key(s, 0) for s in shards} <= set(hidden)
    assert manifest["extraction"]["pods"] == 2 and manifest["extraction"]["bytes"] > 0
    assert st["extraction"] == {"shardsDone": 2, "shardsTotal": 2, "bytes": manifest["extraction"]["bytes"]}
    assert manifest["extraction"]["samples"] == manifest["reconstruction"]["samples"]["kept"] > 0
    assert json.loads(store.get(layout.PROGRESS))["stage"] == "done"
    assert manifest["fidelity"]["overall"]["samples"] == manifest["extraction"]["samples"] > 0
    assert st["outputReport"] == store.url(layout.REPORT)
    page = store.get(layout.REPORT).decode()
    assert "transformers / float32" in page and "fidelity: the answers scored by " in page
    ids = [r["sample_id"] for r in records.iter_records(store)]
    assert len(ids) == len(set(ids)) == n
    delete_and_wait(cluster, "full")


def test_budget_exhaustion_suspends_removing_the_ray_pods_and_a_raised_budget_resumes_paying_nothing_twice(
        cluster: Cluster) -> None:
    cp, n = cluster.cp, 30
    bucket = bucket_with_prompts(cluster, n)
    before = cluster.sim_stats()
    cp.create(DSG, NS, dsg("budget", spec(cluster, bucket, max_usd="0.003")))  # 30 answers cost about 0.008
    cluster.wait("budget", "Suspended", cluster.phase_is("budget", "Suspended", "Failed", "Succeeded"), timeout=600)
    cond = cluster.condition("budget", "Suspended")
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", "BudgetExceeded"), \
        cluster.diagnose("budget")
    assert cp.get(DSG, NS, "budget")["spec"]["suspend"] is True
    cluster.wait("budget", "the Ray pods gone", lambda: not eyrie_pods(cluster, "budget"), timeout=300)
    spent1 = Decimal(cluster.status("budget")["spentUSD"])
    said = re.match(r"spent \$?([0-9.]+)", cond["message"])
    assert said and Decimal(said[1]) <= spent1, cond["message"]  # what was spent when it stopped; in flight after
    assert f"of the {dollars(Decimal('0.003'))} budget (spec.budget.maxUSD); raise spec.budget.maxUSD" in cond[
        "message"]
    assert [(e["reason"], e["message"]) for e in cp.events(NS, "budget") if e["type"] == "Warning"] == [
        ("BudgetExceeded", cond["message"])]
    done1 = cluster.status("budget")["samples"]["done"]
    assert 0 < done1 < n

    cp.patch(DSG, NS, "budget", {"spec": {"budget": {"maxUSD": "5.00"}, "suspend": False}})
    cluster.wait("budget", "Succeeded", cluster.phase_is("budget", "Succeeded", "Failed"), timeout=600)
    st = cluster.status("budget")
    assert (st["phase"], st["attempt"]) == ("Succeeded", "2"), cluster.diagnose("budget")
    after = cluster.sim_stats()
    assert after["completed"] - before["completed"] == n  # every prompt paid once over both attempts
    billed = Decimal(after["billedUSD"]) - Decimal(before["billedUSD"])
    assert Decimal(st["spentUSD"]) == Decimal(brief(billed)) and billed > spent1
    assert Decimal(json.loads(cluster.store(bucket).get(layout.PROGRESS))["spentUSD"]) == billed
    ids = [r["sample_id"] for r in records.iter_records(cluster.store(bucket))]
    assert len(ids) == len(set(ids)) == n
    resumed = cluster.condition("budget", "Suspended")
    assert (resumed["status"], resumed["reason"]) == ("False", "Resumed")
    assert 'eyrie_suspensions_total{reason="BudgetExceeded"} 1.0' in cluster.release.metrics()
    delete_and_wait(cluster, "budget")


def test_a_missing_secret_and_an_image_not_on_the_node_say_which_and_what_to_do(cluster: Cluster) -> None:
    cp = cluster.cp
    bucket = bucket_with_prompts(cluster, 4)
    before = cluster.sim_stats()
    body = spec(cluster, bucket)
    body["api"]["apiKeySecretRef"] = {"name": "provider-late", "key": "api-key"}
    body["generation"]["ray"]["image"] = "ghcr.io/eyrie-dev/eyrie-ray-worker:9.9.9"  # on no node, in no registry
    cp.create(DSG, NS, dsg("bad", body))
    cluster.wait("bad", "SecretsReady=False", lambda: (cluster.condition("bad", "SecretsReady") or {}).get(
        "reason") == "SecretNotFound", timeout=60)
    secret = cluster.condition("bad", "SecretsReady")
    assert secret["message"] == "spec.api.apiKeySecretRef: Secret 'provider-late' not found in namespace 'e2e'"
    assert [(e["type"], e["message"]) for e in cp.events(NS, "bad") if e["reason"] == "SecretNotFound"] == [
        ("Warning", secret["message"])]
    assert cp.get(RAYJOBS, NS, "bad-gen-1") is None  # nothing starts without its Secret

    cp.secret(NS, "provider-late", {"api-key": API_KEY})  # the Secret appears: the run starts, its image is absent
    cluster.wait("bad", "PodsHealthy=False", lambda: (cluster.condition("bad", "PodsHealthy") or {}).get(
        "status") == "False", timeout=240)
    pods = cluster.condition("bad", "PodsHealthy")
    assert pods["reason"] == "ImagePullFailed", pods
    assert "image ghcr.io/eyrie-dev/eyrie-ray-worker:9.9.9 cannot be pulled" in pods["message"]
    assert "spec.generation.ray.image" in pods["message"]
    # the kubelet retries the pull, alternating ErrImagePull and ImagePullBackOff: the run's Warning events follow
    # the problem (a pod more, say), not each retry, so no message comes twice
    head = next(p["metadata"]["name"] for p in eyrie_pods(cluster, "bad")
                if p["metadata"]["labels"].get("ray.io/node-type") == "head")
    cluster.wait("bad", "the kubelet's second back-off on the head pod", lambda: sum(
        e.get("count") or 1 for e in cp.events(NS, head) if e["reason"] == "BackOff") >= 2, timeout=180)
    said = [e for e in cp.events(NS, "bad") if e["reason"] == "ImagePullFailed"]
    assert said and {e["type"] for e in said} == {"Warning"}
    assert all("cannot be pulled" in e["message"] and "spec.generation.ray.image" in e["message"] for e in said)
    assert len({e["message"] for e in said}) == len(said), [e["message"][:300] for e in said]
    assert cluster.status("bad")["phase"] == "Pending"
    assert cluster.sim_stats()["completed"] == before["completed"]  # nothing was paid
    delete_and_wait(cluster, "bad")


def test_helm_uninstall_keeps_the_crd_and_the_users_objects(cluster: Cluster) -> None:
    cp, release = cluster.cp, cluster.release
    cp.create(DSG, NS, dsg("kept", spec(cluster, "nowhere", suspend=True)))
    cluster.wait("kept", "the operator's first pass", lambda: cluster.status("kept").get("phase"), timeout=60)
    release.uninstall()
    try:
        assert cp.get(("apiextensions.k8s.io", "v1", "customresourcedefinitions"), "",
                      "datasetgenerations.eyrie.dev") is not None
        kept = cp.get(DSG, NS, "kept")
        assert kept is not None and kept["status"]["phase"] == "Suspended"
        assert cp.list(PODS, release.namespace) == [] or all(
            p["metadata"].get("deletionTimestamp") for p in cp.list(PODS, release.namespace))
    finally:
        cp.patch(DSG, NS, "kept", {"metadata": {"finalizers": None}})  # nobody else removes kopf's finalizer now
        cp.delete(DSG, NS, "kept")
        release.install()  # as it was for the tests after this one
