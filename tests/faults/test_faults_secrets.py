"""Secrets under fire: a full Ray run with provider faults writing to S3, and providers that echo the
Authorization header back in their errors. The API key and the S3 keys appear in no byte eyrie writes:
stdout, stderr, Ray's logs, records, progress, or the text of any error.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

sys.path.insert(0, str(Path(__file__).parents[1]))
from fault_helpers import (
    API_KEY,
    PrivateS3,
    assert_exactly_once,
    persisted,
    simple_rows,
    spec_doc,
    write_rows,
    write_spec,
)
from proc_tree import children_of, kill_all

from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess
from eyrie.jobs.store import open_store

pytestmark = pytest.mark.integration  # tier (tests/conftest.py): the simulator and MinIO as processes


def _leaks(blobs: dict[str, bytes], secrets: list[str]) -> list[tuple[str, str]]:
    """(where, which secret) for every blob holding a secret, raw or gzip-compressed."""
    found = []
    for where, data in blobs.items():
        texts = [data]
        if data[:2] == b"\x1f\x8b":
            texts.append(gzip.decompress(data))
        for secret in secrets:
            if any(secret.encode() in t for t in texts):
                found.append((where, secret[:6] + "..."))
    return found


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_socket()}


@pytest.fixture
def private_s3() -> Iterator[PrivateS3]:
    base = Path(tempfile.mkdtemp(prefix="eyrie-s3s-"))
    s3 = PrivateS3(base).start()
    try:
        yield s3
    finally:
        s3.stop()
        shutil.rmtree(base, ignore_errors=True)




@pytest.mark.parametrize("ray", [False, True],
                         ids=["inline", "ray"])
def test_a_run_with_faults_on_s3_writes_no_secret_anywhere(tmp_path, private_s3, ray):
    """The provider insists on the key (401 without it), so the key is really sent on every request."""
    s3 = private_s3
    out = f"{s3.make_bucket(f's{time.time_ns()}')}/run"
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(24, tools_every=2))
    ray_dir = tempfile.mkdtemp(prefix="ry", dir="/tmp")
    cfg = SimulatorConfig(latency_ms=20, fault_rate=0.3, seed=1, retry_after_s=0, api_key=API_KEY,
                          faults=["429", "500", "503", "stream-cut", "200-error", "malformed-json"])
    try:
        with SimulatorProcess(cfg) as sim:
            spec = write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, workers=2,
                                                 extra={"output.endpoint": s3.endpoint}))
            env = {**os.environ, **s3.env(), "EYRIE_API_KEY": API_KEY, "RAY_TMPDIR": ray_dir}
            env.pop("EYRIE_NO_RAY", None)
            if not ray:
                env["EYRIE_NO_RAY"] = "1"
            proc = subprocess.Popen([sys.executable, "-m", "eyrie.jobs.cli", "run", str(spec), "--no-progress"],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            try:
                stdout, stderr = proc.communicate(timeout=240)
            finally:
                kill_all([proc.pid, *children_of(proc.pid)])
            stats = sim.stats()
        assert proc.returncode == 0, stderr.decode()[-3000:]
        assert sum(stats["faults"].values()) > 0
        store = s3.store(out)
        assert_exactly_once(persisted(store), range(24))
        blobs = {"stdout": stdout, "stderr": stderr, **{f"s3:{k}": store.get(k) for k in store.list()}}
        ray_files = _tree(Path(ray_dir))
        if ray:
            assert any("/logs/" in k for k in ray_files)  # Ray ran and logged: its logs are scanned too
        blobs.update(ray_files)
        assert "progress.json" in {k.removeprefix("s3:") for k in blobs}
        assert _leaks(blobs, [API_KEY, s3.secret_key, s3.access_key]) == []
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)


class EchoProvider:
    """A provider that puts the caller's Authorization header into every error it returns."""

    def __init__(self, models_status: int = 200):
        self.models_status = models_status
        self.calls = 0
        self.base_url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _models(self, request: web.Request) -> web.Response:
        if self.models_status != 200:
            return web.json_response({"error": {"code": self.models_status,
                                                "message": f"bad key {request.headers.get('Authorization')}"}},
                                     status=self.models_status)
        return web.json_response({"object": "list", "data": []})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        auth = request.headers.get("Authorization", "")
        err = {"error": {"code": 502, "message": f"upstream refused {auth}", "metadata": {"raw": auth}}}
        if self.calls % 2:
            return web.json_response(err, status=500)
        return web.json_response(err)  # an error inside HTTP 200

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.base_url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"

    def __enter__(self) -> EchoProvider:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _run(spec: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "EYRIE_API_KEY": API_KEY, "EYRIE_NO_RAY": "1"}
    return subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "run", str(spec), "--no-progress"],
                          env=env, capture_output=True, timeout=120)


def test_errors_that_echo_the_key_are_recorded_redacted(tmp_path):
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(4))
    out = tmp_path / "out"
    with EchoProvider() as provider:
        r = _run(write_spec(tmp_path, spec_doc(prompts, f"file://{out}", provider.base_url, max_retries=1,
                                               stream=False)), tmp_path)
        calls = provider.calls
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert calls == 8  # two attempts per prompt, both answered with the key echoed back
    recs = {x["row"]: x for x in persisted(open_store(str(out)))}
    assert sorted(recs) == [0, 1, 2, 3]
    for rec in recs.values():
        assert rec["status"] == "failed"
        assert "upstream refused Bearer ***" in rec["error"]["message"]
    assert _leaks({"stdout": r.stdout, "stderr": r.stderr, **_tree(out)}, [API_KEY]) == []


def test_a_rejected_key_echoed_at_preflight_stays_out_of_the_error(tmp_path):
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(2))
    with EchoProvider(models_status=401) as provider:
        r = _run(write_spec(tmp_path, spec_doc(prompts, f"file://{tmp_path}/out", provider.base_url)), tmp_path)
        calls = provider.calls
    assert r.returncode == 2 and calls == 0
    assert b"rejected the API key" in r.stderr and b"bad key Bearer ***" in r.stderr
    assert API_KEY.encode() not in r.stderr + r.stdout


def test_a_wrong_s3_secret_is_named_as_a_store_problem_without_the_secret(tmp_path, private_s3):
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(2))
    out = f"{private_s3.make_bucket(f'w{time.time_ns()}')}/run"
    wrong = "eyrie-wrong-s3-secret-1234567890abcdef"
    with SimulatorProcess(SimulatorConfig()) as sim:
        spec = write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, extra={"output.endpoint":
                                                                                  private_s3.endpoint}))
        env = {**os.environ, **private_s3.env(), "EYRIE_S3_SECRET_KEY": wrong, "EYRIE_API_KEY": API_KEY,
               "EYRIE_NO_RAY": "1"}
        r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "run", str(spec), "--no-progress"],
                           env=env, capture_output=True, timeout=120)
        assert sim.stats()["requests"] == 0
    assert r.returncode == 2 and b"output.uri" in r.stderr, r.stderr[-2000:]
    assert _leaks({"stdout": r.stdout, "stderr": r.stderr}, [wrong, private_s3.secret_key, API_KEY]) == []
