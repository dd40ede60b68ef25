"""Provider faults at rates up to 30%: every prompt still gets exactly one record, spend stays within
the budget and equals what the (simulated) provider billed, and the run ends with a clear outcome.

Runs inline (no Ray): the point here is the client, the ledger and persistence, not scheduling.
"""

from __future__ import annotations

import sys
from decimal import Decimal
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from fault_helpers import (
    assert_exactly_once,
    persisted,
    progress,
    run_inline,
    simple_rows,
    spec_doc,
    spent_sum,
    write_rows,
    write_spec,
)

from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess

# tier (tests/conftest.py): the simulator as a process, injecting faults into `eyrie run`
pytestmark = pytest.mark.integration

N = 24
STATUS_FAULTS = ["429", "429-no-retry-after", "402-in-flight", "500", "502", "503"]
BODY_FAULTS = ["stream-cut", "200-error", "malformed-json", "empty-choices"]  # differ between SSE and JSON
RETRYABLE = STATUS_FAULTS + BODY_FAULTS
# Fault draws come from one seeded sequence. A seed whose first ~150 draws hold no run of more than
# two faults keeps a lone last request from backing off for tens of seconds (correct, but slow).
CALM_SEED = 1
CALM_SEED_ALL_FAULTS = 12


def _run(tmp_path, monkeypatch, sim, n=N, **kw):
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(n, tools_every=3))
    out = f"file://{tmp_path}/out"
    result, store = run_inline(write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, **kw)), monkeypatch)
    return result, store, sim.stats()


@pytest.mark.parametrize(("fault", "stream"), [(f, True) for f in STATUS_FAULTS]
                         + [(f, s) for f in BODY_FAULTS for s in (True, False)])
def test_each_retryable_fault_at_30_percent_is_retried_and_paid_once(tmp_path, monkeypatch, fault, stream):
    cfg = SimulatorConfig(fault_rate=0.3, faults=[fault], retry_after_s=0, seed=CALM_SEED)
    with SimulatorProcess(cfg) as sim:
        result, store, stats = _run(tmp_path, monkeypatch, sim, stream=stream)
    recs = persisted(store)
    by_row = assert_exactly_once(recs, range(N))
    assert result.outcome == "Done", result.message
    assert all(r["status"] == "ok" and r["error"] is None for r in recs)
    # each fault cost exactly one retry; the provider saw every attempt
    injected = stats["faults"].get(fault, 0)
    assert injected > 0
    assert sum(r["attempts"] for r in recs) == N + injected == stats["requests"]
    # paid once per sample: what eyrie spent is what the provider billed, within the budget
    spent = Decimal(progress(store)["spentUSD"])
    assert spent == Decimal(stats["billedUSD"]) == spent_sum(recs) <= Decimal("5.00")
    assert stats["completed"] == N
    assert progress(store)["samples"] == {"total": N, "done": N, "rejected": 0, "discarded": 0, "failed": 0}
    assert progress(store)["retries"] == injected
    assert by_row[0]["request"]["tools"][0]["function"]["name"] == "get_weather"


def test_retry_after_is_honoured_on_429(tmp_path, monkeypatch):
    """Retry-After: 2 on every 429: a sample that met k of them took at least 2k seconds. Backoff alone
    would retry within 0.5 s, then 1 s (full jitter), so the run would end far sooner."""
    import time

    cfg = SimulatorConfig(fault_rate=0.3, faults=["429"], retry_after_s=2, seed=CALM_SEED)
    with SimulatorProcess(cfg) as sim:
        t0 = time.monotonic()
        result, store, stats = _run(tmp_path, monkeypatch, sim, n=12, concurrency=12)
        elapsed = time.monotonic() - t0
    recs = persisted(store)
    assert_exactly_once(recs, range(12))
    assert result.outcome == "Done"
    most = max(r["attempts"] for r in recs)
    assert stats["faults"]["429"] > 0 and most >= 2
    assert elapsed >= 2.0 * (most - 1)
    assert Decimal(progress(store)["spentUSD"]) == Decimal(stats["billedUSD"])


