"""The money booked after an abrupt stop (issue 32 item 1): `eyrie run` against a slow fake provider
that bills every request it received, abandoned or not, and cannot say what a generation cost
(tests/slow_provider.py), stopped by Ctrl-C twice and by kill -9, then resumed. What eyrie books as
spent is never below the provider's bill and above it by at most the worst case of the requests
that were in flight (maxConcurrency of them), never by the budget leased to its workers; the summary
says what is confirmed and what may still be billed. Real processes, real signals, real HTTP."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from fault_helpers import API_KEY, persisted, progress, simple_rows, spec_doc, spent_sum, write_rows, write_spec
from proc_tree import kill_all
from slow_provider import slow_provider

from eyrie.jobs.contract.money import dollars
from eyrie.jobs.generate.budget.checkpoint import read_checkpoint
from eyrie.jobs.generate.budget.pricing import Pricing, worst_case
from eyrie.jobs.store import open_store

pytestmark = pytest.mark.integration  # tier (tests/conftest.py): `eyrie` as a process against a fake provider
ENV = {**os.environ, "EYRIE_API_KEY": API_KEY, "EYRIE_NO_RAY": "1"}
CONCURRENCY = 6
# an upper bound of one request's worst case here (a few hundred prompt bytes, 256 output tokens)
WORST = worst_case(Pricing(Decimal("0.60"), Decimal("2.50")), 1000, 256)
IN_FLIGHT_WORST = CONCURRENCY * WORST
MAX_USD = Decimal("5.00")


def _start(spec: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "eyrie.jobs.cli", "run", str(spec), "--no-progress"], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stopped_mid_run(spec: Path, store, provider, stop: Callable[[subprocess.Popen], None]) -> tuple[int, str]:
    """`eyrie run`, stopped by `stop` once answers are stored and requests are in flight: (exit, stderr)."""
    proc = _start(spec)
    try:
        deadline = time.time() + 120
        while len(persisted(store)) < CONCURRENCY or provider.open == 0:
            assert time.time() < deadline and proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        stop(proc)
        _, stderr = proc.communicate(timeout=120)
    finally:
        kill_all([proc.pid])
    return proc.returncode, stderr


def _ctrl_c_twice(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)


def _resume(spec: Path) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "run", str(spec), "--no-progress"], env=ENV,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _bounded(booked: Decimal, bill: Decimal) -> None:
    assert bill <= booked <= bill + IN_FLIGHT_WORST, (booked, bill, IN_FLIGHT_WORST)
    assert booked <= MAX_USD


def test_ctrl_c_twice_books_the_bill_plus_at_most_the_worst_case_in_flight(tmp_path):
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(60))
    out = f"file://{tmp_path}/out"
    store = open_store(out)
    with slow_provider(latency_s=2.5) as (provider, url):
        spec = write_spec(tmp_path, spec_doc(prompts, out, url, concurrency=CONCURRENCY, max_usd=str(MAX_USD)))
        rc, stderr = _stopped_mid_run(spec, store, provider, _ctrl_c_twice)
        assert rc == 6, stderr[-3000:]
        assert re.search(r"^eyrie: stopping: finishing [1-6] requests in flight; Ctrl-C again to abandon them$",
                         stderr, re.M), stderr[-3000:]
        bill = provider.settled()  # the abandoned requests are billed too, in full
        prog = progress(store)
        booked, paid = Decimal(prog["spentUSD"]), Decimal(prog["paidUSD"])
        assert paid == spent_sum(persisted(store)) < bill  # some were paid and never stored
        _bounded(booked, bill)
        a = prog["abandoned"]
        assert 0 < a["unreconciled"] == a["requests"] <= CONCURRENCY and a["reconciled"] == 0
        assert booked == paid + Decimal(a["upToUSD"])
        said = " ".join(stderr.split())
        assert (f"confirmed spend {dollars(paid)} (the stored answers); up to {dollars(Decimal(a['upToUSD']))} more "
                f"may be billed for {a['unreconciled']} requests abandoned in flight") in said
        _resume(spec)  # starts from that, and ends within the same bound of the whole bill
        bill = provider.settled()
    assert len(persisted(store)) == 60
    _bounded(Decimal(progress(store)["spentUSD"]), bill)


def test_kill_minus_9_books_the_bill_plus_at_most_the_worst_case_in_flight(tmp_path):
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(60))
    out = f"file://{tmp_path}/out"
    store = open_store(out)
    with slow_provider(latency_s=1.5) as (provider, url):
        spec = write_spec(tmp_path, spec_doc(prompts, out, url, concurrency=CONCURRENCY, max_usd=str(MAX_USD)))
        rc, _ = _stopped_mid_run(spec, store, provider, lambda proc: proc.send_signal(signal.SIGKILL))
        assert rc == -signal.SIGKILL
        bill = provider.settled()
        assert spent_sum(persisted(store)) < bill  # paid for answers it never stored
        _bounded(read_checkpoint(store).spent, bill)  # what the resume will start from
        r = _resume(spec)
        bill = provider.settled()
    assert len(persisted(store)) == 60
    prog = progress(store)
    _bounded(Decimal(prog["spentUSD"]), bill)
    a = prog["abandoned"]
    assert a["requests"] <= CONCURRENCY and a["thisAttempt"] == a["requests"]  # booked by the resume
    said = " ".join(r.stderr.split())
    assert f"more may be billed for {a['unreconciled']} requests abandoned in flight" in said


def test_ctrl_c_twice_the_provider_says_what_the_abandoned_requests_cost_and_that_is_booked(tmp_path):
    """A provider that names each generation before answering and prices it once billed (OpenRouter's
    `GET /generation?id=`): the requests a second Ctrl-C abandoned are asked about when the attempt
    ends (and again by the next one while the provider has not billed them yet), booked at what they
    really cost, and the summary says so. Booked spend ends equal to the provider's bill."""
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(60))
    out = f"file://{tmp_path}/out"
    store = open_store(out)
    with slow_provider(latency_s=2.5, generations=True) as (provider, url):
        spec = write_spec(tmp_path, spec_doc(prompts, out, url, concurrency=CONCURRENCY, max_usd=str(MAX_USD)))
        rc, stderr = _stopped_mid_run(spec, store, provider, _ctrl_c_twice)
        assert rc == 6, stderr[-3000:]
        bill = provider.settled()
        stopped = progress(store)
        assert spent_sum(persisted(store)) < bill  # paid for answers it never stored
        _bounded(Decimal(stopped["spentUSD"]), bill)
        assert stopped["abandoned"]["requests"] > 0
        r = _resume(spec)  # asks about any the provider had not billed when the stop was accounted
        bill = provider.settled()
    assert len(persisted(store)) == 60 and provider.lookups >= stopped["abandoned"]["requests"]
    prog = progress(store)
    a = prog["abandoned"]
    assert a["requests"] == stopped["abandoned"]["requests"] and a["unreconciled"] == 0
    assert a["reconciled"] == a["requests"] and Decimal(a["upToUSD"]) == 0
    assert Decimal(prog["spentUSD"]) == bill  # the records' costs plus what the provider said: the bill, exactly
    assert Decimal(a["reconciledUSD"]) == a["requests"] * provider.cost
    said = " ".join((stderr + r.stderr).split())
    assert (f"{a['reconciled']} requests abandoned in flight cost {dollars(Decimal(a['reconciledUSD']))} (what the "
            "provider billed for them") in said
    assert "the provider's key usage rose $" in said  # GET /key: shown beside the booking, never booked from


