"""Shared benchmark plumbing: one worker's full per-request path, run in this process."""

from __future__ import annotations

import asyncio
import json
import resource
import tempfile
import time
from decimal import Decimal
from pathlib import Path

from eyrie.jobs.contract import layout
from eyrie.jobs.generate.coordinator import Counts, RunCoordinator
from eyrie.jobs.generate.requests import build_body
from eyrie.jobs.generate.worker import ShardWorker, WorkerConfig
from eyrie.jobs.sources import Prompt
from eyrie.jobs.spec import parse_spec
from eyrie.jobs.store import FileStore
from eyrie.jobs.tools.gate import ToolGate


def prompts(n: int) -> list[Prompt]:
    return [Prompt(source="bench", row=i, fmt="openai", tools=None,
                   messages=[{"role": "user", "content": f"Benchmark prompt {i}: say something short."}])
            for i in range(n)]


def spec_for(base_url: str, concurrency: int, stream: bool, shards: int = 8):
    return parse_spec({
        "sources": [{"name": "bench", "uri": "unused.jsonl"}], "target": {"model": "bench/model"},
        "api": {"baseUrl": base_url, "maxConcurrency": concurrency, "stream": stream, "maxRetries": 2,
                "requestTimeoutSeconds": 60, "sampling": {"maxTokens": 64}},
        "tools": {"gate": {"enabled": False}},
        "budget": {"maxUSD": "1000", "pricing": {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}},
        "generation": {"shards": shards, "partRecords": 512},
        "output": {"uri": "file:///unused"},
    }).spec


async def eyrie_run(base_url: str, n: int, concurrency: int, stream: bool) -> tuple[float, float]:
    """Requests/s of eyrie's whole path (reserve, send, parse, check, settle, persist) and the CPU
    seconds this process spent per request (robust to a busy machine, unlike wall time)."""
    spec = spec_for(base_url, concurrency, stream)
    shard_prompts: dict[int, list] = {s: [] for s in range(spec.generation.shards)}
    for p in prompts(n):
        sid = p.sample_id()
        shard_prompts[layout.shard_of(sid, spec.generation.shards)].append((sid, p))
    with tempfile.TemporaryDirectory() as d:
        store = FileStore(Path(d))
        coord = RunCoordinator(Decimal(1000), Decimal(0), Counts(), n, sorted(shard_prompts),
                               ToolGate(spec.tools.gate))
        config = WorkerConfig(spec.model_dump_json(by_alias=True), "w0", "bench", base_url, concurrency)
        worker = ShardWorker(config, coord, shard_prompts, store)
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
