"""`eyrie audit` end to end: against an independent fake provider whose text answers use each call
format (tests/fake_openrouter.py), and against the simulator for the budget and the CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parents[1]))
from fake_openrouter import CASES_IN_ORDER, CATEGORY, TOOLS, scripted

from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import audit as stored
from eyrie.jobs.contract import layout, records
from eyrie.jobs.generate.audit.run import pick_prompts, run_audit
from eyrie.jobs.generate.audit.stats import fmt_rate
from eyrie.jobs.generate.budget.checkpoint import read_checkpoint
from eyrie.jobs.generate.sending.requests import build_body
from eyrie.jobs.intervals import wilson
from eyrie.jobs.pipeline import provider
from eyrie.jobs.simulator import SimulatorConfig, make_answer
from eyrie.jobs.spec import load_spec
from eyrie.jobs.store import open_store
from eyrie.jobs.tools import declarations

ROOT = Path(__file__).resolve().parents[2]
PRICING = {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}


def glaive_system() -> str:
    body = "\n".join(json.dumps(t["function"], indent=2) for t in TOOLS)
    return f"SYSTEM: You are a helpful assistant with access to the following functions. Use them if required -\n{body}"


def case_rows(tmp_path: Path, cases: list[str]) -> tuple[Path, Path]:
    """One openai row (tools given structurally) and one glaive row (functions as text) per case."""
    openai_rows = [{"messages": [{"role": "user", "content": f"case={c} What is the weather in Paris?"}],
                    "tools": TOOLS} for c in cases]
    glaive_rows = [{"system": glaive_system(),
                    "chat": f"USER: case={c} Weather in Paris, please?\n\n\nASSISTANT: <functioncall> "
                            "{\"name\": \"get_weather\", \"arguments\": '{\"city\": \"Paris\"}'} <|endoftext|>\n"}
                   for c in cases]
    a, b = tmp_path / "openai.jsonl", tmp_path / "glaive.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in openai_rows))
    b.write_text("".join(json.dumps(r) + "\n" for r in glaive_rows))
    return a, b


def fake_spec(tmp_path: Path, base_url: str, cases: list[str], **over) -> Path:
    a, b = case_rows(tmp_path, cases)
    spec = {"sources": [{"name": "tools", "uri": str(a)}, {"name": "glaive", "uri": str(b), "format": "glaive"}],
            "target": {"model": "fake/model"},
            "api": {"baseUrl": base_url, "maxConcurrency": 4, "stream": False, "maxRetries": 0,
                    "sampling": {"maxTokens": 256, "temperature": 0.6}},
            "budget": {"maxUSD": "1.00", "pricing": PRICING}, "output": {"uri": f"file://{tmp_path}/out"}}
    for k, v in over.items():
        spec[k] = {**spec.get(k, {}), **v} if isinstance(v, dict) else v
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


@pytest.mark.integration
def test_each_text_format_is_counted_exactly(tmp_path):
    """Every case once per source: the format of each text answer, its validity and whether it made
    the structured answer's calls are known by construction."""
    with scripted().running() as fake:
        dg = load_spec(fake_spec(tmp_path, fake.base_url, CASES_IN_ORDER))
        doc = run_audit(dg, 100, RunContext("t"), fake.base_url)
    n = 2 * len(CASES_IN_ORDER)
    assert doc["samples"] == n and doc["sent"] == 2 * n and len(fake.log) == 2 * n
    t, s = doc["figures"]["modes"]["text"], doc["figures"]["modes"]["structured"]
    want = Counter(CATEGORY[c] for c in CASES_IN_ORDER for _ in range(2))
    assert {c: f["count"] for c, f in t["formats"].items()} == dict(want)
    assert t["callsByFormat"] == {"deepseek": 2, "glaive": 4, "hermes": 12, "json": 4, "kimi": 2}
    # invalid: the kelvin call (schema) and book_hotel (not declared), once per source
    assert (t["calls"], t["invalidRate"]) == (24, wilson(4, 24).to_dict())
    assert t["hallucinatedRate"] == wilson(2, 24).to_dict()
    called = sum(CATEGORY[c] not in ("prose only", "no call") for c in CASES_IN_ORDER)
    assert t["callRate"] == wilson(2 * called, n).to_dict()
    assert s["callRate"] == wilson(n - 2, n).to_dict() and s["validRate"] == wilson(s["calls"], s["calls"]).to_dict()
    p = doc["figures"]["paired"]
    agree = [c for c in CASES_IN_ORDER if c not in ("invalid", "hallucinated", "other_args", "prose", "none")]
    assert p["bothCalled"] == 2 * called and p["argumentAgreement"] == wilson(2 * len(agree), 2 * called).to_dict()
    # the glaive rows carry the dataset's own answer, a get_weather call: every declared function the
    # text answers called is that one (book_hotel is not declared: hallucinated, not wrong)
    g = doc["figures"]["bySource"]["glaive"]["text"]
    assert g["neededCallRate"] == wilson(called, len(CASES_IN_ORDER)).to_dict()
    assert g["wrongFunctionRate"] == wilson(0, 12).to_dict()
    assert doc["figures"]["bySource"]["tools"]["text"]["neededCallRate"]["n"] == 0  # no answer in those rows
    assert doc["figures"]["byTool"]["get_weather"]["text"]["declaredIn"] == n
    by = doc["population"]["bySource"]  # the shape each source declared its functions in, in words too
    assert by["tools"]["declarationShapes"] == {"tools-field": len(CASES_IN_ORDER)}
    assert by["glaive"]["declarationShapes"] == {"glaive": len(CASES_IN_ORDER)}
    assert (f"glaive: glaive's 'Use them if required -' {len(CASES_IN_ORDER)}; tools: the `tools` field "
            f"{len(CASES_IN_ORDER)}.") in doc["verdict"]
    rows = stored.read_rows(open_store(f"file://{tmp_path}/out"))  # one line per answer bought
    assert len(rows) == 2 * n and {(r["sampleId"], r["mode"]) for r in rows} == {
        (sid, m) for sid in doc["sampleIds"] for m in ("text", "structured")}
    assert all(r["row"] >= 1 and r["source"] in ("tools", "glaive") and r["model"] == "fake/model" for r in rows)
    assert Counter(c["format"] for r in rows if r["mode"] == "text" for c in r["calls"]) == t["callsByFormat"]
    assert sum(not r["valid"] for r in rows) == 4 and all(r["why"] for r in rows if not r["valid"])
    assert Decimal(doc["spentUSD"]) == fake.billed
    for e in (t["callRate"], s["callRate"]):
        assert fmt_rate(e) in doc["verdict"]
    assert doc["examples"] and all(e["text"] and e["structured"] for e in doc["examples"])