def test_after_ctrl_c_twice_progress_report_and_why_say_what_is_true_now(tmp_path):
    """The process has exited: progress.json holds no request in flight and nothing reserved; `eyrie
    report` shows the confirmed/abandoned spend line the run printed; once the provider has said what
    the abandoned requests cost, the "why" no longer says their worst case is booked until it does."""
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(60))
    out = f"file://{tmp_path}/out"
    store = open_store(out)
    with slow_provider(latency_s=2.5, generations=True) as (provider, url):
        spec = write_spec(tmp_path, spec_doc(prompts, out, url, concurrency=CONCURRENCY, max_usd=str(MAX_USD)))
        rc, stderr = _stopped_mid_run(spec, store, provider, _ctrl_c_twice)
    assert rc == 6, stderr[-3000:]
    prog = progress(store)
    assert prog.get("inFlight", 0) == 0 and Decimal(str(prog.get("reservedUSD") or 0)) == 0, prog
    said = " ".join(stderr.split())
    line = re.search(r"confirmed spend \$[0-9.]+ \(the stored answers\)[^\n]*", stderr)
    assert line, stderr[-3000:]
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "report", out], env=ENV, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    shown = " ".join((r.stdout + r.stderr).replace("│", " ").split())  # a table cell's lines, joined
    assert " ".join(line.group(0).split())[:120] in shown, shown
    a = prog["abandoned"]
    why = re.search(r"^why: (.*)$", stderr, re.M)
    if a["unreconciled"] == 0:  # the provider said what every abandoned request cost
        assert a["reconciled"] > 0
        assert "until the provider says" not in prog["message"] and "until the provider says" not in said
        assert why and "provider" in why.group(1), stderr[-2000:]
    else:
        assert "until the provider says" in prog["message"]