def test_all_faults_mixed_including_timeouts_and_empty_length(tmp_path, monkeypatch):
    """Every fault at once at 30%: hangs end at the request timeout and are retried; `length` with
    empty content is a paid, completed answer recorded as such (not retried, not lost)."""
    faults = [*RETRYABLE, "timeout", "length-empty"]
    cfg = SimulatorConfig(fault_rate=0.3, faults=faults, retry_after_s=0, seed=CALM_SEED_ALL_FAULTS)
    with SimulatorProcess(cfg) as sim:
        result, store, stats = _run(tmp_path, monkeypatch, sim, n=40, concurrency=16, timeout_s=1.0)
    recs = persisted(store)
    by_row = assert_exactly_once(recs, range(40))
    assert result.outcome == "Done", result.message
    assert all(r["status"] == "ok" for r in recs)
    empty = [r for r in recs if r["response"]["finish_reason"] == "length" and not r["response"]["content"]
             and not r["response"]["tool_calls"]]
    length_empty = stats["faults"].get("length-empty", 0)
    assert len(empty) == length_empty  # each one recorded as an answer, none retried
    for r in empty:
        assert Decimal(r["costUSD"]) > 0 and r["usage"]["completion_tokens"] == 256
    retried = sum(n for f, n in stats["faults"].items() if f != "length-empty")
    assert stats["faults"].get("timeout", 0) > 0
    assert sum(r["attempts"] for r in recs) == 40 + retried == stats["requests"]
    spent = Decimal(progress(store)["spentUSD"])
    assert spent == Decimal(stats["billedUSD"]) == spent_sum(recs) <= Decimal("5.00")
    assert len(by_row) == 40


def test_provider_slower_than_the_timeout_gives_failed_records_with_a_reason(tmp_path, monkeypatch):
    """Every answer takes 3 s, the timeout is 0.4 s: each sample is recorded failed with the reason,
    after maxRetries+1 attempts; nothing is billed, nothing spent, the run finishes."""
    with SimulatorProcess(SimulatorConfig(latency_ms=3000)) as sim:
        result, store, stats = _run(tmp_path, monkeypatch, sim, n=6, concurrency=6, max_retries=1,
                                    timeout_s=0.4)
    recs = persisted(store)
    assert_exactly_once(recs, range(6))
    assert result.outcome == "Done"
    for r in recs:
        assert r["status"] == "failed" and r["attempts"] == 2 and r["costUSD"] == "0"
        assert r["error"]["type"] == "timeout"
        assert "0.4s" in r["error"]["message"]
    assert stats["requests"] == 12 and stats["completed"] == 0 and Decimal(stats["billedUSD"]) == 0
    prog = progress(store)
    assert prog["samples"] == {"total": 6, "done": 0, "rejected": 0, "discarded": 0, "failed": 6}
    assert Decimal(prog["spentUSD"]) == 0 and Decimal(prog["reservedUSD"]) == 0


def test_faults_under_a_tight_budget_never_overspend_and_resume_exactly_once(tmp_path, monkeypatch):
    """30% faults while the budget runs out: spend <= cap (retries are not paid twice), the run stops
    with BudgetExhausted, and a resume with a higher cap completes every prompt exactly once."""
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(50))
    out = f"file://{tmp_path}/out"
    cfg = SimulatorConfig(fault_rate=0.3, faults=["500", "stream-cut", "200-error", "429"], retry_after_s=0,
                          seed=CALM_SEED)
    with SimulatorProcess(cfg) as sim:
        r1, store = run_inline(write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, max_usd="0.008")),
                               monkeypatch)
        first = progress(store)
        billed1 = Decimal(sim.stats()["billedUSD"])
        assert r1.outcome == "BudgetExhausted" and "budget exhausted" in r1.message
        spent1 = Decimal(first["spentUSD"])
        assert spent1 == billed1 <= Decimal("0.008")
        n1 = len(persisted(store))
        assert 0 < n1 < 50
        r2, store = run_inline(write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, max_usd="1.00")),
                               monkeypatch)
        stats = sim.stats()
    recs = persisted(store)
    assert_exactly_once(recs, range(50))
    assert r2.outcome == "Done"
    assert stats["completed"] == 50  # nothing paid twice across the two attempts
    assert Decimal(progress(store)["spentUSD"]) == Decimal(stats["billedUSD"]) == spent_sum(recs)


