"""A Ray pod leaves as soon as it is told to (issue 35 item 2), with the env the RayJob's pods get.

In a pod, `ray start --block` is PID 1 of the container's PID namespace, and Ray handles SIGTERM by draining the
node first, up to RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S (30 s by default): a worker node holding an actor (a shard
worker) never becomes idle, and with the head gone first, as when a RayCluster is deleted, the drain's call to the
GCS hangs that long. Here the same: a head and a worker node, each `ray start --block` as PID 1 of a PID namespace
of its own (unshare), the worker with exactly the RAY_* env operator/children.py gives the Ray containers and an
actor on it; the head's namespace is killed, then the worker's PID 1 gets SIGTERM, as the kubelet sends it. It must
be gone well before the 30 s a drain waits (measured: 2.5 s with the env, 36 s without it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eyrie.operator import children

from .test_reconcile import spec

pytestmark = pytest.mark.integration  # tier (tests/conftest.py): Ray nodes as processes in namespaces of their own
RAY = Path(sys.executable).with_name("ray")
LEAVES_WITHIN_S = 15.0  # half of Ray's default drain: the drain did not run
GCS_PORT = 6379  # inside the head's own network namespace: nothing else listens there


def ray_container_env() -> dict[str, str]:
    """The plain-valued RAY_* variables of the RayJob's worker container."""
    body = children.rayjob("dg", "ns", spec(), "1")
    [worker] = body["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in worker["env"] if e["name"].startswith("RAY_") and "value" in e}


def can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return False
    return subprocess.run(["unshare", "--pid", "--net", "--fork", "--mount-proc", "true"],
                          capture_output=True).returncode == 0


class PidOne:
    """A command as PID 1 of a new PID namespace (what a container's entrypoint is); stopped by its PID."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, netns: str):
        self.log = log
        self._out = log.open("wb")
        # `ip netns exec` execs unshare, which forks the command as PID 1 of the new PID namespace
        self.unshare = subprocess.Popen(["ip", "netns", "exec", netns, "unshare", "--pid", "--fork", "--kill-child",
                                         "--mount-proc", *argv], env=env, stdout=self._out, stderr=subprocess.STDOUT,
                                        cwd=log.parent)  # not the checkout: its operator/ shadows the stdlib's
        self.pid = self._child()

    def _child(self) -> int:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            kids = Path(f"/proc/{self.unshare.pid}/task/{self.unshare.pid}/children")
            if kids.exists() and (pids := kids.read_text().split()):
                return int(pids[0])
            time.sleep(0.05)
        raise AssertionError(f"unshare {self.unshare.pid} started no child")

    def alive(self) -> bool:
        return Path(f"/proc/{self.pid}").exists() and "zombie" not in Path(f"/proc/{self.pid}/status").read_text()

    def wait_for_line(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log.read_text(errors="replace"):
                return
            assert self.unshare.poll() is None, self.log.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        raise AssertionError(f"no {text!r} within {timeout} s: {self.log.read_text(errors='replace')[-3000:]}")

    def kill(self) -> None:
        if self.unshare.poll() is None:
            for pid in (self.pid, self.unshare.pid):  # the namespace's PID 1 first: the kernel ends the rest
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.unshare.wait(30)
        self._out.close()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """Ray's socket paths must fit in 107 bytes: pytest's tmp_path is too deep."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="rps", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def started() -> Iterator[list[PidOne]]:
    procs: list[PidOne] = []
    yield procs
    for p in reversed(procs):
        p.kill()


HEAD_IP, WORKER_IP = "10.251.0.1", "10.251.0.2"


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, str]]:
    """Two network namespaces joined by a veth pair, as two pods on a pod network: every address Ray binds is in
    them, none on the machine's own interfaces."""
    names = (f"rps-h-{os.getpid()}", f"rps-w-{os.getpid()}")
    veth = (f"rpsh{os.getpid()}"[:15], f"rpsw{os.getpid()}"[:15])

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    try:
        for ns in names:
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
        ip("link", "add", veth[0], "netns", names[0], "type", "veth", "peer", "name", veth[1], "netns", names[1])
        for ns, dev, addr in zip(names, veth, (HEAD_IP, WORKER_IP), strict=True):
            ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
        yield names
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.mark.skipif(not can_unshare(), reason="needs root and unshare(1) for PID namespaces")
def test_a_worker_node_with_an_actor_leaves_at_once_on_sigterm_with_the_ray_pods_env(
        short_tmp: Path, started: list[PidOne], two_hosts: tuple[str, str]) -> None:
    tmp_path = short_tmp
    pod_env = ray_container_env()
    assert pod_env == {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    head_ns, worker_ns = two_hosts
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    base.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    head = PidOne([str(RAY), "start", "--head", "--block", f"--node-ip-address={HEAD_IP}", f"--port={GCS_PORT}",
                   "--num-cpus=0", "--include-dashboard=false", f"--temp-dir={tmp_path / 'h'}"], base,
                  tmp_path / "head.log", head_ns)
    started.append(head)
    head.wait_for_line("block forever", 120)
    worker = PidOne([str(RAY), "start", "--block", f"--node-ip-address={WORKER_IP}",
                     f"--address={HEAD_IP}:{GCS_PORT}", "--num-cpus=1", '--resources={"w": 1}',
                     f"--temp-dir={tmp_path / 'w'}"], {**base, **pod_env}, tmp_path / "worker.log", worker_ns)
    started.append(worker)
    worker.wait_for_line("block forever", 120)
    driver_code = f"""
import ray, time
ray.init(address="{HEAD_IP}:{GCS_PORT}", log_to_driver=False, _node_ip_address="{HEAD_IP}")
@ray.remote(num_cpus=0, resources={{"w": 1}})
class ShardWorkerStandIn:
    def ping(self):
        return 1
a = ShardWorkerStandIn.remote()
ray.get(a.ping.remote())
print("ACTOR UP", flush=True)
time.sleep(600)
"""
    driver_log = tmp_path / "driver.log"
    with driver_log.open("wb") as out:
        driver = subprocess.Popen(["ip", "netns", "exec", head_ns, sys.executable, "-c", driver_code], env=base,
                                  stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while "ACTOR UP" not in driver_log.read_text(errors="replace"):
            assert driver.poll() is None and time.monotonic() < deadline, driver_log.read_text()[-3000:]
            time.sleep(0.5)
        head.kill()  # the RayCluster deleted: the head's pod goes first (it leaves in about 4 s)
        assert worker.alive()
        t0 = time.monotonic()
        os.kill(worker.pid, signal.SIGTERM)  # what the kubelet sends the worker pod's PID 1
        while worker.alive() and time.monotonic() - t0 < 60:
            time.sleep(0.1)
        took = time.monotonic() - t0
    finally:
        driver.kill()
        driver.wait(30)
    assert not worker.alive(), "the worker node ignored SIGTERM for 60 s"
    assert took < LEAVES_WITHIN_S, (f"the worker node took {took:.1f} s to leave after SIGTERM (Ray drained the node "
                                    f"first?): {worker.log.read_text(errors='replace')[-2000:]}")
