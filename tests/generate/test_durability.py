"""Durable before release (jobs/generate/sending/journal.py): at every moment, answers paid but not durable
<= maxConcurrency; readers see a store left in any state once per sample; and any failing task
stops the worker with outcome Failed instead of a hang.

Real HTTP to the simulator, the inline driver, a real file store wrapped to watch every write (and,
for the invariant, to write slower than the provider answers: a fast local disk would hide a slot
freed before its commit, since the write would be done before the next answer came back).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from fault_helpers import API_KEY, assert_exactly_once, simple_rows, spec_doc, write_rows, write_spec

from eyrie.jobs.api import ChatClient
from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import layout, records
from eyrie.jobs.generate.budget.coordinator import RunCoordinator
from eyrie.jobs.generate.driver import GenerationResult, run_generation
from eyrie.jobs.generate.sending.journal import ShardState, compact_shard, scan_shard
from eyrie.jobs.pipeline import provider
from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess
from eyrie.jobs.spec import load_spec
from eyrie.jobs.store import FileStore, StoreError

CONCURRENCY = 6


class WatchedStore(FileStore):
    """A file store that counts the records made durable by journal writes; each journal write
    takes at least `write_s` (a slow disk, a distant bucket)."""

    def __init__(self, root: Path, fail_after: int | None = None, write_s: float = 0.0):
        super().__init__(root)
        self.durable = 0
        self.journal_writes = 0
        self.fail_after = fail_after
        self.write_s = write_s
        self.lock = threading.Lock()

    def put(self, key: str, data: bytes) -> None:
        if layout.parse_journal_key(key):
            if self.fail_after is not None and self.journal_writes >= self.fail_after:
                raise StoreError(f"cannot write {self.url(key)}: disk full (injected)")
            time.sleep(self.write_s)  # on the journal's writer thread, as a slow PUT would block it
            super().put(key, data)
            with self.lock:
                self.journal_writes += 1
                self.durable += len(records.decode_part(data))
            return
        super().put(key, data)


def run(tmp_path: Path, store: FileStore, n: int, monkeypatch: pytest.MonkeyPatch, *, latency_ms: int = 30,
        workers: int = 2) -> GenerationResult:
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(n))
    with SimulatorProcess(SimulatorConfig(latency_ms=latency_ms)) as sim:
        spec = write_spec(tmp_path, spec_doc(prompts, store.uri, sim.base_url, workers=workers, shards=4,
                                             concurrency=CONCURRENCY))
        monkeypatch.setenv("EYRIE_API_KEY", API_KEY)
        dg = load_spec(spec)
        with provider(dg.spec) as base_url:
            result: list[GenerationResult] = []
            t = threading.Thread(target=lambda: result.append(run_generation(
                dg, store, RunContext(attempt=f"d-{time.time_ns()}", api_key=API_KEY), base_url, inline=True)))
            t.start()
            t.join(timeout=120)
            assert not t.is_alive(), "the run hangs"
    assert result, "the run raised instead of ending with an outcome"
    return result[0]


@pytest.mark.integration
@pytest.mark.parametrize("company", ["default", "every slot"])
def test_paid_but_not_durable_never_exceeds_max_concurrency(tmp_path, monkeypatch, company):
    # each journal write takes 10x the provider's 30 ms: with the slot freed before its commit, a
    # worker would collect about 3 slots x 10 answers paid but not durable during every write.
    # "every slot": each journal waits (up to LINGER_S) for as many records as its worker has slots
    if company == "every slot":
        monkeypatch.setattr("eyrie.jobs.generate.sending.sender.company_for", lambda slots: slots)
    store = WatchedStore(tmp_path / "out", write_s=0.3)
    paid, gaps = [0], []
    original = ChatClient.complete

    async def counted(self, body, **kw):
        done = await original(self, body, **kw)
        with store.lock:  # the answer is paid once it is back; is it durable before its slot frees?
            paid[0] += 1
            gaps.append(paid[0] - store.durable)
        return done

    monkeypatch.setattr(ChatClient, "complete", counted)
    result = run(tmp_path, store, 120, monkeypatch)
    assert result.outcome == "Done", result.message
    assert paid[0] == store.durable == 120
    assert max(gaps) <= CONCURRENCY, f"{max(gaps)} answers paid but not durable at once"
    assert max(gaps) > 1  # answers were really in flight together
    # group commit: answers that arrive together share a write
    assert store.journal_writes < 120
    # the shard ended: its journal was compacted into parts, and nothing else is left
    keys = [k for k in store.list(layout.GENERATIONS) if k != layout.PLAN]
    assert keys and all(layout.parse_part_key(k) for k in keys)
    assert_exactly_once(list(records.iter_records(store)), range(120))


@pytest.mark.integration
def test_a_failing_store_write_stops_the_worker_with_outcome_failed(tmp_path, monkeypatch):
    store = WatchedStore(tmp_path / "out", fail_after=3)
    result = run(tmp_path, store, 60, monkeypatch, workers=1)
    assert result.outcome == "Failed"
    assert "StoreError" in result.message and "disk full (injected)" in result.message
    assert result.message.startswith("worker w0 stopped")
    # what was made durable before the failure stays readable
    assert len(list(records.iter_records(store))) == store.durable > 0


@pytest.mark.integration
def test_a_failing_coordinator_call_stops_the_run_instead_of_hanging(tmp_path, monkeypatch):
    def broken(self, shard):
        raise RuntimeError("the coordinator lost its state")

    monkeypatch.setattr(RunCoordinator, "shard_done", broken)
    result = run(tmp_path, FileStore(tmp_path / "out"), 20, monkeypatch, workers=1, latency_ms=5)
    assert result.outcome == "Failed"
    assert "RuntimeError: the coordinator lost its state" in result.message


def record(sid: str) -> records.Record:
    return {"sample_id": sid, "source": "p", "row": int(sid[1:]), "status": "ok"}


def test_readers_see_each_sample_once_in_any_state_a_kill_leaves(tmp_path):
    store = FileStore(tmp_path / "out")
    # shard 0: journal only (killed mid-shard)
    store.put(layout.journal_key(0, "0000000a", 0), records.encode_part([record("r0"), record("r1")]))
    store.put(layout.journal_key(0, "0000000a", 1), records.encode_part([record("r2")]))
    # shard 1: killed mid-compaction: a part holds r3, the journal still holds r3 and r4
    store.put(layout.part_key(1, 0), records.encode_part([record("r3")]))
    store.put(layout.journal_key(1, "0000000b", 0), records.encode_part([record("r3"), record("r4")]))
    assert records.list_shards(store) == [0, 1]
    assert sorted(r["sample_id"] for r in records.iter_records(store)) == ["r0", "r1", "r2", "r3", "r4"]
    assert [r["sample_id"] for r in records.iter_records(store, 1)] == ["r3", "r4"]
    # the resume's scan skips all of them; the compaction finishes the interrupted one exactly once
    state = scan_shard(store, 1)
    assert state.done == {"r3", "r4"} and state.next_part == 1
    assert compact_shard(store, 1, state, part_records=1) == 1
    assert store.list(layout.journal_prefix(1)) == []
    assert [r["sample_id"] for r in records.iter_records(store, 1)] == ["r3", "r4"]
    assert [p for _s, p, _k in records.list_parts(store, 1)] == [0, 1]
    assert compact_shard(store, 0, ShardState(), part_records=2) == 3
    assert [len(records.decode_part(store.get(k))) for _s, _p, k in records.list_parts(store, 0)] == [2, 1]


def test_a_reader_beside_a_running_compaction_still_sees_each_sample_once(tmp_path):
    class CompactingUnderfoot(FileStore):
        """The shard is compacted between the reader's listing and its first journal read."""

        compacted = False

        def get(self, key: str) -> bytes:
            if layout.parse_journal_key(key) and not self.compacted:
                self.compacted = True
                compact_shard(self, 0, scan_shard(self, 0), part_records=2)
            return super().get(key)

    store = CompactingUnderfoot(tmp_path / "out")
    store.put(layout.part_key(0, 0), records.encode_part([record("r0")]))
    for seq in range(3):
        store.put(layout.journal_key(0, "0000000c", seq), records.encode_part([record(f"r{seq + 1}")]))
    assert sorted(r["sample_id"] for r in records.iter_records(store)) == ["r0", "r1", "r2", "r3"]
    assert store.compacted and store.list(layout.journal_prefix(0)) == []


