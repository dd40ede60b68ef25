"""Faults during a real run on the node (issue 35 item 1): the operator from the chart, KubeRay's head and worker
pods from the Ray worker image, the simulator as a Deployment, the host's MinIO as a Service (node_runs.py). Each
test starts a DatasetGeneration, lets the provider answer some of its prompts, breaks one thing a cluster breaks
(a pod deleted, the operator's pod deleted, the store stopped for 30 s, the kubelet or containerd restarted, the
run deleted or suspended meanwhile), and then checks what a user's money and data need, whatever eyrie did about
it: the run Succeeded (resumed where the test suspends it); every prompt persisted exactly once; the provider paid
again at most for the requests in flight when it broke; the booked spend (progress.json, the status) never below
the provider's own bill and at most that plus the in-flight worst cases; never two RayJobs of a run at once; and
the DatasetGeneration's status and events saying what happened. Who retries what is docs/architecture.md's
"When a pod, the operator or the store goes mid-run"."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest

from eyrie.jobs.contract import layout, records
from eyrie.jobs.contract.money import brief
from eyrie.jobs.generate.budget.pricing import Pricing, worst_case

from .conftest import dsg
from .node import images_archive
from .node_runs import (
    EXTRACTOR_IMAGE,
    PRICING,
    Cluster,
    bucket_with_prompts,
    delete_and_wait,
    delete_every_run,
    eyrie_pods,
    ray_pod,
    running_cluster,
    spec,
)
from .testbed import DSG, JOBS, PODS, RAYJOBS

NS = "faults"
N = 40  # prompts per run: 20 s of answers at 4 in flight and 2 s each, so every fault lands mid-generation
CONCURRENCY = 4  # node_runs.spec's api.maxConcurrency, one Ray worker
MAX_USD = Decimal("5.00")
# a request's worst case, as the run reserves it: 200 prompt tokens, far more than these one-sentence prompts
# render to, and at most maxTokens (256) out
WORST = worst_case(Pricing(Decimal(PRICING["inputPerMillion"]), Decimal(PRICING["outputPerMillion"])), 200, 256)


@pytest.fixture(scope="module")
def cluster(node_kuberay: Any, release: Any, s3_server: Any) -> Iterator[Cluster]:
    with running_cluster(node_kuberay, release, s3_server, NS, latency_ms=2000) as c:
        yield c


@pytest.fixture(autouse=True)
def nothing_left(cluster: Cluster) -> Iterator[None]:
    cluster.sim_reset()  # each test's figures (maxInFlight too) are its own
    yield
    if cluster.s3.proc.poll() is not None:  # a test that failed while the store was stopped
        cluster.s3.start()
    delete_every_run(cluster)


@dataclass
class Run:
    cluster: Cluster
    name: str
    bucket: str
    rayjobs_at_once: int = 0  # the most RayJobs of this run that existed at one time (deleting ones included)

    def start(self, **extra: Any) -> Run:
        self.cluster.cp.create(DSG, NS, dsg(self.name, spec(self.cluster, self.bucket, max_usd=str(MAX_USD),
                                                            **extra)))
        return self

    def answered(self, k: int, timeout: float = 300) -> None:
        """Returns once the provider has answered `k` of the run's prompts: generation is under way."""
        self.cluster.wait(self.name, f"{k} answers", lambda: self.cluster.sim_stats()["completed"] >= k,
                          timeout=timeout, every=0.25)

    def delete_ray_pod(self, node_type: str) -> None:
        """Deletes the run's running Ray pod of `node_type` (head, worker), as a drain or an eviction does."""
        pod = ray_pod(self.cluster, self.name, node_type)
        assert pod is not None, self.cluster.diagnose(self.name)
        self.cluster.cp.delete(PODS, NS, pod["metadata"]["name"])

    def rayjobs(self) -> list[dict[str, Any]]:
        return [d for d in self.cluster.cp.list(RAYJOBS, NS) if d["metadata"]["name"].startswith(f"{self.name}-gen-")]

    @contextlib.contextmanager
    def watched(self) -> Iterator[None]:
        """Counts the run's RayJobs every half second while the block runs (a second job paying at once would show
        as two)."""
        done = threading.Event()

        def count() -> None:
            while not done.wait(0.5):
                with contextlib.suppress(Exception):  # an API call that failed mid-fault: the next one counts
                    self.rayjobs_at_once = max(self.rayjobs_at_once, len(self.rayjobs()))

        t = threading.Thread(target=count, daemon=True)
        t.start()
        try:
            yield
        finally:
            done.set()
            t.join()

    def ends(self, *phases: str, timeout: float = 900) -> dict[str, Any]:
        self.cluster.wait(self.name, f"one of {phases}", self.cluster.phase_is(self.name, *phases, "Failed"),
                          timeout=timeout, every=0.5)
        st = self.cluster.status(self.name)
        assert st["phase"] in phases, self.cluster.diagnose(self.name)
        return st

    def events(self) -> list[tuple[str, str]]:
        return [(e["type"], e["reason"]) for e in self.cluster.events(self.name)]

    def check_money_and_data(self, stops: int = 1) -> dict[str, Any]:
        """Every prompt persisted once; re-paid at most the requests in flight at each of `stops` stops; booked
        between the provider's bill and the bill plus those requests' worst cases; the status says the same."""
        st = self.cluster.status(self.name)
        store = self.cluster.store(self.bucket)
        ids = [r["sample_id"] for r in records.iter_records(store)]
        assert len(ids) == len(set(ids)) == N, (len(ids), len(set(ids)))
        assert st["samples"]["done"] == N
        paid = self.cluster.sim_stats()
        assert N <= paid["completed"] <= N + stops * CONCURRENCY, paid
        billed = Decimal(paid["billedUSD"])
        booked = Decimal(json.loads(store.get(layout.PROGRESS))["spentUSD"])
        assert billed <= booked <= billed + stops * CONCURRENCY * WORST, (billed, booked)
        assert booked <= MAX_USD
        assert Decimal(st["spentUSD"]) == Decimal(brief(booked))
        return paid


