"""Tool declarations as users paste them: a JSON list or JSON objects after a lead-in, OpenAI-style
or bare objects, in a system or the first user message, beside glaive's and Hermes' shapes; the
shape each prompt used, counted per source by the audit; the documented examples, each read as the
shape it names; the limits that keep hostile text cheap."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from eyrie.jobs.generate.audit.run import pick_prompts
from eyrie.jobs.sources import Prompt
from eyrie.jobs.spec import load_spec
from eyrie.jobs.tools.declarations import (
    DeclarationError,
    DeclarationShape,
    Prepared,
    Rejected,
    ToolLimits,
    may_declare,
    prepare_prompt,
    read_declarations,
)

WEATHER = {"name": "get_weather", "description": "Current weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}
OPENAI = [{"type": "function", "function": WEATHER}, {"type": "function", "function": TIME}]
NAMES = ["get_weather", "get_time"]
DOC = Path(__file__).resolve().parents[2] / "docs" / "operating.md"


def names(p: Prepared | Rejected) -> list[str]:
    assert isinstance(p, Prepared), p
    return [t["function"]["name"] for t in p.declared_tools]


# (what a user pasted, what the text reads as once the declarations left it)
LEAD_INS = {
    "openai list after a colon": ("You are a weather bot. You have access to these tools: " + json.dumps(OPENAI),
                                  "You are a weather bot. You have access to these tools."),
    "bare objects one a line": ("Available functions:\n" + json.dumps(WEATHER) + "\n" + json.dumps(TIME)
                                + "\n\nAnswer briefly.", "Available functions.\n\nAnswer briefly."),
    "fenced list after a line break": ("Tools\n```json\n" + json.dumps([WEATHER, TIME], indent=2) + "\n```\nBe kind.",
                                       "Tools.\n\nBe kind."),
    "openai objects, indented": ("Here are the functions you may call:\n\n" + json.dumps(OPENAI[0], indent=4) + "\n"
                                 + json.dumps(OPENAI[1], indent=4),
                                 "Here are the functions you may call."),
}


@pytest.mark.parametrize("case", sorted(LEAD_INS))
def test_a_json_list_or_objects_after_a_lead_in_are_declarations(case):
    text, rest = LEAD_INS[case]
    got = read_declarations(text)
    assert [d.get("name") or d["function"]["name"] for d in got.found] == NAMES
    assert got.rest == rest and got.shapes == (DeclarationShape.LEAD_IN,)


@pytest.mark.parametrize("role", ["system", "user"])
def test_structured_mode_moves_them_out_of_a_system_or_the_first_user_message(role):
    text, rest = LEAD_INS["openai list after a colon"]
    question = "Weather in Lagos?"
    msgs = ([{"role": "system", "content": text}, {"role": "user", "content": question}] if role == "system"
            else [{"role": "user", "content": f"{text}\n{question}"}])
    p = prepare_prompt(Prompt("s", 0, msgs, None, "openai"), "structured")
    assert names(p) == NAMES and p.tools == p.declared_tools and p.shapes == (DeclarationShape.LEAD_IN,)
    sent = [m["content"] for m in p.messages]
    assert sent == ([rest, question] if role == "system" else [f"{rest}\n\n{question}"])
    t = prepare_prompt(Prompt("s", 0, msgs, None, "openai"), "text")  # text mode: sent as it was
    assert names(t) == NAMES and t.tools is None and t.messages == msgs


def test_only_the_first_user_message_is_read_and_one_holding_only_tools_is_refused():
    text = "Tools: " + json.dumps(OPENAI)
    later = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
             {"role": "user", "content": text}]
    assert prepare_prompt(Prompt("s", 0, later, None, "openai"), "structured").declared_tools == []
    bare = "Use them if required -\n" + json.dumps(WEATHER)  # nothing but the declarations
    only = prepare_prompt(Prompt("s", 0, [{"role": "user", "content": bare}], None, "openai"), "structured")
    assert isinstance(only, Rejected) and "holds only tool declarations" in only.reason


def test_json_after_a_lead_in_that_is_not_a_declaration_stays_prose():
    for text in ('Use the tools wisely. Example input: {"city": "Paris"}',
                 "Functions:\n[1, 2, 3]",
                 'You are provided with function signatures within <tools></tools> XML tags:\n{"name": "x", '
                 '"parameters": {}}',  # a bracket between the word and the colon: no lead-in
                 'Here is the data:\n[{"name": "Ada", "parameters": {}}]',  # no tools/functions word
                 "Tools: see the manual."):
        assert read_declarations(text).found == [] and read_declarations(text).rest == text, text


def test_broken_json_naming_a_declaration_is_unparsable_not_absent():
    text = 'You have access to these tools: [{"name": "get_weather", "parameters": {"type": "object",}}]'
    with pytest.raises(DeclarationError, match="after a lead-in: declaration 1 is not valid JSON"):
        read_declarations(text)
    p = prepare_prompt(Prompt("s", 0, [{"role": "system", "content": text}, {"role": "user", "content": "?"}],
                              None, "openai"), "structured")
    assert isinstance(p, Rejected)
    # a declaration-shaped first item makes the rest declarations too: a bad one is named
    mixed = "Tools: " + json.dumps([WEATHER, {"name": "bad name!", "parameters": {}}])
    p = prepare_prompt(Prompt("s", 0, [{"role": "system", "content": mixed}, {"role": "user", "content": "?"}],
                              None, "openai"), "structured")
    assert isinstance(p, Rejected) and "bad name!" in p.reason


def test_every_shape_reports_itself_and_they_combine():
    glaive = "You are helpful. Use them if required -\n" + json.dumps(WEATHER)
    hermes = "Signatures are within <tools></tools> XML tags:\n<tools>\n" + json.dumps([OPENAI[1]]) + "\n</tools>"
    msgs = [{"role": "system", "content": glaive}, {"role": "system", "content": hermes},
            {"role": "user", "content": "What time is it?"}]
    p = prepare_prompt(Prompt("s", 0, msgs, None, "openai"), "structured")
    assert names(p) == NAMES and p.shapes == (DeclarationShape.GLAIVE, DeclarationShape.TOOLS_TAG)
    row = prepare_prompt(Prompt("s", 0, msgs[2:], OPENAI, "openai"), "structured")
    assert row.shapes == (DeclarationShape.TOOLS_FIELD,)
    assert prepare_prompt(Prompt("s", 0, msgs[2:], None, "openai"), "structured").shapes == ()


def test_the_documented_examples_read_as_the_shape_they_name():
    """docs/operating.md's table of accepted shapes: each example, its `{...}` filled in, is that shape."""
    text = DOC.read_text()
    section = text[text.index("\n## Tool declarations eyrie reads\n"):text.index("\n## Tools as text")]
    rows = re.findall(r"^\| `([a-z-]+)` \| `(.+?)`(?: \(|,| \|)", section, flags=re.M)
    assert {s for s, _ in rows} == {str(s) for s in DeclarationShape}
    for shape, example in rows:
        filled = example.replace('"parameters": {...}', '"parameters": {"type": "object"}') \
            .replace('"description": "..."', '"description": "d"').replace("\\n", "\n")
        if shape == "tools-field":
            row = json.loads(filled.replace("[...]", '[{"role": "user", "content": "?"}]'))
            p = prepare_prompt(Prompt("s", 0, row["messages"], row["tools"], "openai"), "structured")
        else:
            p = prepare_prompt(Prompt("s", 0, [{"role": "system", "content": filled},
                                               {"role": "user", "content": "?"}], None, "openai"), "structured")
        assert isinstance(p, Prepared) and p.shapes == (DeclarationShape(shape),), (shape, p)
        assert names(p) == ["get_weather"]


