"""A worker's budget: its lease (lease.py) behind an async front, and the only path from a worker to
the coordinator's ledger and gate; and its requests in flight (inflight.py) kept bounded in the store.

Reservations and settlements are local; the coordinator is called when a reservation does not fit
the lease (a renewal, one at a time per worker), every `REPORT_SECONDS` (spend and tool observations
for progress and the gate), and once at the end (give back). At steady state that is one call per
lease (about `LEASE_REQUESTS` requests, see `hint`) plus one per `REPORT_SECONDS`.

A reservation is also a request in flight until its record is durable (`durable`): `InflightLog`
writes the worker's slots before any request they must cover is sent, so a kill -9 at any moment
leaves in the store a bound of what the requests in flight may cost; a stop the worker lives
through (`abandon`) leaves the exact requests instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

import orjson

from eyrie.jobs.contract.progress import now_iso
from eyrie.jobs.errors import EyrieError
from eyrie.jobs.generate.budget.coordinator import RequestResult
from eyrie.jobs.generate.budget.inflight import Drop, InflightBook, bound_doc, final_doc
from eyrie.jobs.generate.budget.lease import Grant, Lease, Renewal

REPORT_SECONDS = 1.0  # progress, the gate's sliding window and stops are at most this late
LEASE_REQUESTS = 64  # a lease aims at this many answers (at their mean cost) beyond the concurrency
FIRST_LEASE_REQUESTS = 8  # ...or this many worst cases before any answer was settled

Call = Callable[..., Awaitable[Any]]


class StoppedAtOnce(EyrieError):
    """The run stopped at once: the worker abandons its requests in flight (raised in its reporter,
    so its TaskGroup cancels every request; `ShardWorker.run` writes them down and ends). What it abandons is
    booked as `inflight.Abandoned`."""


class InflightLog:
    """`InflightBook` behind an async front: its writes one at a time, off the event loop, each
    shared by every request waiting for one (group commit). `put` writes the worker's in-flight
    object, `delete` removes it; `meta` goes into every version of it (attempt, worker, maxUSD)."""

    def __init__(self, put: Callable[[bytes], None], delete: Callable[[], None], meta: dict[str, Any]):
        self.book = InflightBook()
        self._put, self._delete, self.meta = put, delete, meta
        self._lock = asyncio.Lock()
        self._thread: asyncio.Future[None] | None = None  # the put under way (it outlives a cancel)
        self.written = False
        self.writes = 0

    async def open(self, rid: int, amount: Decimal) -> None:
        """Return once request `rid` may be sent: its slot's cap is in the store."""
        if self.book.open(rid, amount):
            return
        while not self.book.covered(rid):
            async with self._lock:
                if not self.book.covered(rid):  # else the write another request waited on covered it
                    await self._write(Drop.NONE)

    async def _write(self, drop: Drop) -> None:
        caps = self.book.begin_write(drop)
        doc = bound_doc(caps, {**self.meta, "updatedAt": now_iso()})
        try:
            await self._run(self._put, orjson.dumps(doc))
        except BaseException:
            self.book.fail_write()
            raise
        self.book.end_write()
        self.written = True
        self.writes += 1

    async def _run(self, fn: Callable[..., None], *args: Any) -> None:
        """One store call at a time, in order: a put left running by a cancelled write lands before
        the next one starts (an older version landing last would cover less than the book thinks)."""
        await self._settled_thread()
        self._thread = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        await asyncio.shield(self._thread)

    async def tick(self, stopping: bool) -> None:
        """Every REPORT_SECONDS: drop the slots left idle for a period (every free one once the
        worker dispatches nothing more), so the bound follows what is really in flight."""
        if self._lock.locked():
            return
        drop = Drop.FREE if stopping else Drop.IDLE
        if self.book.droppable(drop):
            async with self._lock:
                await self._write(drop)
        else:
            self.book.new_period()

    async def _settled_thread(self) -> None:
        if self._thread is not None:
            with contextlib.suppress(BaseException):
                await self._thread

    async def finish(self) -> None:
        """The worker ended: with nothing in flight its object goes; else it holds what is left."""
        await self._settled_thread()
        if self.book.flights:
            await self.abandon()
        elif self.written:
            await self._run(self._delete)
            self.written = False

    async def abandon(self) -> None:
        """A stop the worker lives through: the store gets the exact requests it abandons (sent and
        not durable), in place of the slots that bounded them."""
        await self._settled_thread()  # a bound written after the exact list would hide it
        flights = self.book.abandoned()
        if not flights and not self.written:
            return
        await self._run(self._put, orjson.dumps(final_doc(flights, {**self.meta, "updatedAt": now_iso()})))
        self.written = True