@pytest.mark.integration
def test_a_worker_holds_a_few_prompts_not_its_shard(tmp_path, monkeypatch):
    """Shards read their own rows (generate/plan.py): the driver holds none, a worker about its
    concurrency, however many rows its shard has."""
    import gc

    from eyrie.jobs.sources import Prompt

    live: list[int] = []
    original = ChatClient.complete

    async def counted(self, body, **kw):
        if len(live) < 40:
            live.append(sum(isinstance(o, Prompt) for o in gc.get_objects()))
        return await original(self, body, **kw)

    monkeypatch.setattr(ChatClient, "complete", counted)
    result = run(tmp_path, FileStore(tmp_path / "out"), 800, monkeypatch, workers=1, latency_ms=0)
    assert result.outcome == "Done", result.message
    assert len(live) == 40 and max(live) <= 3 * CONCURRENCY  # a batch read ahead + those in flight


def failed(sid: str, transient: bool) -> records.Record:
    error = {"type": "http-429" if transient else "moderation", "message": "x"}
    return {**record(sid), "status": "failed", "error": {**error, "transient": True} if transient else error}


def test_a_sample_resent_after_a_transient_failure_reads_as_its_later_record_in_any_state(tmp_path):
    """A transient failure is replaced by the next attempt's record wherever each sits (parts,
    journal, either writer's order), a moderated failure is final, and a compaction never leaves a
    transient failure behind the record that replaced it."""
    store = FileStore(tmp_path / "out")
    # shard 0: the failure compacted in a part, the resend still in the journal (killed mid-shard)
    store.put(layout.part_key(0, 0), records.encode_part([failed("r0", True), failed("r1", False), record("r2")]))
    store.put(layout.journal_key(0, "0000000a", 0), records.encode_part([record("r0")]))
    got = {r["sample_id"]: r["status"] for r in records.iter_records(store, 0)}
    assert got == {"r0": "ok", "r1": "failed", "r2": "ok"} and len(list(records.iter_records(store, 0))) == 3
    # the scan resends only the transient one
    assert scan_shard(store, 0).done == {"r0", "r1", "r2"}
    store.delete(layout.journal_key(0, "0000000a", 0))
    assert scan_shard(store, 0).done == {"r1", "r2"}
    # shard 1: two attempts' journals left by kills; the later attempt's writer sorts first
    store.put(layout.journal_key(1, "0000000b", 0), records.encode_part([record("r3"), failed("r4", True)]))
    store.put(layout.journal_key(1, "0000000c", 0), records.encode_part([failed("r3", True), failed("r4", True)]))
    assert {r["sample_id"]: r["status"] for r in records.iter_records(store, 1)} == {"r3": "ok", "r4": "failed"}
    state = scan_shard(store, 1)
    assert state.done == {"r3"}
    compact_shard(store, 1, state, part_records=10)
    parts = [records.decode_part(store.get(k)) for _s, _p, k in records.list_parts(store, 1)]
    assert [r["sample_id"] for r in parts[0]] == ["r3", "r4", "r4"]  # r3's older failure dropped
    assert [(r["sample_id"], r["status"]) for r in records.iter_records(store, 1)] == [("r3", "ok"), ("r4", "failed")]


