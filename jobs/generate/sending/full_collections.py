"""Full garbage collections on the sending loop's schedule, not on CPython's.

CPython (3.11) runs a full collection once the objects promoted to the oldest generation since the last one reach a
quarter of those that survived it. A request in flight keeps ~100 tracked objects (its task and coroutines, aiohttp's
request, response and connection, its prompt) and lives long enough for all of them to be promoted, so with N in flight
a full collection (a pass over all N requests' objects) comes every ~N/4 requests: a fixed cost per request whatever N
is. Measured on `eyrie run` at 5,000 in flight (2-4 s answers, 60,000 prompts, this machine's 2 cores): 70 full
collections of ~330 ms each, 23 s of the process's 48 s of CPU.

Here the young collections stay automatic (they catch most cycles: an exception's traceback, a future's callbacks),
every 50,000 allocations rather than 700 (CPython's count is sized for small heaps: at 700 a request's objects are
scanned and promoted several times while it waits for its answer), and the full ones run on the loop, each at least
`min_interval` seconds after the last and spaced so that they take at most `max_share` of the time: what a long-lived
cycle holds is freed within a bounded time, and a full pass no longer follows every few thousand answers. Measured on
the same run (30,000 prompts, 5,000 in flight, 1-3 s answers): 21.7 s of CPU with CPython's collections, 15.6 with
the full ones scheduled, 14.0 with the young ones every 50,000 allocations too (most of the rest is aiohttp's).

What the process held when the first loop started (modules, the spec, the tokenizer: ~100,000 objects of the ~500,000
a full pass looks at with 5,000 in flight) is frozen (`gc.freeze`) until the last loop ends: a cycle among them that
becomes garbage meanwhile waits for that end, and no full collection walks them again.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

NEVER = 1 << 30  # a collection count the automatic ones never reach
YOUNG, MIDDLE = 50_000, 50  # allocations between young collections; young collections between middle ones
MIN_INTERVAL_S = 10.0
MAX_SHARE = 0.02

_lock = threading.Lock()
_started = 0  # policies running in this process (a loop per thread): CPython's thresholds come back with the last
_saved: tuple[int, int, int] = gc.get_threshold()


class FullCollections:
    """Full collections scheduled on `loop` while started (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, min_interval: float = MIN_INTERVAL_S,
                 max_share: float = MAX_SHARE):
        self.loop, self.min_interval, self.max_share = loop, min_interval, max_share
        self.collections = 0
        self.seconds = 0.0  # spent in them
        self._next: asyncio.TimerHandle | None = None

    def start(self) -> None:
        global _started, _saved
        with _lock:
            if _started == 0:
                _saved = gc.get_threshold()
                gc.set_threshold(YOUNG, MIDDLE, NEVER)
                gc.freeze()
            _started += 1
        self._next = self.loop.call_later(self.min_interval, self._collect)

    def stop(self) -> None:
        global _started
        if self._next is None:
            return
        self._next.cancel()
        self._next = None
        with _lock:
            _started -= 1
            if _started == 0:
                gc.set_threshold(*_saved)
                gc.unfreeze()

    def _collect(self) -> None:
        start = time.perf_counter()
        gc.collect()
        took = time.perf_counter() - start
        self.collections += 1
        self.seconds += took
        self._next = self.loop.call_later(max(self.min_interval, took / self.max_share), self._collect)


@contextmanager
def full_collections_scheduled(min_interval: float = MIN_INTERVAL_S,
                               max_share: float = MAX_SHARE) -> Iterator[FullCollections]:
    """Within: full collections on the running loop's schedule; CPython's own thresholds restored on the way out."""
    policy = FullCollections(asyncio.get_running_loop(), min_interval, max_share)
    policy.start()
    try:
        yield policy
    finally:
        policy.stop()