def new_run(cluster: Cluster, name: str) -> Run:
    return Run(cluster, name, bucket_with_prompts(cluster, N))


def test_a_deleted_ray_worker_pod_is_replaced_and_its_shards_finished_by_the_same_rayjob(cluster: Cluster) -> None:
    """A drained or evicted worker: KubeRay makes another pod, the driver another shard worker on it; the same
    RayJob and attempt finish the run, which says a worker was lost."""
    run = new_run(cluster, "worker").start()
    with run.watched():
        run.answered(6)
        run.delete_ray_pod("worker")
        st = run.ends("Succeeded")
    assert st["attempt"] == "1" and "retries" not in st, cluster.diagnose("worker")
    assert st["disruptions"]["workersLost"] >= 1, st
    assert ("Warning", "WorkerLost") in run.events()
    assert [d["metadata"]["name"] for d in run.rayjobs()] == ["worker-gen-1"] and run.rayjobs_at_once == 1
    run.check_money_and_data()
    delete_and_wait(cluster, "worker")


def test_a_deleted_ray_head_pod_is_resumed_under_the_operators_control_never_two_jobs_paying(
        cluster: Cluster) -> None:
    """The head goes with the driver and the coordinator. Either KubeRay submits the same job again to the new head
    (same RayJob and attempt: GenerationRestarted) or it gives up on the RayJob and the operator deletes it and
    retries as attempt 2 once it is gone (GenerationRetried); never two RayJobs at once, nothing paid twice beyond
    the requests in flight."""
    run = new_run(cluster, "head").start()
    with run.watched():
        run.answered(6)
        run.delete_ray_pod("head")
        st = run.ends("Succeeded")
    events = run.events()
    print(f"head pod deleted: attempt {st['attempt']}, disruptions {st.get('disruptions')}, retries "
          f"{st.get('retries')}, events {[r for _, r in events]}")
    if st["attempt"] == "1":  # KubeRay's submitter resubmitted: the job found its attempt and counted a restart
        assert st["disruptions"]["restarts"] >= 1, st
        assert "GenerationRestarted" in {reason for _, reason in events}, events
    else:  # the operator's retry
        assert (st["attempt"], st["retries"]) == ("2", 1), st
        assert ("Warning", "GenerationRetried") in events, events
        assert [d["metadata"]["name"] for d in run.rayjobs()] == ["head-gen-2"]
    assert run.rayjobs_at_once == 1, "two RayJobs of one run existed at once"
    assert cluster.sim_stats()["maxInFlight"] <= CONCURRENCY  # never two jobs sending at once
    run.check_money_and_data()
    delete_and_wait(cluster, "head")


