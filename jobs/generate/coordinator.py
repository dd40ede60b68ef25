"""The run's single point of truth while it generates: budget ledger, tool gate, counters, stop.

One instance per run: in the driver's event loop when running inline, or as a named Ray actor that
every shard worker calls. Workers report each answer here; the first stop reason (budget, drift,
credits, a fatal error) wins and every worker sees it on its next call.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from eyrie.jobs.contract.progress import Outcome
from eyrie.jobs.generate.budget import AsyncLedger, Ledger, usd


@dataclass
class Observation:
    """What a worker learned from one prompt; plain data so it crosses Ray cheaply."""

    status: str  # ok | failed | rejected
    policy: str = "keep"  # keep | drop | flag
    input_tokens: int = 0
    output_tokens: int = 0
    retries: int = 0
    error_kind: str | None = None
    check: Any = None  # eyrie.jobs.tools.ResponseCheck of an answer (per-tool counts, gate)


@dataclass
class Counts:
    done: int = 0
    dropped: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # failed samples by error type

    def add(self, obs: Observation) -> None:
        if obs.status == "ok":
            if obs.policy == "drop":
                self.dropped += 1
            else:
                self.done += 1
        elif obs.status == "rejected":
            self.dropped += 1
        else:
            self.failed += 1
            self.failures[obs.error_kind or "unknown"] += 1
        self.input_tokens += obs.input_tokens
        self.output_tokens += obs.output_tokens


COMMIT_SHARE = Decimal("0.02")  # a commit raises the persisted bound by 2% of the budget...
COMMIT_RESERVATIONS = 8  # ...or 8 reservations of the request that asked, whichever is more


class RunCoordinator:
    """`commit`, when given, persists an upper bound of what may have been paid (spent + reserved)
    before any request is granted past the last bound: a run killed with answers paid but not yet
    flushed resumes from that bound, so even kill -9 cannot take spend past maxUSD."""

    def __init__(self, max_usd: Decimal, spent: Decimal, counts: Counts, total: int,
                 shards: list[int], gate: Any = None, audit_usd: Decimal = Decimal(0),
                 commit: Callable[[Decimal], None] | None = None):
        self.ledger = Ledger(max_usd=max_usd, spent=spent)
        self._commit = commit
        self.committed = spent
        self._commit_lock = asyncio.Lock()
        self.budget = AsyncLedger(self.ledger)
        self.counts = counts
        self.total = total
        self.gate = gate  # eyrie.jobs.tools.gate.ToolGate or None
        self.audit_usd = audit_usd  # part of the spend, paid by `eyrie audit`
        self.outcome = Outcome.RUNNING
        self.message = ""
        self.retries = 0
        self.errors: Counter[str] = Counter()
        self.requests = 0
        self._pending_shards = list(shards)
        self._active: dict[int, str] = {}  # shard -> worker id
        self._holders: dict[int, str] = {}  # reservation id -> worker id

    # -- shards ------------------------------------------------------------------------------
    def next_shard(self, worker: str) -> int | None:
        if self.outcome != Outcome.RUNNING or not self._pending_shards:
            return None
        shard = self._pending_shards.pop(0)
        self._active[shard] = worker
        return shard

    def shard_done(self, shard: int) -> None:
        self._active.pop(shard, None)

    async def worker_lost(self, worker: str) -> list[int]:
        """A worker died: requeue its shards and count its open reservations as spent (their
        requests may have been paid; counting them is the safe side)."""
        lost = [s for s, w in self._active.items() if w == worker]
        for s in lost:
            del self._active[s]
        self._pending_shards[:0] = lost
        for rid in [r for r, w in self._holders.items() if w == worker]:
            del self._holders[rid]
            await self.budget.settle(rid, None)
        return lost

    # -- budget ------------------------------------------------------------------------------
    async def reserve(self, worker: str, amount: Decimal) -> int | None:
        if self.outcome != Outcome.RUNNING:
            return None
        rid = await self.budget.reserve(amount)
        if rid is None:
            self._stop(Outcome.BUDGET_EXHAUSTED,
                       f"budget exhausted: spent ${self.ledger.spent} of ${self.ledger.max_usd}; the next "
                       f"request could cost up to ${amount * self.ledger.price_factor}")
            return None
        if self.outcome != Outcome.RUNNING:  # stopped while we waited
            await self.budget.release(rid)
            return None
        self._holders[rid] = worker
        if self._commit is not None and self.ledger.spent + self.ledger.reserved > self.committed:
            await self._raise_commit(amount)
        return rid

    async def _raise_commit(self, amount: Decimal) -> None:
        async with self._commit_lock:
            exposure = self.ledger.spent + self.ledger.reserved
            if exposure <= self.committed:  # another reservation's commit covered this one
                return
            step = max(self.ledger.max_usd * COMMIT_SHARE, amount * COMMIT_RESERVATIONS)
            bound = min(self.ledger.max_usd, exposure + step)
            await asyncio.to_thread(self._commit, bound)
            self.committed = bound

    async def settle_commit(self) -> None:
        """A clean end: the persisted bound drops to the exact spend."""
        if self._commit is not None:
            async with self._commit_lock:
                await asyncio.to_thread(self._commit, self.ledger.spent)
                self.committed = self.ledger.spent

    async def finish(self, rid: int | None, cost: Decimal | None, paid: bool, obs: Observation) -> bool:
        """Settle (paid) or release a reservation and account the answer; True means stop."""
        if rid is not None:
            self._holders.pop(rid, None)
            if paid:
                await self.budget.settle(rid, cost)
            else:
                await self.budget.release(rid)
        self.observe(obs)
        return self.outcome != Outcome.RUNNING

    def observe(self, obs: Observation) -> bool:
        self.counts.add(obs)
        self.retries += obs.retries
        if obs.status != "rejected":
            self.requests += 1 + obs.retries
        if obs.error_kind:
            self.errors[obs.error_kind] += 1
        if self.gate is not None and obs.check is not None:
            drift = self.gate.observe_check(obs.check)
            if drift is not None:
                self._stop(Outcome.TOOL_SEMANTICS_DRIFT, drift.message)
        return self.outcome != Outcome.RUNNING

    def stop(self, outcome: str, message: str) -> None:
        self._stop(outcome, message)

    def _stop(self, outcome: str, message: str) -> None:
        if self.outcome == Outcome.RUNNING:
            self.outcome, self.message = outcome, message
            self.ledger.exhausted = True

    async def wake(self) -> None:
        await self.budget.exhaust()

    # -- reporting ---------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        c = self.counts
        tools = self.gate.metrics() if self.gate is not None else {}
        return {
            "outcome": self.outcome,
            "message": self.message,
            "spentUSD": usd(self.ledger.spent),
            "reservedUSD": usd(self.ledger.reserved),
            "maxUSD": usd(self.ledger.max_usd),
            "auditUSD": usd(self.audit_usd),
            "priceFactor": usd(self.ledger.price_factor),
            "samples": {"total": self.total, "done": c.done, "dropped": c.dropped, "failed": c.failed},
            "failures": dict(c.failures),
            "tokens": {"input": c.input_tokens, "output": c.output_tokens},
            "tools": tools,
            "requests": self.requests,
            "retries": self.retries,
            "errors": dict(self.errors),
            "inFlight": self.ledger.in_flight,
        }