@pytest.mark.integration
def test_a_repeated_audit_pays_nothing_and_samples_extend(tmp_path):
    with scripted().running() as fake:
        path = fake_spec(tmp_path, fake.base_url, CASES_IN_ORDER)
        dg = load_spec(path)
        first = run_audit(dg, 5, RunContext("t"), fake.base_url)
        assert len(fake.log) == 10 and first["sent"] == 10
        again = run_audit(dg, 5, RunContext("t"), fake.base_url)
        assert len(fake.log) == 10 and again["sent"] == 0 and again["reused"] == 10  # nothing paid twice
        assert again["figures"] == first["figures"]
        more = run_audit(dg, 8, RunContext("t"), fake.base_url)
        assert len(fake.log) == 16 and more["sent"] == 6
        assert set(first["sampleIds"]) < set(more["sampleIds"])  # the sample of 8 holds the sample of 5
        other = run_audit(dg, 8, RunContext("t"), fake.base_url, seed=1)
        assert other["sampleIds"] != more["sampleIds"] and len(fake.log) == 16 + other["sent"]
        assert other["sent"] == 2 * len(set(other["sampleIds"]) - set(more["sampleIds"]))
        billed_before_change = len(fake.log)
        doc = yaml.safe_load(path.read_text())
        doc["api"]["sampling"]["temperature"] = 1.0  # a changed setting: old answers do not count
        path.write_text(yaml.safe_dump(doc))
        changed = run_audit(load_spec(path), 5, RunContext("t"), fake.base_url)
        assert changed["sent"] == 10 and len(fake.log) == billed_before_change + 10
        assert changed["fingerprint"]["id"] != first["fingerprint"]["id"]
        assert changed["changedSince"] == ["api.sampling.temperature: 0.6 -> 1.0"]  # named, old -> new
    store = open_store(f"file://{tmp_path}/out")
    history = stored.read_audit(store)["history"]
    assert [h["sent"] for h in history] == [10, 6, other["sent"], 10]  # the repeat added nothing
    kept = list(stored.iter_audit_records(store))
    assert len(kept) == len(fake.log)  # every answer bought is kept, each once
    assert stored.audit_spend(store) == fake.billed


