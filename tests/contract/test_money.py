"""Money for people (issue 24, item 4): at most 6 decimals wherever it is printed, every digit in the JSON."""

from __future__ import annotations

from decimal import Decimal

import pytest

from eyrie.jobs.contract.money import PRICE_PLACES, brief, dollars, usd


@pytest.mark.parametrize("value,shown", [
    ("1.010928723076923076923076923", "$1.010929"), ("0.8823288", "$0.882329"), ("12.5", "$12.50"),
    ("100", "$100.00"), ("0", "$0.00"), ("0.0000001", "<$0.000001"), ("0.0000005", "$0.000001"),
    ("-0.5", "-$0.50"), (Decimal("3.1E-3"), "$0.0031"), (2, "$2.00"),
])
def test_dollars_rounds_to_at_most_six_decimals_and_keeps_the_cents(value, shown):
    assert dollars(value) == shown


def test_what_is_not_an_amount_prints_as_it_is():
    assert dollars(None) == "None" and dollars("n/a") == "n/a"


def test_json_keeps_every_digit_and_the_status_rounds_up():
    d = Decimal("1.010928723076923076923076923")
    assert usd(d) == "1.010928723076923076923076923" and usd(Decimal("0E-10")) == "0"
    assert brief(d) == "1.010929" and brief(Decimal("1.0000001")) == "1.000001"  # never below the spend
    assert brief(Decimal("9.97")) == "9.97" and brief(Decimal("5.00")) == "5.00"


@pytest.mark.parametrize("value,shown", [
    ("3.739842", "$3.7398"), ("36.666667", "$36.6667"), ("0.6", "$0.60"), ("2.5", "$2.50"), ("0.00001", "<$0.0001"),
])
def test_a_price_per_million_has_two_to_four_decimals(value, shown):
    assert dollars(value, PRICE_PLACES) == shown


def test_the_provider_tables_print_money_through_dollars():
    import io

    from rich.console import Console

    from eyrie.jobs.report.providers import listing_table, probe_table, served_table

    doc = {"model": "m", "listed": True, "spentUSD": "0.0183648", "settings": {"samples": 4}, "reference": "a",
           "listing": [{"tag": "a", "providerName": "A", "pricing": {"promptPerMillion": "0.6",
                                                                     "completionPerMillion": "3.739842"}}],
           "candidates": [{"tag": "a", "passed": True, "answers": 4, "sent": 4, "costPerAnswerUSD": "0.0003304125"}]}
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(listing_table(doc), probe_table(doc), served_table(doc))
    text = console.export_text()
    assert "$0.60" in text and "$3.7398" in text and "3.739842" not in text
    assert "spent $0.018365" in text and "$0.00033" in text and "0.0003304125" not in text
