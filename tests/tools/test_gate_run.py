"""The drift gate inside a real run: it stops within canarySamples + concurrency answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eyrie.jobs.contract import layout, records
from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess, make_answer
from eyrie.jobs.simulator.text import TextBehaviour
from eyrie.jobs.store import open_store

pytestmark = pytest.mark.integration  # tier (tests/conftest.py): `eyrie run` as a process against the simulator


def glaive_rows(path: Path, n: int) -> Path:
    fn = {"name": "lookup_order", "description": "Find an order",
          "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                         "required": ["order_id"]}}
    system = ("SYSTEM: You are a helpful assistant with access to the following functions. "
              "Use them if required -\n" + json.dumps(fn, indent=4))
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"system": system,
                                "chat": f"USER: Where is my order A{i:04d}?\n\n\nASSISTANT: Let me check.\n"}) + "\n")
    return path


def run(tmp_path: Path, sim_url: str, mode: str, concurrency: int,
        max_invalid: float = 0.02) -> tuple[subprocess.CompletedProcess, str]:
    out = f"file://{tmp_path}/out-{mode}"
    gate = {"canarySamples": 20, "minToolCallRate": 0.5, "maxLeakRate": 0.0, "maxInvalidCallRate": max_invalid}
    spec = {"sources": [{"name": "g", "uri": str(glaive_rows(tmp_path / "g.jsonl", 120)), "format": "glaive"}],
            "target": {"model": "sim/model"},
            "api": {"baseUrl": sim_url, "maxConcurrency": concurrency, "stream": False},
            "tools": {"mode": mode, "gate": gate},
            "budget": {"maxUSD": "5", "pricing": {"inputPerMillion": "0.6", "outputPerMillion": "2.5"}},
            "generation": {"shards": 2},
            "output": {"uri": out}}
    path = tmp_path / f"spec-{mode}.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "EYRIE_NO_RAY": "1"}
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "run", str(path), "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=120)
    return r, out


def test_text_declared_tools_trip_the_gate_within_canary_plus_concurrency(tmp_path):
    # functions described only in the prompt: the simulated model rarely calls them (and then as
    # text, which the gate counts): exactly the failure eyrie exists to catch
    with SimulatorProcess(SimulatorConfig(text_calls=TextBehaviour(0.2, {"kimi": 1}, 0, 0))) as sim:
        r, out = run(tmp_path, sim.base_url, "text", concurrency=4)
        completed = sim.stats()["completed"]
    assert r.returncode == 4, r.stderr
    prog = json.loads(open_store(out).get(layout.PROGRESS))
    assert prog["outcome"] == "ToolSemanticsDrift"
    assert "below minToolCallRate 0.50" in prog["message"]
    assert 20 <= completed <= 20 + 4
    assert completed == 20  # leases allow no request past the canary before the gate has judged it
    assert len(list(records.iter_records(open_store(out)))) == completed  # in-flight answers kept


def test_a_text_mode_run_keeps_the_calls_written_as_text(tmp_path):
    """tools.mode text: the model writes its calls into the content in several formats; the gate
    counts them, every record keeps them as calls with the format they were written in and the
    validity the simulator gave them, and nothing valid is dropped for being text."""
    cfg = SimulatorConfig(text_calls=TextBehaviour(0.9, {"glaive": 1, "hermes": 1, "kimi": 1, "json": 1}, 0.1, 0.5))
    with SimulatorProcess(cfg) as sim:
        r, out = run(tmp_path, sim.base_url, "text", concurrency=4, max_invalid=0.3)
    assert r.returncode == 0, r.stderr
    prog = json.loads(open_store(out).get(layout.PROGRESS))
    recs = list(records.iter_records(open_store(out)))
    assert prog["outcome"] == "Done" and len(recs) == 120
    called = 0
    for rec in recs:
        plan = make_answer(rec["request"], cfg).text  # what the simulated model did, from its own plan
        assert not rec["response"].get("tool_calls") and not rec["checks"]["leaked"]
        assert [(c["format"], c["name"], c["valid"]) for c in rec["checks"]["calls"]] == \
            [(plan.format, c.name, c.valid) for c in plan.calls]
        assert rec["checks"]["prose"] == plan.prose
        assert rec["policy"] == ("keep" if all(c.valid for c in plan.calls) else "drop")
        called += bool(plan.calls)
    assert called > 90
    assert prog["tools"]["callRate"] == round(called / 120, 6) and prog["tools"]["leaks"] == 0


def test_structured_tools_pass_the_gate(tmp_path):
    with SimulatorProcess(SimulatorConfig(tool_call_rate=0.9)) as sim:
        r, out = run(tmp_path, sim.base_url, "structured", concurrency=4)
        completed = sim.stats()["completed"]
    assert r.returncode == 0, r.stderr
    prog = json.loads(open_store(out).get(layout.PROGRESS))
    assert prog["outcome"] == "Done" and completed == 120
    assert prog["tools"]["declaredPrompts"] == 120 and prog["tools"]["leaks"] == 0
    assert prog["tools"]["callRate"] > 0.8
