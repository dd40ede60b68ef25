"""Shared benchmark plumbing: one worker's full per-request path, run in this process."""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from proc_tree import children_of, cmdline  # noqa: F401  (the benchmarks import them from here)

from eyrie.jobs.api.limits import Limits
from eyrie.jobs.generate.budget.coordinator import Counts, RunCoordinator
from eyrie.jobs.generate.plan import plan_shards
from eyrie.jobs.generate.sending.requests import build_body
from eyrie.jobs.generate.sending.sender import Sender, SenderConfig, coordinator_call
from eyrie.jobs.generate.sending.worker import ShardWorker
from eyrie.jobs.sources import Prompt
from eyrie.jobs.spec import parse_spec
from eyrie.jobs.store import FileStore
from eyrie.jobs.tools.gate import ToolGate


def prompts(n: int) -> list[Prompt]:
    return [Prompt(source="bench", row=i, fmt="openai", tools=None,
                   messages=[{"role": "user", "content": f"Benchmark prompt {i}: say something short."}])
            for i in range(n)]


def spec_for(base_url: str, concurrency: int, stream: bool, shards: int = 8, uri: str = "unused.jsonl"):
    return parse_spec({
        "sources": [{"name": "bench", "uri": uri}], "target": {"model": "bench/model"},
        "api": {"baseUrl": base_url, "maxConcurrency": concurrency, "stream": stream, "maxRetries": 2,
                "requestTimeoutSeconds": 60, "sampling": {"maxTokens": 64}},
        "tools": {"gate": {"enabled": False}},
        "budget": {"maxUSD": "1000", "pricing": {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}},
        "generation": {"shards": shards, "partRecords": 512},
        "output": {"uri": "file:///unused"},
    }).spec


async def eyrie_run(base_url: str, n: int, concurrency: int, stream: bool) -> tuple[float, float]:
    """Requests/s of eyrie's whole path (read the shard, reserve, send, parse, check, settle,
    persist) and the CPU seconds this process spent per request (robust to a busy machine)."""
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "prompts.jsonl"
        src.write_bytes(b"".join(orjson.dumps({"messages": p.messages}) + b"\n" for p in prompts(n)))
        spec = spec_for(base_url, concurrency, stream, uri=str(src))
        store = FileStore(Path(d) / "out")
        plan = plan_shards(spec, store)
        coord = RunCoordinator(Decimal(1000), Decimal(0), Counts(), n, sorted(plan.shards),
                               ToolGate(spec.tools.gate))
        config = SenderConfig(spec.model_dump_json(by_alias=True), "w0", "bench", base_url, Limits(concurrency))
        worker = ShardWorker(Sender(config, coordinator_call(coord), store), plan)
        t0, c0 = time.perf_counter(), time.process_time()
        persisted = await worker.run()
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert persisted == n, (persisted, n)
    return n / dt, cpu / n


async def bare_httpx(base_url: str, n: int, concurrency: int,
                     aiohttp_transport: bool = False) -> tuple[float, float]:
    """The ceiling: a bare httpx loop posting the same bodies and parsing the JSON; optionally on
    the aiohttp transport eyrie itself uses (the stricter ceiling)."""
    import httpx

    spec = spec_for(base_url, concurrency, False)
    bodies = [json.dumps(build_body(spec, p.messages, None)).encode() for p in prompts(n)]
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    extra = {}
    if aiohttp_transport:
        from httpx_aiohttp import AiohttpTransport

        extra["transport"] = AiohttpTransport(limits=limits)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=60, **extra) as client:
        async def one(body: bytes) -> None:
            async with sem:
                r = await client.post("/chat/completions", content=body,
                                      headers={"content-type": "application/json"})
                json.loads(r.content)

        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(b) for b in bodies))
        return n / (time.perf_counter() - t0), (time.process_time() - c0) / n


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def bare_aiohttp(base_url: str, n: int, concurrency: int) -> tuple[float, float]:
    """The leanest client there is: raw aiohttp posting the same bodies and parsing the JSON. On a
    small machine it shows what the simulator and the loop leave for any client."""
    import aiohttp
    import orjson

    spec = spec_for(base_url, concurrency, False)
    bodies = [orjson.dumps(build_body(spec, p.messages, None)) for p in prompts(n)]
    sem = asyncio.Semaphore(concurrency)
    url = base_url + "/chat/completions"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency + 1)) as session:
        async def one(body: bytes) -> None:
            async with sem, session.post(url, data=body, headers={"content-type": "application/json"}) as r:
                orjson.loads(await r.read())

        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(b) for b in bodies))
        return n / (time.perf_counter() - t0), (time.process_time() - c0) / n


