"""The generation job (DESIGN §3, §4): read prompts, shard them, run shard workers, keep progress.

Runs as the entrypoint of a Ray job in a cluster (RayJob or a submission: `ray.init()` joins the
cluster it runs in) and under a local `ray.init()` for `generation.ray.mode: Local`. The driver
owns progress.json; the run coordinator (a named Ray actor) owns the budget and stop decision;
workers own their shards' parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import orjson

from eyrie.jobs import records, sources
from eyrie.jobs.budget import usd
from eyrie.jobs.coordinator import Counts, Observation, Outcome, RunCoordinator
from eyrie.jobs.gate import ToolGate
from eyrie.jobs.spec import SIMULATED, DatasetGeneration, DatasetGenerationSpec
from eyrie.jobs.store import NotFound, Store
from eyrie.jobs.tools import ResponseCheck
from eyrie.jobs.worker import ShardWorker, now_iso, run_loop

PROGRESS_EVERY_S = 2.0
MAX_WORKER_RESTARTS = 3


class PreflightError(RuntimeError):
    """The run cannot start: nothing was paid; the message says what to fix."""


def resolve_attempt() -> str:
    """The operator passes EYRIE_ATTEMPT; a local run makes one up."""
    return os.environ.get("EYRIE_ATTEMPT") or (
        f"local-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}")


def api_key() -> str | None:
    return os.environ.get("EYRIE_API_KEY") or None


# ----------------------------------------------------------------------------------- prompts

ShardPrompts = dict[int, list[tuple[str, sources.Prompt | sources.BadRow]]]


def prompt_identity(item: sources.Prompt | sources.BadRow) -> Any:
    if isinstance(item, sources.BadRow):
        return {"bad": item.reason}
    return {"messages": item.messages, "tools": item.tools}


def load_prompts(spec: DatasetGenerationSpec) -> tuple[ShardPrompts, int]:
    """Every prompt of every source, keyed by shard; bad rows travel too (they get a record)."""
    shards: ShardPrompts = {i: [] for i in range(spec.generation.shards)}
    total = 0
    for src in spec.sources:
        for item in sources.iter_source(src, spec.output.endpoint):
            sid = records.sample_id(src.name, item.row, prompt_identity(item))
            shards[records.shard_of(sid, spec.generation.shards)].append((sid, item))
            total += 1
    return shards, total


# ------------------------------------------------------------------------------- checkpoint


@dataclass
class Checkpoint:
    """What earlier attempts left in the store: the floor for spend and the counters."""

    spent: Decimal
    counts: Counts
    audit: Decimal  # paid by `eyrie audit` runs, part of `spent`


def read_checkpoint(store: Store, gate: ToolGate | None = None) -> Checkpoint:
    """Scan every persisted record once; `gate` absorbs earlier answers into its cumulative metrics."""
    counts = Counts()
    spent = Decimal(0)
    for rec in records.iter_records(store):
        spent += Decimal(rec.get("costUSD") or "0")
        usage = rec.get("usage") or {}
        counts.add(Observation(str(rec.get("status")), policy=rec.get("policy", "keep"),
                               input_tokens=int(usage.get("prompt_tokens") or 0),
                               output_tokens=int(usage.get("completion_tokens") or 0)))
        if gate is not None and rec.get("status") == "ok" and rec.get("checks"):
            gate.absorb(ResponseCheck.from_record(rec["checks"]))
    from eyrie.jobs.audit import previous_audit_spend

    audit = previous_audit_spend(store)
    prev = read_progress(store)
    if prev and prev.get("spentUSD"):
        # progress also counts answers that were paid but never flushed before a crash...
        spent = max(spent, Decimal(prev["spentUSD"]) - Decimal(prev.get("auditUSD") or "0"))
    # ...and the committed bound covers even those paid after progress was last written
    spent = max(spent, read_committed(store) - audit)
    return Checkpoint(spent=spent + audit, counts=counts, audit=audit)


@dataclass(frozen=True)
class BudgetCommitter:
    """Writes `<output>/budget.json`; picklable (the coordinator actor opens the store itself)."""

    uri: str
    endpoint: str | None
    region: str | None
    attempt: str

    def __call__(self, bound: Decimal) -> None:
        from eyrie.jobs.store import open_store

        doc = {"committedUSD": usd(bound), "attempt": self.attempt, "updatedAt": now_iso()}
        open_store(self.uri, self.endpoint, None, self.region).put(records.BUDGET, orjson.dumps(doc))


def read_committed(store: Store) -> Decimal:
    try:
        return Decimal(orjson.loads(store.get(records.BUDGET))["committedUSD"])
    except NotFound:
        return Decimal(0)


def read_progress(store: Store) -> dict | None:
    try:
        return orjson.loads(store.get(records.PROGRESS))
    except NotFound:
        return None


def write_progress(store: Store, snapshot: dict, attempt: str, stage: str, **extra: Any) -> dict:
    run_id = {"runId": os.environ["EYRIE_RUN_ID"]} if os.environ.get("EYRIE_RUN_ID") else {}
    doc = {"attempt": attempt, **run_id, "stage": stage, **snapshot, **extra, "updatedAt": now_iso()}
    store.put(records.PROGRESS, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return doc


# ------------------------------------------------------------------------------------ run


@dataclass
class GenerationResult:
    outcome: str
    message: str
    snapshot: dict


class _Stopper:
    """SIGTERM/SIGINT (Ray's stop_job, Ctrl-C): stop dispatching, let in-flight requests finish."""

    def __init__(self) -> None:
        self.requested = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Stopper:
        self.install()
        return self

    def install(self) -> None:
        """(Re)install the handlers: `ray.init()` replaces SIGTERM's with an immediate exit, which
        would lose the answers in flight when Ray's stop_job signals the driver."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: no handlers then
                old = signal.signal(sig, self._handle)
                self._old.setdefault(sig, old)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _simulator(spec: DatasetGenerationSpec, stack: ExitStack) -> str:
    from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess

    cfg = SimulatorConfig.from_spec(spec.api.simulator)
    if spec.budget.pricing is not None:
        cfg.input_per_million = spec.budget.pricing.input_per_million
        cfg.output_per_million = spec.budget.pricing.output_per_million
    return stack.enter_context(SimulatorProcess(cfg)).base_url


async def preflight(spec: DatasetGenerationSpec, base_url: str, store: Store) -> None:
    """Everything that can fail before the first paid request fails here."""
    from eyrie.jobs.api import ApiError, ChatClient

    try:
        store.check_writable()
    except Exception as e:
        raise PreflightError(f"output.uri: the store is not writable: {e}") from None
    async with ChatClient(base_url, api_key(), timeout=min(30.0, spec.api.request_timeout_seconds),
                          max_retries=0, max_concurrency=1) as client:
        try:
            await client.preflight()
        except ApiError as e:
            raise PreflightError(f"api.baseUrl: {e}") from None
    if spec.target.tokenizer:
        from eyrie.jobs.chat.tokenizers import check_tokenizer

        try:
            check_tokenizer(spec.target, spec.output.endpoint)
        except Exception as e:
            raise PreflightError(f"target.tokenizer: {e}") from None


def run_generation(dg: DatasetGeneration, store: Store, attempt: str, *, inline: bool = False,
                   on_progress: Callable[[dict], None] | None = None) -> GenerationResult:
    """Generate until every prompt is persisted or the run stops; returns the final snapshot."""
    spec = dg.spec
    with ExitStack() as stack, _Stopper() as stopper:
        base_url = _simulator(spec, stack) if spec.api.base_url == SIMULATED else spec.api.base_url
        asyncio.run(preflight(spec, base_url, store))
        shard_prompts, total = load_prompts(spec)
        gate = ToolGate(spec.tools.gate)  # a disabled gate still measures; it never stops
        ckpt = read_checkpoint(store, gate)
        committer = BudgetCommitter(store.uri, spec.output.endpoint, spec.output.region, attempt)
        coord_args = (spec.budget.max_usd, ckpt.spent, ckpt.counts, total, sorted(shard_prompts), gate,
                      ckpt.audit, committer)
        run = _run_inline if inline or (spec.generation.ray.mode == "Local" and _no_ray()) else _run_ray
        on_progress = on_progress or (lambda s: None)
        snapshot = run(spec, attempt, base_url, coord_args, shard_prompts, store, stopper, on_progress)
    # The store is the truth: a worker lost before flushing reported answers that were never
    # persisted (and are redone), so counts come from what was persisted; spend stays the ledger's.
    final_gate = ToolGate(spec.tools.gate)
    final = read_checkpoint(store, final_gate)
    snapshot["samples"] = {"total": total, "done": final.counts.done, "dropped": final.counts.dropped,
                           "failed": final.counts.failed}
    snapshot["tokens"] = {"input": final.counts.input_tokens, "output": final.counts.output_tokens}
    snapshot["tools"] = final_gate.metrics()
    if snapshot["outcome"] == Outcome.RUNNING:
        c = snapshot["samples"]
        missing = c["total"] - c["done"] - c["dropped"] - c["failed"]
        if missing > 0:
            snapshot["outcome"] = Outcome.FAILED
            snapshot["message"] = f"{missing} prompts were not processed (workers lost); run again to resume"
        else:
            snapshot["outcome"] = Outcome.DONE
    on_progress(snapshot)
    write_progress(store, snapshot, attempt, "generate")
    return GenerationResult(snapshot["outcome"], snapshot.get("message", ""), snapshot)


def _no_ray() -> bool:
    return os.environ.get("EYRIE_NO_RAY") == "1"


def _worker_share(spec: DatasetGenerationSpec, workers: int) -> tuple[int, int | None, int | None]:
    a = spec.api
    per = max(1, a.max_concurrency // workers)
    rpm = max(1, a.requests_per_minute // workers) if a.requests_per_minute else None
    tpm = max(1, a.tokens_per_minute // workers) if a.tokens_per_minute else None
    return per, rpm, tpm


class _Monitor:
    """Throttled progress.json writes plus the on_progress callback (the progress bar)."""

    def __init__(self, store: Store, attempt: str, on_progress: Callable[[dict], None]):
        self.store, self.attempt, self.on_progress = store, attempt, on_progress
        self.last = 0.0

    def tick(self, snap: dict) -> None:
        self.on_progress(snap)
        if time.monotonic() - self.last >= PROGRESS_EVERY_S:
            write_progress(self.store, snap, self.attempt, "generate")
            self.last = time.monotonic()


def _run_inline(spec, attempt, base_url, coord_args, shard_prompts, store, stopper, on_progress) -> dict:
    """Workers as tasks in this process (the benchmark path and `EYRIE_NO_RAY=1`)."""
    monitor = _Monitor(store, attempt, on_progress)

    async def main() -> dict:
        coord = RunCoordinator(*coord_args)
        n = spec.generation.ray.workers
        per, rpm, tpm = _worker_share(spec, n)
        workers = [ShardWorker(spec.model_dump_json(by_alias=True), f"w{i}", attempt, base_url, api_key(),
                               per, rpm, tpm, coord, shard_prompts, store) for i in range(n)]
        tasks = [asyncio.create_task(w.run()) for w in workers]
        while not all(t.done() for t in tasks):
            await asyncio.wait(tasks, timeout=0.5)
            if stopper.requested:
                coord.stop(Outcome.STOPPED, "stopped by a signal; resume by running again")
                await coord.wake()
            # off the loop: a store that retries (S3 down) must not stall answers in flight
            await asyncio.to_thread(monitor.tick, coord.snapshot())
        for t in tasks:
            t.result()
        await coord.settle_commit()
        return coord.snapshot()

    return run_loop(main())


def _run_ray(spec, attempt, base_url, coord_args, shard_prompts, store, stopper, on_progress) -> dict:
    import ray
    from ray.exceptions import RayActorError

    monitor = _Monitor(store, attempt, on_progress)
    if not ray.is_initialized():
        # Workers inherit this process's environment (a local cluster) or their pod's (RayJob),
        # which is how the API key reaches them: never through a runtime_env, which Ray records.
        if spec.generation.ray.mode == "Local" and not os.environ.get("RAY_ADDRESS"):
            # a private cluster bound to loopback for this run only (DESIGN §9)
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False,
                     _node_ip_address="127.0.0.1")
        else:
            ray.init(log_to_driver=True)
    stopper.install()
    n = spec.generation.ray.workers
    per, rpm, tpm = _worker_share(spec, n)
    coord = ray.remote(RunCoordinator).options(
        name=f"eyrie-coordinator-{attempt}", num_cpus=0, max_concurrency=100_000).remote(*coord_args)
    refs = {s: ray.put(p) for s, p in shard_prompts.items()}
    actor_cls = ray.remote(ShardWorker).options(
        num_cpus=spec.generation.ray.cpus_per_worker if spec.generation.ray.mode != "Local" else 0,
        max_concurrency=1, max_restarts=0)
    spec_json = spec.model_dump_json(by_alias=True)

    def start(i: int, gen: int) -> tuple[str, Any, Any]:
        wid = f"w{i}.{gen}"
        # the API key reaches workers through their environment, never as an argument
        w = actor_cls.remote(spec_json, wid, attempt, base_url, None, per, rpm, tpm, coord, refs,
                             None, True)
        return wid, w, w.run_blocking.remote()

    running = {}
    for i in range(n):
        wid, w, ref = start(i, 0)
        running[ref] = (i, wid, w)
    restarts = 0
    try:
        while running:
            ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
            for ref in ready:
                i, wid, _w = running.pop(ref)
                try:
                    ray.get(ref)
                except RayActorError:
                    ray.get(coord.worker_lost.remote(wid))
                    if restarts < MAX_WORKER_RESTARTS * n:
                        restarts += 1
                        nwid, nw, nref = start(i, restarts)
                        running[nref] = (i, nwid, nw)
            if stopper.requested:
                ray.get(coord.stop.remote(Outcome.STOPPED, "stopped by a signal; resume by running again"))
                ray.get(coord.wake.remote())
            monitor.tick(ray.get(coord.snapshot.remote()))
        ray.get(coord.settle_commit.remote())
        return ray.get(coord.snapshot.remote())
    finally:
        ray.kill(coord)
