"""Requests in flight: what a stop can leave paid and unrecorded, bounded without a write per request. Pure.

A request is *in flight* from its reservation until its record is durable (journal.py): only then is
its exact cost in the store. A stop that abandons requests (a kill -9, a second Ctrl-C, a worker
that fails) loses exactly the ones in flight, at most `concurrency` per worker, each costing at most
its reservation (its worst case; while providers charge at most that, as for the cap). So what a
stop leaves unknown is bounded by the requests in flight, not by the budget leased to the worker
(lease.py): the leases' slack was never spent.

A kill -9 gives no chance to write anything, so the bound must be durable *before* a request is
sent. To need no store write per request, a worker persists *slots*, a list of caps, and keeps
every request it sends in a slot of its own whose persisted cap is at least the request's
reservation. At every moment, for one worker:

    cost of the requests sent and not yet durable  <=  sum(persisted caps)                  (B1)
    persisted slots  <=  the most requests it had open at once  <=  concurrency            (B2)
    each persisted cap  <=  the largest reservation it made

so a kill -9 books at most `concurrency x the largest worst case` above the bill, and never less
than the bill. A request is sent only once its slot's cap is on disk: a new slot or a raised cap
costs one write, shared by every request that needs one while it is under way (group commit); a
slot freed by a durable answer is reused with no write while its cap covers the next reservation,
which is every request of a steady run: a slot created or raised gets the largest reservation made so
far, not the request's own, and every write takes every kept slot to it (reservations vary with the
prompt: caps that followed each request were raised again and again, and at 10,000 in flight each write
lists 10,000 slots; so once the largest reservation stops growing, no slot needs a write again). Slots
left free for a whole period are dropped, and every free slot once the worker stops dispatching, so the
persisted bound follows the requests really in flight (a drain after the first Ctrl-C lowers it as
answers come in).

A stop that leaves the worker alive (Ctrl-C twice, a failure) writes the exact requests it abandons
instead (`abandoned`): each sent request's reservation, its cost when its answer had come (paid,
never made durable) and the provider's generation id when known, which the next accounting asks the
provider about (`eyrie.jobs.api.ChatClient.generation_cost`). tests/budget/test_budget.py checks B1, B2 and
the booking that follows from them (bill <= booked <= bill + what was in flight) with hypothesis.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any

from eyrie.jobs.contract.money import usd
from eyrie.jobs.contract.progress import AbandonedFigures


class Drop(StrEnum):
    """Which free slots a write leaves out."""

    NONE = "none"
    IDLE = "idle"  # those not used since the last IDLE write (the periodic one)
    FREE = "free"  # every free slot (the worker dispatches nothing more)


@dataclass
class _Slot:
    cap: Decimal  # what the next write persists
    durable: Decimal = Decimal(0)  # what the store holds (0: not written yet)
    occupant: int | None = None
    used: bool = True  # occupied since the last IDLE write
    dropping: bool = False  # left out of the write under way: not to be occupied


@dataclass
class Flight:
    """One request in flight."""

    usd: Decimal  # its reservation
    slot: int
    sent: bool = False
    cost: Decimal | None = None  # answered and settled, its record not durable yet
    generation_id: str | None = None


@dataclass
class InflightBook:
    """One worker's requests in flight and the slots that bound them (the module docstring). The free slots are
    also kept sorted by (persisted cap, slot): a request finds its slot in O(log slots), not by a scan of all of
    them (10,000 in flight made the scan the worker's largest cost)."""

    slots: dict[int, _Slot] = field(default_factory=dict)
    flights: dict[int, Flight] = field(default_factory=dict)
    _snapshot: dict[int, Decimal] | None = None  # the write under way: slot -> cap
    _next_slot: int = 0
    _largest: Decimal = Decimal(0)  # the largest reservation made: what a slot created or raised gets
    _free: list[tuple[Decimal, int]] = field(default_factory=list)  # (durable, slot) of free slots not dropping

    def _unfree(self, i: int) -> None:
        k = bisect.bisect_left(self._free, (self.slots[i].durable, i))
        if k < len(self._free) and self._free[k][1] == i:
            del self._free[k]

    # -- requests ----------------------------------------------------------------------------
    def open(self, rid: int, amount: Decimal) -> bool:
        """Give request `rid` (reservation `amount`) a slot; True when the slot's persisted cap
        already covers it (send at once), False when a write must land first (`covered`)."""
        free = self._free
        self._largest = max(self._largest, amount)
        k = bisect.bisect_left(free, (amount, -1))
        if k < len(free):
            i = free.pop(k)[1]  # the smallest cap that covers it: large caps stay for large requests
        elif free:
            i = free.pop()[1]  # raise the largest free cap: the fewest slots raised
            self.slots[i].cap = max(self.slots[i].cap, self._largest)
        else:
            i = self._next_slot
            self._next_slot += 1
            self.slots[i] = _Slot(cap=self._largest)
        slot = self.slots[i]
        slot.occupant, slot.used = rid, True
        self.flights[rid] = Flight(amount, i)
        return slot.durable >= amount

    def covered(self, rid: int) -> bool:
        f = self.flights[rid]
        return self.slots[f.slot].durable >= f.usd

    def sending(self, rid: int) -> None:
        """Just before its first byte goes out (only once covered)."""
        if not self.covered(rid):
            raise AssertionError("a request was sent before its slot's cap was durable")
        self.flights[rid].sent = True

    def identify(self, rid: int, generation_id: str) -> None:
        if (f := self.flights.get(rid)) is not None:
            f.generation_id = generation_id

    def settle(self, rid: int, cost: Decimal) -> None:
        if (f := self.flights.get(rid)) is not None:
            f.cost = cost

    def close(self, rid: int) -> None:
        """Its record is durable (or it was never paid): the slot is free for the next request."""
        f = self.flights.pop(rid, None)
        if f is not None:
            slot = self.slots[f.slot]
            slot.occupant = None
            if not slot.dropping:
                bisect.insort(self._free, (slot.durable, f.slot))

    # -- writes ------------------------------------------------------------------------------
    def droppable(self, drop: Drop) -> list[int]:
        if drop is Drop.NONE:
            return []
        return [i for i, s in self.slots.items()
                if s.occupant is None and (drop is Drop.FREE or not s.used)]

    def begin_write(self, drop: Drop = Drop.NONE) -> dict[int, Decimal]:
        """The slots the next write persists (slot -> cap); the ones dropped may not be occupied
        until it lands (`end_write`)."""
        if self._snapshot is not None:
            raise AssertionError("one write at a time")
        gone = set(self.droppable(drop))
        for i in gone:
            self._unfree(i)
            self.slots[i].dropping = True
        largest = self._largest  # every kept slot goes to it: once it stops growing, no slot needs a write again
        self._snapshot = {i: max(s.cap, largest) for i, s in self.slots.items() if i not in gone}
        if drop is Drop.IDLE:
            self.new_period()
        return dict(self._snapshot)

    def end_write(self) -> None:
        """The write landed: its caps are what the store holds now."""
        snap, self._snapshot = self._snapshot or {}, None
        for i in [i for i, s in self.slots.items() if s.dropping]:
            del self.slots[i]
        for i, cap in snap.items():
            slot = self.slots[i]
            if slot.durable != cap:
                free = slot.occupant is None and not slot.dropping
                if free:
                    self._unfree(i)
                slot.durable = cap
                if free:
                    bisect.insort(self._free, (cap, i))

    def fail_write(self) -> None:
        """The write failed or was cancelled: the store holds what it held before or what the write
        said. Either way the kept slots hold at least their old caps (a write never lowers a kept
        slot), and the dropped ones may be gone: they leave the book too."""
        self._snapshot = None
        for i in [i for i, s in self.slots.items() if s.dropping]:
            del self.slots[i]

    def new_period(self) -> None:
        """A period passed without a write: slots free from now on until the next tick are idle."""
        for s in self.slots.values():
            s.used = s.occupant is not None

    # -- what a stop leaves --------------------------------------------------------------------
    def bound(self) -> Decimal:
        """What the store's slots say requests in flight may cost (B1's right side)."""
        return sum((s.durable for s in self.slots.values()), Decimal(0))

    def abandoned(self) -> list[Flight]:
        """The requests sent and not durable: what a stop now abandons (never-sent ones cost nothing)."""
        return [f for f in self.flights.values() if f.sent]


# ------------------------------------------------------------------------------------ documents

BOUND, FINAL = "bound", "final"


def bound_doc(caps: dict[int, Decimal], meta: dict[str, Any]) -> dict[str, Any]:
    """The object a worker keeps while it sends (`layout.inflight_key`): its persisted slots. Their caps take few
    distinct values (`InflightBook.open`): each is written out once."""
    text: dict[Decimal, str] = {}
    return {**meta, "kind": BOUND, "slots": [text.get(c) or text.setdefault(c, usd(c)) for c in caps.values()]}


def final_doc(flights: list[Flight], meta: dict[str, Any]) -> dict[str, Any]:
    """The object a worker leaves when it abandons requests: each one exactly."""
    return {**meta, "kind": FINAL, "requests": [
        {"reservedUSD": usd(f.usd), **({"costUSD": usd(f.cost)} if f.cost is not None else {}),
         **({"generationId": f.generation_id} if f.generation_id else {})} for f in flights]}


@dataclass(frozen=True)
class Abandoned:
    """Requests a stop left paid or possibly paid, with no record: one per request abandoned in a
    live process, or one per kill -9'd worker (`requests` slots, `bound` their caps). `cost` is what
    they really cost (an answer that had come, or the provider's word on the generation); None while
    only the bound is known."""

    source: str  # the in-flight object it came from (merging twice changes nothing)
    attempt: str
    worker: str
    requests: int
    bound: Decimal
    cost: Decimal | None = None
    how: str | None = None  # answered | provider: where `cost` comes from
    generation_id: str | None = None
    cap: Decimal | None = None  # the maxUSD its worker ran under
    asked: int = 0  # accountings that asked the provider and got no answer

    @property
    def booked(self) -> Decimal:
        return self.cost if self.cost is not None else self.bound

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source, "attempt": self.attempt, "worker": self.worker,
                               "requests": self.requests, "boundUSD": usd(self.bound)}
        if self.cost is not None:
            out.update(costUSD=usd(self.cost), how=self.how)
        if self.generation_id:
            out["generationId"] = self.generation_id
        if self.cap is not None:
            out["maxUSD"] = usd(self.cap)
        if self.asked:
            out["asked"] = self.asked
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Abandoned:
        cost, cap = d.get("costUSD"), d.get("maxUSD")
        return cls(str(d["source"]), str(d.get("attempt") or ""), str(d.get("worker") or ""), int(d["requests"]),
                   Decimal(d["boundUSD"]), Decimal(cost) if cost is not None else None, d.get("how"),
                   d.get("generationId"), Decimal(cap) if cap is not None else None, int(d.get("asked") or 0))


