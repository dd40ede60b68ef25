"""A shard worker: takes shards from the coordinator, sends their prompts through its `Sender`
(`sender.py`: the per-request path; each prompt is one `Sender.answer`, the slot step the audit and the probe
run too) and reports each shard done once its records are durable (`journal.py`: the invariant and the group
commit). In the driver's process (`--inline`) or in a Ray actor (`actor.py`, the adapter).

Persistence is the exactly-once boundary: a shard's ids already in the store are skipped. The
worker is one `asyncio.TaskGroup`: the journal's writer, one task per request in flight (at most
`concurrency`, each holding a slot) and one per shard finishing. Any task that raises (a store that
stays down, a lost coordinator, a bug) cancels the others and the worker ends with outcome Failed
naming the error; nothing can wait forever on a sibling that died.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from eyrie.jobs.contract import records
from eyrie.jobs.contract.progress import Outcome
from eyrie.jobs.errors import EyrieError
from eyrie.jobs.generate.budget.holder import StoppedAtOnce
from eyrie.jobs.generate.plan import ShardPlan
from eyrie.jobs.generate.sending import agentic
from eyrie.jobs.generate.sending.journal import ShardState, compact_shard, scan_shard
from eyrie.jobs.generate.sending.sender import Sender
from eyrie.jobs.sources import BadRow, Prompt, iter_source

log = logging.getLogger(__name__)

class WorkerFailed(EyrieError, RuntimeError):
    """A worker could not go on (store down after retries, coordinator lost, a bug); the run's
    outcome is Failed with this message."""


@dataclass
class _ShardRun:
    """One shard while a worker holds it: requests still open, and whether all were fed."""

    shard: int
    state: ShardState
    todo: int
    open: int = 0
    fed: bool = False
    answered: int = 0
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    earlier: dict[str, list[records.Record]] = field(default_factory=dict)  # turns: all, by conversation

    def settle_one(self, answered: bool) -> None:
        self.open -= 1
        self.answered += answered
        if self.fed and self.open == 0:
            self.drained.set()


class ShardWorker:
    """The shard loop of one sender (built by the session: `Session.shard_worker`, `Session.actor_sender`)."""

    def __init__(self, sender: Sender, plan: ShardPlan):
        self.sender = sender
        self._call = sender.call
        self.spec = sender.spec
        self.worker_id = sender.sender_id
        self.plan = plan  # the shards' row ranges: the worker reads its own
        self.persisted = 0

    # -- the worker: shards in, durable records out --------------------------------------------
    async def run(self) -> int:
        """Process shards until none are left or the run stops; returns records persisted. Any
        failure of any task ends the worker and the run with outcome Failed and its message."""
        budget = self.sender.budget
        try:
            async with self.sender.open_client():
                await self._run_shards()
            await budget.give_back()
        except asyncio.CancelledError:  # the run stopped at once: what was in flight is written down
            await budget.abandon()
            raise
        except Exception as e:  # an ExceptionGroup from the TaskGroup, or the client's own
            err = _first_cause(e)
            if isinstance(err, StoppedAtOnce):  # the run stopped at once (under Ray: no cancel reaches here)
                await budget.abandon()
                return self.sender.journal.durable
            message = f"worker {self.worker_id} stopped: {type(err).__name__}: {err}"
            if not isinstance(err, EyrieError):
                log.error("%s", message, exc_info=err)  # a bug: keep its traceback
            try:
                await budget.give_back(failed=True)
                await budget.stop(Outcome.FAILED, message)
            except Exception:
                raise WorkerFailed(message) from err
        return self.persisted

    async def _run_shards(self) -> None:
        sender = self.sender
        async with asyncio.TaskGroup() as tg:
            writer = tg.create_task(sender.journal.run())
            reporter = tg.create_task(sender.budget.report_forever())
            finishing = []
            while not sender.stopping:
                shard = await self._call("next_shard", self.worker_id)
                if shard is None:
                    break
                run = await self._start_shard(shard)
                finishing.append(tg.create_task(self._finish_shard(run)))
                await self._feed(tg, run)
            await asyncio.gather(*finishing)  # every record durable, every shard compacted
            writer.cancel()
            sender.budget.close()
            await reporter
        self.persisted = sender.journal.durable

    async def _start_shard(self, shard: int) -> _ShardRun:
        store = self.sender.open_store()
        state = await asyncio.to_thread(scan_shard, store, shard)
        run = _ShardRun(shard, state, todo=0)
        if self.sender.agentic:
            run.earlier = await asyncio.to_thread(agentic.earlier_turns, store, shard)
        return run

    async def _feed(self, tg: asyncio.TaskGroup, run: _ShardRun) -> None:
        """Start one task per prompt not yet persisted, each once a slot is free."""
        sender, done = self.sender, run.state.done
        async for sid, prompt in self._prompts(run.shard):
            if sender.stopping:
                break
            if agentic.finished(run.earlier.get(sid, [])) if sender.agentic else sid in done:
                continue
            run.todo += 1
            await sender.slots.acquire()
            run.open += 1
            tg.create_task(self._conversation(run, sid, prompt) if sender.agentic else self._request(run, sid, prompt))
        run.fed = True
        if run.open == 0:
            run.drained.set()

    async def _prompts(self, shard: int) -> AsyncIterator[tuple[str, Prompt | BadRow]]:
        """The shard's rows streamed from their sources, `concurrency` at a time and read off the
        event loop: a worker holds O(concurrency) prompts, however large its shard."""
        by_name = {s.name: s for s in self.spec.sources}
        whole = self.spec.generation.turns == "all"
        for span in self.plan.shards[shard]:
            rows = iter_source(by_name[span.source], self.spec.output.endpoint, whole=whole, start=span.start,
                               stop=span.stop, index=self.plan.indexes[span.source],
                               answers=self.sender.dataset_answers)

            def take(rows: Iterator[Prompt | BadRow] = rows) -> list[tuple[str, Prompt | BadRow]]:
                return [(item.sample_id(), item) for item in itertools.islice(rows, self.sender.concurrency)]

            while batch := await asyncio.to_thread(take):
                for item in batch:
                    yield item

    async def _request(self, run: _ShardRun, sid: str, prompt: Prompt | BadRow) -> None:
        """One prompt under the slot `_feed` took: `Sender.answer` frees it once the record is durable."""
        rec = None
        try:
            rec = await self.sender.answer(run.shard, sid, prompt, held=True)
        finally:
            run.settle_one(rec is not None)

    async def _conversation(self, run: _ShardRun, sid: str, prompt: Prompt | BadRow) -> None:
        """A conversation's turns under one slot (`agentic.converse`: each turn durable before the next)."""
        ended = False
        try:
            ended = await agentic.converse(self.sender, run.shard, sid, prompt, run.earlier.get(sid, []))
        finally:
            run.settle_one(ended)
            self.sender.slots.release()

    async def _finish_shard(self, run: _ShardRun) -> None:
        """Once the shard's requests are durable: compact its journal into parts; report it done
        when every prompt got a record (a stopped run leaves it for the resume)."""
        await run.drained.wait()
        await asyncio.to_thread(compact_shard, self.sender.open_store(), run.shard, run.state,
                                self.spec.generation.part_records)
        if run.answered == run.todo:
            await self._call("shard_done", run.shard)


def _first_cause(e: BaseException) -> BaseException:
    """The first leaf of an ExceptionGroup (the TaskGroup's), else the exception itself."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e
