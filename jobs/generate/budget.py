"""The budget: a reservation ledger that makes overspending impossible, and its async front.

Before a request a worker reserves its worst case (prompt tokens x input price + max output tokens
x output price). A reservation that fits beside what is spent and reserved is granted; one that
would fit once in-flight requests settle waits for them (so the run never stops early because of
pessimistic reservations); one that cannot fit even if every in-flight request turned out free is
refused, and the run is exhausted. The run therefore stops no earlier than maxUSD minus one
worst-case reservation, and spend never exceeds maxUSD while providers charge no more than the
reservation (a charge above it raises the price factor for every later reservation).
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from enum import StrEnum

from eyrie.jobs.errors import EyrieError

MILLION = Decimal(1_000_000)
CENT_PRECISION = Decimal("0.0000000001")


def usd(d: Decimal) -> str:
    """A decimal amount as plain text: "0" rather than "0E-10", never an exponent."""
    return format(d.normalize(), "f") if d else "0"


class UnpriceableRequest(EyrieError, ValueError):
    """No price is known for a request: it is refused rather than sent (fail closed)."""


class Verdict(StrEnum):
    GRANTED = "granted"
    WAIT = "wait"
    EXHAUSTED = "exhausted"


@dataclass(frozen=True)
class Pricing:
    input_per_million: Decimal
    output_per_million: Decimal

    def cost(self, prompt_tokens: int, completion_tokens: int) -> Decimal:
        return ((self.input_per_million * prompt_tokens + self.output_per_million * completion_tokens)
                / MILLION).quantize(CENT_PRECISION, rounding=ROUND_CEILING)


def worst_case(pricing: Pricing | None, prompt_tokens: int, max_output_tokens: int) -> Decimal:
    if pricing is None:
        raise UnpriceableRequest("no pricing: set budget.pricing (inputPerMillion, outputPerMillion)")
    if prompt_tokens < 0 or max_output_tokens <= 0:
        raise UnpriceableRequest(f"cannot price {prompt_tokens} prompt / {max_output_tokens} output tokens")
    return pricing.cost(prompt_tokens, max_output_tokens)


def actual_cost(pricing: Pricing | None, usage: dict | None, reported: Decimal | None) -> Decimal | None:
    """The provider's `usage.cost` when given, else price x usage; None when neither is known."""
    if reported is not None:
        return reported
    if usage and pricing is not None:
        try:
            return pricing.cost(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
        except (TypeError, ValueError):
            return None
    return None


@dataclass
class Ledger:
    """Pure reservation ledger (no I/O, no clock); one per run."""

    max_usd: Decimal
    spent: Decimal = Decimal(0)
    reserved: Decimal = Decimal(0)
    exhausted: bool = False
    price_factor: Decimal = Decimal(1)
    overcharges: int = 0
    _open: dict[int, Decimal] = field(default_factory=dict)
    _ids: itertools.count = field(default_factory=itertools.count)

    def reserve(self, amount: Decimal) -> tuple[Verdict, int | None]:
        if amount is None or amount < 0:
            raise UnpriceableRequest(f"invalid reservation {amount!r}")
        amount = amount * self.price_factor
        if self.exhausted or self.spent + amount > self.max_usd:
            self.exhausted = True
            return Verdict.EXHAUSTED, None
        if self.spent + self.reserved + amount > self.max_usd:
            return Verdict.WAIT, None
        rid = next(self._ids)
        self._open[rid] = amount
        self.reserved += amount
        return Verdict.GRANTED, rid

    def settle(self, rid: int, cost: Decimal | None) -> None:
        """Record what a request really cost; an unknown cost counts as the whole reservation."""
        held = self._open.pop(rid)
        self.reserved -= held
        if cost is None:
            cost = held
        if cost > held:
            self.overcharges += 1
            if held > 0:
                self.price_factor = max(self.price_factor, (cost / held).quantize(Decimal("0.0001"),
                                                                                rounding=ROUND_CEILING))
        self.spent += cost

    def release(self, rid: int) -> None:
        """The request was never paid (refused before sending, or failed with no charge)."""
        self.reserved -= self._open.pop(rid)

    @property
    def in_flight(self) -> int:
        return len(self._open)


class AsyncLedger:
    """The ledger for concurrent async callers: a reservation that must WAIT sleeps until a
    settlement or release frees budget, instead of polling."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self._changed = asyncio.Condition()

    async def reserve(self, amount: Decimal) -> int | None:
        """A reservation id, or None when the budget is exhausted."""
        async with self._changed:
            while True:
                verdict, rid = self.ledger.reserve(amount)
                if verdict is Verdict.GRANTED:
                    return rid
                if verdict is Verdict.EXHAUSTED:
                    self._changed.notify_all()  # wake waiters: they are exhausted too now
                    return None
                await self._changed.wait()

    async def settle(self, rid: int, cost: Decimal | None) -> None:
        async with self._changed:
            self.ledger.settle(rid, cost)
            self._changed.notify_all()

    async def release(self, rid: int) -> None:
        async with self._changed:
            self.ledger.release(rid)
            self._changed.notify_all()

    async def exhaust(self) -> None:
        """Stop granting (another stop reason ended the run); wake every waiter."""
        async with self._changed:
            self.ledger.exhausted = True
            self._changed.notify_all()
