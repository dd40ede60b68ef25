"""timeseries.jsonl: spend, requests and retries over time, kept beside progress.json for the report.

progress.json says where a run stands; the report also wants how it got there (spend against the
budget, throughput, retries). The driver adds a point at every progress write and rewrites the
whole file (a single PUT: S3 has no append). Bounded: past `MAX_POINTS` every other point is
dropped and the sampling interval doubles, so a week-long run keeps the same few hundred points
spread over its whole length, first and last always kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from eyrie.jobs.contract.layout import TIMESERIES
from eyrie.jobs.contract.progress import Progress, now_iso
from eyrie.jobs.store import NotFound, Store

MAX_POINTS = 512
# forecastUSD: the projection as it stood at each point (none before the canary), so the page plots how it moved
POINT_KEYS = ("spentUSD", "reservedUSD", "forecastUSD", "requests", "retries", "inFlight")


def point(progress: Progress) -> dict[str, Any]:
    """One point of a progress snapshot: the counters the report plots, nothing else."""
    doc, s = progress.to_json(), progress.samples
    return {"t": now_iso(), "attempt": progress.attempt, **{k: doc[k] for k in POINT_KEYS if k in doc},
            "errors": sum(progress.errors.values()), "done": s.done, "rejected": s.rejected,
            "discarded": s.discarded, "failed": s.failed, "total": s.total}


@dataclass
class TimeSeries:
    """A bounded series: at most `max_points` kept, evenly thinned as it grows (pure; no I/O).

    The newest point offered is always part of `points()` even when thinning would skip it, so
    the report's last point is the run's state at its last write.
    """

    kept: list[dict[str, Any]] = field(default_factory=list)
    max_points: int = MAX_POINTS
    stride: int = 1  # keep one offered point in `stride`
    _since: int = 0
    _latest: dict[str, Any] | None = None

    def add(self, p: dict[str, Any]) -> None:
        self._since += 1
        if self.kept and self._since < self.stride:
            self._latest = p
            return
        self._since, self._latest = 0, None
        self.kept.append(p)
        if len(self.kept) > self.max_points:
            self.kept = self.kept[::2]  # the first stays; the spread over time stays even
            self.stride *= 2

    def points(self) -> list[dict[str, Any]]:
        return [*self.kept, self._latest] if self._latest is not None else list(self.kept)


def encode(points: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(p) + b"\n" for p in points)


def read_timeseries(store: Store) -> list[dict[str, Any]]:
    """Every point written so far (an empty list before the first write, or for runs before it)."""
    try:
        data = store.get(TIMESERIES)
    except NotFound:
        return []
    return [orjson.loads(line) for line in data.splitlines() if line.strip()]
