"""What a stop left in flight, merged into budget.json's ledger and asked about
(jobs/generate/budget/reconcile.py `settle_abandoned`): each in-flight object booked once however
often a merge is repeated, a generation's real cost replacing its bound when the provider says it, a
request asked about at most `MAX_ASKS` times, a bound capped by what the budget left. A store on
disk, a stand-in for the provider; nothing is sent."""

from __future__ import annotations

from decimal import Decimal

import orjson
import pytest

from eyrie.jobs.contract import layout
from eyrie.jobs.generate.budget.inflight import BOUND, FINAL
from eyrie.jobs.generate.budget.reconcile import MAX_ASKS, read_ledger, settle_abandoned
from eyrie.jobs.store import FileStore

KEY = layout.inflight_key("w0", "0a1b2c3d")
META = {"attempt": "a1", "worker": "w0", "maxUSD": "5"}


def final(*requests: dict) -> bytes:
    """A worker's object after a second Ctrl-C: each request it abandoned, exactly."""
    return orjson.dumps({**META, "kind": FINAL, "requests": list(requests)})


class Provider:
    """Answers `GET /generation?id=` for the ids it knows; counts what it was asked."""

    def __init__(self, costs: dict[str, Decimal] | None = None):
        self.costs = costs or {}
        self.asked: list[list[str]] = []

    def __call__(self, ids: list[str]) -> dict[str, Decimal]:
        self.asked.append(list(ids))
        return {g: self.costs[g] for g in ids if g in self.costs}


def paid() -> Decimal:
    return Decimal(0)


@pytest.fixture
def store(tmp_path) -> FileStore:
    return FileStore(tmp_path / "out")


def test_the_same_stop_merged_twice_is_booked_once(store):
    """A kill between the ledger's write and the objects' deletion leaves them to be merged again."""
    obj = final({"reservedUSD": "0.002"}, {"reservedUSD": "0.003", "costUSD": "0.0011"})
    store.put(KEY, obj)
    first = settle_abandoned(store, paid)
    assert (first.requests, first.news, first.booked) == (2, 2, Decimal("0.0031"))
    assert (first.reconciled, first.open_requests, first.open_usd) == (1, 1, Decimal("0.002"))
    assert not store.list(layout.INFLIGHT + "/")  # merged, then deleted
    store.put(KEY, obj)  # as if the deletion had never happened
    again = settle_abandoned(store, paid)
    assert (again.requests, again.news, again.booked) == (2, 0, Decimal("0.0031"))
    assert len(read_ledger(store)) == 2 and not store.list(layout.INFLIGHT + "/")
    # nothing new and nothing to ask: budget.json is not even written again
    before = store.get(layout.BUDGET)
    assert settle_abandoned(store, paid, Provider()).booked == Decimal("0.0031")
    assert store.get(layout.BUDGET) == before


def test_what_the_provider_says_a_generation_cost_replaces_its_bound(store):
    store.put(KEY, final({"reservedUSD": "0.002", "generationId": "gen-1"},
                         {"reservedUSD": "0.002", "generationId": "gen-2"}))
    provider = Provider({"gen-1": Decimal("0.00042")})  # gen-2 not stored by the provider yet
    t = settle_abandoned(store, paid, provider)
    assert provider.asked == [["gen-1", "gen-2"]]
    assert (t.reconciled, t.reconciled_usd, t.open_requests, t.open_usd) == (1, Decimal("0.00042"), 1,
                                                                             Decimal("0.002"))
    assert t.booked == Decimal("0.00242") and t.news == 2
    ledger = {a.generation_id: a for a in read_ledger(store)}
    assert (ledger["gen-1"].cost, ledger["gen-1"].how) == (Decimal("0.00042"), "provider")
    assert (ledger["gen-2"].cost, ledger["gen-2"].asked) == (None, 1)
    # the next accounting asks about the one still unknown only, and books what it cost
    provider.costs["gen-2"] = Decimal("0.0005")
    t = settle_abandoned(store, paid, provider)
    assert provider.asked[-1] == ["gen-2"] and t.news == 1  # reconciled anew by this accounting
    assert (t.reconciled, t.open_requests, t.booked) == (2, 0, Decimal("0.00092"))
    settle_abandoned(store, paid, provider)
    assert len(provider.asked) == 2  # all known: nothing more to ask


def test_a_generation_is_asked_about_at_most_max_asks_times_then_its_bound_stays(store):
    store.put(KEY, final({"reservedUSD": "0.002", "generationId": "gen-x"}))
    provider = Provider()  # never finds it
    for n in range(1, MAX_ASKS + 3):
        t = settle_abandoned(store, paid, provider)
        assert t.booked == Decimal("0.002") and t.open_requests == 1
        assert len(provider.asked) == min(n, MAX_ASKS)
    assert read_ledger(store)[0].asked == MAX_ASKS


def test_a_killed_workers_slots_stay_a_bound_capped_by_what_the_budget_left(store):
    """A kill -9 names no request: its slots are a bound, never asked about, and no more than what
    the budget left beyond what the records show paid (its worker never sent past the cap)."""
    store.put(KEY, orjson.dumps({**META, "kind": BOUND, "maxUSD": "1.00", "slots": ["0.3", "0.3", "0.3", "0.3"]}))
    provider = Provider()
    t = settle_abandoned(store, lambda: Decimal("0.85"), provider)
    assert (t.requests, t.open_requests, t.booked) == (4, 4, Decimal("0.15"))  # 1.00 - 0.85, not 1.20
    assert provider.asked == []
