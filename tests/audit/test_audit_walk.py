"""Issue 45's walk through `eyrie audit --from`: a text-mode dataset with Kimi K2.5's call markers in
the content (tests/audit_walk.py), counted as the engineer who paid for it needs: a cut call counts
for the function it names, why the calls are invalid, what regenerating would cost and what to do,
the shapes training data is kept in, and a paired difference said as such."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parents[1]))
from audit_walk import EXPECT, MODEL, write

from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import audit as stored
from eyrie.jobs.contract.money import dollars
from eyrie.jobs.generate.audit.from_recorded import FromOptions, run_audit_from
from eyrie.jobs.generate.budget.pricing import Pricing
from eyrie.jobs.reconstruct import kimi_facts as kimi
from eyrie.jobs.store import open_store


def audit(path: Path, dg=None) -> dict:
    return run_audit_from(path, dg, RunContext("t"), None, FromOptions(output=str(path.parent / "audit-out")))


def test_a_cut_off_call_counts_for_its_function_as_never_closed(tmp_path):
    doc = audit(write(tmp_path))
    t = doc["figures"]["modes"]["text"]
    assert (t["answers"], t["calls"]) == (EXPECT["answers"], EXPECT["calls"])
    assert round(t["hallucinatedRate"]["value"] * t["calls"]) == EXPECT["undeclared"] == 1
    weather = doc["figures"]["byTool"]["get_weather"]["text"]
    assert weather["declaredIn"] == EXPECT["declaredIn"]["get_weather"]
    assert round(weather["callRate"]["value"] * weather["declaredIn"]) == EXPECT["called"]["get_weather"]
    assert doc["figures"]["byTool"]["(not declared)"]["text"]["calls"] == EXPECT["undeclared"]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env={**os.environ, "COLUMNS": "200"})


def spec(tmp: Path) -> Path:
    doc = {"sources": [{"name": "unused", "uri": str(tmp / "unused.jsonl")}], "target": {"model": MODEL},
           "api": {"baseUrl": "http://127.0.0.1:9/v1"},  # never called: nothing is sent without --rerun
           "budget": {"maxUSD": "5.00", "pricing": {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}},
           "output": {"uri": f"file://{tmp}/out"}}
    p = tmp / "spec.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


@pytest.mark.integration
def test_why_invalid_is_counted_by_reason_on_screen(tmp_path):
    path = write(tmp_path)
    doc = audit(path)
    assert doc["figures"]["modes"]["text"]["invalidReasons"] == EXPECT["reasons"]
    r = cli("--from", str(path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    for reason, n in EXPECT["reasons"].items():
        assert f"{reason} {n}" in out, (reason, out)


def test_a_renamed_argument_is_named_beside_the_missing_one(tmp_path):
    path = write(tmp_path)
    audit(path)
    rows = stored.read_rows(open_store(str(tmp_path / "audit-out")))
    missing = [r["why"][0] for r in rows if r.get("why") and "is a required property" in r["why"][0]]
    assert len(missing) == EXPECT["reasons"]["missing required"] == 4  # two renamed original_price, two left one out
    renamed = [w for w in missing if "'original_price' is a required property" in w]
    assert len(renamed) == 2 and all("'price'" in w for w in renamed), renamed
    assert not any("'price'" in w for w in missing if w not in renamed)


@pytest.mark.integration
def test_what_regenerating_costs_the_model_and_what_to_do(tmp_path):
    path = write(tmp_path)
    r = cli("--from", str(path), cwd=tmp_path)  # no spec: its prices are what an estimate needs
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert f"model {MODEL}" in out and "model None" not in out
    assert "regenerat" in out and "budget.pricing" in out
    assert "What to do:" in out and "--rerun" in out
    r = cli(str(spec(tmp_path)), "--from", str(path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    prompt, completion = EXPECT["tokens"]
    cost = Pricing(Decimal("0.60"), Decimal("2.50")).cost(prompt, completion)
    assert f"{dollars(cost)}" in out and f"{EXPECT['answers']} rows" in out, out
    assert "What to do:" in out


def test_a_paired_difference_says_it_is_over_the_prompts_answered_both_ways():
    """30 text answers, 20 of them also answered structured: the rates are over 30 and 20, their
    difference over the 20 prompts answered both ways, and the screen says so."""
    from rich.console import Console

    from eyrie.jobs.generate.audit import stats as st
    from eyrie.jobs.report.terminal import audit_renderables

    def fact(sid: str, mode: str, called: bool) -> st.AnswerFact:
        calls = (st.CallFact("get_weather", True, "kimi" if mode == "text" else "structured", 1, True),) if called \
            else ()
        return st.AnswerFact(sid, "src", mode, "ok", frozenset({"get_weather"}), calls)

    facts = [fact(f"s{i}", "text", i % 3 != 0) for i in range(30)] + \
        [fact(f"s{i}", "structured", i % 4 != 0) for i in range(20)]
    figs = st.summarize(facts, {"prompts": 30, "declaredPrompts": 30})
    assert figs["paired"]["prompts"] == 20
    verdict = st.verdict(figs)
    assert "of 30 prompts" in verdict and "of 20 structured" in verdict
    diff = st.fmt_diff(figs["paired"]["difference"]["callRate"], "rate")
    assert f"on the 20 prompts answered both ways, structured minus text: {diff}" in verdict, verdict
    console = Console(width=160, record=True)
    for r in audit_renderables({"figures": figs, "verdict": verdict, "samples": 30, "model": "m"}):
        console.print(r)
    header = [line.split("┃")[-2].strip() for line in console.export_text().splitlines()
              if line.startswith("┃") and line.count("┃") >= 5]  # the main table's header, its last column
    assert " ".join(x for x in header[:3]) == "structured - text on the 20 prompts answered both ways", header


def test_training_shapes_whose_last_turn_is_the_answer_are_read(tmp_path):
    """OpenAI fine-tuning `messages` and ShareGPT/SpecForge `conversations` ending in the assistant's
    turn: that turn is the answer, the turns before it the prompt; the same figures as the glaive rows."""
    def figures(doc: dict) -> tuple:
        t = doc["figures"]["modes"]["text"]
        return (t["answers"], t["calls"], t["invalidReasons"], t["callRate"], doc["figures"]["byTool"],
                doc["from"]["badRows"])

    want = figures(audit(write(tmp_path, "glaive")))
    assert want[0] == EXPECT["answers"]
    for shape in ("openai", "sharegpt"):
        out = tmp_path / shape
        out.mkdir()
        assert figures(audit(write(out, shape))) == want, shape
    # SpecForge's own rows: `conversations` of role/content messages
    rows = [json.loads(line) for line in write(tmp_path, "openai", "ft.jsonl").read_text().splitlines()[:-1]]
    specforge = tmp_path / "specforge"
    specforge.mkdir()
    (specforge / "sf.jsonl").write_text("".join(json.dumps({"conversations": r["messages"]}) + "\n" for r in rows))
    doc = audit(specforge / "sf.jsonl")
    t = doc["figures"]["modes"]["text"]
    assert (t["answers"], t["calls"], t["invalidReasons"]) == want[:3]


@pytest.mark.integration
def test_rerun_sends_earlier_calls_structured_not_as_text(tmp_path):
    """--rerun of multi-turn text rows in structured mode: the earlier assistant turn's call goes as
    `tool_calls`, its result as a `tool` message answering it; never the native markers as text
    beside `tools`, nor the result as a user turn."""
    from fake_openrouter import scripted

    from eyrie.jobs.spec import load_spec

    path = write(tmp_path, "openai")
    (tmp_path / "unused.jsonl").write_text("")  # the spec's source: preflight checks it is there
    with scripted().running() as fake:
        p = spec(tmp_path)
        doc = yaml.safe_load(p.read_text())
        doc["api"] = {"baseUrl": fake.base_url, "maxConcurrency": 4, "stream": False, "maxRetries": 0}
        p.write_text(yaml.safe_dump(doc))
        opts = FromOptions(rerun=EXPECT["answers"], output=str(tmp_path / "audit-out"))
        got = run_audit_from(path, load_spec(p), RunContext("t"), fake.base_url, opts)
        bodies = list(fake.bodies())
    assert got["sent"] == len(bodies) == EXPECT["answers"]
    multi = [b for b in bodies if any(m["role"] == "assistant" for m in b["messages"])]
    assert len(multi) == 2
    for b in bodies:
        assert b.get("tools")
        for m in b["messages"]:
            assert kimi.CALL_BEGIN not in str(m.get("content")) and kimi.SECTION_BEGIN not in str(m.get("content"))
            assert not str(m.get("content") or "").startswith("FUNCTION RESPONSE"), m
    for b in multi:
        roles = [m["role"] for m in b["messages"]]
        assert roles[-4:] == ["user", "assistant", "tool", "user"], roles
        asked, answered = b["messages"][-3], b["messages"][-2]
        (c,) = asked["tool_calls"]
        assert c["function"]["name"] == "get_weather" and json.loads(c["function"]["arguments"]) == {"city": "Rome"}
        assert answered["tool_call_id"] == c["id"] and answered["content"] == '{"temperature": 21}'


def test_a_history_that_cannot_be_sent_structured_is_said_so():
    from audit_walk import call

    from eyrie.jobs.generate.audit.recorded import structured_history
    from eyrie.jobs.sources import Prompt

    names = frozenset({"get_weather"})

    def prompt(*turns: tuple[str, str]) -> Prompt:
        return Prompt("f", 0, [{"role": "system", "content": "s"}, *({"role": r, "content": c} for r, c in turns)],
                      None, "openai")

    cut = prompt(("user", "a"), ("assistant", call("get_weather", '{"city": "R', closed=False)),
                 ("user", "FUNCTION RESPONSE: {}"), ("user", "b"))
    assert "never closed" in structured_history(cut, names)
    unanswered = prompt(("user", "a"), ("assistant", call("get_weather", {"city": "Rome"})), ("user", "b"))
    assert "never answered" in structured_history(unanswered, names)
    plain = prompt(("user", "a"), ("assistant", "hello"), ("user", "b"))
    assert structured_history(plain, names) is plain


def test_a_sharegpt_row_ending_in_a_function_call_turn_has_that_call_as_its_answer():
    """glaive's ShareGPT form: the answer is a `function_call` turn holding the call as JSON (with the
    functions in `tools`): a structured answer whose call is checked like the provider's `tool_calls`."""
    from eyrie.jobs.generate.audit.recorded import RecordedRow, parse_row

    tools = json.dumps([{"type": "function", "function": {
        "name": "get_weather", "description": "w", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
    row = {"conversations": [{"from": "human", "value": "Weather in Paris?"},
                             {"from": "function_call", "value": json.dumps({"name": "get_weather",
                                                                            "arguments": {"town": "Paris"}})}],
           "tools": tools}
    got = parse_row(row, "f", 1)
    assert isinstance(got, RecordedRow) and got.mode == "structured", got
    (c,) = got.response["tool_calls"]
    assert c["function"]["name"] == "get_weather" and json.loads(c["function"]["arguments"]) == {"town": "Paris"}
