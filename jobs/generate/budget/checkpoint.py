"""What earlier attempts left in the store: the floor for spend, the counters, the committed bound."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal

import orjson

from eyrie.jobs.contract import layout, records
from eyrie.jobs.contract.audit import audit_spend
from eyrie.jobs.contract.progress import now_iso, read_progress
from eyrie.jobs.contract.tally import Tally, cost_of
from eyrie.jobs.generate.budget.coordinator import Counts, RequestResult
from eyrie.jobs.generate.budget.pricing import usd
from eyrie.jobs.store import NotFound, Store
from eyrie.jobs.tools.checks import ResponseCheck
from eyrie.jobs.tools.gate import ToolGate


@dataclass
class Checkpoint:
    """What earlier attempts left in the store: the floor for spend and the counters."""

    spent: Decimal  # what the budget counts as spent: at least `paid`, more after a kill (budget.json)
    counts: Counts
    audit: Decimal  # paid by `eyrie audit` runs, part of `spent`
    costs: list[Decimal] = field(default_factory=list)  # what each persisted prompt cost, in store order
    probe: Decimal = Decimal(0)  # paid by the provider probe (its adopted answers included), part of `spent`
    paid: Decimal = Decimal(0)  # what the persisted records say was paid, the probe's included (the audit's not)
    tally: Tally = field(default_factory=Tally)  # the records by fingerprint and attempt, the bad rows


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
        if "probe" not in rec:  # an adopted probe answer is paid once, in the probe's total below
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
    prev = read_progress(store)
    if prev and prev.get("spentUSD"):
        # progress also counts answers that were paid but never flushed before a crash...
        spent = max(spent, Decimal(prev["spentUSD"]) - Decimal(prev.get("auditUSD") or "0"))
    # ...and the committed bound covers even those paid after progress was last written
    spent = max(spent, read_committed(store) - audit)
    return Checkpoint(spent=spent + audit, counts=counts, audit=audit, costs=costs, probe=probe, paid=paid,
                      tally=tally)


@dataclass(frozen=True)
class BudgetCommitter:
    """Writes `<output>/budget.json`; picklable (the coordinator actor opens the store itself)."""

    uri: str
    endpoint: str | None
    region: str | None
    attempt: str

    def __call__(self, bound: Decimal) -> None:
        from eyrie.jobs.store import open_store

        doc = {"committedUSD": usd(bound), "attempt": self.attempt, "updatedAt": now_iso()}
        open_store(self.uri, self.endpoint, None, self.region).put(layout.BUDGET, orjson.dumps(doc))


def read_committed(store: Store) -> Decimal:
    try:
        return Decimal(orjson.loads(store.get(layout.BUDGET))["committedUSD"])
    except NotFound:
        return Decimal(0)