def test_402_among_other_faults_stops_the_run_and_the_resume_completes_it_once(tmp_path, monkeypatch):
    """Out of credits in the middle of 5xx noise: the run stops (InsufficientCredits), nothing half-done
    is recorded, and after 'adding credits' (a provider that no longer says 402) the resume finishes
    every prompt exactly once, paying only for what was not yet answered."""
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(N))
    out = f"file://{tmp_path}/out"
    cfg = SimulatorConfig(fault_rate=0.3, faults=["500", "402"], retry_after_s=0, seed=CALM_SEED)
    with SimulatorProcess(cfg) as sim:
        r1, store = run_inline(write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, concurrency=4)),
                               monkeypatch)
        first = sim.stats()
    assert r1.outcome == "InsufficientCredits" and "402" in r1.message
    assert first["faults"]["402"] >= 1
    recs1 = persisted(store)
    assert len({r["sample_id"] for r in recs1}) == len(recs1) < N
    assert all(r["status"] == "ok" for r in recs1)  # the 402'd samples are not recorded as failed
    assert first["completed"] == len(recs1)
    assert Decimal(progress(store)["spentUSD"]) == Decimal(first["billedUSD"])
    with SimulatorProcess(SimulatorConfig()) as sim:
        r2, store = run_inline(write_spec(tmp_path, spec_doc(prompts, out, sim.base_url)), monkeypatch)
        second = sim.stats()
    assert r2.outcome == "Done"
    recs = persisted(store)
    assert_exactly_once(recs, range(N))
    assert second["completed"] == N - len(recs1)
    total = Decimal(first["billedUSD"]) + Decimal(second["billedUSD"])
    assert Decimal(progress(store)["spentUSD"]) == total == spent_sum(recs)


def test_moderated_prompts_at_30_percent_fail_alone_and_the_run_finishes(tmp_path, monkeypatch):
    """`403-moderation` (OpenRouter's moderation 403: reasons, flagged_input) on 30% of requests: each
    flagged prompt is recorded failed with reason `moderation` after one request (never retried, never
    billed), every other prompt is answered, the run is Done and counts them by reason."""
    cfg = SimulatorConfig(fault_rate=0.3, faults=["403-moderation"], seed=CALM_SEED)
    with SimulatorProcess(cfg) as sim:
        result, store, stats = _run(tmp_path, monkeypatch, sim)
    recs = persisted(store)
    assert_exactly_once(recs, range(N))
    assert result.outcome == "Done", result.message
    flagged = stats["faults"]["403-moderation"]
    failed = [r for r in recs if r["status"] == "failed"]
    assert 0 < len(failed) == flagged and stats["requests"] == N  # one request per prompt
    for r in failed:
        assert (r["error"]["type"], r["attempts"], r["costUSD"]) == ("moderation", 1, "0")
        assert r["error"]["details"]["reasons"] == ["harassment"]
        assert r["error"]["details"]["flagged_input"].startswith("Fault suite question")
    prog = progress(store)
    assert prog["samples"] == {"total": N, "done": N - flagged, "rejected": 0, "discarded": 0,
                              "failed": flagged}
    assert prog["failures"] == {"moderation": flagged}
    assert Decimal(prog["spentUSD"]) == Decimal(stats["billedUSD"]) == spent_sum(recs)


