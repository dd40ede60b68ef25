"""`eyrie audit --from FILE`: answers someone already paid for, read, checked and counted with the
same code as a run's own; malformed rows named by their 1-based row; nothing sent (the provider in
these tests answers 500 to anything and counts it); `--rerun N` buys the other mode for N prompts."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from fake_provider import CASES_IN_ORDER, CATEGORY, TEXT_ANSWERS, TOOLS, FakeProvider, structured_message, text_message

from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import audit as stored
from eyrie.jobs.generate.audit.from_recorded import analyse_recorded, run_audit_from
from eyrie.jobs.generate.audit.recorded import RecordedRow, RowProblem, parse_row, read_recorded
from eyrie.jobs.generate.budget.pricing import Pricing
from eyrie.jobs.intervals import wilson
from eyrie.jobs.spec import load_spec
from eyrie.jobs.store import open_store

PRICING = {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}
SYSTEM = ("You are a helpful assistant with access to the following functions. Use them if required -\n"
          + "\n".join(json.dumps(t["function"]) for t in TOOLS))


def chat_completion(message: dict, cost: float | None = 0.0004) -> dict:
    usage = {"prompt_tokens": 500, "completion_tokens": 60, "total_tokens": 560}
    if cost is not None:
        usage["cost"] = cost
    return {"id": "gen-1", "object": "chat.completion", "model": "moonshotai/kimi-k2.5", "provider": "Moonshot",
            "choices": [{"index": 0, "finish_reason": "stop", "message": message}], "usage": usage}


def recorded_file(tmp_path: Path) -> tuple[Path, dict]:
    """Every case twice (an OpenAI request/response row, and the glaive-shaped row of content,
    reasoning and usage the team behind eyrie's question had), structured rows, and bad ones."""
    lines: list[str] = []
    expect: dict = {"problems": [], "cost": Decimal(0), "priced": Counter()}

    def add(row: object, problem: str | None = None) -> None:
        lines.append(row if isinstance(row, str) else json.dumps(row))
        if problem:
            expect["problems"].append((len(lines), problem))

    for c in CASES_IN_ORDER:
        add({"request": {"model": "moonshotai/kimi-k2.5", "messages": [
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": f"case={c} Weather in Paris?"}]},
            "response": chat_completion(text_message(c))})
        expect["cost"] += Decimal("0.0004")
        expect["priced"]["usage"] += 1
        msg = text_message(c)
        add({"system": "SYSTEM: " + SYSTEM, "chat": f"USER: case={c} And in Paris tomorrow?\n\n\nASSISTANT: ok",
             "content": msg["content"], "reasoning": msg["reasoning"],
             "usage": {"prompt_tokens": 1000, "completion_tokens": 200}})  # no cost: the spec's prices
        expect["cost"] += Decimal("0.0011")
        expect["priced"]["pricing"] += 1
    for c in ("hermes", "none"):
        add({"request": {"messages": [{"role": "user", "content": f"case={c} Paris?"}], "tools": TOOLS},
             "response": {"status_code": 200, "body": chat_completion(structured_message(c))}})
        expect["cost"] += Decimal("0.0004")
        expect["priced"]["usage"] += 1
    add("")  # a blank line is no row, but it is a line: row numbers stay those an editor shows
    add("{not json", "invalid JSON")
    add("[1, 2]", "row is a JSON array, not an object")
    add({"request": {"messages": [{"role": "user", "content": "hi"}]}}, "no answer")
    add({"system": "SYSTEM: " + SYSTEM, "chat": "ASSISTANT: hello", "content": "x"}, "no USER turn")
    add({"messages": [{"role": "user", "content": "case=hermes"}], "content": 5}, "content is a JSON number")
    add({"messages": [{"role": "user", "content": "hello"}], "response": {"content": "Hi!"}})  # declares nothing
    expect["priced"]["unpriced"] += 1
    add({"system": "SYSTEM: helpful. Use them if required -\n{\"name\": \"broken\", ", "chat": "USER: case=hermes x",
         "content": TEXT_ANSWERS["hermes"], "usage": {"prompt_tokens": 10, "completion_tokens": 10, "cost": 0.0001}})
    expect["cost"] += Decimal("0.0001")
    expect["priced"]["usage"] += 1
    add("")
    add({"request": {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "case=none x"}]},
         "response": {"error": {"code": 502, "message": "Provider returned error"}, "usage": None}})
    expect["priced"]["unpriced"] += 1
    path = tmp_path / "answers.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, expect


def spec_file(tmp_path: Path, base_url: str) -> Path:
    spec = {"sources": [{"name": "unused", "uri": str(tmp_path / "answers.jsonl")}], "target": {"model": "fake/model"},
            "api": {"baseUrl": base_url, "maxConcurrency": 4, "stream": False, "maxRetries": 0},
            "budget": {"maxUSD": "1.00", "pricing": PRICING}, "output": {"uri": f"file://{tmp_path}/out"}}
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


def test_the_reader_names_each_bad_row_and_reads_the_rest(tmp_path):
    path, expect = recorded_file(tmp_path)
    items = list(read_recorded(path))
    problems = [(i.line, i.error) for i in items if isinstance(i, RowProblem)]
    assert [n for n, _ in problems] == [n for n, _ in expect["problems"]]
    for (_, got), (_, want) in zip(problems, expect["problems"], strict=True):
        assert want in got, (got, want)
    rows = [i for i in items if isinstance(i, RecordedRow)]
    assert len(rows) == 2 * len(CASES_IN_ORDER) + 2 + 3
    assert Counter(r.mode for r in rows) == {"text": 2 * len(CASES_IN_ORDER) + 3, "structured": 2}
    assert sum(r.error is not None for r in rows) == 1  # the provider's 502: a failed request, not a bad row


@pytest.mark.integration
def test_from_counts_like_a_run_and_sends_nothing(tmp_path):
    path, expect = recorded_file(tmp_path)
    with FakeProvider(refuse=True) as fake:
        spec = spec_file(tmp_path, fake.base_url)
        r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", str(spec), "--from", str(path)],
                           capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
        assert fake.requests == 0  # nothing sent: no preflight, no request
    assert r.returncode == 0, r.stderr
    doc = stored.read_audit(open_store(f"file://{tmp_path}/out"))
    f = doc["from"]
    assert f["badRows"] == len(expect["problems"]) and [p["row"] for p in f["problems"]] == [
        n for n, _ in expect["problems"]]
    assert f["unparsableRows"] == 1 and "not valid JSON" in f["unparsable"][0]["error"] and f["noTools"] == 1
    assert Decimal(f["costUSD"]) == expect["cost"]  # from usage.cost, else the spec's prices
    assert f["priced"] == {"usage": expect["priced"]["usage"], "pricing": expect["priced"]["pricing"],
                           "unpriced": expect["priced"]["unpriced"]}
    t = doc["figures"]["modes"]["text"]
    # the unparsable row is counted as such, not as an answer without a call
    assert t["unparsable"] == 1 and t["failed"] == 1 and t["answers"] == 2 * len(CASES_IN_ORDER)
    assert doc["figures"]["modes"]["structured"]["answers"] == 2 and doc["sent"] == 0 and doc["spentUSD"] == "0"
    out = " ".join(r.stdout.split())
    assert "recorded in answers.jsonl" in out and f"row {expect['problems'][0][0]}:" in out
    assert "1 prompt declared functions that could not be parsed" in doc["verdict"]


@pytest.mark.integration
def test_from_counts_each_text_format_exactly(tmp_path):
    path, _ = recorded_file(tmp_path)
    prices = Pricing(Decimal("0.60"), Decimal("2.50"))
    tally = analyse_recorded(path, prices)
    assert analyse_recorded(path, prices, workers=2).facts == tally.facts  # the same in a pool of processes
    text = [f for f in tally.facts if f.mode == "text" and f.status == "ok"]
    got = Counter(f.category for f in text)
    assert got == Counter(CATEGORY[c] for c in CASES_IN_ORDER for _ in range(2))
    calls = [c for f in text for c in f.calls]
    assert len(calls) == 24 and sum(not c.valid for c in calls) == 4 and sum(not c.declared for c in calls) == 2


@pytest.mark.integration
def test_from_without_a_spec_prints_and_writes_nothing(tmp_path):
    path, _ = recorded_file(tmp_path)
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", "--from", str(path)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "recorded in answers.jsonl" in " ".join(r.stdout.split()) and "written to" not in r.stderr
    assert not (tmp_path / "out").exists()
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", "--from", str(tmp_path / "nope.jsonl")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "nope.jsonl" in r.stderr
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", "--from", str(path), "--rerun", "3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--rerun needs a SPEC" in r.stderr


@pytest.mark.integration
def test_rerun_buys_the_other_mode_once_under_the_budget(tmp_path):
    path, _ = recorded_file(tmp_path)
    with FakeProvider() as fake:
        dg = load_spec(spec_file(tmp_path, fake.base_url))
        doc = run_audit_from(path, dg, RunContext("t"), fake.base_url, rerun=4)
        assert fake.requests == 4 and doc["sent"] == 4
        assert all(b.get("tools") for b in fake.bodies)  # text rows rerun with structured tools
        again = run_audit_from(path, dg, RunContext("t"), fake.base_url, rerun=4)
        assert fake.requests == 4 and again["sent"] == 0  # kept, not bought again
    p = doc["figures"]["paired"]
    assert p["prompts"] == 4
    s = doc["figures"]["modes"]["structured"]
    assert s["answers"] == 2 + 4  # the file's two structured rows and the four bought
    store = open_store(f"file://{tmp_path}/out")
    assert stored.audit_spend(store) == fake.billed == Decimal(doc["spentUSD"])
    assert doc["examples"] and all(e["text"] and e["structured"] for e in doc["examples"])


def test_other_shapes_gzip_and_a_corrupt_tail(tmp_path):
    row = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "case=hermes"}],
           "choices": [{"message": {"content": TEXT_ANSWERS["hermes"]}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 5, "completion_tokens": 5, "cost": 0.01}}
    assert isinstance(parse_row(row, "f", 1), RecordedRow)
    conv = {"conversations": [{"from": "system", "value": SYSTEM}, {"from": "human", "value": "case=json"}],
            "response": {"content": TEXT_ANSWERS["json"]}}
    got = parse_row(conv, "f", 2)
    assert isinstance(got, RecordedRow) and got.mode == "text" and got.response["content"] == TEXT_ANSWERS["json"]
    data = gzip.compress(("\n".join(json.dumps(r) for r in (row, conv)) + "\n").encode())
    (tmp_path / "a.jsonl.gz").write_bytes(data[:-8])  # cut: the last bytes of the stream are gone
    items = list(read_recorded(tmp_path / "a.jsonl.gz"))
    assert isinstance(items[0], RecordedRow) and isinstance(items[-1], RowProblem)
    assert "corrupt" in items[-1].error


def test_rate_intervals_in_from_are_wilson(tmp_path):
    path, _ = recorded_file(tmp_path)
    doc = run_audit_from(path, None, RunContext("t"), None)
    t = doc["figures"]["modes"]["text"]
    k = round(t["callRate"]["value"] * t["answers"])
    assert t["callRate"] == wilson(k, t["answers"]).to_dict()