def test_a_deleted_operator_pod_is_replaced_and_the_new_one_adopts_the_run(cluster: Cluster) -> None:
    """The Deployment's new pod finds the run's RayJob by its name and attempt: no second RayJob, no status lost."""
    run = new_run(cluster, "adopted").start()
    with run.watched():
        run.answered(6)
        old = cluster.release.pod()
        cluster.cp.delete(PODS, cluster.release.namespace, old["metadata"]["name"])
        new = cluster.release.pod()
        assert new["metadata"]["uid"] != old["metadata"]["uid"]
        st = run.ends("Succeeded")
    assert st["attempt"] == "1" and "retries" not in st, st
    assert [d["metadata"]["name"] for d in run.rayjobs()] == ["adopted-gen-1"] and run.rayjobs_at_once == 1
    assert cluster.sim_stats()["maxInFlight"] <= CONCURRENCY
    assert run.check_money_and_data(stops=0)["completed"] == N  # the operator's pod sends nothing: paid once
    delete_and_wait(cluster, "adopted")


@contextlib.contextmanager
def store_down(cluster: Cluster, seconds: float = 30) -> Iterator[None]:
    """MinIO stopped for `seconds` from the block's start (its pod restarting, as its clients see it)."""
    t0 = time.monotonic()
    cluster.s3.stop()
    try:
        yield
        time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
    finally:
        cluster.s3.start()


def said_it_waited(run: Run) -> None:
    """The operator says once that the output was unreachable, and once that it is readable again."""
    events = run.events()
    assert events.count(("Warning", "OutputUnreachable")) == 1, events
    assert ("Normal", "OutputReadable") in events, events
    assert (run.cluster.condition(run.name, "OutputReachable") or {}).get("status") == "True"


def test_the_store_stopped_for_30_s_mid_generation_costs_a_pause_not_the_run(cluster: Cluster) -> None:
    """Writers retry within their 60 s; nothing acknowledged is lost; the run says it waited."""
    run = new_run(cluster, "storegen").start()
    with run.watched():
        run.answered(6)
        with store_down(cluster):
            cluster.wait("storegen", "the operator to see the store gone", lambda: (cluster.condition(
                "storegen", "OutputReachable") or {}).get("status") == "False", timeout=25, every=0.5)
        st = run.ends("Succeeded")
    assert st["attempt"] == "1", st
    said_it_waited(run)
    run.check_money_and_data(stops=0)
    delete_and_wait(cluster, "storegen")


def test_the_store_stopped_for_30_s_mid_extraction_costs_a_pause_not_the_run(cluster: Cluster) -> None:
    """The extraction pod's reads and writes retry; every hidden-state file is written and listed."""
    cluster.node.import_image(images_archive("extractor-cpu"))
    run = new_run(cluster, "storeext").start(extraction={
        "enabled": True, "engine": "transformers", "model": "builtin:tiny-llama", "image": EXTRACTOR_IMAGE,
        "pods": 1, "gpusPerPod": 0, "device": "cpu", "dtype": "float32"})

    def extracting() -> bool:
        return any(p["status"].get("phase") in ("Pending", "Running") for p in cluster.cp.list(
            PODS, NS, labelSelector="batch.kubernetes.io/job-name=storeext-extract"))

    cluster.wait("storeext", "the extraction pod", extracting, timeout=600, every=0.25)
    [pod] = cluster.cp.list(PODS, NS, labelSelector="batch.kubernetes.io/job-name=storeext-extract")

    def log() -> str:
        return cluster.cp.kubectl("logs", "-n", NS, pod["metadata"]["name"]).stdout

    with store_down(cluster):  # until the pod has met it (its first store call), and 30 s at least
        cluster.wait("storeext", "the extraction pod waiting for the store", lambda: "waiting for the store" in log(),
                     timeout=50, every=0.5)
    st = run.ends("Succeeded")
    said_it_waited(run)
    assert "the store answered again after" in log(), log()[-3000:]
    assert (cluster.cp.get(JOBS, NS, "storeext-extract").get("status") or {}).get("failed") in (None, 0)
    store = cluster.store(run.bucket)
    manifest = json.loads(store.get(layout.MANIFEST))
    assert sorted(manifest["files"]["hidden"]) == sorted(k for k in store.list(f"{layout.HIDDEN}/")
                                                         if "summary-" not in k)
    assert manifest["extraction"]["samples"] == manifest["reconstruction"]["samples"]["kept"] > 0
    assert st["extraction"] == {"shardsDone": 1, "shardsTotal": 1, "bytes": manifest["extraction"]["bytes"]}
    run.check_money_and_data(stops=0)
    delete_and_wait(cluster, "storeext")


