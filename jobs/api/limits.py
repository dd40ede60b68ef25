"""Pacing: a provider's limits and their share per sender, rate limits, Retry-After, backoff with full jitter.

A provider states its limits per minute over a key (requests, tokens, requests in flight); every sender of a run,
an audit or a probe shares them. `Limits` is that budget as plain data and `Limits.split` its exact share per
sender in another process (shares add up to the whole, never more); senders in one process share one `Rates`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import time
from collections import deque
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

from eyrie.jobs.api.errors import NotSent
from eyrie.jobs.errors import EyrieError

RATE_WINDOW_S = 60.0  # the window providers count requests and tokens per ("requests per minute")


async def pause(seconds: float | None, stop: asyncio.Event | None = None, wake: asyncio.Event | None = None) -> None:
    """Wait `seconds`, or (None) until `wake` is set; NotSent as soon as `stop` is set: a run that stopped
    sends nothing that was still waiting for its turn. Without `stop`, a plain sleep or wait."""
    if stop is None:
        await (asyncio.sleep(seconds) if seconds is not None else wake.wait())  # type: ignore[union-attr]
        return
    if stop.is_set():
        raise NotSent
    waits = [asyncio.ensure_future(stop.wait())]
    if seconds is None and wake is not None:
        waits.append(asyncio.ensure_future(wake.wait()))
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    if stop.is_set():
        raise NotSent


class TokenBucket:
    """Smooth rate limit: at most a second's worth of burst, then evenly spaced.

    `reserve` takes the tokens at once (going into debt if needed) and returns how long the caller
    must wait, so concurrent callers queue in arrival order without a lock.
    """

    def __init__(self, per_minute: float, clock: Any = time.monotonic, window_s: float = 60.0):
        if per_minute <= 0 or window_s <= 0:
            raise ValueError("a rate limit and its window must be positive")
        self.rate = per_minute / window_s
        self.capacity = max(1.0, self.rate)
        self.level = self.capacity
        self._clock = clock
        self._t = clock()

    def reserve(self, n: float) -> float:
        now = self._clock()
        self.level = min(self.capacity, self.level + (now - self._t) * self.rate)
        self._t = now
        self.level -= n
        return 0.0 if self.level >= 0 else -self.level / self.rate

    async def acquire(self, n: float = 1.0, stop: asyncio.Event | None = None) -> None:
        wait = self.reserve(n)
        if wait > 0:
            try:
                await pause(wait, stop)
            except NotSent:
                self.level += n  # never sent: its tokens go back
                raise


class Taken:
    """Units a `WindowLimit` gave out; they count against it until `window_s` after `seen`."""

    __slots__ = ("_limit", "done", "n")

    def __init__(self, n: float, limit: WindowLimit):
        self.n, self._limit, self.done = n, limit, False

    def seen(self) -> None:
        """The provider has certainly seen the request (its answer's head arrived, or the attempt ended):
        the window counts it from now. Only the first call counts."""
        if not self.done:
            self.done = True
            self._limit.settle(self.n)

    def release(self) -> None:
        """The request was never sent (the run stopped first): its units go back."""
        if not self.done:
            self.done = True
            self._limit.give_back(self.n)


class WindowLimit:
    """At most `limit` units in any `window_s` seconds, as a provider that counts a sliding window sees them.

    A taking counts from when the provider has certainly seen its request (`Taken.seen`), not from when it was
    sent: a provider that reads a request late must still find the window clear. Until then it counts as
    taking its place now. Callers wait in arrival order; one taking larger than the whole limit waits for an
    empty window.
    """

    def __init__(self, limit: float, window_s: float, clock: Any = time.monotonic):
        if limit <= 0 or window_s <= 0:
            raise ValueError("a window limit and its window must be positive")
        self.limit, self.window_s = limit, window_s
        self._clock = clock
        self.unseen = 0.0  # units given out whose requests the provider may not have seen yet
        self.seen: deque[tuple[float, float]] = deque()  # (when seen, units), in the order seen
        self.seen_units = 0.0
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()

    def wait(self, n: float) -> float | None:
        """Seconds until `n` units fit (0: now), or None when only requests not yet seen block them."""
        now = self._clock()
        while self.seen and self.seen[0][0] <= now - self.window_s:
            self.seen_units -= self.seen.popleft()[1]
        excess = self.unseen + self.seen_units + min(n, self.limit) - self.limit
        if excess <= 1e-9:
            return 0.0
        for when, units in self.seen:  # the oldest leave the window first
            excess -= units
            if excess <= 1e-9:
                return when + self.window_s - now
        return None

    def take(self, n: float) -> Taken:
        """Take `n` units now (the caller checked `wait(n) == 0`)."""
        n = min(n, self.limit)
        self.unseen += n
        return Taken(n, self)

    def settle(self, n: float) -> None:
        self.unseen -= n
        self.seen.append((self._clock(), n))
        self.seen_units += n
        self._changed.set()

    def give_back(self, n: float) -> None:
        self.unseen -= n
        self._changed.set()

    async def acquire(self, n: float = 1.0, stop: asyncio.Event | None = None) -> Taken:
        async with self._lock:  # arrival order: the first waiter is served first
            while (wait := self.wait(n)) != 0:
                self._changed.clear()
                await pause(wait, stop, self._changed)
            return self.take(n)


class RateLimit:
    """A provider's rate limit: smooth (a `TokenBucket` at limit/window) and never above `limit` in any
    window (a `WindowLimit`): the bucket spaces requests out, the window bounds what its burst could add."""

    def __init__(self, limit: int, window_s: float = RATE_WINDOW_S):
        self.bucket = TokenBucket(limit, window_s=window_s)
        self.window = WindowLimit(limit, window_s)

    async def acquire(self, n: float = 1.0, stop: asyncio.Event | None = None) -> Taken:
        """The units, once both allow them; NotSent when `stop` is set while waiting."""
        await self.bucket.acquire(n, stop)
        return await self.window.acquire(n, stop)


class LimitsTooLow(EyrieError, ValueError):
    """Limits that cannot be shared among that many senders in separate processes (a share would be zero)."""


@dataclass(frozen=True)
class Limits:
    """A provider's limits over one key, or one sender's share of them: plain data (it crosses into Ray)."""

    concurrency: int
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    window_s: float | None = None  # None: RATE_WINDOW_S, read when the limits are used

    @property
    def window(self) -> float:
        return RATE_WINDOW_S if self.window_s is None else self.window_s

    def split(self, n: int) -> list[Limits]:
        """`n` shares that add up to these limits exactly (the first ones take the remainders); LimitsTooLow
        when a share would be zero. For senders that cannot share one `Pacer` (separate processes)."""

        def parts(total: int | None, name: str) -> list[int | None]:
            if total is None:
                return [None] * n
            if total < n:
                raise LimitsTooLow(f"{name} {total} cannot be shared by {n} senders: each needs at least one")
            return [total // n + (i < total % n) for i in range(n)]

        return [Limits(c, r, t, self.window_s) for c, r, t in zip(
            parts(self.concurrency, "concurrency"), parts(self.requests_per_minute, "requests per minute"),
            parts(self.tokens_per_minute, "tokens per minute"), strict=True)]


class Rates:
    """The request and token rates of `Limits`, as the clients that keep to them share them."""

    def __init__(self, limits: Limits):
        window = limits.window
        self.requests = RateLimit(limits.requests_per_minute, window) if limits.requests_per_minute else None
        self.tokens = RateLimit(limits.tokens_per_minute, window) if limits.tokens_per_minute else None


class Pacer:
    """A sender's pace: its own slots (requests in flight, from the reservation to the durable record) and the
    rates it keeps to, its own (`Rates(limits)`) or shared with the other senders of its process.

    Slots are never shared between senders: each sender holds its own budget lease, and a sender whose requests
    waited for slots that another's requests held while they waited for budget that sender leased would wait
    forever."""

    def __init__(self, concurrency: int, rates: Rates):
        self.slots = asyncio.Semaphore(concurrency)
        self.rates = rates

    @classmethod
    def of(cls, limits: Limits) -> Pacer:
        return cls(limits.concurrency, Rates(limits))


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds (delay-seconds or an HTTP-date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def backoff_delay(failures: int, base: float, cap: float, retry_after: float | None,
                  rand: float | None = None) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**(failures-1))]; at least Retry-After (<= cap)."""
    span = min(cap, base * (2 ** (failures - 1)))
    delay = span * (random.random() if rand is None else rand)
    if retry_after is not None:
        delay = max(delay, min(retry_after, cap))
    return delay


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
