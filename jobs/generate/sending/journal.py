"""Durable before release: a worker's answers reach the store in group commits, before their slots
are freed, and are compacted into the shard's parts when the shard ends.

The invariant (DESIGN §3; tests/generate/test_durability.py checks it at every write): at every moment,

    answers paid but not durable  <=  requests holding a slot  <=  maxConcurrency.

A worker takes one of its slots before it reserves budget for a request and gives it back only once
`Journal.commit` has returned for that request's record, and `commit` returns only once the object
holding the record is in the store (atomically: rename or a single PUT). A kill -9 at any moment
therefore loses at most the answers whose slots were still held, and a rerun pays again for at most
the requests that were in flight.

Group commit: records that arrive while a write is under way wait for the next write and share it
(one journal object per shard per write, however many records). Under load a write carries about as
many records as arrived during the previous one, so writes per answer fall as the rate rises. With many
requests in flight and slow answers that is still a write per one or two answers (at 10,000 in flight
and 2-60 s: 12,500 objects for 20,000 answers, each created, fsynced, read back and deleted), so a
journal may wait for company (`company`): up to `LINGER_S` for that many records before it writes. The
answers waiting hold their slots meanwhile, so the bound above holds as it is; `company` 1 (the
default, and what a sender with few slots gets) writes at once. Waiting for a sixty-fourth of the slots
costs a sixty-fourth of an answer's time when they are all busy; `LINGER_S` bounds the wait when they are
not (a run's last answers, a rate limit). Measured (`eyrie run`, 5,000 in flight, 2-20 s answers): a wait
of 25 ms made a write per 8 answers, 623 us of CPU per answer (104 of them in the kernel: a file created,
fsynced and renamed, a thread woken, per write); 250 ms, a write per 44, 506 us (33).

When a shard ends, `compact_shard` rewrites its journal objects as the final parts
(`generations/shard-NNNNN/part-NNNNN.jsonl.gz`, `generation.partRecords` records each) and then
deletes them. Killed between the two, the store holds some records twice; `records.iter_records`
reads each sample once (parts first) and the next compaction skips what a part already holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from eyrie.jobs.contract import layout, records
from eyrie.jobs.store import Store

LINGER_S = 0.25  # the longest a write waits for company: under 1% of a slow model's seconds per answer
COMPANY_MAX = 64  # records a write waits for at most


def company_for(slots: int) -> int:
    """The records a sender's journal waits for: a sixty-fourth of its slots, 1 (no wait) below 128 slots, at most
    COMPANY_MAX. Fewer slots fill a write by themselves (at 64 slots and a fast provider, a wait for 4 records
    cost a tenth of the throughput); 10,000 fill 64 in well under LINGER_S."""
    return max(1, min(COMPANY_MAX, slots // 64))


class Journal:
    """One worker's group committer; `run` is its writer loop (a task in the worker's TaskGroup)."""

    def __init__(self, store: Store, writer: str | None = None,
                 key: Callable[[int, str, int], str] = layout.journal_key, company: int = 1):
        self.store = store
        self.company = company  # a write waits up to LINGER_S for this many records (1: it writes at once)
        self.writer = writer or secrets.token_hex(4)  # names this worker instance's objects
        self._key = key  # (shard, writer, seq) -> object key: a shard's journal, or the probe's answers
        self._seq = 0
        self._pending: dict[int, list[tuple[records.Record, asyncio.Future[None]]]] = {}
        self._pending_n = 0
        self._wake = asyncio.Event()
        self._enough = asyncio.Event()  # `company` records are pending
        self.writes = 0  # journal objects written
        self.durable = 0  # records made durable

    async def commit(self, shard: int, rec: records.Record) -> None:
        """Return once `rec` is durable in the store."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(shard, []).append((rec, done))
        self._pending_n += 1
        self._wake.set()
        if self._pending_n >= self.company:
            self._enough.set()
        await done

    async def run(self) -> None:
        """Write whatever is pending, one object per shard, until cancelled. A failed write fails
        (cancels) every commit waiting on it and raises, which stops the worker's TaskGroup."""
        while True:
            await self._wake.wait()
            if self._pending_n < self.company:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(LINGER_S):
                        await self._enough.wait()
            self._wake.clear()
            self._enough.clear()
            batch, self._pending, self._pending_n = self._pending, {}, 0
            try:
                # compress and write off the event loop: answers keep arriving meanwhile
                await asyncio.to_thread(self._write, {s: [r for r, _ in items] for s, items in batch.items()})
            except BaseException:
                for items in batch.values():
                    for _, f in items:
                        f.cancel("the journal write failed")
                raise
            for items in batch.values():
                for _, f in items:
                    if not f.done():
                        f.set_result(None)

    def _write(self, batch: dict[int, list[records.Record]]) -> None:
        for shard, recs in batch.items():
            self.write(shard, recs)

    def write(self, shard: int, recs: list[records.Record]) -> None:
        """Write `recs` as one journal object of `shard` now, in the caller's thread: the group commit's own
        write, and that of a caller outside a sending loop (the probe's answers adopted into the run's shards)."""
        key = self._key(shard, self.writer, self._seq)
        self._seq += 1
        self.store.put(key, records.encode_part(recs))
        self.writes += 1
        self.durable += len(recs)

    @classmethod
    def probe(cls, store: Store) -> Journal:
        """The provider probe's journal: its answers under `providers/answers/`, one folder for every endpoint."""
        return cls(store, key=lambda _shard, writer, seq: layout.probe_answers_key(writer, seq))


