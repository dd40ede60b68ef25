"""How the report writes its numbers, one way each, on the terminal and on the page alike: a rate as
a percentage with one decimal, money through `contract.money.dollars` (at most 6 decimals), bytes in
binary units."""

from __future__ import annotations

from typing import Any

from eyrie.jobs.contract.money import dollars
from eyrie.jobs.intervals import bracket  # an interval's one written form, re-exported: numbers are written here

__all__ = ["WIDTH", "abandoned_spend", "bracket", "dollars", "human_bytes", "num", "rate"]

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


def abandoned_spend(paid: Any, abandoned: dict[str, Any] | None) -> str | None:
    """After a stop that abandoned requests in flight (Ctrl-C twice, kill -9, a lost worker): the spend
    the stored answers confirm, what the provider said the abandoned ones cost, what may still be
    billed for the rest, and the key's usage, in one line (what `eyrie run` ends with and `eyrie
    report` shows); None without abandoned requests."""
    a = abandoned or {}
    if not a.get("requests"):
        return None
    parts = [f"confirmed spend {dollars(paid or 0)} (the stored answers)"]
    if a.get("reconciled"):
        parts.append(f"{a['reconciled']} requests abandoned in flight cost {dollars(a.get('reconciledUSD', 0))} "
                     "(what the provider billed for them, or their answers that were never stored)")
    if a.get("unreconciled"):
        parts.append(f"up to {dollars(a.get('upToUSD', 0))} more may be billed for {a['unreconciled']} requests "
                     "abandoned in flight (booked at their worst case until the provider says what they cost; "
                     "compare with its bill)")
    if a.get("keyUsageRoseUSD") is not None:
        parts.append(f"the provider's key usage rose {dollars(a['keyUsageRoseUSD'])} during this attempt (GET /key; "
                     "any other use of the key counts too)")
    return "; ".join(parts)
