"""A worker's budget: its lease (lease.py) behind an async front, and the only path from a worker to
the coordinator's ledger and gate.

Reservations and settlements are local; the coordinator is called when a reservation does not fit
the lease (a renewal, one at a time per worker), every `REPORT_SECONDS` (spend and tool observations
for progress and the gate), and once at the end (give back). At steady state that is one call per
lease (about `LEASE_REQUESTS` requests, see `hint`) plus one per `REPORT_SECONDS`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

from eyrie.jobs.generate.budget.coordinator import RequestResult
from eyrie.jobs.generate.budget.lease import Grant, Lease, Renewal

REPORT_SECONDS = 1.0  # progress, the gate's sliding window and stops are at most this late
LEASE_REQUESTS = 64  # a lease aims at this many answers (at their mean cost) beyond the concurrency
FIRST_LEASE_REQUESTS = 8  # ...or this many worst cases before any answer was settled

Call = Callable[..., Awaitable[Any]]


class LeaseHolder:
    def __init__(self, call: Call, worker: str, concurrency: int):
        self._call = call
        self.worker = worker
        self.concurrency = concurrency
        self.lease = Lease()
        self.stopped = False
        self._observations: list[RequestResult] = []
        self._renewing = asyncio.Lock()
        self._settled = asyncio.Event()
        self._closing = asyncio.Event()

    async def reserve(self, amount: Decimal) -> int | None:
        """A reservation id for `amount` (the request's worst case), renewing the lease as needed;
        None when the run stops (budget exhausted, or any other stop reason)."""
        while not self.stopped:
            rid = self.lease.reserve(amount)
            if rid is not None:
                return rid
            want = self.lease.price(amount)
            grant = await self._renew(want, self.hint(want))
            if grant is None or grant.renewal is Renewal.GRANTED:
                continue  # another request renewed meanwhile, or we did: try the lease again
            if grant.renewal is Renewal.EXHAUSTED:
                self.stopped = True
            elif self.lease.in_flight:  # WAIT: our own reservations must settle first
                await self._wait_settled()
        return None

    def hint(self, want: Decimal) -> Decimal:
        """The lease to aim at: the worst case of a full concurrency in flight, plus LEASE_REQUESTS
        answers at what answers have really cost. Sized by actual cost, a lease lasts about
        LEASE_REQUESTS requests (<= 1/64 coordinator calls per request at steady state) and keeps
        little slack leased, which is all a kill -9 can add to the persisted bound beyond the
        requests in flight."""
        mean = self.lease.mean_cost()
        extra = want * FIRST_LEASE_REQUESTS if mean is None else mean * LEASE_REQUESTS
        return want * self.concurrency + extra

    def settle(self, rid: int, cost: Decimal | None, obs: RequestResult) -> None:
        """A paid request: its actual cost (None: the whole reservation) and what it taught."""
        self.lease.settle(rid, cost)
        self._observe(obs)

    def release(self, rid: int, obs: RequestResult) -> None:
        """A request that was not paid (failed without a charge)."""
        self.lease.release(rid)
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
