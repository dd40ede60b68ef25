"""Process faults on real local Ray: the shard workers' processes SIGKILLed mid-run while they hold
requests in flight (the driver requeues their shards on new workers), and the whole `eyrie run`
SIGKILLed and run again (exactly once; only the requests in flight at the kill are paid twice: an
answer is durable before its slot is freed).

Ray's state API needs the dashboard, which a Local run turns off, so a worker is found the way an
operator would find it on the node: by its process title (`ray::ShardWorker...`) among the
descendants of the driver this test started. Every process the test saw is killed by PID at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from fault_helpers import (
    API_KEY,
    all_part_bytes,
    assert_exactly_once,
    persisted,
    progress,
    simple_rows,
    spec_doc,
    spent_sum,
    start_run,
    wait_persisted,
    write_rows,
    write_spec,
)
from proc_tree import children_of, cmdline, kill_all

from eyrie.jobs.generate.budget.pricing import Pricing, worst_case
from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess
from eyrie.jobs.store import open_store

# tier (tests/conftest.py): `eyrie run` as a process on local Ray, its workers killed
pytestmark = pytest.mark.integration

N = 80
CONCURRENCY = 8
LATENCY_MS = 150
# Paid twice at most: the requests in flight when a process died (durable before release).
PAID_TWICE_MAX = CONCURRENCY
# an upper bound of one request's worst case here (a few hundred prompt bytes, 256 output tokens)
WORST = worst_case(Pricing(Decimal("0.60"), Decimal("2.50")), 1000, 256)


def _workers(pid: int) -> list[int]:
    return [p for p in children_of(pid) if cmdline(p).startswith("ray::ShardWorker")]


@dataclass
class LostWorkers:
    rc: int
    stderr: str
    stats: dict
    out: str
    persisted_at_kill: int




@pytest.fixture(scope="module")
def lost_workers(tmp_path_factory) -> Iterator[LostWorkers]:
    """One Ray run whose two shard-worker processes are SIGKILLed with requests in flight (three workers: a local
    run's first works in the driver's process, the other two are Ray actors, started once Ray is up)."""
    tmp_path = tmp_path_factory.mktemp("lost-worker")
    ray_dir = tempfile.mkdtemp(prefix="ry", dir="/tmp")
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(N, tools_every=4))
    out = f"file://{tmp_path}/out"
    seen: set[int] = set()
    try:
        # slow enough answers that the first worker alone cannot finish the run before Ray's workers are up
        with SimulatorProcess(SimulatorConfig(latency_ms=1000)) as sim:
            spec = write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, workers=3, shards=6,
                                                 concurrency=CONCURRENCY))
            proc = start_run(spec, ray_dir)
            store = open_store(out)
            try:
                wait_persisted(out, 10, proc, seen)
                deadline = time.time() + 60
                while len(victims := _workers(proc.pid)) < 2:  # both workers are up and busy
                    assert time.time() < deadline and proc.poll() is None, [cmdline(p) for p in children_of(proc.pid)]
                    time.sleep(0.05)
                for v in victims:
                    os.kill(v, 9)
                at_kill = len(persisted(store))
                _, stderr = proc.communicate(timeout=180)
            finally:
                seen.update(children_of(proc.pid))
                kill_all([proc.pid, *seen])
            yield LostWorkers(proc.returncode, stderr, sim.stats(), out, at_kill)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)


def test_killed_ray_workers_are_replaced_and_their_shards_requeued(lost_workers):
    lw = lost_workers
    assert lw.rc == 0, lw.stderr[-3000:]
    store = open_store(lw.out)
    all_part_bytes(store)
    recs = persisted(store)
    assert_exactly_once(recs, range(N))
    assert all(r["status"] == "ok" for r in recs)
    prog = progress(store)
    assert prog["outcome"] == "Done"
    assert (prog["workersLost"], prog["restarts"]) == (2, 0)  # what the operator turns into WorkerLost events
    # paid twice: at most what was in flight when they died (every answer was durable before release)
    assert N <= lw.stats["completed"] <= N + CONCURRENCY
    # the lost workers' open reservations count as spent (the safe side): spend covers every bill
    billed, spent = Decimal(lw.stats["billedUSD"]), Decimal(prog["spentUSD"])
    assert spent_sum(recs) <= billed <= spent <= Decimal("5.00")


def test_progress_after_lost_workers_counts_each_sample_once(lost_workers):
    store = open_store(lost_workers.out)
    recs = persisted(store)
    prog = progress(store)
    assert prog["samples"] == {"total": N, "done": N, "rejected": 0, "discarded": 0, "failed": 0}
    assert prog["tokens"]["output"] == sum(r["usage"]["completion_tokens"] for r in recs)


def test_eyrie_run_killed_with_sigkill_then_rerun_is_exactly_once(tmp_path, ray_tmp):
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(N))
    out = f"file://{tmp_path}/out"
    seen: set[int] = set()
    with SimulatorProcess(SimulatorConfig(latency_ms=LATENCY_MS)) as sim:
        spec = write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, workers=2, shards=6,
                                             concurrency=CONCURRENCY))
        proc = start_run(spec, ray_tmp)
        try:
            wait_persisted(out, 15, proc, seen)
            seen.update(children_of(proc.pid))
            os.killpg(proc.pid, 9)  # the driver and everything in its session, as a node loss would
            proc.communicate(timeout=30)
        finally:
            kill_all([proc.pid, *seen])
        before = len(persisted(open_store(out)))
        assert 0 < before < N
        billed_first = Decimal(sim.stats()["billedUSD"])
        rerun = start_run(spec, ray_tmp)
        try:
            _, stderr = rerun.communicate(timeout=180)
        finally:
            kill_all([rerun.pid, *children_of(rerun.pid)])
        stats = sim.stats()
    assert rerun.returncode == 0, stderr[-3000:]
    all_part_bytes(open_store(out))
    recs = persisted(open_store(out))
    assert_exactly_once(recs, range(N))
    prog = progress(open_store(out))
    assert prog["outcome"] == "Done" and prog["samples"]["done"] == N
    paid_twice = stats["completed"] - N
    assert 0 <= paid_twice <= PAID_TWICE_MAX
    # spend is cumulative over both attempts and never below the bill: the rerun books what the
    # killed workers' slots said their requests in flight could cost, at most maxConcurrency of
    # them at their worst case above the bill (never the leases' slack)
    spent, billed = Decimal(prog["spentUSD"]), Decimal(stats["billedUSD"])
    assert billed_first > 0 and spent <= Decimal("5.00")
    assert spent_sum(recs) <= billed <= spent <= billed + CONCURRENCY * WORST


def _start_inline(spec: Path) -> subprocess.Popen:
    env = {**os.environ, "EYRIE_API_KEY": API_KEY, "EYRIE_NO_RAY": "1"}
    return subprocess.Popen([sys.executable, "-m", "eyrie.jobs.cli", "run", str(spec), "--no-progress"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.integration
def test_sigterm_stops_cleanly_and_the_resume_pays_nothing_twice(tmp_path):
    """SIGTERM (Ray's stop_job, a pod's termination): stop dispatching, let in-flight answers land,
    flush, outcome Stopped (exit 6); the resume then completes every prompt, each paid exactly once."""
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(N))
    out = f"file://{tmp_path}/out"
    # slow answers, so the signal lands mid-run even on a loaded machine
    with SimulatorProcess(SimulatorConfig(latency_ms=4 * LATENCY_MS)) as sim:
        spec = write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, concurrency=CONCURRENCY))
        proc = _start_inline(spec)
        try:
            wait_persisted(out, 1, proc, set())
            os.kill(proc.pid, 15)
            _, stderr = proc.communicate(timeout=60)
        finally:
            kill_all([proc.pid])
        assert proc.returncode == 6, stderr[-3000:]
        first = progress(open_store(out))
        assert first["outcome"] == "Stopped" and "resume" in first["message"]
        stopped_at = len(persisted(open_store(out)))
        assert sim.stats()["completed"] == stopped_at < N  # everything paid was flushed
        _, stderr = (rerun := _start_inline(spec)).communicate(timeout=120)
        stats = sim.stats()
    assert rerun.returncode == 0, stderr[-3000:]
    recs = persisted(open_store(out))
    assert_exactly_once(recs, range(N))
    assert stats["completed"] == N
    assert Decimal(progress(open_store(out))["spentUSD"]) == Decimal(stats["billedUSD"]) == spent_sum(recs)


@pytest.mark.integration
def test_kill_minus_9_then_rerun_never_bills_past_the_cap(tmp_path):
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(400))
    out = f"file://{tmp_path}/out"
    cap = Decimal("0.06")
    with SimulatorProcess(SimulatorConfig(latency_ms=LATENCY_MS)) as sim:
        spec = write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, concurrency=CONCURRENCY,
                                             max_usd=str(cap)))
        proc = _start_inline(spec)
        store = open_store(out)
        try:
            deadline = time.time() + 60
            # kill once the provider has billed more than the store knows of (requests in flight)
            while True:
                assert time.time() < deadline and proc.poll() is None
                known = max(spent_sum(persisted(store)),
                            Decimal(progress(store)["spentUSD"]) if store.exists("progress.json") else Decimal(0))
                if Decimal(sim.stats()["billedUSD"]) - known > Decimal("0.001"):
                    break
                time.sleep(0.02)
            os.kill(proc.pid, 9)
            proc.communicate(timeout=30)
        finally:
            kill_all([proc.pid])
        _, stderr = (rerun := _start_inline(spec)).communicate(timeout=120)
        stats = sim.stats()
    assert rerun.returncode == 3, stderr[-3000:]  # BudgetExhausted
    assert_exactly_once(persisted(open_store(out)), sorted({r["row"] for r in persisted(open_store(out))}))
    assert Decimal(stats["billedUSD"]) <= cap
