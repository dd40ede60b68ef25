"""Prices: a request's worst case and its actual cost (the ledger that spends them: lease.py).

Before a request a worker reserves its worst case (prompt tokens x input price + max output tokens
x output price); after it, it settles at the actual cost (`usage.cost` when the provider returns
it, else price x usage). No price known means no request (fail closed).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

from eyrie.jobs.contract.money import usd as usd  # re-exported: generation writes money with it
from eyrie.jobs.errors import EyrieError

MILLION = Decimal(1_000_000)
CENT_PRECISION = Decimal("0.0000000001")


class UnpriceableRequest(EyrieError, ValueError):
    """No price is known for a request: it is refused rather than sent (fail closed)."""


@dataclass(frozen=True)
class Pricing:
    input_per_million: Decimal
    output_per_million: Decimal

    def cost(self, prompt_tokens: int, completion_tokens: int) -> Decimal:
        return ((self.input_per_million * prompt_tokens + self.output_per_million * completion_tokens)
                / MILLION).quantize(CENT_PRECISION, rounding=ROUND_CEILING)


def worst_case(pricing: Pricing | None, prompt_tokens: int, max_output_tokens: int) -> Decimal:
    if pricing is None:
        raise UnpriceableRequest("no pricing: set budget.pricing (inputPerMillion, outputPerMillion)")
    if prompt_tokens < 0 or max_output_tokens <= 0:
        raise UnpriceableRequest(f"cannot price {prompt_tokens} prompt / {max_output_tokens} output tokens")
    return pricing.cost(prompt_tokens, max_output_tokens)


def actual_cost(pricing: Pricing | None, usage: dict | None, reported: Decimal | None) -> Decimal | None:
    """The provider's `usage.cost` when given, else price x usage; None when neither is known."""
    if reported is not None:
        return reported
    if usage and pricing is not None:
        try:
            return pricing.cost(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
        except (TypeError, ValueError):
            return None
    return None
