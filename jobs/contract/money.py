"""Money as text: full precision for the JSON files, rounded for people.

`usd` is what progress.json, budget.json, records and the manifest keep (a decimal string, never
an exponent, never rounded). `dollars` is what a person reads (the CLI, the report, the operator's
messages): at most 6 decimals, at least the cents, so "$1.010928723076923076923076923" prints as
"$1.010929" and "$12.5" as "$12.50"; a price per million tokens at most 4 (`PRICE_PLACES`): "$3.7683".
"""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

PLACES = 6  # the most decimals an amount is printed with for people
PRICE_PLACES = 4  # a price per million tokens: dollars per million, where a sixth decimal is noise


def usd(d: Decimal) -> str:
    """A decimal amount as plain text: "0" rather than "0E-10", never an exponent."""
    return format(d.normalize(), "f") if d else "0"


def brief(d: Decimal) -> str:
    """A plain amount with at most 6 decimals, rounded up (a spend shown is never below the spend):
    what the DatasetGeneration's status carries, since `kubectl get dsg` prints it."""
    exponent = d.as_tuple().exponent
    if not isinstance(exponent, int) or exponent >= -6:
        return str(d)
    return usd(d.quantize(Decimal(1).scaleb(-PLACES), rounding=ROUND_CEILING))


def dollars(value: Any, places: int = PLACES) -> str:
    """"$1.010929" for people: at most `places` decimals (half up, never more than 6), trailing zeros
    cut down to the cents; an amount too small to show reads "<$0.000001". Anything that is not an
    amount prints as it is."""
    try:
        d = value if isinstance(value, Decimal) else Decimal(str(value))
    except (InvalidOperation, ValueError):
        return str(value)
    if not d.is_finite():
        return str(value)
    shown = Decimal(1).scaleb(-min(max(places, 2), PLACES))
    sign = "-" if d < 0 else ""
    d = abs(d)
    if 0 < d < shown / 2:
        return f"{sign}<${shown}"
    text = format(d.quantize(shown, rounding=ROUND_HALF_UP), "f")
    whole, _, frac = text.partition(".")
    frac = frac.rstrip("0").ljust(2, "0")
    return f"{sign}${whole}.{frac}"
