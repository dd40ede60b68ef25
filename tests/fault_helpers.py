"""Helpers of the fault suite (tests/test_faults_*.py): invariant checks, in-process runs, a private
MinIO on free ports that a test may kill and restart (process trees: proc_tree.py).

Every fault test ends in the same four checks, so they live here once: no sample lost, none
duplicated, spend within the budget and equal to (or, after a lost worker, at least) what the
provider billed, and a clear outcome.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from conftest import S3Server, start_minio, stop_pid
from proc_tree import children_of, kill_all

from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import layout, records
from eyrie.jobs.generate.driver import GenerationResult, run_generation
from eyrie.jobs.pipeline import provider
from eyrie.jobs.spec import load_spec
from eyrie.jobs.store import Store, open_output, open_store

API_KEY = "sk-or-v1-eyrie-fault-suite-key-5f4e3d2c1b0a"
PRICING = {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}


# ------------------------------------------------------------------------------------ prompts, specs


def write_rows(path: Path, rows: list[Any]) -> Path:
    path.write_bytes(b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows))
    return path


def simple_rows(n: int, tools_every: int = 0) -> list[dict]:
    weather = {"type": "function", "function": {"name": "get_weather", "description": "weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                              "required": ["city"]}}}
    rows = []
    for i in range(n):
        row: dict[str, Any] = {"messages": [{"role": "user", "content": f"Fault suite question {i}."}]}
        if tools_every and i % tools_every == 0:
            row["tools"] = [weather]
        rows.append(row)
    return rows


def spec_doc(prompts: Path, output: str, base_url: str, *, max_usd: str = "5.00", workers: int = 1,
             shards: int = 3, concurrency: int = 8, max_retries: int = 10, timeout_s: float = 10,
             stream: bool = True, extra: dict[str, Any] | None = None) -> dict:
    spec = {
        "sources": [{"name": "p", "uri": str(prompts), "format": "openai"}],
        "target": {"model": "test/model"},
        "api": {"baseUrl": base_url, "maxConcurrency": concurrency, "maxRetries": max_retries,
                "requestTimeoutSeconds": timeout_s, "stream": stream, "sampling": {"maxTokens": 256}},
        "tools": {"gate": {"enabled": False}},
        "budget": {"maxUSD": max_usd, "pricing": PRICING},
        "generation": {"shards": shards, "ray": {"mode": "Local", "workers": workers}},
        "output": {"uri": output},
    }
    for dotted, value in (extra or {}).items():
        node = spec
        *head, last = dotted.split(".")
        for k in head:
            node = node.setdefault(k, {})
        node[last] = value
    return {"apiVersion": "eyrie.dev/v1alpha1", "kind": "DatasetGeneration", "metadata": {"name": "faults"},
            "spec": spec}


def write_spec(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / f"spec-{time.time_ns()}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run_inline(spec_path: Path, monkeypatch: Any) -> tuple[GenerationResult, Store]:
    """The generation stage in this process with inline workers (no Ray): fast, same code path."""
    monkeypatch.setenv("EYRIE_API_KEY", API_KEY)
    dg = load_spec(spec_path)
    store = open_output(dg.spec)
    with provider(dg.spec) as base_url:
        ctx = RunContext(attempt=f"fault-{time.time_ns()}", api_key=API_KEY)
        return run_generation(dg, store, ctx, base_url, inline=True), store


# No test here has a wall-clock ceiling: a run that makes progress is waited for as long as it takes.
# This guard only ends a test whose run hangs (on a quiet machine these runs take seconds).
HANG_GUARD_S = 900


def start_run(spec_path: Path, ray_tmp: str | None) -> subprocess.Popen:
    """`eyrie run SPEC` as a user starts it: on local Ray, the default path, with Ray's temp dir in
    `ray_tmp` (short: unix socket paths are limited), or inline (EYRIE_NO_RAY=1) when None. In a
    session of its own, so that the whole tree can be SIGKILLed as a node loss would end it."""
    env = {**os.environ, "EYRIE_API_KEY": API_KEY}
    env.pop("RAY_ADDRESS", None)
    if ray_tmp is None:
        env["EYRIE_NO_RAY"] = "1"
    else:
        env.pop("EYRIE_NO_RAY", None)
        env["RAY_TMPDIR"] = ray_tmp
    return subprocess.Popen([sys.executable, "-m", "eyrie.jobs.cli", "run", str(spec_path), "--no-progress"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_persisted(out: str, n: int, proc: subprocess.Popen, seen: set[int],
                   until: Any = None) -> list[dict]:
    """Wait until the store holds `n` records (and `until(records)`, when given) while `proc` runs;
    `seen` collects its process tree meanwhile (Ray's processes, to kill by PID at the end)."""
    store = open_store(out)
    deadline = time.time() + HANG_GUARD_S
    while True:
        seen.update(children_of(proc.pid))
        recs = persisted(store)
        if len(recs) >= n and (until is None or until(recs)):
            return recs
        if proc.poll() is not None:
            raise AssertionError(f"the run ended first (exit {proc.returncode}): {proc.communicate()[1][-3000:]}")
        assert time.time() < deadline, f"fewer than {n} records after {HANG_GUARD_S} s: the run hangs"
        time.sleep(0.2)


def kill_tree(proc: subprocess.Popen, seen: set[int]) -> None:
    """SIGKILL the run's session and every process of its tree seen, then reap it."""
    seen.update(children_of(proc.pid))
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    kill_all([proc.pid, *seen])
    proc.communicate(timeout=60)


def run_to_end(spec_path: Path, ray_tmp: str | None) -> tuple[int, str]:
    """(exit code, stderr) of a whole `eyrie run SPEC` (`start_run`); its tree is killed after."""
    proc = start_run(spec_path, ray_tmp)
    seen: set[int] = set()
    deadline = time.time() + HANG_GUARD_S
    try:
        while True:
            seen.update(children_of(proc.pid))  # what outlives the driver is killed by PID
            try:
                _, stderr = proc.communicate(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                assert time.time() < deadline, f"the run did not end within {HANG_GUARD_S} s: it hangs"
    finally:
        kill_all([proc.pid, *seen])
    return proc.returncode, stderr


# ----------------------------------------------------------------------------------------- checks


def persisted(store: Store) -> list[dict]:
    return list(records.iter_records(store))


def progress(store: Store) -> dict:
    return json.loads(store.get(layout.PROGRESS))


def assert_exactly_once(recs: list[dict], rows: range | list[int]) -> dict[int, dict]:
    """One record per row, no sample id twice: nothing lost, nothing duplicated."""
    ids = Counter(r["sample_id"] for r in recs)
    dupes = {k: n for k, n in ids.items() if n > 1}
    assert not dupes, f"duplicated samples: {dupes}"
    by_row = {r["row"]: r for r in recs}
    assert sorted(by_row) == sorted(rows), f"lost rows: {sorted(set(rows) - set(by_row))}"
    return by_row


def spent_sum(recs: list[dict]) -> Decimal:
    return sum((Decimal(r["costUSD"]) for r in recs), Decimal(0))


def all_part_bytes(store: Store) -> list[tuple[str, bytes]]:
    """Every part, decoded: a torn part raises here."""
    out = []
    for _s, _p, key in records.list_parts(store):
        raw = store.get(key)
        records.decode_part(raw)  # must not raise
        out.append((key, gzip.decompress(raw)))
    return out


# ------------------------------------------------------------------------------- a private MinIO


@dataclass
class PrivateS3:
    """A MinIO of the test's own (conftest's `start_minio` on free ports), so a test can SIGKILL
    it and start it again on the same ports and data without touching the session's shared server."""

    base: Path
    server: S3Server | None = None

    def start(self) -> PrivateS3:
        self.server = start_minio(self.base, self.server.ports if self.server else None)
        return self

    def _s(self) -> S3Server:
        if self.server is None:
            raise RuntimeError("private MinIO not started")
        return self.server

    @property
    def endpoint(self) -> str:
        return self._s().endpoint

    @property
    def access_key(self) -> str:
        return self._s().access_key

    @property
    def secret_key(self) -> str:
        return self._s().secret_key

    def env(self) -> dict[str, str]:
        return self._s().env()

    def make_bucket(self, name: str) -> str:
        from minio import Minio

        Minio(f"127.0.0.1:{self._s().port}", access_key=self.access_key, secret_key=self.secret_key,
              secure=False).make_bucket(name)
        return f"s3://{name}"

    def kill(self) -> None:
        """SIGKILL the server's process group, as a crash would end it."""
        proc = self._s().proc
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def stop(self) -> None:
        if self.server is not None:
            stop_pid(self.server.proc)

    def store(self, uri: str) -> Store:
        from eyrie.jobs.store import S3Credentials

        return open_store(uri, self.endpoint, S3Credentials(self.access_key, self.secret_key))
