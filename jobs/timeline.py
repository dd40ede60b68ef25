"""Where a command's first seconds go: its steps, each with its start (seconds since the process
started, the interpreter's own start and imports included) and its duration, and the moments that
matter to a user (the first request sent, the first answer back). `eyrie run --verbose` prints it.

Steps that run beside each other (Ray's start beside the first requests) overlap in the listing:
each is timed on its own. A timeline is handed from the CLI to the stages; one that nobody asked for
(`Timeline.off`) still times, and is simply never printed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


def process_start() -> float:
    """The wall-clock time this process started (Linux: /proc), else the time this module was imported."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])  # field 22: starttime, clock ticks since boot
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED


_IMPORTED = time.time()


@dataclass(frozen=True)
class Entry:
    name: str
    start_s: float  # since the process started
    duration_s: float | None  # None: a moment, not a step


class Timeline:
    """Steps and moments of one process, in the order they began. Thread-safe (Ray starts on a thread)."""

    def __init__(self, origin: float | None = None):
        self.origin = process_start() if origin is None else origin
        self._entries: list[Entry] = []
        self._lock = threading.Lock()

    @classmethod
    def off(cls) -> Timeline:
        """A timeline nobody will print (a caller that did not ask for one)."""
        return cls(origin=time.time())

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        t0 = time.time()
        try:
            yield
        finally:
            self.add(name, t0, time.time() - t0)

    def add(self, name: str, started: float, duration: float | None = None) -> None:
        """A step that began at wall-clock `started` and lasted `duration` (None: a moment)."""
        with self._lock:
            self._entries.append(Entry(name, started - self.origin, duration))

    def mark(self, name: str, at: float | None = None) -> None:
        """A moment (`at`: its wall-clock time; default now), once: a later mark of the same name is dropped."""
        with self._lock:
            if any(e.name == name and e.duration_s is None for e in self._entries):
                return
        self.add(name, time.time() if at is None else at)

    def entries(self) -> list[Entry]:
        with self._lock:
            return sorted(self._entries, key=lambda e: e.start_s)

    def at(self, name: str) -> float | None:
        """When the first entry of that name began (seconds since the process started), None if never."""
        return next((e.start_s for e in self.entries() if e.name == name), None)

    def lines(self) -> list[str]:
        """`  +1.23 s  0.45 s  preflight`: one line per entry, by start; a moment has no duration."""
        out = []
        for e in self.entries():
            took = f"{e.duration_s:6.2f} s" if e.duration_s is not None else "      --"
            out.append(f"  +{e.start_s:6.2f} s {took}  {e.name}")
        return out
