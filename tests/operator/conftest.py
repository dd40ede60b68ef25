"""Fixtures for the operator's end-to-end tests: an emulated API server, the real `eyrie operator`
process, and a player for KubeRay and the kubelet that runs the real job entrypoints locally."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from eyrie.operator import rbac

from ..conftest import S3_SECRET_KEY
from .kube import CONFIGMAPS, DSG, JOBS, RAYJOBS, Cluster, running_cluster

NS = "default"
API_KEY = "sk-or-v1-operator-e2e-key-0123456789abcdef"
OPERATOR_AGENTS = ("kopf/", "OpenAPI-Generator/")  # kopf's own client, and the kubernetes client
SECRET_ENV = ("EYRIE_S3_ACCESS_KEY", "EYRIE_S3_SECRET_KEY", "EYRIE_S3_ENDPOINT", "EYRIE_API_KEY")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 20.0, every: float = 0.1) -> Any:
    """Poll until fn() returns something truthy; fail naming what never happened."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def clean_env() -> dict[str, str]:
    """The test's env without credentials: the operator and jobs must get them from Secrets."""
    return {k: v for k, v in os.environ.items() if k not in SECRET_ENV}


class OperatorProcess:
    """`eyrie operator` as the chart runs it, pointed at the emulator by a kubeconfig."""

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
        wait_for("operator liveness", self.alive, timeout=30, every=0.2)
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
    """Plays KubeRay and the kubelet: runs what a child describes, patches the child's status."""

    def __init__(self, cluster: Cluster, workdir: Path):
        self.cluster, self.workdir = cluster, workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def _env(self, container: dict[str, Any]) -> dict[str, str]:
        env = clean_env()
        for e in container.get("env") or []:
            if "value" in e:
                env[e["name"]] = e["value"]
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

    def start_rayjob(self, name: str) -> subprocess.Popen[bytes]:
        """Run the RayJob's entrypoint as its head would (workers inline: a one-process 'cluster')."""
        rj = self.rayjob(name)
        head = rj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        container = head["containers"][0]
        cm_name = head["volumes"][0]["configMap"]["name"]
        argv = rj["spec"]["entrypoint"].split()
        assert argv[:3] == ["eyrie", "run", "/etc/eyrie/spec.yaml"], argv
        cmd = [sys.executable, "-m", "eyrie.jobs.cli", "run", str(self._spec_file(cm_name)), *argv[3:],
               "--no-progress", "--inline"]
        self.cluster.patch(RAYJOBS, NS, name, {"status": {"jobDeploymentStatus": "Running",
                                                          "jobStatus": "RUNNING"}}, sub="status")
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
            self.cluster.patch(RAYJOBS, NS, name, {"status": {
                "jobDeploymentStatus": "Complete" if ok else "Failed",
                "jobStatus": "SUCCEEDED" if ok else "FAILED"}}, sub="status")
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

    def run_job(self, name: str, timeout: float = 60) -> list[int]:
        """Run every index of an Indexed Job as the kubelet would, then report it Complete."""
        job = wait_for(f"Job {name}", lambda: self.cluster.get(JOBS, NS, name))
        pod = job["spec"]["template"]["spec"]
        container = pod["containers"][0]
        cm_name = pod["volumes"][0]["configMap"]["name"]
        spec_file = self._spec_file(cm_name)
        procs = []
        for i in range(job["spec"]["completions"]):
            argv = [a.replace("$(JOB_COMPLETION_INDEX)", str(i)) for a in container["command"]]
            assert argv[:3] == ["eyrie", "extract", "/etc/eyrie/spec.yaml"], argv
            env = {**self._env(container), "JOB_COMPLETION_INDEX": str(i)}
            log = (self.workdir / f"{name}-{i}.log").open("ab")
            procs.append(subprocess.Popen([sys.executable, "-m", "eyrie.jobs.cli", "extract", str(spec_file),
                                           *argv[3:]], env=env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, cwd=self.workdir))
        codes = [p.wait(timeout) for p in procs]
        if all(c == 0 for c in codes):
            self.complete_job(name)
        return codes

    def complete_job(self, name: str) -> None:
        job = self.cluster.get(JOBS, NS, name)
        assert job is not None
        n = job["spec"]["completions"]
        self.cluster.patch(JOBS, NS, name, {"status": {"succeeded": n, "conditions": [
            {"type": "Complete", "status": "True"}]}}, sub="status")


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with running_cluster() as c:
        yield c


@pytest.fixture
def operator(cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster.kubeconfig(tmp_path / "kubeconfig"), tmp_path / "operator.log")
    op.start()
    try:
        yield op
    finally:
        op.stop()
    # every request the operator made is covered by the one declared RBAC list (the chart's source)
    assert cluster.emulator is not None
    used = {c[1:] for c in cluster.emulator.calls if c[0].startswith(OPERATOR_AGENTS)}
    assert used, "the operator made no requests"
    assert sorted(u for u in used if not rbac.allows(*u)) == []
    log = op.log()
    assert API_KEY not in log and S3_SECRET_KEY not in log, "a secret reached the operator's log"


@pytest.fixture
def player(cluster: Cluster, tmp_path: Path) -> Iterator[Player]:
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


def status_of(cluster: Cluster, name: str) -> dict[str, Any]:
    doc = cluster.get(DSG, NS, name)
    return (doc or {}).get("status") or {}


def condition(cluster: Cluster, name: str, type_: str) -> dict[str, Any] | None:
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