@dataclass
class ShardState:
    """What the store holds for a shard when a worker takes it: the ids of its final records (a
    sample that failed only on transient errors has none, and is sent again)."""

    in_parts: set[str] = field(default_factory=set)  # final records in compacted parts
    in_journal: set[str] = field(default_factory=set)  # final records only in journal objects
    next_part: int = 0

    @property
    def done(self) -> set[str]:
        return self.in_parts | self.in_journal


def _final_keys(recs: list[records.Record]) -> set[str]:
    return {records.record_key(r) for r in recs if not records.resend_on_resume(r)}


def scan_shard(store: Store, shard: int) -> ShardState:
    """The ids a shard already holds for good (to skip them) and the number of its next part."""
    state = ShardState()
    for _s, part, key in records.list_parts(store, shard):
        state.next_part = max(state.next_part, part + 1)
        state.in_parts |= _final_keys(records.decode_part(store.get(key)))
    for key in records.list_journal(store, shard):
        state.in_journal |= _final_keys(records.decode_part(store.get(key)))
    state.in_journal -= state.in_parts
    return state


def compact_shard(store: Store, shard: int, state: ShardState, part_records: int) -> int:
    """Rewrite the shard's journal objects as parts, then delete them; streams, holding at most
    `part_records` records. Returns records moved. Skipped: any record whose sample already has a
    final record in a part (a copy left by a compaction killed midway, or a transient failure
    of an earlier attempt that this one answered), so parts never hold a final record followed
    by another of its sample (readers: `records.iter_shard`)."""
    journal = records.list_journal(store, shard)
    moved, buf = 0, []
    for key in journal:
        for rec in records.decode_part(store.get(key)):
            rkey = records.record_key(rec)
            if rkey in state.in_parts:
                continue
            buf.append(rec)
            if not records.resend_on_resume(rec):
                state.in_parts.add(rkey)
            if len(buf) == part_records:
                moved += _put_part(store, shard, state, buf)
                buf = []
    if buf:
        moved += _put_part(store, shard, state, buf)
    for key in journal:
        store.delete(key)
    return moved


def _put_part(store: Store, shard: int, state: ShardState, recs: list[records.Record]) -> int:
    store.put(layout.part_key(shard, state.next_part), records.encode_part(recs))
    state.next_part += 1
    return len(recs)
