"""Pure pacing: rate limits, Retry-After, backoff with full jitter."""

from __future__ import annotations

import asyncio
import ipaddress
import random
import time
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit


class TokenBucket:
    """Smooth rate limit: at most a second's worth of burst, then evenly spaced.

    `reserve` takes the tokens at once (going into debt if needed) and returns how long the caller
    must wait, so concurrent callers queue in arrival order without a lock.
    """

    def __init__(self, per_minute: float, clock: Any = time.monotonic):
        if per_minute <= 0:
            raise ValueError("a rate limit must be positive")
        self.rate = per_minute / 60.0
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

    async def acquire(self, n: float = 1.0) -> None:
        wait = self.reserve(n)
        if wait > 0:
            await asyncio.sleep(wait)


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