# ------------------------------------------------------------- `eyrie run` as a user runs it

ROOT = Path(__file__).resolve().parents[1]


def eyrie_python() -> str:
    """eyrie's own Python (peer_curator runs from curator's venv): $EYRIE_PYTHON, else .venv."""
    import os
    import sys

    own = ROOT / ".venv" / "bin" / "python"
    return os.environ.get("EYRIE_PYTHON") or (str(own) if own.exists() else sys.executable)


def write_prompt_file(path: Path, n: int, text: str = "Benchmark prompt {i}: say something short.") -> Path:
    path.write_bytes(b"".join(orjson.dumps({"messages": [{"role": "user", "content": text.format(i=i)}]}) + b"\n"
                              for i in range(n)))
    return path


def cli_spec(path: Path, prompts: Path, out: Path, base_url: str, concurrency: int, *, max_tokens: int = 64,
             model: str = "bench/model", price_in: str = "0.60", price_out: str = "2.50", shards: int = 8,
             workers: int = 1, max_usd: str = "1000") -> Path:
    """A spec file for `eyrie run`: defaults everywhere else (local Ray, the file store)."""
    import yaml

    doc = {"apiVersion": "eyrie.dev/v1alpha1", "kind": "DatasetGeneration", "metadata": {"name": "bench"},
           "spec": {"sources": [{"name": "bench", "uri": str(prompts)}], "target": {"model": model},
                    "api": {"baseUrl": base_url, "maxConcurrency": concurrency, "stream": False, "maxRetries": 2,
                            "requestTimeoutSeconds": 60, "sampling": {"maxTokens": max_tokens}},
                    "tools": {"gate": {"enabled": False}},
                    "budget": {"maxUSD": max_usd, "pricing": {"inputPerMillion": price_in,
                                                              "outputPerMillion": price_out}},
                    "generation": {"shards": shards, "ray": {"workers": workers}},
                    "output": {"uri": f"file://{out}"}}}
    path.write_text(yaml.safe_dump(doc))
    return path


def start_eyrie(spec: Path, *, ray: bool = True, ray_tmp: str | None = None) -> Any:
    """`eyrie run SPEC` in a new session (so the whole tree can be killed at once)."""
    import os
    import subprocess

    env = {**os.environ, "EYRIE_API_KEY": "sk-bench", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    if ray:
        env.pop("EYRIE_NO_RAY", None)
        if ray_tmp:
            env["RAY_TMPDIR"] = ray_tmp
    else:
        env["EYRIE_NO_RAY"] = "1"
    return subprocess.Popen([eyrie_python(), "-m", "eyrie.jobs.cli", "run", str(spec), "--no-progress"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def run_eyrie(spec: Path, *, ray: bool = True, timeout: float = 900) -> tuple[float, dict]:
    """(wall seconds of the whole process, its progress.json) for `eyrie run SPEC`."""
    import shutil

    ray_tmp = tempfile.mkdtemp(prefix="rb", dir="/tmp")
    try:
        t0 = time.perf_counter()
        proc = start_eyrie(spec, ray=ray, ray_tmp=ray_tmp)
        _, err = proc.communicate(timeout=timeout)
        dt = time.perf_counter() - t0
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"eyrie run exited {proc.returncode}: {err[-2000:]}")
    import yaml

    out = yaml.safe_load(spec.read_text())["spec"]["output"]["uri"].removeprefix("file://")
    return dt, json.loads((Path(out) / "progress.json").read_text())


def steady_rate(out: Path) -> float:
    """Requests/s between the 10th and 90th percentile of the records' start times: the rate once
    running, without start-up (Ray, preflight) or the tail."""
    from datetime import datetime

    from eyrie.jobs.contract import records

    times = sorted(datetime.fromisoformat(r["createdAt"].replace("Z", "+00:00")).timestamp()
                   for r in records.iter_records(FileStore(out)))
    lo, hi = len(times) // 10, len(times) * 9 // 10
    return (hi - lo) / max(1e-9, times[hi] - times[lo])


def peak_rss_of(pid: int) -> float:
    """VmHWM (peak resident set) of a live process, MB; 0 when gone."""
    return status_mb(pid, "VmHWM")


def status_mb(pid: int, key: str) -> float:
    """A memory figure of a live process's /proc status (VmRSS, VmHWM), MB; 0 when gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0
