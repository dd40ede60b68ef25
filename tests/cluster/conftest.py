"""Fixtures of the real control plane (testbed.py): one per test session, the chart installed by Helm, the
real KubeRay operator; and the real `eyrie operator` process running against it with the chart's ServiceAccount."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import httpx
import pytest
import yaml

from ..conftest import S3_SECRET_KEY
from .node import Node, busybox_image, images_archive, install_kuberay, running_node
from .testbed import (
    CONFIGMAPS,
    DSG,
    JOBS,
    PODS,
    RAYCLUSTERS,
    RAYJOBS,
    REPO,
    SECRETS,
    ControlPlane,
    KubeRay,
    free_port,
    kuberay_crds,
    running_control_plane,
    wait_for,
)

CHART = REPO / "charts" / "eyrie"
OPERATOR_NS = "eyrie-system"
RELEASE = "eyrie"


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with running_control_plane(tmp_path_factory.mktemp("testbed")) as cp:
        sys.stderr.write(f"\ntestbed: etcd + kube-apiserver + kube-controller-manager ready in {cp.started_in:.1f}s\n")
        yield cp


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A real node (node.py: containerd, kubelet, kube-proxy, CoreDNS, kube-scheduler) on a control plane of its
    own: the tests that play the kubelet's part (Player) keep `control_plane`, where no pod ever runs."""
    with running_node(tmp_path_factory.mktemp("node-testbed"), images=[busybox_image()[1]]) as n:
        sys.stderr.write(f"\ntestbed: control plane for a node in {n.cp.started_in:.1f}s, node Ready and its "
                         f"services up in {n.started_in:.1f}s\n")
        yield n


@pytest.fixture(scope="session")
def node_kuberay(node: Node) -> Node:
    """KubeRay deployed on the node as its release deploys it (node.install_kuberay)."""
    install_kuberay(node)
    return node


RESTRICTED = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "audit", "warn")}
# The node's release polls each DatasetGeneration every second (the chart's `operator.interval`, default 5 s), as
# the operator the other end-to-end tests run as a process polls every 0.5 s: every step of a run the operator
# follows (RayJob finished -> extraction Job -> Succeeded; a suspension; a resume) otherwise waits a 5-s poll.
NODE_RELEASE_VALUES: dict[str, Any] = {"operator": {"interval": 1}}


@dataclass(frozen=True)
class Release:
    """The chart installed by Helm's install action on the node's control plane: the operator runs as the pod of
    its Deployment."""

    node: Node
    namespace: str = OPERATOR_NS
    name: str = RELEASE

    def helm(self) -> AbstractContextManager[helm.Config]:
        return self.node.cp.helm(self.namespace)

    def install(self, values: dict[str, Any] | None = None) -> None:
        with self.helm() as cfg:  # what `helm install --wait` does: returns once the Deployment is available
            cfg.install(CHART, self.name, {**NODE_RELEASE_VALUES, **(values or {})}, namespace=self.namespace,
                        wait="watcher", timeout=300)

    def uninstall(self) -> None:
        with self.helm() as cfg:
            cfg.uninstall(self.name, wait="watcher", timeout=120, ignore_not_found=True)

    def pod(self) -> dict[str, Any]:
        """The Deployment's one pod, Ready."""
        def ready() -> dict[str, Any] | None:
            pods = self.node.cp.list(PODS, self.namespace, labelSelector=f"app.kubernetes.io/instance={self.name}")
            live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
            return live[0] if len(live) == 1 and any(
                c["type"] == "Ready" and c["status"] == "True" for c in (live[0].get("status") or {}).get(
                    "conditions") or []) else None
        return wait_for("the operator's pod Ready", ready, timeout=180, every=0.5)

    def log(self) -> str:
        return self.node.cp.kubectl("logs", "-n", self.namespace, f"deploy/{self.name}").stdout

    def metrics(self) -> str:
        """The operator pod's /metrics, read at its address (the host routes the node's pods through the veth)."""
        return httpx.get(f"http://{self.pod()['status']['podIP']}:9090/metrics", timeout=10).text


