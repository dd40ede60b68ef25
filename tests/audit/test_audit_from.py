"""`eyrie audit --from FILE`: answers someone already paid for, read, checked and counted with the
same code as a run's own; malformed rows named by their 1-based row; nothing sent (the provider in
these tests answers 500 to anything and counts it); `--rerun N` buys the other mode for N prompts."""

from __future__ import annotations

import gzip
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
from fake_openrouter import CASES_IN_ORDER, CATEGORY, TEXT_ANSWERS, TOOLS, scripted, structured_message, text_message

from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import audit as stored
from eyrie.jobs.generate.audit.from_recorded import FromOptions, analyse_recorded, run_audit_from
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
    with scripted(refuse=True).running() as fake:
        spec = spec_file(tmp_path, fake.base_url)
        r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", str(spec), "--from", str(path)],
                           capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
        assert len(fake.log) == 0  # nothing sent: no preflight, no request
    assert r.returncode == 0, r.stderr
    doc = stored.read_audit(open_store(f"file://{tmp_path}/answers-audit"))  # its own output, next to the file
    assert not (tmp_path / "out").exists()  # never the dataset's
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
def test_from_without_a_spec_is_written_next_to_the_file(tmp_path):
    path, _ = recorded_file(tmp_path)
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", "--from", str(path)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "recorded in answers.jsonl" in " ".join(r.stdout.split())
    assert f"written to file://{tmp_path}/answers-audit/audit.json" in r.stderr
    assert stored.read_audit(open_store(str(tmp_path / "answers-audit")))["from"]["priced"]["pricing"] == 0
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", "--from", str(tmp_path / "nope.jsonl")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "nope.jsonl" in r.stderr
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", "--from", str(path), "--rerun", "3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--rerun needs a SPEC" in r.stderr


@pytest.mark.integration
def test_rerun_buys_the_other_mode_once_under_the_budget(tmp_path):
    path, _ = recorded_file(tmp_path)
    with scripted().running() as fake:
        dg = load_spec(spec_file(tmp_path, fake.base_url))
        opts = FromOptions(rerun=4, rerun_model="moonshotai/kimi-k2.5")  # the model the file's rows name
        doc = run_audit_from(path, dg, RunContext("t"), fake.base_url, opts)
        assert len(fake.log) == 4 and doc["sent"] == 4
        assert all(b.get("tools") for b in fake.bodies())  # text rows rerun with structured tools
        assert {b["model"] for b in fake.bodies()} == {"moonshotai/kimi-k2.5"}
        again = run_audit_from(path, dg, RunContext("t"), fake.base_url, opts)
        assert len(fake.log) == 4 and again["sent"] == 0 and again["reused"] == 4  # kept, not bought again
    p = doc["figures"]["paired"]
    assert p["prompts"] == 4
    s = doc["figures"]["modes"]["structured"]
    assert s["answers"] + s["failed"] == 4  # the four bought: the file's own structured rows are not compared
    assert "and the 4 bought structured (4 requests sent now, 0 answers reused)" in doc["verdict"]
    assert "and the 4 bought structured (0 requests sent now, 4 answers reused)" in again["verdict"]
    store = open_store(f"file://{tmp_path}/answers-audit")
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
    doc = run_audit_from(path, None, RunContext("t"), None, FromOptions(output=str(tmp_path / "a")))
    t = doc["figures"]["modes"]["text"]
    k = round(t["callRate"]["value"] * t["answers"])
    assert t["callRate"] == wilson(k, t["answers"]).to_dict()


# ----------------------------------------------------------------- audit/rows.jsonl, per row


def test_rows_jsonl_says_for_each_row_its_calls_and_whether_they_are_valid(tmp_path):
    path, expect = recorded_file(tmp_path)
    run_audit_from(path, None, RunContext("t"), None)
    rows = stored.read_rows(open_store(str(tmp_path / "answers-audit")))
    lines = path.read_text().splitlines()
    assert [r["row"] for r in rows] == [i + 1 for i, line in enumerate(lines) if line.strip()]  # every row, 1-based
    by_row = {r["row"]: r for r in rows}
    for n, problem in expect["problems"]:
        assert by_row[n]["status"] == "bad-row" and problem in by_row[n]["error"] and by_row[n]["valid"] is None
    for i, case in enumerate(CASES_IN_ORDER):
        for n in (2 * i + 1, 2 * i + 2):  # its request/response row and its glaive row
            r = by_row[n]
            assert (r["status"], r["mode"], r["source"]) == ("ok", "text", "answers.jsonl") and r["sampleId"]
            formats = {c["format"] for c in r["calls"]}
            assert formats == ({CATEGORY[case]} if CATEGORY[case] not in ("prose only", "no call") else set()), case
            assert r["prose"] == (case == "prose")
            if case in ("invalid", "hallucinated"):
                assert r["valid"] is False and len(r["why"]) == 1 and r["why"][0].startswith("call 1 ("), r
            else:
                assert r["valid"] is True and "why" not in r
    assert by_row[1]["model"] == "moonshotai/kimi-k2.5" and by_row[1]["costUSD"] == "0.0004"
    statuses = Counter(r["status"] for r in rows)
    assert statuses == {"ok": 2 * len(CASES_IN_ORDER) + 2, "bad-row": len(expect["problems"]), "no-declarations": 1,
                        "unparsable": 1, "failed": 1}
    structured = [r for r in rows if r.get("mode") == "structured"]
    assert [c["format"] for r in structured for c in r["calls"]] == ["structured"]  # hermes case calls; none not