class LeaseHolder:
    def __init__(self, call: Call, worker: str, concurrency: int, inflight: InflightLog | None = None):
        self._call = call
        self.worker = worker
        self.concurrency = concurrency
        self.inflight = inflight
        self.lease = Lease()
        self.stop_event = asyncio.Event()  # set once the run stops: requests still waiting to go out never do
        self.abandoning = False
        self._observations: list[RequestResult] = []
        self._renewing = asyncio.Lock()
        self._queue = asyncio.Lock()  # requests waiting for budget, first come first served (`reserve`)
        self._settled = asyncio.Event()
        self._closing = asyncio.Event()

    @property
    def stopped(self) -> bool:
        """The run stopped (any reason): nothing more is dispatched or sent."""
        return self.stop_event.is_set()

    @stopped.setter
    def stopped(self, value: bool) -> None:
        if value:
            self.stop_event.set()

    async def reserve(self, amount: Decimal) -> int | None:
        """A reservation id for `amount` (the request's worst case), renewing the lease as needed;
        None when the run stops (budget exhausted, or any other stop reason).

        Requests the lease cannot cover queue (FIFO, `_queue`): only the first renews or waits for a settlement,
        the others wait their turn. Woken all together on each settlement, thousands of them (10,000 allowed in
        flight, a budget that holds fewer) each renewed in turn: work for every waiter on every answer. A request
        that arrives while others queue joins the queue, so none is overtaken for ever."""
        rid = None if self._queue.locked() or self.stopped else self.lease.reserve(amount)
        if rid is None:
            async with self._queue:
                rid = await self._reserve_queued(amount)
            if rid is None:
                return None
        if self.inflight is not None:
            try:
                await self.inflight.open(rid, self.lease.amount(rid))
            except BaseException:
                self.lease.release(rid)
                self.inflight.book.close(rid)
                raise
        return rid

    async def _reserve_queued(self, amount: Decimal) -> int | None:
        while not self.stopped:
            rid = self.lease.reserve(amount)
            if rid is not None:
                return rid
            want = self.lease.price(amount)
            grant = await self._renew(want, self.hint(want))
            if grant is None or grant.renewal is Renewal.GRANTED:
                continue  # the periodic report renewed meanwhile, or we did: try the lease again
            if grant.renewal is Renewal.EXHAUSTED:
                self.stopped = True
            elif self.lease.in_flight:  # WAIT: our own reservations must settle first
                await self._wait_settled()
        return None

    def hint(self, want: Decimal) -> Decimal:
        """The lease to aim at: the worst case of a full concurrency in flight, plus LEASE_REQUESTS
        answers at what answers have really cost. Sized by actual cost, a lease lasts about
        LEASE_REQUESTS requests (<= 1/64 coordinator calls per request at steady state); the slack
        leased is never booked as spent, whatever stops the run (inflight.py bounds what can be)."""
        mean = self.lease.mean_cost()
        extra = want * FIRST_LEASE_REQUESTS if mean is None else mean * LEASE_REQUESTS
        return want * self.concurrency + extra

    def sending(self, rid: int) -> None:
        """Request `rid` is about to go out (a stop after this may leave it paid)."""
        if self.inflight is not None:
            self.inflight.book.sending(rid)

    def identify(self, rid: int, generation_id: str) -> None:
        """The provider's id of the generation answering `rid` (to ask what it cost, if abandoned)."""
        if self.inflight is not None:
            self.inflight.book.identify(rid, generation_id)

    def settle(self, rid: int, cost: Decimal | None, obs: RequestResult) -> None:
        """A paid request: its actual cost (None: the whole reservation) and what it taught. It stays
        in flight until its record is durable (`durable`)."""
        if self.inflight is not None:
            self.inflight.book.settle(rid, cost if cost is not None else self.lease.amount(rid))
        self.lease.settle(rid, cost)
        self._observe(obs)

    def durable(self, rid: int) -> None:
        """Request `rid`'s record is in the store: no longer in flight."""
        if self.inflight is not None:
            self.inflight.book.close(rid)

    def unsent(self, rid: int) -> None:
        """A request the run stopped before it was sent (it waited for the rate limits): as if never reserved."""
        self.lease.release(rid)
        if self.inflight is not None:
            self.inflight.book.close(rid)

    def release(self, rid: int, obs: RequestResult) -> None:
        """A request that was not paid (failed without a charge)."""
        self.lease.release(rid)
        if self.inflight is not None:
            self.inflight.book.close(rid)
        self._observe(obs)

    def observe(self, obs: RequestResult) -> None:
        """A prompt that never reserved (a rejected row) still counts."""
        self._observations.append(obs)

    def _observe(self, obs: RequestResult) -> None:
        self._observations.append(obs)
        self._settled.set()
        self._settled = asyncio.Event()

    async def _wait_settled(self) -> None:
        await self._settled.wait()

    async def _renew(self, want: Decimal, hint: Decimal) -> Grant | None:
        """One call at a time; None when another call was under way (its grant is in the lease)."""
        if self._renewing.locked():
            async with self._renewing:
                return None
        async with self._renewing:
            observations, self._observations = self._observations, []
            grant = await self._call("lease", self.lease.take_report(self.worker, observations), want, hint)
            self.lease.apply(grant)
            self.stopped = self.stopped or grant.stop
            self.abandoning = self.abandoning or grant.abandon
            return grant

    async def report(self) -> None:
        """The periodic call: spend and observations out, the lease topped up, stops learnt."""
        if not self._renewing.locked():
            await self._renew(Decimal(0), self.lease.granted - self.lease.spent)

    async def report_forever(self) -> None:
        """Report every REPORT_SECONDS until `close`; never cancelled in the middle of a call."""
        while True:
            try:
                await asyncio.wait_for(self._closing.wait(), REPORT_SECONDS)
                return
            except TimeoutError:
                await self.report()
                if self.abandoning:
                    raise StoppedAtOnce(self.worker) from None
                if self.inflight is not None:
                    await self.inflight.tick(self.stopped)

    def close(self) -> None:
        self._closing.set()

    async def stop(self, outcome: str, message: str) -> None:
        """Stop the run (credits, a key refused, an unpriceable request)."""
        self.stopped = True
        await self._call("stop", outcome, message)

    async def give_back(self, failed: bool = False) -> None:
        """The worker ended: final spend and observations; nothing stays leased to it. After a
        failure, reservations still open count as spent (their requests may have been paid)."""
        async with self._renewing:
            observations, self._observations = self._observations, []
            report = (self.lease.abandon(self.worker, observations) if failed
                      else self.lease.take_report(self.worker, observations))
            await self._call("give_back", report)
        if self.inflight is not None:
            await (self.inflight.abandon() if failed else self.inflight.finish())

    async def abandon(self) -> None:
        """A stop the worker lives through (the run stopped at once): the requests in flight are
        written down exactly; the coordinator needs no word (the final accounting reads the store)."""
        if self.inflight is not None:
            await self.inflight.abandon()
