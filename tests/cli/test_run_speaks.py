"""A run that says what it did (issue 24, items 2-4): bad data named by row before and while paying
nothing for it, an empty or missing source refused, rejected (never sent) apart from discarded (paid,
then excluded, with dollars), relative outputs next to the spec, a resume that says what it reused
and paid, money rounded for people, and a second Ctrl-C that stops at once and leaves progress.json
agreeing with the store. Real HTTP to the simulator, real subprocesses and signals."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parents[1]))
import pytest
from fault_helpers import API_KEY, persisted, progress, simple_rows, spec_doc, spent_sum, write_rows, write_spec
from proc_tree import children_of, kill_all

from eyrie.jobs.contract import layout
from eyrie.jobs.contract.money import dollars
from eyrie.jobs.generate.budget.pricing import Pricing, worst_case
from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess
from eyrie.jobs.spec import load_spec
from eyrie.jobs.store import open_store

pytestmark = pytest.mark.integration  # tier (tests/conftest.py): `eyrie` as a process against the simulator

ENV = {**os.environ, "EYRIE_API_KEY": API_KEY, "EYRIE_NO_RAY": "1"}
# an upper bound of one request's worst case here (a few hundred prompt bytes, 256 output tokens)
WORST = worst_case(Pricing(Decimal("0.60"), Decimal("2.50")), 1000, 256)
MONEY = re.compile(r"\$\d+\.\d+")


def eyrie(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", *args], capture_output=True, text=True, env=ENV,
                          cwd=cwd, timeout=300)


def run(spec: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return eyrie("run", str(spec), "--no-progress", *args, cwd=cwd)


def assert_money_for_people(text: str) -> None:
    amounts = MONEY.findall(text)
    assert amounts, "no amount printed"
    assert all(len(a.split(".")[1]) <= 6 for a in amounts), [a for a in amounts if len(a.split(".")[1]) > 6]


BAD = [b'{"broken": ', b"[1, 2]", b'{"messages": 5}']


def rows_with_bad_ones(path: Path) -> Path:
    """11 rows; rows 3, 7 and 10 (1-based, as an editor counts lines) are bad."""
    rows: list = simple_rows(8)
    for line, bad in zip((3, 7, 10), BAD, strict=True):
        rows.insert(line - 1, bad)
    return write_rows(path, rows)


# ------------------------------------------------------------------------------------- bad data


def test_validate_reads_every_row_and_names_the_bad_ones_without_sending_anything(tmp_path):
    prompts = rows_with_bad_ones(tmp_path / "p.jsonl")
    tools = write_rows(tmp_path / "t.jsonl", [
        {"messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "f", "parameters": {"type": "object"}}]},
        {"messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "f", "parameters": {"type": "string"}}]}])
    doc = spec_doc(prompts, f"file://{tmp_path}/out", "simulated")
    doc["spec"]["sources"].append({"name": "t", "uri": str(tools)})
    r = eyrie("validate", str(write_spec(tmp_path, doc)))
    assert r.returncode == 0, r.stderr
    assert f"sources[0] p: {prompts}: 11 rows, 3 bad" in r.stdout
    assert "row 3 (bad_row): invalid JSON" in r.stdout
    assert "row 7 (bad_row): row is a JSON array, not an object" in r.stdout
    assert "row 10 (bad_row): 'messages' must be a list" in r.stdout
    assert f"sources[1] t: {tools}: 2 rows, 1 bad" in r.stdout
    assert "row 2 (bad_declaration): tool 'f': parameters must be an object schema" in r.stdout
    assert "samples/bad_rows.jsonl" in r.stdout
    assert not (tmp_path / "out").exists()  # nothing written, nothing sent (no provider was started)


def test_validate_and_run_refuse_a_missing_or_empty_source_naming_it(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    for bad, words in ((tmp_path / "missing.jsonl", "does not exist"), (empty, "holds no rows")):
        doc = spec_doc(write_rows(tmp_path / "ok.jsonl", simple_rows(2)), f"file://{tmp_path}/out", "simulated")
        doc["spec"]["sources"].append({"name": "b", "uri": str(bad)})
        spec = write_spec(tmp_path, doc)
        r = eyrie("validate", str(spec))
        assert r.returncode == 2 and "sources[1].uri" in r.stderr and words in r.stderr, r.stderr
        assert "valid DatasetGeneration" not in r.stdout
        with SimulatorProcess(SimulatorConfig()) as sim:
            doc["spec"]["api"]["baseUrl"] = sim.base_url
            r = run(write_spec(tmp_path, doc))
            assert r.returncode == 2 and "sources[1].uri" in r.stderr and words in r.stderr, r.stderr
            assert sim.stats()["requests"] == 0
        assert "Traceback" not in r.stderr
        assert not (tmp_path / "out" / "progress.json").exists() and not (tmp_path / "out" / "manifest.json").exists()


def test_a_run_prints_its_bad_rows_lists_them_all_and_keeps_the_cause_in_the_summary(tmp_path):
    prompts = rows_with_bad_ones(tmp_path / "p.jsonl")
    out = tmp_path / "out"
    with SimulatorProcess(SimulatorConfig()) as sim:
        spec = write_spec(tmp_path, spec_doc(prompts, f"file://{out}", sim.base_url, extra={
            "target.tokenizer": "bundled:deepseek-v4", "target.chatFormat": "deepseek-v4"}))
        r = run(spec, "--until", "samples")
        assert sim.stats()["requests"] == 8  # the bad rows were never sent
    assert r.returncode == 0, r.stderr[-3000:]
    assert "samples done 8/11 (rejected 3 never sent" in r.stderr
    assert "3 rows never sent (bad data, not paid); the first:" in r.stderr
    assert "  p row 3: invalid JSON" in r.stderr and "  p row 7: row is a JSON array, not an object" in r.stderr
    assert f"all of them: file://{out}/samples/bad_rows.jsonl" in r.stderr
    listed = [json.loads(line) for line in (out / "samples" / "bad_rows.jsonl").read_text().splitlines()]
    assert [(b["source"], b["row"], b["error"]) for b in listed] == [("p", 3, "bad_row"), ("p", 7, "bad_row"),
                                                                      ("p", 10, "bad_row")]
    assert listed[2]["reason"] == "'messages' must be a list"
    prog = json.loads((out / "progress.json").read_text())
    assert prog["samples"] == {"total": 11, "done": 8, "rejected": 3, "discarded": 0, "failed": 0}
    assert prog["badRows"]["count"] == 3 and prog["badRows"]["file"] == layout.BAD_ROWS
    summary = json.loads((out / "samples" / "summary.json").read_text())["samples"]
    causes = [e["message"] for e in summary["excludedExamples"]]
    assert any(c.endswith("(p row 3): never sent (bad_row: invalid JSON: unexpected end of data: line 1 column 12 "
                          "(char 11))") for c in causes), causes
    assert not any("generation status is" in c for c in causes)


def test_discarded_answers_are_paid_counted_apart_from_rejected_rows_and_priced(tmp_path):
    prompts = write_rows(tmp_path / "p.jsonl", [*simple_rows(30, tools_every=1), b"not json"])
    out = f"file://{tmp_path}/out"
    with SimulatorProcess(SimulatorConfig(fault_rate=0.4, faults=["leak"], seed=3)) as sim:
        spec = write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, extra={"tools.onInvalidCall": "drop"}))
        r = run(spec)
        billed = Decimal(sim.stats()["billedUSD"])
    assert r.returncode == 0, r.stderr[-3000:]
    recs = persisted(open_store(out))
    dropped = [x for x in recs if x["status"] == "ok" and x["policy"] == "drop"]
    assert dropped, "the simulator leaked no tool-call markers"
    prog = progress(open_store(out))
    s = prog["samples"]
    assert (s["rejected"], s["discarded"]) == (1, len(dropped)) and s["done"] == 30 - len(dropped)
    assert Decimal(prog["discardedUSD"]) == spent_sum(dropped) > 0
    assert Decimal(prog["paidUSD"]) == billed == Decimal(prog["spentUSD"]) and prog["unrecordedUSD"] == "0"
    assert f"discarded {len(dropped)} paid $" in r.stderr and "rejected 1 never sent" in r.stderr
    manifest = json.loads(open_store(out).get(layout.MANIFEST))
    assert manifest["samples"] == s and manifest["discardedUSD"] == prog["discardedUSD"]


# --------------------------------------------------------------------------------------- paths


def test_a_relative_output_is_next_to_the_spec_wherever_eyrie_runs(tmp_path):
    home, elsewhere = tmp_path / "examples", tmp_path / "cwd"
    (home / "prompts").mkdir(parents=True)
    elsewhere.mkdir()
    write_rows(home / "prompts" / "p.jsonl", simple_rows(3))
    doc = spec_doc(Path("prompts/p.jsonl"), "eyrie-out/run", "simulated")
    spec = home / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    assert load_spec(spec).spec.output.uri == str(home / "eyrie-out" / "run")
    r = run(spec, "--until", "generate", cwd=elsewhere)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.startswith(f"eyrie: output file://{home}/eyrie-out/run\n")
    assert len(persisted(open_store(f"file://{home}/eyrie-out/run"))) == 3
    assert not (elsewhere / "eyrie-out").exists()
    # from the spec's own folder: the same output, nothing bought twice
    r = run(Path("spec.yaml"), "--until", "generate", cwd=home)
    assert r.returncode == 0
    said = " ".join(r.stderr.split())  # the summary wraps at 100 columns
    assert "resumed attempt 2: reused 3 answers" in said and "paid $0.00 for 0 requests" in said
    r = eyrie("validate", "spec.yaml", cwd=home)
    assert f"output {home}/eyrie-out/run" in r.stdout


# -------------------------------------------------------------------------------------- resumes


def test_a_resume_says_what_it_reused_and_what_it_paid_in_rounded_money(tmp_path):
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(40))
    out = f"file://{tmp_path}/out"
    with SimulatorProcess(SimulatorConfig()) as sim:
        r = run(write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, max_usd="0.004", concurrency=2)))
        assert r.returncode == 3, r.stderr[-3000:]  # budget exhausted part-way
        first = persisted(open_store(out))
        assert 0 < len(first) < 40
        r = run(write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, max_usd="1.00")))
        billed = Decimal(sim.stats()["billedUSD"])
    assert r.returncode == 0, r.stderr[-3000:]
    recs = persisted(open_store(out))
    mine = [x for x in recs if x["attempt"] != first[0]["attempt"]]
    assert len(mine) == 40 - len(first)
    said = " ".join(r.stderr.split())  # the summary wraps at 100 columns
    assert (f"resumed attempt 2: reused {len(first)} answers ({dollars(spent_sum(first))}) from earlier attempts; "
            f"this attempt paid {dollars(spent_sum(mine))} for {len(mine)} requests") in said
    assert_money_for_people(r.stderr)
    report = eyrie("report", out)
    assert report.returncode == 0 and "attempt 2: reused" in report.stdout + report.stderr
    assert_money_for_people(report.stdout + report.stderr)
    prog = progress(open_store(out))
    assert prog["resume"]["reusedUSD"] == str(spent_sum(first).normalize())  # full precision stays in JSON
    assert Decimal(prog["spentUSD"]) == billed == Decimal(prog["paidUSD"])


def _start(spec: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "eyrie.jobs.cli", "run", str(spec), "--no-progress"], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_second_sigint_stops_at_once_exit_6_no_traceback_and_progress_agrees_with_the_store(tmp_path):
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(60))
    out = f"file://{tmp_path}/out"
    store = open_store(out)
    # answers take 3 s: a graceful stop would wait for the requests in flight, a second Ctrl-C does not
    with SimulatorProcess(SimulatorConfig(latency_ms=3000)) as sim:
        spec = write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, concurrency=6))
        proc = _start(spec)
        try:
            deadline = time.time() + 120
            while len(persisted(store)) < 6:  # the first answers are in; the next six are in flight
                assert time.time() < deadline and proc.poll() is None, proc.communicate()[1][-3000:]
                time.sleep(0.1)
            while sim.stats()["inFlight"] == 0:
                assert time.time() < deadline
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGINT)
            time.sleep(2)  # the first one is acknowledged within a second
            os.kill(proc.pid, signal.SIGINT)
            _, stderr = proc.communicate(timeout=120)
            time.sleep(0.5)
            stats = sim.stats()
        finally:
            kill_all([proc.pid])
        assert proc.returncode == 6, stderr[-3000:]
        assert re.search(r"^eyrie: stopping: finishing \d+ requests in flight; Ctrl-C again to abandon them$",
                         stderr, re.M), stderr[-3000:]
        assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
        recs = persisted(store)
        prog = progress(store)
        assert prog["outcome"] == "Stopped" and "second signal" in prog["message"]
        by_status = Counter(x["status"] for x in recs)
        assert prog["samples"] == {"total": 60, "done": by_status["ok"], "rejected": 0, "discarded": 0,
                                   "failed": by_status["failed"]}
        assert len(recs) < stats["requests"]  # requests in flight were abandoned, not waited for
        assert Decimal(prog["paidUSD"]) == spent_sum(recs)
        # booked: never below the provider's bill, above it by at most the worst case of the six in flight
        billed = Decimal(stats["billedUSD"])
        assert billed <= Decimal(prog["spentUSD"]) <= billed + 6 * WORST
        abandoned = prog["abandoned"]
        assert 0 < abandoned["requests"] <= 6 and abandoned["thisAttempt"] == abandoned["requests"]
        said = " ".join(stderr.split())
        assert f"confirmed spend {dollars(Decimal(prog['paidUSD']))} (the stored answers)" in said
        assert (f"{abandoned['reconciled']} requests abandoned in flight cost" in said if abandoned["reconciled"]
                else f"more may be billed for {abandoned['unreconciled']} requests abandoned in flight" in said)

        r = run(spec)
        billed = Decimal(sim.stats()["billedUSD"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert len({x["sample_id"] for x in persisted(store)}) == 60 == len(persisted(store))
    final = progress(store)
    assert billed <= Decimal(final["spentUSD"]) <= billed + 6 * WORST
    assert billed >= Decimal(final["paidUSD"]) == spent_sum(persisted(store))


def test_two_ctrl_c_on_local_ray_reach_the_whole_process_group_and_still_stop_at_once(tmp_path):
    """What a terminal does: both SIGINTs go to every process of the foreground group, Ray's too."""
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(60))
    out = f"file://{tmp_path}/out"
    store = open_store(out)
    ray_tmp = tempfile.mkdtemp(prefix="ry", dir="/tmp")  # unix socket paths are limited to ~107 bytes
    env = {**ENV, "RAY_TMPDIR": ray_tmp}
    env.pop("EYRIE_NO_RAY")
    seen: set[int] = set()
    with SimulatorProcess(SimulatorConfig(latency_ms=3000)) as sim:
        spec = write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, concurrency=6, workers=2))
        proc = subprocess.Popen([sys.executable, "-m", "eyrie.jobs.cli", "run", str(spec), "--no-progress"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            deadline = time.time() + 300
            while len(persisted(store)) < 6 or sim.stats()["inFlight"] == 0:
                seen.update(children_of(proc.pid))
                assert time.time() < deadline and proc.poll() is None, proc.communicate()[1][-3000:]
                time.sleep(0.1)
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.5)
            os.killpg(proc.pid, signal.SIGINT)
            _, stderr = proc.communicate(timeout=180)
        finally:
            kill_all([proc.pid, *seen])
            shutil.rmtree(ray_tmp, ignore_errors=True)
        stats = sim.stats()
    assert proc.returncode == 6, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    recs = persisted(store)
    prog = progress(store)
    assert prog["outcome"] == "Stopped" and "second signal" in prog["message"]
    assert prog["samples"]["done"] + prog["samples"]["failed"] == len(recs) < stats["requests"]
    assert Decimal(prog["paidUSD"]) == spent_sum(recs) <= Decimal(prog["spentUSD"])
    assert Decimal(stats["billedUSD"]) <= Decimal(prog["spentUSD"]) <= Decimal(stats["billedUSD"]) + 6 * WORST
