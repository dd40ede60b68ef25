"""Shards as row ranges: the driver plans them from cheap scans, each worker streams its own slice.

The driver never holds prompts: it scans each source once (`sources.scan_source`: a row count and a
mark every few thousand rows, or a Parquet footer) and cuts the rows of all sources, in order, into
`generation.shards` contiguous ranges. A worker given a shard streams its spans from the source
(seeking to the nearest mark) and holds at most its concurrency in prompts.

The plan is stored in the output (`generations/plan.json`) and kept by every later attempt, so a
shard always covers the same rows and a resumed shard skips exactly the ids persisted in it, even
when `generation.shards` changed. Rows a source gained since (a raised `limit`, a file grown at its
end) are planned into new shards after the old ones; rows it lost (a lowered `limit`) are left out
of the old shards for this attempt, which keep them in the stored plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from eyrie.jobs import sources
from eyrie.jobs.contract import layout
from eyrie.jobs.spec import DatasetGenerationSpec
from eyrie.jobs.store import NotFound, Store

PLAN_VERSION = 1


@dataclass(frozen=True)
class Span:
    """Rows [start, stop) of one source, counted as `sources.iter_source` counts them."""

    source: str
    start: int
    stop: int


@dataclass
class ShardPlan:
    shards: dict[int, list[Span]]
    indexes: dict[str, sources.SourceIndex] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(s.stop - s.start for spans in self.shards.values() for s in spans)


def plan_shards(spec: DatasetGenerationSpec, store: Store) -> ShardPlan:
    """Scan the sources and return the shards: the stored plan, clipped to the rows there are now,
    plus new shards for rows no stored shard covers (then stored). A stored shard is never
    renumbered or dropped: its persisted ids are skipped only by the worker that reads that shard."""
    indexes = {src.name: sources.scan_source(src, spec.output.endpoint) for src in spec.sources}
    stored = read_plan(store)
    shards: dict[int, list[Span]] = {}
    covered: dict[str, int] = {}
    for shard, spans in stored.items():
        kept = []
        for sp in spans:
            covered[sp.source] = max(covered.get(sp.source, 0), sp.stop)
            if sp.source in indexes and sp.start < indexes[sp.source].rows:
                kept.append(Span(sp.source, sp.start, min(sp.stop, indexes[sp.source].rows)))
        if kept:
            shards[shard] = kept
    new = [Span(name, covered.get(name, 0), idx.rows) for name, idx in indexes.items()
           if idx.rows > covered.get(name, 0)]
    first = max(stored, default=-1) + 1
    added = {first + i: spans for i, spans in enumerate(cut(new, spec.generation.shards))}
    if added:  # the stored shards are written back whole: clipped rows may come back later
        write_plan(store, {**stored, **added})
    return ShardPlan({**shards, **added}, indexes)


def cut(spans: list[Span], n: int) -> list[list[Span]]:
    """Split the rows of `spans`, in order, into at most `n` contiguous shards of near-equal size."""
    total = sum(s.stop - s.start for s in spans)
    if total == 0:
        return []
    n = min(n, total)
    out: list[list[Span]] = []
    queue = list(spans)
    for k in range(n):
        want = total * (k + 1) // n - total * k // n
        shard: list[Span] = []
        while want:
            sp = queue.pop(0)
            take = min(want, sp.stop - sp.start)
            shard.append(Span(sp.source, sp.start, sp.start + take))
            if sp.start + take < sp.stop:
                queue.insert(0, Span(sp.source, sp.start + take, sp.stop))
            want -= take
        out.append(shard)
    return out


def read_plan(store: Store) -> dict[int, list[Span]]:
    try:
        doc = orjson.loads(store.get(layout.PLAN))
    except NotFound:
        return {}
    return {int(k): [Span(s["source"], int(s["start"]), int(s["stop"])) for s in v]
            for k, v in doc["shards"].items()}


def write_plan(store: Store, shards: dict[int, list[Span]]) -> None:
    doc = {"version": PLAN_VERSION,
           "shards": {str(k): [{"source": s.source, "start": s.start, "stop": s.stop} for s in v]
                      for k, v in sorted(shards.items())}}
    store.put(layout.PLAN, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