def test_lead_in_limits_are_explicit():
    text = "You may call these tools" + " (see below)" * 20 + ": " + json.dumps([WEATHER])
    assert read_declarations(text).found == []  # the word is 240 characters before the colon
    assert read_declarations(text, ToolLimits(max_lead_in_chars=400)).found == [WEATHER]
    decoys = "Tools: [1]\n" * 3 + "Tools: " + json.dumps([WEATHER])
    assert read_declarations(decoys, ToolLimits(max_lead_ins=3)).found == []
    assert read_declarations(decoys, ToolLimits(max_lead_ins=4)).found == [WEATHER]
    big = "Tools: " + json.dumps([{**WEATHER, "description": "x" * 2000}])
    with pytest.raises(DeclarationError, match="over the 1000 limit"):
        read_declarations(big, ToolLimits(max_declaration_bytes=1000))


def test_hostile_texts_are_read_in_linear_time():
    t0 = time.perf_counter()
    for text in ("functions " * 30_000, "tools:\n" + "[" * 100_000, "Tools: [" * 40_000, ":-[{" * 75_000,
                 "tools:" + "\n" * 300_000, ("tool " * 30 + "\n") * 2_000, "Tools: {\"a\": 1} " * 20_000):
        assert read_declarations(text).found == []
        may_declare(text)
    assert time.perf_counter() - t0 < 3


def test_may_declare_is_never_false_where_declarations_are_found():
    for text, _rest in LEAD_INS.values():
        assert may_declare(text)
    assert not may_declare("What is the weather in Lagos? Use Celsius.")


def test_the_audit_counts_each_sources_prompts_by_shape(tmp_path):
    lead = [{"messages": [{"role": "system", "content": "You have access to these tools: " + json.dumps(OPENAI)},
                          {"role": "user", "content": f"Weather in city {i}?"}]} for i in range(3)]
    plain = [{"messages": [{"role": "user", "content": "hello"}]}]
    glaive = [{"system": "SYSTEM: You are helpful. Use them if required -\n" + json.dumps(WEATHER),
               "chat": f"USER: weather {i}?\n\n\nASSISTANT: ok"} for i in range(2)]
    for name, rows in (("pasted", lead + plain), ("glaive", glaive)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"sources": [{"name": "pasted", "uri": str(tmp_path / "pasted.jsonl")},
                        {"name": "glaive", "uri": str(tmp_path / "glaive.jsonl"), "format": "glaive"}],
            "target": {"model": "m"}, "api": {"baseUrl": "http://127.0.0.1:9/v1"},
            "budget": {"maxUSD": "1", "pricing": {"inputPerMillion": "1", "outputPerMillion": "1"}},
            "output": {"uri": str(tmp_path / "out")}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    picked = pick_prompts(load_spec(tmp_path / "spec.yaml"), 10)
    by = picked.population["bySource"]
    assert by["pasted"]["declarationShapes"] == {"lead-in-json": 3, "none": 1}
    assert by["glaive"]["declarationShapes"] == {"glaive": 2}
    assert by["pasted"]["declaredPrompts"] == 3 and len(picked.prompts) == 5
