"""Shared fixtures: real servers started on 127.0.0.1 by the tests, stopped by their own PID."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

S3_ACCESS_KEY = "eyrietestaccess"
S3_SECRET_KEY = "eyrie-test-s3-secret-9f8e7d6c5b4a"
S3_PORT = 8333


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

    def env(self) -> dict[str, str]:
        return {"EYRIE_S3_ACCESS_KEY": self.access_key, "EYRIE_S3_SECRET_KEY": self.secret_key,
                "EYRIE_S3_ENDPOINT": self.endpoint}


def start_seaweedfs(base: Path) -> S3Server:
    weed = shutil.which("weed") or str(Path(os.__file__).parents[2] / "bin" / "weed")
    if _port_open(S3_PORT):
        raise RuntimeError(f"port {S3_PORT} is taken: another S3 server is running")
    data = base / "weed"
    data.mkdir(parents=True, exist_ok=True)
    cfg = base / "s3.json"
    cfg.write_text(json.dumps({"identities": [{
        "name": "eyrie", "credentials": [{"accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    log = (base / "weed.log").open("wb")
    proc = subprocess.Popen(
        [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-s3.config={cfg}"],
        stdout=log, stderr=subprocess.STDOUT, cwd=base, start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed exited early: {(base / 'weed.log').read_text()[-2000:]}")
        if _port_open(S3_PORT):
            break
        time.sleep(0.2)
    else:
        stop_pid(proc)
        raise RuntimeError("SeaweedFS S3 did not come up in 60 s")
    server = S3Server(f"http://127.0.0.1:{S3_PORT}", S3_ACCESS_KEY, S3_SECRET_KEY, proc, data)
    _wait_s3_ready(server)
    return server


def _wait_s3_ready(server: S3Server) -> None:
    from minio import Minio

    client = Minio(f"127.0.0.1:{S3_PORT}", access_key=server.access_key, secret_key=server.secret_key,
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
    """A real SeaweedFS S3 gateway on 127.0.0.1:8333 with credentials enforced."""
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
    Minio(f"127.0.0.1:{S3_PORT}", access_key=S3_ACCESS_KEY, secret_key=S3_SECRET_KEY,
          secure=False).make_bucket(name)
    return f"s3://{name}"
