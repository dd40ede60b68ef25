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

import json
import re
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from eyrie.jobs.contract import layout, records
from eyrie.jobs.contract.money import brief, dollars
from eyrie.jobs.extract import shards as shards_

from .conftest import API_KEY, Release, dsg
from .node import Node, images_archive
from .node_runs import (
    EXTRACTOR_IMAGE,
    RAY_IMAGE,
    Cluster,
    bucket_with_prompts,
    delete_and_wait,
    delete_every_run,
    eyrie_pods,
    running_cluster,
    spec,
)
from .testbed import CONFIGMAPS, DSG, JOBS, PODS, RAYJOBS

NS = "e2e"


@pytest.fixture(scope="module")
def cluster(node_kuberay: Node, release: Release, s3_server: Any) -> Iterator[Cluster]:
    with running_cluster(node_kuberay, release, s3_server, NS, latency_ms=20) as c:
        yield c


@pytest.fixture(autouse=True)
def nothing_left(cluster: Cluster) -> Iterator[None]:
    yield
    delete_every_run(cluster)


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
    # KubeRay's word, read from the head's dashboard on its own time: the operator moves on when progress.json
    # says Done, which may be before KubeRay's next poll of a loaded head
    cluster.wait("full", "KubeRay's jobStatus SUCCEEDED", lambda: (
        cp.get(RAYJOBS, NS, "full-gen-1").get("status") or {}).get("jobStatus") == "SUCCEEDED", timeout=120)
    rj = cp.get(RAYJOBS, NS, "full-gen-1")
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
