"""How many reconcile passes run at once, and which go first.

Every DatasetGeneration is polled every `--interval` seconds, and a pass makes several API calls.
Unbounded, 1,000 objects keep about a thousand passes in flight, the API server answers them all
slowly, and the first pass of a new object (or the answer to a spec edit) waits behind every poll:
measured against a real kube-apiserver, 1,000 objects created at once waited 334 s (p95) for a
first status. Bounded, with urgent passes first, a new object waits for a free slot only.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

DEFAULT_MAX_PASSES = 32


class PassGate:
    """At most `limit` passes at once; waiting urgent passes (a new object, a spec change) go before
    waiting polls, each kind in arrival order."""

    def __init__(self, limit: int = DEFAULT_MAX_PASSES):
        if limit < 1:
            raise ValueError(f"a pass gate needs at least one slot, got {limit}")
        self.limit = limit
        self.running = 0
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    @property
    def waiting(self) -> int:
        return sum(1 for _, _, f in self._waiting if not f.done())

    @asynccontextmanager
    async def slot(self, urgent: bool) -> AsyncIterator[None]:
        # a freed slot goes to a live waiter before `running` drops, so a free slot means nobody waits
        if self.running < self.limit:
            self.running += 1
        else:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (0 if urgent else 1, next(self._arrivals), fut))
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():  # the slot was handed over just before the cancel
                    self._release()
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        """Hand the slot to the first live waiter, else free it."""
        while self._waiting:
            _, _, fut = heapq.heappop(self._waiting)
            if not fut.done():
                fut.set_result(None)
                return
        self.running -= 1
