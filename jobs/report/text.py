"""How the report writes its numbers, one way each, on the terminal and on the page alike: a rate as
a percentage with one decimal, money through `contract.money.dollars` (at most 6 decimals), bytes in
binary units."""

from __future__ import annotations

from typing import Any

from eyrie.jobs.contract.money import dollars

__all__ = ["WIDTH", "dollars", "human_bytes", "num", "rate"]

WIDTH = 100  # columns when not on a terminal: what a log viewer or an editor shows without scrolling


def rate(x: float | None) -> str:
    """A share of something: "78.3%"; "-" when it could not be measured (no denominator)."""
    return "-" if x is None else f"{100 * x:.1f}%"


def num(x: Any, digits: int = 3) -> str:
    """A measured quantity that is not a rate (a mean NLL, a mean gap): "-" when absent."""
    return "-" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - the loop always returns