@pytest.mark.integration
def test_audit_spend_is_in_the_report_and_the_budget_at_once(tmp_path):
    from eyrie.jobs.report import collect
    from eyrie.jobs.report.terminal import run_table

    with scripted().running() as fake:
        dg = load_spec(fake_spec(tmp_path, fake.base_url, CASES_IN_ORDER))
        run_audit(dg, 6, RunContext("t"), fake.base_url)
    store = open_store(f"file://{tmp_path}/out")
    data = collect(store)  # no run yet: only the audit
    assert data.spent == fake.billed == data.audit_spent
    assert data.answers.cost_by_provider["FakeCo"].usd == fake.billed
    assert read_checkpoint(store).spent == fake.billed  # the next run's budget starts there
    from rich.console import Console

    c = Console(record=True, width=200)
    c.print(run_table(data))
    assert f"FakeCo ${fake.billed}" in c.export_text()
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "report", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr  # an output that only holds an audit is reported, not refused
    assert "audit verdict" in r.stdout and re.search(rf"spent +│ \${fake.billed} ", r.stdout), r.stdout


def simulator_spec(tmp_path: Path, max_usd: str = "1.00") -> Path:
    spec = {
        "sources": [{"name": "glaive", "uri": str(ROOT / "examples/prompts/glaive_sample.jsonl"), "format": "glaive"},
                    {"name": "q", "uri": str(ROOT / "examples/prompts/quickstart.jsonl"), "format": "openai"}],
        "target": {"model": "sim/model"},
        "api": {"baseUrl": "simulated", "maxConcurrency": 4, "stream": False},
        "budget": {"maxUSD": max_usd},
        "output": {"uri": f"file://{tmp_path}/out"},
    }
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


@pytest.mark.integration
def test_figures_match_what_the_simulator_did(tmp_path):
    dg = load_spec(simulator_spec(tmp_path))
    picked = pick_prompts(dg, 20)
    assert len(picked.prompts) == 20 and picked.population["declaredPrompts"] == 23
    with provider(dg.spec) as url:
        doc = run_audit(dg, 20, RunContext("audit-test"), url)
    for mode in ("text", "structured"):
        called, formats = 0, Counter()
        for _sid, prompt in picked.prompts:
            prepared = declarations.prepare_prompt(prompt, mode)
            ans = make_answer(build_body(dg.spec, prepared.messages, prepared.tools), SimulatorConfig())
            # in text mode the simulated model writes its calls into the content (its plan says how)
            plan_calls = ans.text.calls if mode == "text" and ans.text else ()
            called += bool(ans.tool_calls) or bool(plan_calls)
            if plan_calls:
                formats[ans.text.format] += 1
        f = doc["figures"]["modes"][mode]
        assert f["answers"] == 20 and f["callRate"] == wilson(called, 20).to_dict(), mode
        assert f["leakRate"]["value"] == 0, mode
        if mode == "text":
            text_formats = formats
    s, t = doc["figures"]["modes"]["structured"], doc["figures"]["modes"]["text"]
    assert s["callRate"]["value"] > t["callRate"]["value"] > 0
    assert {k: t["formats"][k]["count"] for k in text_formats} == dict(text_formats)
    stored_doc = json.loads(open_store(dg.spec.output.uri).get(layout.AUDIT))
    assert stored_doc["sampleIds"] == [sid for sid, _ in picked.prompts] and stored_doc["version"] == 2
    assert Decimal(doc["spentUSD"]) == sum(Decimal(r["costUSD"])
                                           for r in stored.iter_audit_records(open_store(dg.spec.output.uri)))


@pytest.mark.integration
def test_audit_spend_counts_against_the_run_budget(tmp_path):
    path = simulator_spec(tmp_path)
    dg = load_spec(path)
    with provider(dg.spec) as url:
        doc = run_audit(dg, 10, RunContext("audit-test"), url)
    audit_spent = Decimal(doc["spentUSD"])
    env = {**os.environ, "EYRIE_NO_RAY": "1"}
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "run", str(path), "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    prog = json.loads(open_store(dg.spec.output.uri).get(layout.PROGRESS))
    recs = list(records.iter_records(open_store(dg.spec.output.uri)))
    assert Decimal(prog["auditUSD"]) == audit_spent
    assert Decimal(prog["spentUSD"]) == audit_spent + sum(Decimal(x["costUSD"]) for x in recs)