@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
def test_byok_answers_mixed_with_credit_answers_are_counted_in_full(tmp_path, monkeypatch, stream):
    """`byok` on half the answers (usage: OpenRouter's 5% fee as `cost`, the provider's charge as
    `cost_details.upstream_inference_cost`) among answers paid from credits: eyrie's spend equals
    what the user paid in all (fee + upstream, plus the credit answers), record by record."""
    cfg = SimulatorConfig(fault_rate=0.5, faults=["byok"], seed=CALM_SEED)
    with SimulatorProcess(cfg) as sim:
        result, store, stats = _run(tmp_path, monkeypatch, sim, stream=stream)
    recs = persisted(store)
    assert_exactly_once(recs, range(N))
    assert result.outcome == "Done", result.message
    byok = [r for r in recs if r["usage"]["is_byok"]]
    assert len(byok) == stats["faults"]["byok"] > 0
    for r in byok:
        u = r["usage"]
        upstream = Decimal(str(u["cost_details"]["upstream_inference_cost"]))
        assert Decimal(r["costUSD"]) == Decimal(str(u["cost"])) + upstream
    assert Decimal(progress(store)["spentUSD"]) == Decimal(stats["billedUSD"]) == spent_sum(recs)


def test_transient_failures_are_resent_on_resume_and_permanent_ones_are_not(tmp_path, monkeypatch):
    """maxRetries 0 against 429, 503, the in-flight 402 and moderation 403s on half the requests: a
    sample whose retries ran out on a transient error is recorded failed (`error.transient`) and
    counted in `failures` by reason with `resendOnResume`; the resume (against a provider that now
    answers) sends exactly those again, and never a moderated one. Nothing is paid twice: a failed
    attempt is billed nothing (OpenRouter's zero completion insurance: an error is not charged)."""
    n = 40
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(n))
    out = f"file://{tmp_path}/out"
    faults = ["429", "503", "402-in-flight", "403-moderation"]
    with SimulatorProcess(SimulatorConfig(fault_rate=0.5, faults=faults, retry_after_s=0, seed=CALM_SEED)) as sim:
        r1, store = run_inline(write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, max_retries=0)),
                               monkeypatch)
        first = sim.stats()
    assert r1.outcome == "Done", r1.message
    by_row = assert_exactly_once(persisted(store), range(n))
    failed = {row: r for row, r in by_row.items() if r["status"] == "failed"}
    kinds = {"429": "http-429", "503": "http-503", "402-in-flight": "402-in-flight", "403-moderation": "moderation"}
    assert sorted(r["error"]["type"] for r in failed.values()) == sorted(
        kinds[f] for f, k in first["faults"].items() for _ in range(k))
    transient = {row for row, r in failed.items() if r["error"]["type"] != "moderation"}
    moderated = set(failed) - transient
    assert transient and moderated, first["faults"]
    assert all(failed[row]["error"].get("transient") is True for row in transient)
    assert not any("transient" in failed[row]["error"] for row in moderated)
    p1 = progress(store)
    assert p1["failures"] == {kinds[f]: k for f, k in first["faults"].items()}
    assert p1["samples"]["failed"] == len(failed) and p1["resendOnResume"] == len(transient)

    with SimulatorProcess(SimulatorConfig()) as sim:
        r2, store = run_inline(write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, max_retries=0)),
                               monkeypatch)
        second = sim.stats()
    assert r2.outcome == "Done", r2.message
    by_row = assert_exactly_once(persisted(store), range(n))
    # exactly the transient ones were sent again, once each; never a moderated prompt
    assert second["requests"] == len(transient)
    assert {row for row, r in by_row.items() if r["attempt"] != failed[min(moderated)]["attempt"]} == transient
    assert {row for row, r in by_row.items() if r["status"] == "failed"} == moderated
    assert all(by_row[row]["status"] == "ok" for row in transient)
    p2 = progress(store)
    assert p2["failures"] == {"moderation": len(moderated)} and p2["resendOnResume"] == 0
    assert (p2["samples"]["done"], p2["samples"]["failed"]) == (n - len(moderated), len(moderated))
    assert first["completed"] + second["completed"] == n - len(moderated)  # each answer bought once
    total = Decimal(first["billedUSD"]) + Decimal(second["billedUSD"])
    assert Decimal(p2["spentUSD"]) == total == spent_sum(persisted(store))