@pytest.fixture(scope="session")
def release(node: Node) -> Iterator[Release]:
    """The operator image imported into the node, the chart installed by Helm (its CRD from crds/) into a namespace
    enforcing the restricted Pod Security Standard; uninstalled at the end."""
    node.import_image(images_archive("operator"))
    node.cp.create(("", "v1", "namespaces"), "", {"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": OPERATOR_NS, "labels": RESTRICTED}})
    rel = Release(node)
    rel.install()
    try:
        yield rel
    finally:
        log = rel.log()
        rel.uninstall()
        assert API_KEY not in log and S3_SECRET_KEY not in log, "a secret reached the operator's log"


@dataclass(frozen=True)
class Installed:
    """What `helm install` leaves behind that the tests use: the operator's ServiceAccount and its token."""

    namespace: str
    service_account: str
    token: str
    release: dict[str, Any]

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


def release_objects(release: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects a Helm release's manifest names (what `helm uninstall` removes; the CRD from crds/ is not one)."""
    return [d for d in yaml.safe_load_all(release["manifest"]) if d]


@pytest.fixture(scope="session")
def chart(control_plane: ControlPlane) -> Installed:
    """The chart installed with Helm's own install action (helm-python-sdk embeds Helm's Go SDK), not by applying
    rendered files: Helm creates the CRD from crds/, then the ServiceAccount, ClusterRole and binding, the metrics
    Service and the Deployment, and records the release. This control plane has no node, so the Deployment's pod never
    runs; the tests run the operator as a process with the ServiceAccount's token (the server enforces the chart's
    RBAC on it). Its namespace enforces the `restricted` Pod Security Standard, as the chart asks of clusters.
    tests/cluster/test_helm.py upgrades and uninstalls releases of its own."""
    control_plane.create(("", "v1", "namespaces"), "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": OPERATOR_NS, "labels": RESTRICTED}})
    with control_plane.helm(OPERATOR_NS) as client:
        release = client.install(CHART, RELEASE, timeout=120)
    assert release["status"] == "deployed", release
    [sa] = [d["metadata"]["name"] for d in release_objects(release) if d["kind"] == "ServiceAccount"]
    return Installed(OPERATOR_NS, sa, control_plane.service_account_token(OPERATOR_NS, sa), release)


@pytest.fixture(scope="session")
def kuberay(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeRay]:
    """KubeRay's CRDs (from the Go module cache) and the real KubeRay operator."""
    control_plane.apply_crds(*kuberay_crds())
    kr = KubeRay.start(control_plane, tmp_path_factory.mktemp("kuberay"))
    try:
        yield kr
    finally:
        kr.stop()


NS = "default"
API_KEY = "sk-or-v1-operator-e2e-key-0123456789abcdef"
SECRET_ENV = ("EYRIE_S3_ACCESS_KEY", "EYRIE_S3_SECRET_KEY", "EYRIE_S3_ENDPOINT", "EYRIE_API_KEY")


def clean_env() -> dict[str, str]:
    """The test's env without credentials: the operator and jobs must get them from Secrets."""
    return {k: v for k, v in os.environ.items() if k not in SECRET_ENV}


