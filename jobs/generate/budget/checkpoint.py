"""What earlier attempts left in the store: what is booked as spent, the counters.

Booked spend = what the records say was paid (exact: every durable answer's cost; the audit's, the
pilot's (in the audit answer sets) and the probe's included, an adopted copy of one never again) + what
stops abandoned in flight (budget.json's ledger, and in-flight objects not merged into it yet: their real
cost where known, else their bound). After any stop that is at least
the provider's bill and at most the bill plus the worst case of the requests that were in flight
(inflight.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal

from eyrie.jobs.contract import records
from eyrie.jobs.contract.audit import audit_spend
from eyrie.jobs.contract.tally import Tally, cost_of
from eyrie.jobs.generate.budget.coordinator import Counts, RequestResult
from eyrie.jobs.generate.budget.inflight import AbandonedTotals
from eyrie.jobs.generate.budget.reconcile import capped, provider_asker, read_ledger, settle_abandoned, unmerged
from eyrie.jobs.store import Store
from eyrie.jobs.tools.checks import ResponseCheck
from eyrie.jobs.tools.gate import ToolGate


@dataclass
class Checkpoint:
    """What earlier attempts left in the store: the floor for spend and the counters."""

    spent: Decimal  # booked: `paid` plus what stops abandoned in flight (`abandoned`)
    counts: Counts
    audit: Decimal  # paid by `eyrie audit` runs, part of `spent`
    costs: list[Decimal] = field(default_factory=list)  # what each persisted prompt cost, in store order
    probe: Decimal = Decimal(0)  # paid by the provider probe (its adopted answers included), part of `spent`
    paid: Decimal = Decimal(0)  # what the persisted records say was paid, the probe's included (the audit's not)
    tally: Tally = field(default_factory=Tally)  # the records by fingerprint and attempt, the bad rows
    abandoned: AbandonedTotals = field(default_factory=AbandonedTotals)  # requests stops left in flight


def read_checkpoint(store: Store, gate: ToolGate | None = None, *, resuming: bool = False,
                    on_bad_row: Callable[[records.Record], None] | None = None) -> Checkpoint:
    """Scan every persisted record once; `gate` absorbs earlier answers into its cumulative metrics.
    `resuming`: an attempt about to start, which sends again every sample that failed only on
    transient errors, so those are left out of the counts (the attempt counts them as it goes).
    `on_bad_row` sees each record of a row never sent."""
    counts = Counts()
    tally = Tally()
    spent = Decimal(0)
    costs = []
    for rec in records.iter_records(store):
        costs.append(cost_of(rec))
        if not records.paid_elsewhere(rec):  # an adopted probe or pilot answer: paid once, where it was bought
            spent += costs[-1]
        tally.add(rec)
        if on_bad_row is not None and rec.get("status") == "rejected":
            on_bad_row(rec)
        usage = rec.get("usage") or {}
        transient = records.resend_on_resume(rec)
        if transient and resuming:
            continue
        counts.add(RequestResult(str(rec.get("status")), policy=rec.get("policy", "keep"),
                               input_tokens=int(usage.get("prompt_tokens") or 0),
                               output_tokens=int(usage.get("completion_tokens") or 0),
                               error_kind=(rec.get("error") or {}).get("type"), transient=transient,
                               cost=costs[-1]))
        if gate is not None and rec.get("status") == "ok" and rec.get("checks"):
            gate.absorb(ResponseCheck.from_record(rec["checks"]))
    # every answer an audit kept (durable before its slot was freed, so a killed audit counts too)
    audit = audit_spend(store)
    probe = sum((cost_of(r) for r in records.iter_probe_records(store)), Decimal(0))
    spent += probe
    paid = spent
    ledger = read_ledger(store)
    new, _keys = unmerged(store, {a.source for a in ledger})  # a kill -9's, until the next attempt merges them
    abandoned = AbandonedTotals.of(ledger + capped(ledger, new, paid + audit))
    spent = paid + audit + abandoned.booked
    return Checkpoint(spent=spent, counts=counts, audit=audit, costs=costs, probe=probe, paid=paid,
                      tally=tally, abandoned=abandoned)


def settle_stops(store: Store, base_url: str | None, api_key: str | None) -> AbandonedTotals:
    """Book what stops left in flight into budget.json (`reconcile.settle_abandoned`), asking the
    provider at `base_url` what it can; run where no worker is sending (an attempt's start and end)."""
    def paid() -> Decimal:
        c = read_checkpoint(store)
        return c.paid + c.audit

    return settle_abandoned(store, paid, provider_asker(base_url, api_key) if base_url else None)
