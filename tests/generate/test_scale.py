"""The provider's limits and the budget at a real provider's scale: 10,000 requests allowed in flight
(`api.maxConcurrency`), answers that take a drawn while (the simulator's `latency` range) and cost what each
answer's usage says (prices that vary per answer). Short latencies keep the tests quick: the scale is what is
allowed in flight, not the wall time. Thousands of sockets on loopback need as many descriptors: the test process
raises its soft limit (`raise_open_files`), the simulator's process its own (`eyrie simulate`)."""

from __future__ import annotations

import sys
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parents[1]))
from fault_helpers import write_rows

from eyrie.jobs.api import limits
from eyrie.jobs.api.client import raise_open_files
from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import records
from eyrie.jobs.generate.budget.pricing import Pricing, worst_case
from eyrie.jobs.generate.driver import run_generation
from eyrie.jobs.generate.sending.requests import estimate_prompt_tokens
from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess
from eyrie.jobs.spec import load_spec
from eyrie.jobs.store import open_output

pytestmark = pytest.mark.integration

ALLOWED = 10_000
PRICES = {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}
MAX_TOKENS = 64


def rows(n: int) -> list[dict]:
    """Prompts of many lengths: each answer's price differs (its prompt and completion tokens)."""
    return [{"messages": [{"role": "user", "content": f"Scale question {i}: " + "and more " * (i % 97)}]}
            for i in range(n)]


def spec_path(tmp_path: Path, base_url: str, prompts: Path, *, max_usd: str, workers: int = 1, **api) -> Path:
    doc = {"sources": [{"name": "p", "uri": str(prompts)}], "target": {"model": "sim/model"},
           "api": {"baseUrl": base_url, "maxConcurrency": ALLOWED, "stream": False, "maxRetries": 2,
                   "requestTimeoutSeconds": 60, "sampling": {"maxTokens": MAX_TOKENS}, **api},
           "tools": {"gate": {"enabled": False}},
           "budget": {"maxUSD": max_usd, "pricing": PRICES},
           "generation": {"shards": 4, "ray": {"workers": workers}},
           "output": {"uri": f"file://{tmp_path}/out"}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_ten_thousand_allowed_never_send_past_the_providers_requests_per_window(tmp_path, monkeypatch):
    """Two workers with 10,000 slots between them, each its share of 20 requests per window: the provider (which
    counts every request it receives per sliding window) never sees more than 20 in any window, refuses none."""
    limit, window = 20, 3.0  # a provider's minute, shortened: the bound is the same
    monkeypatch.setattr(limits, "RATE_WINDOW_S", window)
    prompts = write_rows(tmp_path / "p.jsonl", rows(70))
    cfg = SimulatorConfig(rate_limit_requests=limit, rate_limit_window_s=window, latency_range_s=(0.02, 0.5))
    with SimulatorProcess(cfg) as sim:
        dg = load_spec(spec_path(tmp_path, sim.base_url, prompts, max_usd="5", workers=2, requestsPerMinute=limit))
        store = open_output(dg.spec)
        result = run_generation(dg, store, RunContext("scale-rate"), sim.base_url, inline=True)
        stats = sim.stats()
    assert result.outcome == "Done", result.message
    recs = list(records.iter_records(store))
    assert len(recs) == 70 and all(r["status"] == "ok" for r in recs)
    assert stats["rateLimit"]["maxInWindow"] <= limit, stats["rateLimit"]
    assert stats["rateLimit"]["refused"] == 0, stats["rateLimit"]
    assert stats["requests"] == 70  # several windows' worth, none sent twice


def test_ten_thousand_allowed_never_spend_past_the_budget_with_prices_that_vary(tmp_path):
    """A budget that runs out while thousands of requests are in flight, each answer priced by its own usage: the
    provider's bill and the booked spend never pass maxUSD, and the run stops no earlier than one worst case
    below it (it does not stop early for being wide)."""
    raise_open_files(ALLOWED)  # a socket per request in flight (this process owns the limit)
    n, cap = 8_000, Decimal("0.60")  # at about $0.0002 an answer, the cap buys some 3,000 of them
    data = rows(n)
    prompts = write_rows(tmp_path / "p.jsonl", data)
    with SimulatorProcess(SimulatorConfig(latency_range_s=(1.0, 3.0)), startup_timeout=60) as sim:
        dg = load_spec(spec_path(tmp_path, sim.base_url, prompts, max_usd=str(cap)))
        store = open_output(dg.spec)
        result = run_generation(dg, store, RunContext("scale-budget"), sim.base_url, inline=True)
        stats = sim.stats()
    billed, booked = Decimal(stats["billedUSD"]), result.snapshot.spent
    assert result.outcome == "BudgetExhausted", result.message
    assert billed <= cap and booked <= cap, (billed, booked)
    pricing = Pricing(Decimal(PRICES["inputPerMillion"]), Decimal(PRICES["outputPerMillion"]))
    largest = max(worst_case(pricing, estimate_prompt_tokens(r["messages"], None), MAX_TOKENS) for r in data)
    assert booked > cap - largest, (booked, largest)  # stopped no earlier than one reservation below the cap
    recs = list(records.iter_records(store))
    costs = {r["costUSD"] for r in recs}
    assert len(recs) > 2_000 and len(costs) > 50  # thousands of answers, at many prices
    # hundreds in flight at once (how many depends on how fast this machine sends: the cap is what allows them)
    assert stats["maxInFlight"] > 300, stats["maxInFlight"]
    assert booked == sum(Decimal(r["costUSD"]) for r in recs) == billed  # every answer booked at its own price
