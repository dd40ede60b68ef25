"""Hostile input: huge prompts, broken bytes, absurd tool lists and schemas, rows of the wrong shape,
and a spec with every field wrong. A bad row is recorded (rejected, with its row number and the
reason) and never sent or paid; it never stops the run. A bad spec is refused before anything runs,
with every problem named by its field path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parents[1]))
import pytest
from fault_helpers import (
    assert_exactly_once,
    persisted,
    progress,
    run_inline,
    spec_doc,
    spent_sum,
    write_rows,
    write_spec,
)

from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess

pytestmark = pytest.mark.integration  # tier (tests/conftest.py): `eyrie run` as a process against the simulator


def _fn(name: str, params: dict | None = None) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"tool {name}",
                                             "parameters": params or {"type": "object", "properties": {}}}}


def _nested_schema(levels: int) -> dict:
    """An object schema `levels` objects deep, every level required (so an answer must go all the way)."""
    node: dict = {"type": "string"}
    for _ in range(levels):
        node = {"type": "object", "properties": {"inner": node}, "required": ["inner"]}
    return node


def _nested_schema_text(levels: int) -> bytes:
    """The same as JSON text, for depths no JSON encoder will write (they recurse)."""
    head = b'{"type": "object", "properties": {"inner": ' * levels
    tail = b'}, "required": ["inner"]}' * levels
    return head + b'{"type": "string"}' + tail


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


MB_SYSTEM = "You are careful. " * (1_000_000 // 17 + 1)


def hostile_rows() -> list:
    return [
        {"messages": [_user("a plain question")]},                                      # 0 ok
        {"messages": [{"role": "system", "content": MB_SYSTEM}, _user("and with 1 MB of system")]},  # 1 ok
        b'{"messages": [{"role": "user", "content": "caf\xe9 \xff\xfe broken bytes"}]}',  # 2 invalid UTF-8
        [{"role": "user", "content": "a row that is an array"}],                        # 3 JSON array
        {"messages": [_user("pick one")], "tools": [_fn(f"tool_{i}") for i in range(10_000)]},  # 4
        {"messages": [_user("deep")], "tools": [_fn("deep", _nested_schema(40))]},      # 5 too deep
        {"messages": [_user("nested but fine")], "tools": [_fn("nested", _nested_schema(12))]},  # 6 ok
        b"[" * 5000 + b"]" * 5000,                                                    # 7 past the parser's depth
        {"messages": {"role": "user"}},                                                 # 8 not a list
        {"messages": [_user("the last plain question")]},                              # 9 ok
    ]


def test_hostile_rows_are_recorded_with_a_reason_and_never_paid(tmp_path, monkeypatch):
    prompts = write_rows(tmp_path / "p.jsonl", hostile_rows())
    out = f"file://{tmp_path}/out"
    with SimulatorProcess(SimulatorConfig(tool_call_rate=1.0)) as sim:
        result, store = run_inline(write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, max_usd="5.00",
                                                                 extra={"tools.onInvalidCall": "keep"})),
                                   monkeypatch)
        stats = sim.stats()
    assert result.outcome == "Done", result.message
    recs = persisted(store)
    by_row = assert_exactly_once(recs, range(10))
    sent = [0, 1, 6, 9]
    assert [r for r in range(10) if by_row[r]["status"] == "ok"] == sent
    assert stats["completed"] == stats["requests"] == len(sent)
    for row in set(range(10)) - set(sent):
        rec = by_row[row]
        assert rec["status"] == "rejected" and rec["costUSD"] == "0" and rec["request"] is None, row
    reasons = {r: by_row[r]["error"]["message"] for r in range(10) if r not in sent}
    assert reasons[2] == "invalid UTF-8 at byte 46"
    assert "array" in reasons[3]
    assert reasons[4] == "10000 tools declared, over the limit of 512"
    assert reasons[5] == "tool 'deep': parameters nest deeper than 64 levels"
    assert reasons[7].startswith("invalid JSON")
    assert "'messages' must be a list" in reasons[8]
    # the 1 MB prompt went out whole and was paid at its real size
    assert by_row[1]["request"]["messages"][0]["content"] == MB_SYSTEM
    assert by_row[1]["usage"]["prompt_tokens"] >= 1_000_000 // 4
    # the nested tool was called all the way down, and the call validates
    call = by_row[6]["response"]["tool_calls"][0]
    args = json.loads(call["function"]["arguments"])
    for _ in range(12):
        args = args["inner"]
    assert isinstance(args, str) and by_row[6]["checks"]["invalidCalls"] == 0
    prog = progress(store)
    assert prog["samples"] == {"total": 10, "done": 4, "rejected": 6, "discarded": 0, "failed": 0}
    assert Decimal(prog["spentUSD"]) == Decimal(stats["billedUSD"]) == spent_sum(recs) <= Decimal("5.00")


EVERYTHING_WRONG = {
    "apiVersion": "eyrie.dev/v1alpha1", "kind": "DatasetGeneration", "metadata": {"name": "bad"},
    "spec": {
        "sources": [{"name": "bad name!", "uri": "p.jsonl", "format": "csv", "limit": 0}],
        "target": {"model": 42, "chatFormat": "klingon"},
        "api": {"baseUrl": "simulated", "maxConcurrency": 0, "maxRetries": -1, "requestTimeoutSeconds": 0,
                "sampling": {"temperature": 9, "maxTokens": 0}},
        "tools": {"mode": "psychic", "onInvalidCall": "ignore"},
        "budget": {"maxUSD": "-5", "pricing": {"inputPerMillion": "cheap", "outputPerMillion": "-1"}},
        "generation": {"shards": 0, "ray": {"mode": "Cloud", "workers": 0}},
        "output": {"uri": "ftp://nowhere"},
        "colour": "blue",
    },
}
EXPECTED_PATHS = [
    "spec.sources[0].name", "spec.sources[0].format", "spec.sources[0].limit", "spec.target.model",
    "spec.target.chatFormat", "spec.api.maxConcurrency", "spec.api.maxRetries",
    "spec.api.requestTimeoutSeconds", "spec.api.sampling.temperature", "spec.api.sampling.maxTokens",
    "spec.tools.mode", "spec.tools.onInvalidCall", "spec.budget.maxUSD", "spec.budget.pricing.inputPerMillion",
    "spec.budget.pricing.outputPerMillion", "spec.generation.shards", "spec.generation.ray.mode",
    "spec.generation.ray.workers", "spec.output.uri", "spec.colour",
]


def test_a_spec_with_every_field_wrong_names_each_one(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(EVERYTHING_WRONG))
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "validate", str(path)], capture_output=True,
                       text=True, timeout=60, env={**os.environ})
    assert r.returncode == 2
    missing = [p for p in EXPECTED_PATHS if p not in r.stderr]
    assert missing == [], r.stderr
    assert "unknown field" in r.stderr and "Traceback" not in r.stderr
    # and `eyrie run` refuses it the same way, before anything runs
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "run", str(path), "--no-progress"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and [p for p in EXPECTED_PATHS if p not in r.stderr] == []


def test_rows_nested_past_the_serialiser_limit_are_bad_rows_not_a_crash(tmp_path, monkeypatch):
    deep_content = b'{"messages": [{"role": "user", "content": ' + b"[" * 300 + b'"x"' + b"]" * 300 + b"}]}"
    deep_schema = (b'{"messages": [{"role": "user", "content": "deep"}], "tools": [{"type": "function", '
                   b'"function": {"name": "deep", "parameters": ' + _nested_schema_text(400) + b"}}]}")
    prompts = write_rows(tmp_path / "p.jsonl", [{"messages": [_user("fine")]}, deep_content, deep_schema])
    out = f"file://{tmp_path}/out"
    with SimulatorProcess(SimulatorConfig()) as sim:
        result, store = run_inline(write_spec(tmp_path, spec_doc(prompts, out, sim.base_url)), monkeypatch)
        stats = sim.stats()
    assert result.outcome == "Done"
    by_row = assert_exactly_once(persisted(store), range(3))
    assert [by_row[i]["status"] for i in range(3)] == ["ok", "rejected", "rejected"]
    assert stats["requests"] == 1
