"""A provider's limits, shared: the senders that share a provider (the run's workers, the audit's two modes)
never send past its requests per window together.

The simulator enforces the limit (`rateLimit`: 429 past N requests in any window) and counts every request it
receives per window, accepted or not; the tests read that count. The window is 3 s in both the simulator and the
limiter (`api.limits.RATE_WINDOW_S`, a provider's minute), so a test spans several windows in seconds: the bound is
the same, only shorter."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parents[1]))
from fault_helpers import simple_rows, write_rows

from eyrie.jobs.api import limits
from eyrie.jobs.api.errors import NotSent
from eyrie.jobs.api.limits import Limits, LimitsTooLow, RateLimit, WindowLimit
from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import records
from eyrie.jobs.generate.audit.run import run_audit
from eyrie.jobs.generate.driver import run_generation
from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess
from eyrie.jobs.simulator.faults import RequestWindow
from eyrie.jobs.spec import load_spec, parse_spec
from eyrie.jobs.store import open_output

LIMIT, WINDOW_S = 4, 3.0
PRICING = {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------------------------------ pure


def test_a_window_counts_a_request_from_when_the_provider_has_seen_it():
    clock = Clock()
    w = WindowLimit(3, 10.0, clock)
    taken = [w.take(1) for _ in range(3)]
    assert w.wait(1) is None  # full, and nothing seen yet: it waits for an answer's head, not for a time
    clock.now = 102.0
    taken[0].seen()
    clock.now = 105.0
    for t in taken[1:]:
        t.seen()
    taken[0].seen()  # only the first call counts
    assert w.wait(1) == pytest.approx(7.0)  # the first seen leaves the window 10 s after it was seen
    assert w.wait(2) == pytest.approx(10.0)  # two places: the second leaves at 115
    clock.now = 112.0
    assert w.wait(1) == 0 and w.wait(2) == pytest.approx(3.0)
    assert w.wait(50) == pytest.approx(3.0)  # more than the whole limit waits for an empty window


def test_a_request_waiting_for_the_window_is_never_sent_once_the_run_stops():
    """A stop sends nothing more: a request still waiting for its place in the window (or the bucket's pace) gives
    up with NotSent at once, and what it had taken goes back (the window counts only requests sent)."""

    async def main() -> None:
        limit = RateLimit(1, window_s=60.0)
        (await limit.acquire(1)).seen()  # the window's only place, taken by a request the provider saw
        stop = asyncio.Event()
        waiting = asyncio.ensure_future(limit.acquire(1, stop))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # it would wait a minute for the window
        stop.set()
        with pytest.raises(NotSent):
            await asyncio.wait_for(waiting, 1.0)
        assert (limit.window.unseen, limit.window.seen_units) == (0, 1)
        with pytest.raises(NotSent):  # and one that comes after the stop never waits at all
            await asyncio.wait_for(limit.acquire(1, stop), 1.0)

    asyncio.run(main())


def test_limits_split_exactly_among_senders_or_not_at_all():
    shares = Limits(8, 10, 100).split(3)
    assert [s.concurrency for s in shares] == [3, 3, 2]
    assert [s.requests_per_minute for s in shares] == [4, 3, 3]
    assert sum(s.tokens_per_minute or 0 for s in shares) == 100
    assert Limits(4).split(2) == [Limits(2), Limits(2)]
    with pytest.raises(LimitsTooLow, match="requests per minute 1 cannot be shared by 2 senders"):
        Limits(4, 1).split(2)


def test_a_spec_whose_limits_the_workers_cannot_share_is_refused():
    doc = {"sources": [{"name": "p", "uri": "p.jsonl"}], "target": {"model": "m"},
           "api": {"baseUrl": "http://127.0.0.1:9/v1", "requestsPerMinute": 2},
           "budget": {"maxUSD": "1", "pricing": PRICING}, "generation": {"ray": {"workers": 3}},
           "output": {"uri": "file:///tmp/unused"}}
    with pytest.raises(ValueError, match=r"api.requestsPerMinute: 2 is below generation.ray.workers \(3\)"):
        parse_spec(doc)


def test_the_simulator_refuses_past_its_window_and_counts_what_it_received():
    clock = Clock()
    w = RequestWindow(2, 5.0, clock)
    assert w.admit() is None
    clock.now += 1
    assert w.admit() is None
    clock.now += 1
    assert w.admit() == pytest.approx(3.0)  # until the first accepted leaves
    clock.now = 105.0  # the first one (at 100) is out: (100, 105] holds one accepted
    assert w.admit() is None
    assert w.stats() == {"requests": 2, "windowS": 5.0, "maxInWindow": 3, "refused": 1}


# ------------------------------------------------------------------------------------ end to end


@pytest.fixture
def limited(monkeypatch):
    """A simulator that enforces LIMIT requests per WINDOW_S, and eyrie's limiter counting the same window."""
    monkeypatch.setattr(limits, "RATE_WINDOW_S", WINDOW_S)
    with SimulatorProcess(SimulatorConfig(rate_limit_requests=LIMIT, rate_limit_window_s=WINDOW_S)) as sim:
        yield sim


def spec_file(tmp_path: Path, base_url: str, prompts: Path, **api) -> Path:
    doc = {"sources": [{"name": "p", "uri": str(prompts)}], "target": {"model": "sim/model"},
           "api": {"baseUrl": base_url, "maxConcurrency": 8, "requestsPerMinute": LIMIT, "stream": True, **api},
           "tools": {"gate": {"enabled": False}},
           "budget": {"maxUSD": "5", "pricing": PRICING}, "generation": {"shards": 4},
           "output": {"uri": f"file://{tmp_path}/out"}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def assert_within_the_limit(stats: dict, sent: int) -> None:
    assert stats["rateLimit"]["maxInWindow"] <= LIMIT, stats["rateLimit"]
    assert stats["rateLimit"]["refused"] == 0, stats["rateLimit"]
    assert stats["requests"] == sent > 2 * LIMIT, stats  # several windows' worth, none sent twice


@pytest.mark.integration
def test_an_audit_never_sends_past_the_providers_requests_per_window(tmp_path, limited):
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(6, tools_every=1))
    dg = load_spec(spec_file(tmp_path, limited.base_url, prompts))
    t0 = time.monotonic()
    doc = run_audit(dg, 6, RunContext("rate"), limited.base_url)
    assert doc["sent"] == 12 and doc["outcome"] == "Done", json.dumps(doc)[:2000]
    assert_within_the_limit(limited.stats(), 12)
    assert time.monotonic() - t0 >= 2 * WINDOW_S  # 12 requests at 4 a window: the third window at the earliest


@pytest.mark.integration
def test_a_run_never_sends_past_the_providers_requests_per_window(tmp_path, limited):
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(10))
    doc = yaml.safe_load(spec_file(tmp_path, limited.base_url, prompts).read_text())
    doc["generation"]["ray"] = {"mode": "Local", "workers": 2}  # two workers, each its share of the limit
    path = tmp_path / "spec2.yaml"
    path.write_text(yaml.safe_dump(doc))
    dg = load_spec(path)
    store = open_output(dg.spec)
    result = run_generation(dg, store, RunContext("rate"), limited.base_url, inline=True)
    assert result.outcome == "Done", result.message
    recs = list(records.iter_records(store))
    assert len(recs) == 10 and all(r["status"] == "ok" for r in recs)
    assert_within_the_limit(limited.stats(), 10)
    assert result.snapshot.spent > 0