def test_a_second_start_of_the_same_attempt_is_a_restart_that_keeps_its_lost_workers() -> None:
    """KubeRay submits an attempt's job again when its head was lost: the job then finds its own attempt's progress
    (the operator numbers every new attempt afresh, a local run makes a unique one), counts a restart and carries the
    workers lost so far, so that the operator can say so once per rise."""
    from eyrie.jobs.contract.progress import Progress, parse_progress
    from eyrie.jobs.generate.driver import Resume

    def found(**doc: object) -> Progress:  # the progress.json the job finds (any outcome: it does not matter here)
        return parse_progress({"outcome": "Running", **doc})

    run = "uid-a"
    assert Resume.disruptions_of(None, "1", run) == (0, 0)
    assert Resume.disruptions_of(found(attempt="1", runId=run, outcome="BudgetExhausted"), "2", run) == (0, 0)
    assert Resume.disruptions_of(found(attempt="1", runId=run), "1", run) == (1, 0)
    assert Resume.disruptions_of(found(attempt="1", runId=run, restarts=1, workersLost=2), "1", run) == (2, 2)
    # `kubectl delete dsg`, then the same spec applied again: a new object, attempt 1 again, not a restart
    assert Resume.disruptions_of(found(attempt="1", runId=run), "1", "uid-b") == (0, 0)
    assert Resume.disruptions_of(found(attempt="1"), "1", None) == (1, 0)  # local, no uid
    # the pilot's progress of the same attempt (its Job in a cluster, the first stage locally): the job's first start
    assert Resume.disruptions_of(found(attempt="1", runId=run, stage="pilot", outcome="PilotPassed"), "1", run) == (
        0, 0)


async def test_a_journal_waits_for_company_at_most_its_linger_and_never_returns_before_the_write(tmp_path):
    """`company` records share a write even when they come a few ms apart; a lone record waits no longer than
    LINGER_S; a commit returns only once its object is in the store."""
    from eyrie.jobs.generate.sending.journal import LINGER_S, Journal

    store = WatchedStore(tmp_path / "out")
    journal = Journal(store, company=4)
    writer = asyncio.create_task(journal.run())

    async def spaced(i: int) -> None:
        await asyncio.sleep(0.004 * i)
        await journal.commit(0, record(f"r{i}"))
        assert store.durable >= i + 1  # returned: its record is in the store

    try:
        await asyncio.gather(*(spaced(i) for i in range(4)))  # 12 ms apart in all: one write
        assert (journal.writes, store.journal_writes, store.durable) == (1, 1, 4)
        t0 = time.monotonic()
        await journal.commit(0, record("r9"))  # alone: waits for company, then writes anyway
        waited = time.monotonic() - t0
        assert journal.writes == 2 and store.durable == 5
        assert LINGER_S * 0.8 <= waited < LINGER_S + 1.0, waited
    finally:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
    assert_exactly_once(list(records.iter_records(store)), [0, 1, 2, 3, 9])