@pytest.mark.parametrize("restart", ["kubelet", "containerd"])
def test_the_node_agent_restarted_mid_run_leaves_the_pods_and_the_run_running(cluster: Cluster, restart: str) -> None:
    """`systemctl restart kubelet` (or containerd) under a running job: the containers keep running, the agent
    finds them again; the same RayJob finishes and nothing is paid twice."""
    name = f"restart-{restart}"
    run = new_run(cluster, name).start()
    with run.watched():
        run.answered(6)
        away = getattr(cluster.node, f"restart_{restart}")()
        assert away < 60
        st = run.ends("Succeeded")
    assert st["attempt"] == "1" and "retries" not in st, st
    assert run.rayjobs_at_once == 1
    run.check_money_and_data(stops=0)
    delete_and_wait(cluster, name)


def test_kubectl_delete_mid_run_takes_the_children_keeps_the_output_and_the_same_spec_resumes(
        cluster: Cluster) -> None:
    """The children and pods go with the DatasetGeneration; what was paid for stays in the output, and applying
    the same spec again asks the provider only for the rest (and the requests in flight at the delete)."""
    run = new_run(cluster, "deleted").start()
    run.answered(10)
    delete_and_wait(cluster, "deleted")
    store = cluster.store(run.bucket)
    kept = {r["sample_id"] for r in records.iter_records(store)}
    assert 0 < len(kept) < N and json.loads(store.get(layout.PROGRESS))["attempt"] == "1"
    run.start()
    with run.watched():
        run.ends("Succeeded")
    assert kept <= {r["sample_id"] for r in records.iter_records(store)}
    run.check_money_and_data(stops=1)
    delete_and_wait(cluster, "deleted")


def test_suspend_during_a_store_outage_then_resume(cluster: Cluster) -> None:
    """`kubectl patch` suspend while the store is down: the driver drains into a store that comes back, the Ray pods
    leave within seconds of the job's end, the run says Suspended; unsuspended, attempt 2 finishes the rest."""
    run = new_run(cluster, "paused").start()
    with run.watched():
        run.answered(6)
        with store_down(cluster):
            cluster.cp.patch(DSG, NS, "paused", {"spec": {"suspend": True}})
        run.ends("Suspended", timeout=300)
        # the job drains into the store that came back and ends Stopped; then the operator deletes its RayJob, and
        # the pods, holding nothing, leave at once (they took 45-49 s with Ray's default node drain on SIGTERM)
        cluster.wait("paused", "the stopped attempt's RayJob deleted", lambda: all(
            d["metadata"].get("deletionTimestamp") for d in run.rayjobs()), timeout=300, every=0.25)
        deleted = time.monotonic()
        cluster.wait("paused", "the Ray pods gone", lambda: not eyrie_pods(cluster, "paused"), timeout=120,
                     every=0.25)
        released = time.monotonic() - deleted
        print(f"the Ray pods left {released:.1f} s after their RayJob's deletion")
        assert released < 15, f"the Ray pods took {released:.1f} s to leave after their RayJob was deleted"
        done = cluster.status("paused")["samples"]["done"]
        assert 0 < done < N
        cluster.cp.patch(DSG, NS, "paused", {"spec": {"suspend": False}})
        st = run.ends("Succeeded")
    assert st["attempt"] == "2", st
    said_it_waited(run)
    run.check_money_and_data(stops=1)
    delete_and_wait(cluster, "paused")

