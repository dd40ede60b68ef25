"""Process trees read from /proc: what the fault tests and the benchmarks started, and how to end it.

Free of pytest and of the test fixtures, so that benchmarks/ can import it as well.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def children_of(pid: int) -> list[int]:
    """Direct and indirect children of `pid` (from /proc), so a test kills only what it started."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: the ppid follows the last ')'
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        found += kids
        frontier += kids
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_all(pids: list[int]) -> None:
    """SIGKILL each listed PID that is still alive (processes this test started)."""
    for p in pids:
        if alive(p):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