def abandoned_of(source: str, doc: dict[str, Any]) -> list[Abandoned]:
    """What an in-flight object says a stop left (none for a worker that had nothing in flight)."""
    attempt, worker = str(doc.get("attempt") or ""), str(doc.get("worker") or "")
    cap = Decimal(doc["maxUSD"]) if doc.get("maxUSD") is not None else None  # what it sent is within it
    if doc.get("kind") == FINAL:
        out = []
        for i, r in enumerate(doc.get("requests") or []):
            cost = r.get("costUSD")
            out.append(Abandoned(f"{source}#{i}", attempt, worker, 1, Decimal(r["reservedUSD"]),
                                 Decimal(cost) if cost is not None else None, "answered" if cost is not None else None,
                                 r.get("generationId"), cap))
        return out
    caps = [Decimal(c) for c in doc.get("slots") or []]
    bound = sum(caps, Decimal(0))
    if not bound:
        return []
    return [Abandoned(source, attempt, worker, len(caps), bound if cap is None else min(bound, cap), cap=cap)]


@dataclass(frozen=True)
class AbandonedTotals:
    """For the summary: what the stops so far left, by what is known of it."""

    requests: int = 0
    booked: Decimal = Decimal(0)
    reconciled: int = 0  # requests whose cost is known (answered, or the provider said)
    reconciled_usd: Decimal = Decimal(0)
    open_requests: int = 0  # requests only bounded: "up to $X more may be billed"
    open_usd: Decimal = Decimal(0)
    news: int = 0  # requests the accounting that made these totals booked or reconciled anew

    @classmethod
    def of(cls, items: list[Abandoned], news: int = 0) -> AbandonedTotals:
        known = [a for a in items if a.cost is not None]
        unknown = [a for a in items if a.cost is None]
        return cls(sum(a.requests for a in items), sum((a.booked for a in items), Decimal(0)),
                   sum(a.requests for a in known), sum((a.booked for a in known), Decimal(0)),
                   sum(a.requests for a in unknown), sum((a.bound for a in unknown), Decimal(0)), news)

    def figures(self, this_attempt: int) -> AbandonedFigures:
        """progress.json's `abandoned`; `this_attempt`: the requests this attempt booked or reconciled."""
        return AbandonedFigures(requests=self.requests, booked=self.booked, reconciled=self.reconciled,
                                reconciled_usd=self.reconciled_usd, unreconciled=self.open_requests,
                                up_to=self.open_usd, this_attempt=this_attempt)