class OperatorProcess:
    """`eyrie operator` as the chart runs it, with the chart's ServiceAccount token in its kubeconfig."""

    def __init__(self, kubeconfig: Path, log: Path, interval: float = 0.5, stop_grace: float = 1.0,
                 extra: tuple[str, ...] = ()):
        self.kubeconfig, self.log_path, self.extra = kubeconfig, log, extra
        self.interval, self.stop_grace = interval, stop_grace
        self.metrics_port, self.liveness_port = free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        env = {**clean_env(), "KUBECONFIG": str(self.kubeconfig)}
        cmd = [sys.executable, "-m", "eyrie.jobs.cli", "operator", "--standalone",
               "--interval", str(self.interval), "--stop-grace", str(self.stop_grace),
               "--metrics-port", str(self.metrics_port), "--metrics-address", "127.0.0.1",
               "--liveness", f"http://127.0.0.1:{self.liveness_port}/healthz", *self.extra]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        wait_for("operator liveness", self.alive, timeout=90, every=0.2)
        return self

    def alive(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited {self.proc.returncode}:\n{self.log()[-3000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text

    def reconciled(self, namespace: str, name: str) -> bool:
        """This process has completed a full pass of the object: observed, acted, patched status (the budget gauge
        is its pass's last write)."""
        return f'eyrie_budget_usd{{name="{name}",namespace="{namespace}"}}' in self.metrics()

    def reconciles(self) -> float:
        """Reconcile passes this process has started, over all objects."""
        for line in self.metrics().splitlines():
            if line.startswith("eyrie_reconciles_total "):
                return float(line.split()[1])
        return 0.0

    def settled(self, name: str, namespace: str = "default") -> None:
        """Wait for a full pass of the object by this process: what it would change after a restart it has changed
        by then (a condition to wait on, not a guessed sleep)."""
        wait_for(f"a full reconcile pass of {namespace}/{name}", lambda: self.reconciled(namespace, name), timeout=60,
                 every=0.2)

    def kill(self) -> None:
        """SIGKILL: the crash a restart must survive."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class Player:
    """Plays what the testbed lacks: Ray itself and the kubelet. KubeRay and the Job controller are real: the player
waits for KubeRay to accept a RayJob (its RayCluster created), runs the entrypoint locally, then reports the Ray
job's end the way KubeRay does; for a Job it runs each pod the Job controller created and reports the pod's end."""

    def __init__(self, cluster: ControlPlane, workdir: Path):
        self.cluster, self.workdir = cluster, workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def _env(self, container: dict[str, Any]) -> dict[str, str]:
        env = clean_env()
        for e in container.get("env") or []:
            if "value" in e:
                env[e["name"]] = e["value"]
            elif "fieldRef" in e["valueFrom"]:  # JOB_COMPLETION_INDEX, added by the Job controller: set by run_job
                continue
            else:
                ref = e["valueFrom"]["secretKeyRef"]
                env[e["name"]] = self.cluster.secret_value(NS, ref["name"], ref["key"])
        return env

    def _spec_file(self, name: str) -> Path:
        cm = self.cluster.get(CONFIGMAPS, NS, name)
        assert cm is not None, f"ConfigMap {name} missing"
        path = self.workdir / f"{name}-{time.time_ns()}.yaml"
        path.write_text(cm["data"]["spec.yaml"])
        return path

    def rayjob(self, name: str, timeout: float = 20) -> dict[str, Any]:
        return wait_for(f"RayJob {name}", lambda: self.cluster.get(RAYJOBS, NS, name), timeout)

    def accepted(self, name: str, timeout: float = 60) -> dict[str, Any]:
        """The real KubeRay operator took the RayJob: it created the RayCluster, and never called the spec invalid."""
        def check() -> dict[str, Any] | None:
            rj = self.cluster.get(RAYJOBS, NS, name)
            status = (rj or {}).get("status") or {}
            assert status.get("jobDeploymentStatus") != "ValidationFailed", status
            cluster_name = status.get("rayClusterName")
            return rj if cluster_name and self.cluster.get(RAYCLUSTERS, NS, cluster_name) else None
        return wait_for(f"KubeRay to accept RayJob {name}", check, timeout)

    def _report(self, name: str, deployment: str, job: str, **times: str) -> None:
        self.cluster.patch(RAYJOBS, NS, name, {"status": {"jobDeploymentStatus": deployment, "jobStatus": job,
                                                          **times}}, sub="status")

    def start_rayjob(self, name: str) -> subprocess.Popen[bytes]:
        """Run the RayJob's entrypoint as its head would (workers inline: a one-process 'cluster')."""
        rj = self.accepted(name)
        head = rj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        container = head["containers"][0]
        cm_name = head["volumes"][0]["configMap"]["name"]
        argv = rj["spec"]["entrypoint"].split()
        assert argv[:3] == ["eyrie", "run", "/etc/eyrie/spec.yaml"], argv
        cmd = [sys.executable, "-m", "eyrie.jobs.cli", "run", str(self._spec_file(cm_name)), *argv[3:],
               "--no-progress", "--inline"]
        self._report(name, "Running", "RUNNING", startTime=_now())
        log = (self.workdir / f"{name}.log").open("ab")
        proc = subprocess.Popen(cmd, env=self._env(container), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=self.workdir)
        self.procs[name] = proc
        return proc

    def finish_rayjob(self, name: str, timeout: float = 40) -> int:
        """Wait for the job, then report what Ray would: SUCCEEDED on exit 0, else FAILED."""
        proc = self.procs[name]
        rc = proc.wait(timeout)
        ok = rc == 0
        if self.cluster.get(RAYJOBS, NS, name) is not None:
            self._report(name, "Complete" if ok else "Failed", "SUCCEEDED" if ok else "FAILED", endTime=_now())
        return rc

    def run_rayjob(self, name: str, timeout: float = 40) -> int:
        self.start_rayjob(name)
        return self.finish_rayjob(name, timeout)

    def on_deleted_sigterm(self, name: str, timeout: float = 20) -> int:
        """KubeRay tears the cluster down when the RayJob goes: the job's process gets SIGTERM."""
        wait_for(f"RayJob {name} deleted", lambda: self.cluster.get(RAYJOBS, NS, name) is None, timeout)
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        return proc.wait(30)

    def log(self, name: str) -> str:
        p = self.workdir / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    def pods(self, job: str, n: int) -> list[dict[str, Any]]:
        """The Job controller's pods of an Indexed Job, one per index (nothing schedules them: no kubelet)."""
        def created() -> list[dict[str, Any]] | None:
            pods = self.cluster.list(PODS, NS, labelSelector=f"batch.kubernetes.io/job-name={job}")
            return sorted(pods, key=_index) if len({_index(p) for p in pods}) == n else None
        return wait_for(f"the Job controller's {n} pods of Job {job}", created, timeout=60)

    def end_pod(self, pod: dict[str, Any], code: int) -> None:
        """Report a pod's end as its kubelet would: the Job controller counts it."""
        container = pod["spec"]["containers"][0]["name"]
        self.cluster.patch(PODS, NS, pod["metadata"]["name"], {"status": {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [{"name": container, "image": pod["spec"]["containers"][0]["image"], "imageID": "",
                                   "ready": False, "restartCount": 0,
                                   "state": {"terminated": {"exitCode": code, "startedAt": _now(),
                                                            "finishedAt": _now()}}}]}}, sub="status")

    def run_job(self, name: str, timeout: float = 60) -> list[int]:
        """Run every pod of an Indexed Job as the kubelet would (the index from the pod, as the Job controller set
        it), then report each pod's end; the real Job controller marks the Job complete."""
        job = wait_for(f"Job {name}", lambda: self.cluster.get(JOBS, NS, name))
        pods = self.pods(name, job["spec"]["completions"])
        spec_file = self._spec_file(pods[0]["spec"]["volumes"][0]["configMap"]["name"])
        procs = []
        for pod in pods:
            container, i = pod["spec"]["containers"][0], _index(pod)
            argv = [a.replace("$(JOB_COMPLETION_INDEX)", str(i)) for a in container["command"]]
            assert argv[:3] == ["eyrie", "extract", "/etc/eyrie/spec.yaml"], argv
            env = {**self._env(container), "JOB_COMPLETION_INDEX": str(i)}
            log = (self.workdir / f"{name}-{i}.log").open("ab")
            procs.append(subprocess.Popen([sys.executable, "-m", "eyrie.jobs.cli", "extract", str(spec_file),
                                           *argv[3:]], env=env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, cwd=self.workdir))
        codes = [p.wait(timeout) for p in procs]
        for pod, code in zip(pods, codes, strict=True):
            self.end_pod(pod, code)
        if all(c == 0 for c in codes):
            wait_for(f"Job {name} Complete", lambda: _job_condition(self.cluster.get(JOBS, NS, name), "Complete"))
        return codes

    def complete_job(self, name: str) -> None:
        """Every pod of the Job ends with exit 0 (their work staged by the test); the Job controller completes it."""
        job = wait_for(f"Job {name}", lambda: self.cluster.get(JOBS, NS, name))
        for pod in self.pods(name, job["spec"]["completions"]):
            self.end_pod(pod, 0)
        wait_for(f"Job {name} Complete", lambda: _job_condition(self.cluster.get(JOBS, NS, name), "Complete"))


def _index(pod: dict[str, Any]) -> int:
    return int(pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])


def _job_condition(job: dict[str, Any] | None, type_: str) -> bool:
    return any(c["type"] == type_ and c["status"] == "True" for c in ((job or {}).get("status") or {})
               .get("conditions") or [])


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def cluster(control_plane: ControlPlane, chart: Installed, kuberay: KubeRay) -> Iterator[ControlPlane]:
    """The session's control plane with the chart and KubeRay installed; what a test leaves in its namespace
    is deleted afterwards (the garbage collector takes the children)."""
    yield control_plane
    empty_namespace(control_plane, NS)


def empty_namespace(cp: ControlPlane, ns: str) -> None:
    for doc in cp.list(DSG, ns):
        name = doc["metadata"]["name"]
        if doc["metadata"].get("finalizers"):  # the operator is stopped: nobody else removes kopf's finalizer
            cp.patch(DSG, ns, name, {"metadata": {"finalizers": None}})
        cp.delete(DSG, ns, name)
    for s in cp.list(SECRETS, ns):
        if s.get("type") == "Opaque":
            cp.delete(SECRETS, ns, s["metadata"]["name"])
    wait_for(f"namespace {ns} emptied of DatasetGenerations", lambda: cp.list(DSG, ns) == [], timeout=30)


@pytest.fixture
def operator(cluster: ControlPlane, chart: Installed, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator as the chart runs it: its ServiceAccount's token, so the server enforces the chart's RBAC."""
    op = OperatorProcess(cluster.kubeconfig(tmp_path / "kubeconfig", token=chart.token), tmp_path / "operator.log")
    op.start()
    try:
        yield op
    finally:
        op.stop()
    log = op.log()
    # what the RBAC authorizer answers (an admission policy's refusal is also a 403 "forbidden", and tested as such)
    assert f'"{chart.user}" cannot' not in log, f"the chart's RBAC refused the operator something:\n{log[-3000:]}"
    assert API_KEY not in log and S3_SECRET_KEY not in log, "a secret reached the operator's log"
    assert chart.token not in log, "the operator's token reached its log"


@pytest.fixture
def player(cluster: ControlPlane, tmp_path: Path) -> Iterator[Player]:
    p = Player(cluster, tmp_path)
    try:
        yield p
    finally:
        p.stop_all()


def dsg(name: str, spec: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "eyrie.dev/v1alpha1", "kind": "DatasetGeneration", "metadata": meta, "spec": spec}


def status_of(cluster: ControlPlane, name: str) -> dict[str, Any]:
    doc = cluster.get(DSG, NS, name)
    return (doc or {}).get("status") or {}


def condition(cluster: ControlPlane, name: str, type_: str) -> dict[str, Any] | None:
    for c in status_of(cluster, name).get("conditions") or []:
        if c["type"] == type_:
            return c
    return None


def dump_yaml(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def write_pod_summary(out: Path, index: int, count: int, shard: int, samples: int, tokens: int,
                      nbytes: int) -> None:
    """What an extraction pod writes when its share is done (the real ExtractionSummary format)."""
    from eyrie.jobs.contract.extraction import ExtractionSummary, ShardResult
    from eyrie.jobs.contract.layout import summary_key
    from eyrie.jobs.store import open_store

    summary = ExtractionSummary(
        engine="sglang", model="/models/target", aux_layers=[2, 31, 58], layer_convention="eagle3",
        hidden_size=7168, num_layers=61, dtype="bfloat16", model_config_sha256="0" * 64,
        bytes_per_token=4 * 7168 * 2,
        shards=[ShardResult(shard=shard, index=f"hidden/shard-{shard:05d}.index.json",
                            files=[f"hidden/shard-{shard:05d}-00000.safetensors"], bytes=nbytes,
                            samples=samples, tokens=tokens, skipped={})])
    open_store(f"file://{out}").put(summary_key(index, count), json.dumps(summary.to_manifest()).encode())
