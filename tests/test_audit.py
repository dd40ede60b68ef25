"""`eyrie audit` against the simulator: its table must say exactly what the simulator did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import yaml

from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import layout, records
from eyrie.jobs.generate.audit import pick_prompts, run_audit
from eyrie.jobs.generate.requests import build_body
from eyrie.jobs.pipeline import provider
from eyrie.jobs.simulator import SimulatorConfig, make_answer
from eyrie.jobs.spec import load_spec
from eyrie.jobs.store import open_store
from eyrie.jobs.tools import declarations
from eyrie.jobs.tools.leaks import scan_leaks

ROOT = Path(__file__).resolve().parents[1]


def spec_file(tmp_path: Path, max_usd: str = "1.00") -> Path:
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


def expected(dg, picked, mode: str) -> dict:
    cfg = SimulatorConfig()
    called = leaks = 0
    for _sid, prompt in picked:
        prepared = declarations.prepare_prompt(prompt, mode)
        ans = make_answer(build_body(dg.spec, prepared.messages, prepared.tools), cfg)
        if mode == "text":  # the simulated model writes its call as a Kimi section: a call, not a leak
            called += bool(ans.tool_calls) or "<|tool_calls_section_begin|>" in (ans.content or "")
        else:
            called += bool(ans.tool_calls)
            leaks += bool(scan_leaks(ans.content) or scan_leaks(ans.reasoning))
    return {"called": called, "leaks": leaks}


def test_audit_table_matches_what_the_simulator_did(tmp_path):
    path = spec_file(tmp_path)
    dg = load_spec(path)
    picked = pick_prompts(dg, 20)
    assert len(picked) == 20  # 8 glaive rows declare functions, then openai rows with tools
    assert [p.source for _, p in picked[:8]] == ["glaive"] * 8
    with provider(dg.spec) as url:
        doc = run_audit(dg, 20, RunContext("audit-test"), url)
    m = doc["modes"]
    for mode in ("text", "structured"):
        exp = expected(dg, picked, mode)
        assert m[mode]["answers"] == 20 and m[mode]["declaredPrompts"] == 20
        assert m[mode]["callRate"] == round(exp["called"] / 20, 6), mode
        assert m[mode]["leaks"] == exp["leaks"], mode
    # structured: the model calls natively and never leaks; text: it calls less often, as text
    assert m["structured"]["leaks"] == m["text"]["leaks"] == 0
    assert m["structured"]["callRate"] > m["text"]["callRate"] > 0
    assert m["difference"]["callRate"] == round(m["structured"]["callRate"] - m["text"]["callRate"], 6)
    stored = json.loads(open_store(dg.spec.output.uri).get(layout.AUDIT))
    assert stored["spentUSD"] == doc["spentUSD"]
    assert Decimal(doc["spentUSD"]) == Decimal(m["text"]["costUSD"]) + Decimal(m["structured"]["costUSD"])
    assert stored["sampleIds"] == [sid for sid, _ in picked]


def test_audit_spend_counts_against_the_run_budget(tmp_path):
    path = spec_file(tmp_path)
    dg = load_spec(path)
    with provider(dg.spec) as url:
        doc = run_audit(dg, 10, RunContext("audit-test"), url)
    audit_spent = Decimal(doc["spentUSD"])
    env = {**os.environ, "EYRIE_NO_RAY": "1"}
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "run", str(path), "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    prog = json.loads(open_store(dg.spec.output.uri).get(layout.PROGRESS))
    recs = list(records.iter_records(open_store(dg.spec.output.uri)))
    assert Decimal(prog["auditUSD"]) == audit_spent
    assert Decimal(prog["spentUSD"]) == audit_spent + sum(Decimal(x["costUSD"]) for x in recs)


def test_audit_cli_prints_the_table_and_refuses_without_tool_prompts(tmp_path):
    path = spec_file(tmp_path)
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", str(path), "--samples", "6"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "120"})
    assert r.returncode == 0, r.stderr
    assert "tool-call rate" in r.stdout and "structured" in r.stdout and "leak rate" in r.stdout
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    doc = yaml.safe_load(path.read_text())
    doc["sources"] = [{"name": "plain", "uri": str(plain)}]
    path.write_text(yaml.safe_dump(doc))
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "declares tools" in r.stderr


def test_audit_killed_with_sigkill_leaves_a_bound_the_next_run_starts_from(tmp_path):
    """kill -9 mid-audit: what the audit may have paid is already in budget.json, so the run that
    follows starts from at least the provider's bill and cannot spend past maxUSD."""
    import signal
    import time

    from eyrie.jobs.generate.checkpoint import read_checkpoint
    from eyrie.jobs.simulator import SimulatorProcess

    path = spec_file(tmp_path)
    doc = yaml.safe_load(path.read_text())
    with SimulatorProcess(SimulatorConfig(latency_ms=300)) as sim:
        doc["api"]["baseUrl"] = sim.base_url
        doc["budget"]["pricing"] = {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}
        path.write_text(yaml.safe_dump(doc))
        env = {**os.environ, "EYRIE_API_KEY": "sk-test-audit-kill"}
        proc = subprocess.Popen([sys.executable, "-m", "eyrie.jobs.cli", "audit", str(path), "--samples", "20"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 60
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
