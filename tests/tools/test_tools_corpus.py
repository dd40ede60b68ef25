"""A corpus of real-world-shaped rows (glaive, hermes-function-calling, xlam) through sources, prepare,
call validation, leaks and the gate, with exact counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eyrie.jobs.generate.audit import stats
from eyrie.jobs.intervals import wilson
from eyrie.jobs.sources import BadRow, Prompt, iter_source
from eyrie.jobs.spec import GateSpec, SourceSpec
from eyrie.jobs.tools.checks import check_response, policy
from eyrie.jobs.tools.declarations import Prepared, Rejected, prepare_prompt
from eyrie.jobs.tools.gate import ToolGate

CORPUS = Path(__file__).parents[1] / "data" / "tools"
SOURCES = [("glaive", "glaive"), ("hermes", "sharegpt"), ("xlam", "openai")]

# Arguments a correct model would send for each corpus tool.
VALID = {
    "get_news_headlines": {"country": "France"},
    "get_random_quote": {},
    "create_order": {"customer": {"name": "Jane Doe", "email": "jane@example.com",
                                  "address": {"street": "1 Main St", "city": "Springfield", "zip": "12345"}},
                     "items": [{"product_id": "SKU-123", "quantity": 2}], "shipping": "express"},
    "calculate_loan_payment": {"principal": 50000, "interest_rate": 5, "loan_term": 10},
    "search_recipes": {"ingredients": ["tomato", "basil"], "diet": "vegan"},
    "get_camera_live_feed": {"camera_id": "cam-42", "stream_quality": "1080p"},
    "get_current_weather": {"location": "Paris, France", "unit": "celsius"},
    "schedule_meetings": {"meetings": [{"title": "Kickoff", "start": "2024-06-03T09:00:00Z",
                                        "attendees": [{"email": "ana@example.com"},
                                                      {"email": "bo@example.com", "optional": True}]}]},
    "search_flights": {"origin": "JFK", "destination": "LAX", "date": "2024-06-01", "cabin": "business"},
}
# Mistakes models make, each exactly one invalid call.
MISTAKES = {
    "create_order": {**VALID["create_order"], "items": [{"product_id": "SKU-123", "quantity": 0}]},
    "calculate_loan_payment": {"principal": "50000", "interest_rate": 5, "loan_term": 10},
    "search_flights": {**VALID["search_flights"], "origin": "jfk"},
    "schedule_meetings": {"meetings": [{"title": "Retro", "start": "2024-06-07T16:00:00Z",
                                        "attendees": [{"mail": "ana@example.com"}]}]},
    "get_camera_live_feed": {"camera_id": "cam-42", "stream_quality": "8k"},
}


def load(mode: str) -> dict[str, list[Prepared | Rejected | BadRow]]:
    out: dict[str, list[Prepared | Rejected | BadRow]] = {}
    for name, fmt in SOURCES:
        items = iter_source(SourceSpec(name=name, uri=str(CORPUS / f"{name}.jsonl"), format=fmt))
        out[name] = [prepare_prompt(i, mode) if isinstance(i, Prompt) else i for i in items]  # type: ignore[arg-type]
    return out


def shape(item: Prepared | Rejected | BadRow) -> object:
    if isinstance(item, Prepared):
        return [t["function"]["name"] for t in item.declared_tools]
    return item


def test_corpus_declarations_exactly():
    got = {k: [shape(i) for i in v] for k, v in load("structured").items()}
    assert got == {
        "glaive": [
            ["get_news_headlines"],
            ["get_news_headlines", "get_random_quote"],
            [],
            ["create_order", "calculate_loan_payment"],
            ["calculate_loan_payment", "get_random_quote"],
            Rejected("after 'Use them if required -': declaration 1 is not valid JSON: Expecting property name "
                     "enclosed in double quotes (line 9, column 9 of the system text)"),
            ["search_recipes"],
            Rejected("tool 'get_news_headlines' is declared twice"),
            Rejected("tool 'convert_currency': parameters are not a valid JSON Schema (Draft 2020-12): 'float' is "
                     "not valid under any of the given schemas at /properties/amount/type"),
            ["calculate_loan_payment"],
            BadRow("glaive", 10, "no USER turn in 'chat'"),
            ["get_random_quote"],
        ],
        "hermes": [
            ["get_camera_live_feed"],
            ["get_current_weather", "schedule_meetings"],
            [],
            Rejected("<tools> block: declaration 1 is not valid JSON: Expecting property name enclosed in double "
                     "quotes (line 3, column 3 of the system text) (and it is not a Python literal either)"),
        ],
        "xlam": [
            ["search_flights", "calculate_loan_payment"],
            ["get_current_weather", "search_flights"],
            Rejected("tool 'live_giveaways_by_type': parameters must be an object schema (\"type\": \"object\"), "
                     "got a JSON object"),
            ["get_random_quote"],
            Rejected("tool name 'run tool!' (declaration 1) must match ^[a-zA-Z0-9_-]{1,64}$"),
            [],
        ],
    }


@pytest.mark.parametrize("mode", ["structured", "text"])
def test_both_modes_declare_the_same_tools_and_only_structured_sends_them(mode):
    prepared = [i for v in load(mode).values() for i in v if isinstance(i, Prepared)]
    declared = [p for p in prepared if p.declared]
    assert (len(prepared), len(declared)) == (15, 12)
    assert sum(len(p.declared_tools) for p in declared) == 18
    if mode == "structured":
        assert all(p.tools == p.declared_tools for p in declared)
        # no declaration text reaches the model twice (Hermes' prose about <tools> tags stays)
        texts = [m["content"] for p in prepared for m in p.messages if isinstance(m.get("content"), str)]
        assert not any("Use them if required -" in t or "parameters" in t for t in texts)
    else:
        assert all(p.tools is None for p in prepared)
        # 7 glaive rows as they were, 3 xlam rows whose structured tools were rendered as text
        assert sum("Use them if required -" in p.messages[0]["content"] for p in declared) == 10
        assert sum("<tools>" in p.messages[0]["content"] for p in declared) == 2


def calls_for(p: Prepared, mistakes: bool) -> list[dict]:
    """Parallel calls to every declared tool; with `mistakes`, the known-bad arguments where there are some."""
    out = []
    for i, t in enumerate(p.declared_tools):
        name = t["function"]["name"]
        args = MISTAKES[name] if mistakes and name in MISTAKES else VALID[name]
        out.append({"id": f"functions.{name}:{i}", "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)}})
    return out


def test_scripted_answers_exact_counts_policy_and_metrics():
    prepared = [i for v in load("structured").values() for i in v if isinstance(i, Prepared)]
    gate = ToolGate(GateSpec(canary_samples=5, min_tool_call_rate=0.5, max_invalid_call_rate=0.5, max_leak_rate=0.2))
    checks, stops = [], []
    for n, p in enumerate(prepared):
        response = {"content": None, "reasoning": "The user wants a tool.",
                    "tool_calls": calls_for(p, mistakes=n % 2 == 1)} if p.declared else \
                   {"content": "Here you go.", "reasoning": None}
        if n == 14:
            response["content"] = "<|tool_calls_section_begin|>"  # one provider slip
        checks.append(check_response(p, response))
        if (stop := gate.observe_check(checks[-1])) is not None:
            stops.append(stop)
    # answers 3 (glaive create_order + loan), 9 (hermes schedule) and 11 (xlam flights + loan) hold mistakes
    assert [c.invalid_calls for c in checks] == [0, 0, 0, 2, 0, 0, 0, 0, 0, 1, 0, 2, 0, 0, 0]
    assert sum(len(c.calls) for c in checks) == 18 and sum(c.leaked for c in checks) == 1
    assert [policy(c, "drop") for c in checks].count("drop") == 4
    assert [policy(c, "flag") for c in checks].count("flag") == 4
    assert stops == []
    m = gate.metrics().dump()
    assert {k: m[k] for k in ("declaredPrompts", "callRate", "invalidCalls", "leaks", "answers", "calls")} == \
        {"declaredPrompts": 12, "callRate": 1.0, "invalidCalls": 5, "leaks": 1, "answers": 15, "calls": 18}
    assert m["perTool"] == {
        "calculate_loan_payment": {"calls": 4, "invalid": 2}, "create_order": {"calls": 1, "invalid": 1},
        "get_camera_live_feed": {"calls": 1, "invalid": 0}, "get_current_weather": {"calls": 2, "invalid": 0},
        "get_news_headlines": {"calls": 2, "invalid": 0}, "get_random_quote": {"calls": 4, "invalid": 0},
        "schedule_meetings": {"calls": 1, "invalid": 1}, "search_flights": {"calls": 2, "invalid": 1},
        "search_recipes": {"calls": 1, "invalid": 0}}
    bad = [e for c in checks for v in c.calls for e in v.errors]
    assert bad == [{"path": "/items/0/quantity", "message": "0 is less than the minimum of 1"},
                   {"path": "/principal", "message": "'50000' is not of type 'number'"},
                   {"path": "/meetings/0/attendees/0",  # the renamed argument named beside the missing one
                    "message": "'email' is a required property (the call has 'mail', which the schema does not "
                               "declare)"},
                   {"path": "/origin", "message": "'jfk' does not match '^[A-Z]{3}$'"},
                   {"path": "/principal", "message": "'50000' is not of type 'number'"}]


def kimi_section(name: str, args: dict) -> str:
    return (f"<|tool_calls_section_begin|><|tool_call_begin|>functions.{name}:0<|tool_call_argument_begin|>"
            f"{json.dumps(args)}<|tool_call_end|><|tool_calls_section_end|>")


def test_text_mode_reads_native_markers_as_calls_not_leaks():
    """Tools described as text: a Kimi section in the content is the model's call, validated like a
    structured one and counted in the call rate; never a leak. Structured, the same text is a leak."""
    prepared = [i for v in load("text").values() for i in v if isinstance(i, Prepared)]
    gate = ToolGate(GateSpec(canary_samples=10, min_tool_call_rate=0.5, max_invalid_call_rate=0.2, max_leak_rate=0.0))
    checks, stops = [], []
    for n, p in enumerate(prepared, 1):
        name = p.declared_tools[0]["function"]["name"] if p.declared else ""
        content = "Sure." if not p.declared else kimi_section("x", {}) if n == 4 else kimi_section(name, VALID[name])
        checks.append(check_response(p, {"content": content}))
        if (s := gate.observe_check(checks[-1])) is not None:
            stops.append(s)
    assert stops == []
    assert [len(c.calls) for c in checks] == [1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 0]
    assert [c.invalid_calls for c in checks].count(1) == 1 and checks[3].calls[0].errors == [
        {"path": "", "message": "tool 'x' was not declared"}]
    assert {v.format for c in checks for v in c.calls} == {"kimi"}
    assert checks[0].calls[0].arguments == VALID["get_news_headlines"]
    assert [policy(c, "drop") for c in checks].count("drop") == 1
    facts = [stats.fact_from_record({"status": "ok", "toolsMode": "text", "checks": c.to_record(),
                                           "costUSD": "0.001", "usage": {"completion_tokens": 40}},
                                          [t["function"]["name"] for t in p.declared_tools])
             for p, c in zip(prepared, checks, strict=True) if p.declared]
    column = stats.summarize(facts)["modes"]["text"]  # the audit's column of these answers
    assert (column["answers"], column["calls"], column["callRate"]["value"]) == (12, 12, 1.0)
    assert column["invalidRate"] == column["hallucinatedRate"] == wilson(1, 12).to_dict()
    assert column["leakRate"]["value"] == 0 and column["outputTokens"]["value"] == 40 and column["costUSD"] == "0.012"
    assert column["formats"] == {"kimi": {"count": 12, **wilson(12, 12).to_dict()}}
    structured = next(p for p in load("structured")["glaive"] if isinstance(p, Prepared))
    leak = check_response(structured, {"content": kimi_section("get_news_headlines", {"country": "France"})})
    assert (leak.called, leak.leaked, policy(leak, "drop")) == (False, True, "drop")
