"""Budget leases: the run's ledger split between the coordinator and its workers. Pure (no I/O).

The coordinator's `LeaseBook` grants each worker a lease: a slice of the budget left. A worker's
`Lease` reserves each request's worst case against it and settles the actual cost locally; it goes
back to the coordinator only when a reservation no longer fits (a renewal), at the end (give back)
and every few seconds (a report: spend and tool observations, for progress and the gate). Each
call carries a `Report`: what the worker spent since its last call and what its open reservations
still hold. The book keeps the lease of each worker covering exactly that `held` part and adds a new
slice on a renewal. So, with `grant[w]` the budget worker w may still spend:

    spent + sum(grant) <= maxUSD                                           (I1, always)

and a worker never spends past its grant (while providers charge at most the reservation; a charge
above it raises the price factor for every later reservation, as in budget.py). Spend therefore
never exceeds maxUSD. A grant is not spend: what a stop may leave paid and unrecorded is bounded by
the requests in flight (inflight.py), never by what was leased.

Slices shrink as the budget runs out: a renewal grants min(hint, free / (2 x workers)), but never
less than the request that asked (if that fits at all). A renewal that does not fit waits: for the
worker's own open reservations to settle (its `held` returns to the book), or, with nothing of its
own open, for any other worker's call. It is refused, and the run is exhausted, only when nothing is
leased to anyone and the request still does not fit:

    exhausted  =>  maxUSD - spent  <  the refused request's worst case     (the early-stop bound)

so the run stops early by less than ONE worst-case reservation, however many workers there are
(tests/budget/test_budget.py checks both bounds with hypothesis over random interleavings).

The canary: while the tool gate has not judged its first `canarySamples` answers, a lease also
carries a request quota, and the book never allows more requests than the canary still needs:
`answers observed + requests allowed and not yet reported <= canarySamples`. The gate judges before
any request past the canary is allowed, so a drifting run stops after at most `canarySamples` paid
answers (plus failed ones, which the gate does not count).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from enum import StrEnum

from eyrie.jobs.generate.budget.pricing import UnpriceableRequest


class Renewal(StrEnum):
    GRANTED = "granted"
    WAIT = "wait"  # retry once something changed (an own settlement, another worker's call)
    EXHAUSTED = "exhausted"


@dataclass
class Report:
    """What a worker tells the coordinator on every call; plain data (crosses Ray cheaply)."""

    worker: str
    seq: int = 0  # reports of one worker are numbered: a late or lost one changes nothing
    spent: Decimal = Decimal(0)  # settled by this worker in all (cumulative, so idempotent)
    held: Decimal = Decimal(0)  # what its open reservations hold now
    in_flight: int = 0  # its open reservations
    price_factor: Decimal = Decimal(1)
    observations: list = field(default_factory=list)  # coordinator.RequestResult, in order


@dataclass(frozen=True)
class Grant:
    """The coordinator's answer: the worker's whole grant now (held + new slice), its request quota
    (None: unlimited) and whether the run stopped (and whether at once)."""

    renewal: Renewal
    granted: Decimal
    quota: int | None
    price_factor: Decimal
    stop: bool = False
    abandon: bool = False  # stopped at once: abandon the requests in flight, do not wait for them


@dataclass
class LeaseBook:
    """The coordinator's side: the budget, what is leased to whom, and the canary's request quota."""

    max_usd: Decimal
    workers: int
    spent: Decimal = Decimal(0)
    exhausted: bool = False
    price_factor: Decimal = Decimal(1)
    grants: dict[str, Decimal] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)  # requests allowed, not yet reported
    quotas: dict[str, int] = field(default_factory=dict)  # unused canary quota per worker
    _seen: dict[str, tuple[int, Decimal]] = field(default_factory=dict)  # worker -> (seq, spent)
    _gone: set[str] = field(default_factory=set)  # workers that gave back or were lost

    @property
    def leased(self) -> Decimal:
        return sum(self.grants.values(), Decimal(0))

    def report(self, r: Report) -> bool:
        """Account a report: its spend leaves the worker's grant for `spent`; what its open
        reservations hold stays leased. A charge above a reservation can make the spend exceed the
        grant; the book then keeps nothing leased to the worker beyond `held`. False (and nothing
        changed) for a report older than one already seen, or from a worker that is gone."""
        seq, spent = self._seen.get(r.worker, (-1, Decimal(0)))
        if r.worker in self._gone or r.seq <= seq:
            return False
        self._seen[r.worker] = (r.seq, max(spent, r.spent))
        self.spent += max(Decimal(0), r.spent - spent)
        self.grants[r.worker] = r.held
        self.in_flight[r.worker] = r.in_flight
        self.quotas.pop(r.worker, None)  # unused canary quota comes back with every call
        self.price_factor = max(self.price_factor, r.price_factor)
        return True

    def renew(self, worker: str, want: Decimal, hint: Decimal, canary_left: int | None) -> Renewal:
        """After `report`: grant `worker` a new slice of at least `want` (its next reservation at
        the price factor), aiming at `hint`. `canary_left`: answers the gate still needs before it
        judges (None once it has judged, or without a gate)."""
        if self.exhausted or worker in self._gone:
            return Renewal.EXHAUSTED
        if want < 0:
            raise UnpriceableRequest(f"invalid reservation {want!r}")
        quota = None
        self.quotas.pop(worker, None)
        if canary_left is not None:
            self.quotas[worker] = 0  # until granted: no request may start past the canary
            left = canary_left - sum(self.in_flight.values()) - sum(self.quotas.values())
            if left <= 0:
                return Renewal.WAIT  # the canary's requests are all out: wait for its verdict
            quota = max(1, left // self.workers)  # a share, so every worker takes part
        free = self.max_usd - self.spent - self.leased
        if free < want:
            if self.leased > 0:
                return Renewal.WAIT  # open reservations (this worker's or others') may settle cheaper
            self.exhausted = True
            return Renewal.EXHAUSTED
        size = min(free, max(want, min(hint, free / (2 * self.workers))))
        self.grants[worker] = self.grants.get(worker, Decimal(0)) + size
        if quota is not None:
            self.quotas[worker] = quota
        return Renewal.GRANTED

    def quota(self, worker: str) -> int | None:
        return self.quotas.get(worker)

    def give_back(self, r: Report) -> None:
        """The worker ended: its spend is final and nothing stays leased to it."""
        self.report(r)
        self._gone.add(r.worker)
        self.grants.pop(r.worker, None)
        self.in_flight.pop(r.worker, None)
        self.quotas.pop(r.worker, None)

    def lost(self, worker: str) -> Decimal:
        """A worker died: its whole grant counts as spent (its requests may have been paid; the
        safe side); returns that amount."""
        amount = self.grants.pop(worker, Decimal(0))
        self._gone.add(worker)
        self.in_flight.pop(worker, None)
        self.quotas.pop(worker, None)
        self.spent += amount
        return amount


@dataclass
class Lease:
    """The worker's side: reservations against its grant, settled locally."""

    granted: Decimal = Decimal(0)
    spent: Decimal = Decimal(0)  # since the last report
    total: Decimal = Decimal(0)  # in all (what reports carry)
    held: Decimal = Decimal(0)
    quota: int | None = 0  # requests it may still start; None: unlimited; 0 before the first grant
    price_factor: Decimal = Decimal(1)
    overcharges: int = 0
    settled: int = 0
    _open: dict[int, Decimal] = field(default_factory=dict)
    _ids: itertools.count = field(default_factory=itertools.count)
    _seq: itertools.count = field(default_factory=itertools.count)

    def price(self, amount: Decimal) -> Decimal:
        if amount is None or amount < 0:
            raise UnpriceableRequest(f"invalid reservation {amount!r}")
        return amount * self.price_factor

    def reserve(self, amount: Decimal) -> int | None:
        """A reservation id, or None when the lease cannot cover it (renew, then try again)."""
        amount = self.price(amount)
        if self.quota == 0 or self.spent + self.held + amount > self.granted:
            return None
        if self.quota is not None:
            self.quota -= 1
        rid = next(self._ids)
        self._open[rid] = amount
        self.held += amount
        return rid

    def settle(self, rid: int, cost: Decimal | None) -> None:
        """Record what a request really cost; an unknown cost counts as the whole reservation."""
        held = self._open.pop(rid)
        self.held -= held
        if cost is None:
            cost = held
        if cost > held:
            self.overcharges += 1
            if held > 0:
                self.price_factor = max(self.price_factor, (cost / held).quantize(Decimal("0.0001"),
                                                                                rounding=ROUND_CEILING))
        self.spent += cost
        self.total += cost
        self.settled += 1

    def mean_cost(self) -> Decimal | None:
        """What a request really cost on average so far (None before the first settlement)."""
        return self.total / self.settled if self.settled else None

    def amount(self, rid: int) -> Decimal:
        """What open reservation `rid` holds (its worst case at the price factor)."""
        return self._open[rid]

    def release(self, rid: int) -> None:
        """The request was never paid (not sent, or failed with no charge)."""
        self.held -= self._open.pop(rid)

    @property
    def in_flight(self) -> int:
        return len(self._open)

    def take_report(self, worker: str, observations: list) -> Report:
        """The report for the next call; its spend leaves the grant, and so does any slack until
        the coordinator answers (a renewal may give it to another worker meanwhile)."""
        r = Report(worker, next(self._seq), self.total, self.held, self.in_flight, self.price_factor,
                   observations)
        self.spent = Decimal(0)
        self.granted = self.held
        self.quota = 0 if self.quota is not None else None
        return r

    def abandon(self, worker: str, observations: list) -> Report:
        """The last report of a worker that failed: open reservations count as spent (the safe side)."""
        self.total += self.held
        r = Report(worker, next(self._seq), self.total, Decimal(0), 0, self.price_factor, observations)
        self.spent = self.held = self.granted = Decimal(0)
        self._open.clear()
        return r

    def apply(self, grant: Grant) -> None:
        """The coordinator's answer to the last report. It covers what `held` was then; reservations
        settled meanwhile moved from `held` into `spent`, both still inside it."""
        self.granted = grant.granted
        self.quota = grant.quota
        self.price_factor = max(self.price_factor, grant.price_factor)