# -------------------------------------------------------------- a file that yields nothing usable

ROW = {"request": {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "case=json x"}]},
       "response": chat_completion(text_message("json"))}
UNUSABLE = {  # name -> (the file's text, what the reason says, the first offending rows)
    "empty": ("\n\n", "the file is empty", []),
    "prompt-completion rows": ("".join(json.dumps({"prompt": f"Weather {i}?", "completion": "Sunny."}) + "\n"
                                       for i in range(7)), "completion-style row", [1, 2, 3, 4, 5]),
    "a JSON array, pretty-printed": (json.dumps([ROW, ROW], indent=2), "one JSON array, not JSON lines",
                                     [1, 2, 3, 4, 5]),
    "a JSON array on one line": (json.dumps([ROW, ROW]), "one JSON array, not JSON lines", [1]),
    "no answer field": ("".join(json.dumps({"request": ROW["request"], "answer": "hi"}) + "\n" for _ in range(3)),
                        "none of its 3 rows can be read", [1, 2, 3]),
    "no declared functions": ("\n".join(json.dumps({"messages": [{"role": "user", "content": f"hi {i}"}],
                                                    "response": {"content": "Hello!"}}) for i in range(3)),
                              "3 rows declare no function in a shape eyrie reads", [1, 2, 3]),
    "only the provider's errors": (json.dumps({**ROW, "response": {"error": {"code": 502, "message": "down"}}}),
                                   "1 rows hold the provider's error", [1]),
}


@pytest.mark.parametrize("case", sorted(UNUSABLE))
def test_a_file_with_nothing_usable_is_refused_with_why_and_its_first_rows(tmp_path, case):
    from eyrie.jobs.generate.audit.from_recorded import UnusableFile

    text, reason, rows = UNUSABLE[case]
    path = tmp_path / "answers.jsonl"
    path.write_text(text)
    with pytest.raises(UnusableFile) as e:
        run_audit_from(path, None, RunContext("t"), None)
    msg = str(e.value)
    assert reason in msg and msg.startswith("--from answers.jsonl: "), msg
    assert re.findall(r"row (\d+): ", msg) == [str(r) for r in rows], msg
    assert not (tmp_path / "answers-audit").exists()  # nothing written for nothing


@pytest.mark.integration
def test_the_cli_exits_2_on_a_json_array(tmp_path):
    path = tmp_path / "answers.json"
    path.write_text(json.dumps([ROW, ROW], indent=2))
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", "--from", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "one JSON array, not JSON lines" in r.stderr and "jq -c '.[]' answers.json > answers.jsonl" in r.stderr
    assert "row 1:" in r.stderr and r.stdout == ""  # no verdict, no empty tables


# ------------------------------------------------------- --rerun: the model the file's rows name


def test_same_model_allows_a_vendor_prefix_a_variant_and_a_dated_snapshot():
    from eyrie.jobs.generate.audit.from_recorded import same_model

    for a, b in (("moonshotai/kimi-k2.5", "moonshotai/Kimi-K2.5"), ("kimi-k2.5", "moonshotai/kimi-k2.5"),
                 ("moonshotai/kimi-k2-0905", "moonshotai/kimi-k2"), ("qwen/qwen3-8b:free", "qwen/qwen3-8b"),
                 ("openai/gpt-4o-20240806", "openai/gpt-4o")):
        assert same_model(a, b) and same_model(b, a), (a, b)
    for a, b in (("moonshotai/kimi-k2.5", "fake/model"), ("moonshotai/kimi-k2.5", "moonshotai/kimi-k2"),
                 ("qwen/qwen3-8b", "qwen/qwen3-80b"), ("deepseek/deepseek-v3", "deepseek/deepseek-v3.1")):
        assert not same_model(a, b), (a, b)