@pytest.mark.integration
def test_audit_cli_prints_the_verdict_and_refuses_without_tool_prompts(tmp_path):
    path = simulator_spec(tmp_path)
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", str(path), "--samples", "6"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "audit verdict" in out and "As text, the model called a tool on" in out
    assert "tool-call rate" in out and "structured - text" in out and "n=6" in out
    assert "12 requests sent, 0 answers reused" in r.stderr
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", str(path), "--samples", "6"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "0 requests sent, 12 answers reused" in r.stderr
    h = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", "--help"], capture_output=True, text=True)
    assert "random sample" in h.stdout and "(default: 50)" in h.stdout and "--seed" in h.stdout
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    doc = yaml.safe_load(path.read_text())
    doc["sources"] = [{"name": "plain", "uri": str(plain)}]
    path.write_text(yaml.safe_dump(doc))
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "declares tools" in r.stderr


@pytest.mark.integration
def test_run_in_audit_mode_prints_the_audit_without_a_terminal(tmp_path):
    path = simulator_spec(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["tools"] = {"mode": "audit", "gate": {"canarySamples": 6}}
    path.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "EYRIE_NO_RAY": "1"}
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "run", str(path), "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    err = " ".join(r.stderr.split())
    # the summary ends with the audit's verdict (its tables: --verbose, eyrie report), in 25 lines
    assert "audit verdict" in err and "As text, the model called a tool on" in err and "of 6 prompts" in err
    assert len(r.stderr.splitlines()) <= 26 and "n=6" not in err
    report = (tmp_path / "out" / layout.REPORT).read_text()
    # the first screen: the run's verdict, then the audit's, before the sample and the plots
    sections = [report.index(m) for m in ("<h2>Verdict</h2>", "<h2>Audit: tools as text vs structured</h2>"
                                          "<p class='verdict'>As text", 'id="plot-0"')]
    assert sections == sorted(sections) and report.index("<h2>") == sections[0]


@pytest.mark.integration
def test_audit_killed_with_sigkill_leaves_a_bound_the_next_run_starts_from(tmp_path):
    """kill -9 mid-audit: what the audit may have paid is already in budget.json, so the run that
    follows starts from at least the provider's bill and cannot spend past maxUSD; the answers
    made durable before the kill are kept and not bought again."""
    import signal
    import time

    from eyrie.jobs.simulator import SimulatorProcess

    path = simulator_spec(tmp_path)
    doc = yaml.safe_load(path.read_text())
    with SimulatorProcess(SimulatorConfig(latency_ms=300)) as sim:
        doc["api"]["baseUrl"] = sim.base_url
        doc["budget"]["pricing"] = PRICING
        path.write_text(yaml.safe_dump(doc))
        env = {**os.environ, "EYRIE_API_KEY": "sk-test-audit-kill"}
        proc = subprocess.Popen([sys.executable, "-m", "eyrie.jobs.cli", "audit", str(path), "--samples", "20"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 120
            while sim.stats()["completed"] < 6:
                assert time.time() < deadline and proc.poll() is None
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        billed = Decimal(sim.stats()["billedUSD"])
        store = open_store(doc["output"]["uri"])
        assert not store.exists(layout.AUDIT)  # it died before writing its table
        assert billed > 0 and read_checkpoint(store).spent >= billed
        kept = len(list(stored.iter_audit_records(store)))
        before = sim.stats()["requests"]
        r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", str(path), "--samples", "20"],
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert sim.stats()["requests"] - before == 40 - kept  # what was kept is not bought again


def test_declarations_are_read_once_per_distinct_set():
    from eyrie.jobs.generate.audit.run import declarations_of
    from eyrie.jobs.sources import Prompt

    system = {"role": "system", "content": glaive_system().removeprefix("SYSTEM: ")}
    a = Prompt("s", 0, [system, {"role": "user", "content": "one"}], None, "glaive")
    b = Prompt("s", 1, [system, {"role": "user", "content": "two"}], None, "glaive")
    got = declarations_of(a, "text")
    assert declarations_of(b, "text") is got  # the same reading, not a second parse
    assert got.prepared.declared_tools == declarations.prepare_prompt(b, "text").declared_tools
    assert got.prepared.mode == "text" and got.names == {t["function"]["name"] for t in got.prepared.declared_tools}
    assert got.validator.names == got.names
    assert declarations_of(a, "structured").prepared.tools == declarations.prepare_prompt(a, "structured").tools
    bad = Prompt("s", 2, [{"role": "system", "content": "Use them if required - {\"name\": "},
                          {"role": "user", "content": "x"}], None, "glaive")
    assert declarations_of(bad, "text") == declarations.prepare_prompt(bad, "text")  # Rejected, same reason
