"""After a stop: the requests it abandoned in flight booked in `budget.json`, and asked about.

Workers leave in-flight objects (`layout.INFLIGHT`, inflight.py): the slots that bounded their requests
in flight when they were killed, or the exact requests they abandoned when they lived through the
stop. `settle_abandoned` turns them into entries of the ledger of abandoned requests in budget.json
(each object once: an entry names the object it came from, so a merge killed half-way is merged
again without counting twice), then deletes them. An abandoned request whose generation id is known
is looked up with the provider (`ChatClient.generation_cost`, OpenRouter's `GET /generation?id=`):
found, its real cost replaces its bound; not found yet (OpenRouter needs a few seconds), the bound
stays and the next accounting asks again. A kill -9'd worker's slots name no request: they stay a
bound (`checkpoint.read_checkpoint` books `min(bound, what the cap left)` for them).

It runs where no worker is sending: when an attempt starts (what a kill left) and when it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from decimal import Decimal

import orjson

from eyrie.jobs.contract import layout
from eyrie.jobs.contract.progress import now_iso
from eyrie.jobs.generate.budget.inflight import Abandoned, AbandonedTotals, abandoned_of
from eyrie.jobs.store import NotFound, Store

CostLookup = Callable[[list[str]], dict[str, Decimal]]  # generation ids -> what the provider says each cost
LOOKUP_TRIES = 3  # a generation OpenRouter has not stored yet answers 404 for a few seconds
LOOKUP_WAIT_S = 1.0
MAX_ASKS = 3  # accountings that ask about one request before its bound is left for good


def read_ledger(store: Store) -> list[Abandoned]:
    """budget.json's abandoned requests."""
    try:
        doc = orjson.loads(store.get(layout.BUDGET))
    except NotFound:
        return []
    return [Abandoned.from_json(d) for d in doc.get("abandoned") or []]


def unmerged(store: Store, known: set[str]) -> tuple[list[Abandoned], list[str]]:
    """What the in-flight objects not yet in the ledger say a stop left, and every object's key."""
    keys = store.list(layout.INFLIGHT + "/")
    out: list[Abandoned] = []
    for key in keys:
        try:
            doc = orjson.loads(store.get(key))
        except (NotFound, orjson.JSONDecodeError):  # gone meanwhile, or never whole (writes are atomic)
            continue
        out += [a for a in abandoned_of(key, doc) if a.source not in known]
    return out, keys


def capped(ledger: list[Abandoned], new: list[Abandoned], paid: Decimal) -> list[Abandoned]:
    """`new`'s bounds capped at what the budget its worker ran under left beyond what is known to be
    paid (`paid`, the records, now as at the stop; the costs known in the ledger): the cap kept the
    bill within it, so what the abandoned requests cost is too."""
    known = sum((a.cost for a in ledger + new if a.cost is not None), Decimal(0))
    return [replace(a, bound=min(a.bound, max(Decimal(0), a.cap - paid - known)))
            if a.cost is None and a.cap is not None else a for a in new]


def settle_abandoned(store: Store, paid: Callable[[], Decimal], ask: CostLookup | None = None) -> AbandonedTotals:
    """Merge the in-flight objects into budget.json's ledger, ask the provider about what it can, and
    delete the objects. `paid()`: what the records say was paid now, which is what it was at the stop
    (nothing is sent between a stop and this): a bound is capped at what the budget then left, which
    its worker never sent past. Returns the ledger's totals (`news`: the requests booked or
    reconciled by this call)."""
    ledger = read_ledger(store)
    new, keys = unmerged(store, {a.source for a in ledger})
    askable = [a.generation_id for a in ledger + new if a.cost is None and a.generation_id and a.asked < MAX_ASKS]
    if not keys and not (ask and askable):
        return AbandonedTotals.of(ledger)
    items = ledger + (capped(ledger, new, paid()) if new else [])
    news = sum(a.requests for a in new)
    if ask is not None and askable:
        costs = ask(askable)
        asked = set(askable)
        told = [a.cost is None and a.generation_id in costs for a in items]
        news += sum(a.requests for a, t in zip(items, told, strict=True) if t and a in ledger)
        items = [replace(a, cost=costs[a.generation_id or ""], how="provider") if t
                 else replace(a, asked=a.asked + 1) if a.cost is None and a.generation_id in asked else a
                 for a, t in zip(items, told, strict=True)]
    doc: dict = {"abandoned": [a.to_json() for a in items], "updatedAt": now_iso()}
    store.put(layout.BUDGET, orjson.dumps(doc))
    for key in keys:  # after the ledger holds them: a kill between the two merges nothing twice
        store.delete(key)
    return AbandonedTotals.of(items, news)


async def ask_provider(lookup: Callable[[str], Awaitable[Decimal | None]], ids: list[str],
                       tries: int = LOOKUP_TRIES, wait_s: float = LOOKUP_WAIT_S) -> dict[str, Decimal]:
    """What `lookup` (ChatClient.generation_cost) says each generation cost, asking again for those it
    does not know yet, `tries` times in all."""
    found: dict[str, Decimal] = {}
    todo = list(dict.fromkeys(ids))
    for attempt in range(tries):
        if attempt:
            await asyncio.sleep(wait_s)
        costs = await asyncio.gather(*(lookup(g) for g in todo))
        found.update({g: c for g, c in zip(todo, costs, strict=True) if c is not None})
        todo = [g for g in todo if g not in found]
        if not todo:
            break
    return found


def provider_asker(base_url: str, api_key: str | None) -> CostLookup:
    """The `CostLookup` of the provider at `base_url` (OpenRouter's `GET /generation?id=`; a provider without it
    says nothing, and the bounds stay)."""
    def ask(ids: list[str]) -> dict[str, Decimal]:
        from eyrie.jobs.api import ChatClient

        async def main() -> dict[str, Decimal]:
            async with ChatClient.unpaid(base_url, api_key, concurrency=16) as client:
                return await ask_provider(client.generation_cost, ids)

        return asyncio.run(main())

    return ask


def provider_key_usage(base_url: str, api_key: str | None) -> Decimal | None:
    """The key's `usage` (OpenRouter's `GET /key`) where the provider keeps one (OpenRouter, or the
    simulator on loopback); None elsewhere. Not booked from: it counts every use of the key and may
    lag, so it is shown beside the booking as the provider's own figure."""
    from eyrie.jobs.api import ChatClient
    from eyrie.jobs.api.limits import is_loopback

    async def main() -> Decimal | None:
        async with ChatClient.unpaid(base_url, api_key) as client:
            if not (client.is_openrouter or is_loopback(base_url)):
                return None
            return await client.key_usage()

    return asyncio.run(main())