@pytest.mark.integration
def test_rerun_refuses_to_compare_another_models_answers_unless_told(tmp_path):
    from eyrie.jobs.generate.audit.run import AuditError

    path, _ = recorded_file(tmp_path)
    with scripted().running() as fake:
        dg = load_spec(spec_file(tmp_path, fake.base_url))  # target.model: fake/model
        with pytest.raises(AuditError) as e:
            run_audit_from(path, dg, RunContext("t"), fake.base_url, FromOptions(rerun=3))
        assert f"moonshotai/kimi-k2.5 ({len(CASES_IN_ORDER) + 2} rows) answered" in str(e.value)
        assert "'fake/model'" in str(e.value)
        assert "--rerun-model MODEL" in str(e.value) and len(fake.log) == 0  # refused before anything is sent
        doc = run_audit_from(path, dg, RunContext("t"), fake.base_url, FromOptions(rerun=3, accept_other_model=True))
        assert len(fake.log) == 3 and {b["model"] for b in fake.bodies()} == {"fake/model"}
    s = doc["figures"]["modes"]["structured"]
    assert doc["sent"] == 3 and s["answers"] + s["failed"] == 3 and doc["model"] == "fake/model"
    assert "and the 3 bought structured (3 requests sent now, 0 answers reused)" in doc["verdict"]
    rows = stored.read_rows(open_store(doc["from"]["output"]))
    assert [(r["mode"], r["model"]) for r in rows if r.get("bought")] == [("structured", "fake/model")] * 3
    assert doc["from"]["models"] == {"moonshotai/kimi-k2.5": len(CASES_IN_ORDER) + 2}  # the glaive rows name none


# ------------------------------------------------------------ its own output, not the dataset's


@pytest.mark.integration
def test_a_from_audit_has_its_own_output_and_the_next_run_neither_shows_nor_counts_it(tmp_path):
    from eyrie.jobs.contract import layout, records

    path, _ = recorded_file(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"case=none q{i}"}],
                                           "tools": TOOLS}) + "\n" for i in range(3)))
    spec = {"sources": [{"name": "p", "uri": str(prompts)}], "target": {"model": "sim/model"},
            "api": {"baseUrl": "simulated", "maxConcurrency": 4, "stream": False},
            "budget": {"maxUSD": "1.00"}, "output": {"uri": f"file://{tmp_path}/out"}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    env = {**os.environ, "EYRIE_NO_RAY": "1", "COLUMNS": "200"}
    mine = tmp_path / "my-audit"
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", str(tmp_path / "spec.yaml"), "--from",
                        str(path), "--rerun", "4", "--accept-other-model", "--output", str(mine)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert f"written to file://{mine}/audit.json" in r.stderr
    own = open_store(str(mine))
    doc = stored.read_audit(own)
    assert doc["sent"] == 4 and Decimal(doc["spentUSD"]) > 0 and stored.audit_spend(own) == Decimal(doc["spentUSD"])
    assert not (tmp_path / "out").exists()  # the dataset's output: untouched
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "run", str(tmp_path / "spec.yaml"), "--no-progress"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    out = open_store(f"file://{tmp_path}/out")
    prog = json.loads(out.get(layout.PROGRESS))
    paid = sum(Decimal(x["costUSD"]) for x in records.iter_records(out))
    assert Decimal(prog["auditUSD"]) == 0 and Decimal(prog["spentUSD"]) == paid
    shown = r.stdout + r.stderr
    assert not out.exists(layout.AUDIT) and "answers.jsonl" not in shown
    assert "audit verdict" not in shown and "audit spend" not in shown, shown


def test_tools_pasted_after_a_lead_in_are_judged_not_counted_as_undeclared(tmp_path):
    """The issue's file: tools pasted into the system prompt as a plain JSON list (OpenAI objects) or
    bare objects in the first user message; before, every row was "without declared functions"."""
    pasted = "You have access to these tools: " + json.dumps(TOOLS)
    bare = "Functions:\n" + "\n".join(json.dumps(t["function"]) for t in TOOLS)
    rows = [{"request": {"messages": [{"role": "system", "content": pasted},
                                      {"role": "user", "content": f"case={c} Weather in Paris?"}]},
             "response": chat_completion(text_message(c))} for c in CASES_IN_ORDER]
    rows += [{"messages": [{"role": "user", "content": f"{bare}\n\ncase={c} Weather in Paris?"}],
              "response": text_message(c), "usage": {"prompt_tokens": 9, "completion_tokens": 9}}
             for c in CASES_IN_ORDER]
    path = tmp_path / "pasted.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = run_audit_from(path, None, RunContext("t"), None)
    f = doc["from"]
    assert f["noTools"] == 0 and f["unparsableRows"] == 0
    assert f["declarationShapes"] == {"pasted.jsonl": {"lead-in-json": 2 * len(CASES_IN_ORDER)}}
    t = doc["figures"]["modes"]["text"]
    assert t["answers"] == 2 * len(CASES_IN_ORDER)
    assert {c: x["count"] for c, x in t["formats"].items()} == dict(Counter(CATEGORY[c] for c in CASES_IN_ORDER
                                                                            for _ in range(2)))
    assert f"pasted.jsonl: JSON after a lead-in {2 * len(CASES_IN_ORDER)}." in doc["verdict"]
