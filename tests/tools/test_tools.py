"""Tool semantics per sample: declarations, prepare_prompt, call validation, leaks, policy."""

from __future__ import annotations

import json
import time

import orjson
import pytest

from eyrie.jobs.sources import Prompt
from eyrie.jobs.tools import declarations
from eyrie.jobs.tools.checks import ResponseCheck, check_response, policy
from eyrie.jobs.tools.declarations import (
    EMPTY_PARAMETERS,
    TEXT_PREAMBLE,
    DeclarationError,
    DeclarationShape,
    Prepared,
    Rejected,
    ToolLimits,
    normalize_tools,
    parse_text_declarations,
    prepare_prompt,
    render_text_declarations,
)
from eyrie.jobs.tools.leaks import scan_leaks
from eyrie.jobs.tools.validation import ToolValidator

GLAIVE_HEAD = "You are a helpful assistant with access to the following functions. Use them if required -\n"
NEWS = {"name": "get_news_headlines", "description": "Get the latest news headlines",
        "parameters": {"type": "object", "properties": {"country": {"type": "string"}},
                       "required": ["country"]}}
QUOTE = {"name": "get_random_quote", "description": "Get a random quote", "parameters": {}}
ORDER = {"name": "create_order", "description": "Create an order", "parameters": {
    "type": "object",
    "properties": {
        "customer": {"type": "object", "properties": {
            "name": {"type": "string"},
            "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
            "required": ["name", "address"]},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "product_id": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1}},
            "required": ["product_id", "quantity"], "additionalProperties": False}},
        "shipping": {"type": "string", "enum": ["standard", "express"]},
        "note": {"type": "string"}},
    "required": ["customer", "items", "shipping"],
    "additionalProperties": False}}


def wrap(fn: dict) -> dict:
    return {"type": "function", "function": fn}


def glaive_prompt(system: str, user: str = "Hi") -> Prompt:
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return Prompt("g", 0, msgs, None, "glaive")


def call(name: str, arguments: str | dict, id_: str = "c") -> dict:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


# ------------------------------------------------------------------------------- declarations


def test_parse_single_glaive_declaration_keeps_the_sentence_before_the_marker():
    tools, rest = parse_text_declarations(GLAIVE_HEAD + json.dumps(NEWS, indent=4) + "\n")
    assert tools == [NEWS]
    assert rest == "You are a helpful assistant with access to the following functions."


def test_parse_multiple_declarations_separated_by_blank_lines_and_trailing_text():
    text = GLAIVE_HEAD + json.dumps(NEWS, indent=4) + "\n\n" + json.dumps(QUOTE) + "\n\nAnswer briefly.\n"
    tools, rest = parse_text_declarations(text)
    assert tools == [NEWS, QUOTE]
    assert rest == "You are a helpful assistant with access to the following functions.\n\nAnswer briefly."


def test_parse_list_form_and_openai_wrapped_form():
    tools, rest = parse_text_declarations(GLAIVE_HEAD + json.dumps([NEWS, wrap(QUOTE)]))
    assert tools == [NEWS, wrap(QUOTE)]
    assert normalize_tools(tools) == [wrap(NEWS), wrap({**QUOTE, "parameters": EMPTY_PARAMETERS})]
    assert rest == "You are a helpful assistant with access to the following functions."


def test_parse_hermes_tools_block_json_and_python_literal():
    head = "You are a function calling AI model. Signatures are within <tools> </tools> XML tags.\n"
    for block in (json.dumps([wrap(NEWS)]), repr([wrap(NEWS)])):
        tools, rest = parse_text_declarations(f"{head}<tools>\n{block}\n</tools>\nCall them wisely.")
        assert tools == [wrap(NEWS)]
        assert rest == head.rstrip() + "\n\nCall them wisely."


def test_text_without_declarations_is_returned_unchanged():
    text = "You are a helpful assistant, with no access to external functions.\n"
    assert parse_text_declarations(text) == ([], text)
    # prose that mentions the marker without a dash is not a declaration block
    prose = "Tools exist. Use them if required."
    assert parse_text_declarations(prose) == ([], prose)


def test_hostile_system_texts_are_scanned_in_linear_time():
    t0 = time.perf_counter()
    for text in (" " * 300_000 + "x", "<tools> " * 50_000, "<tools>[" * 50_000, "Use them if required" * 20_000):
        assert parse_text_declarations(text) == ([], text)
    assert time.perf_counter() - t0 < 2


def test_broken_json_declaration_names_the_declaration_and_position():
    text = GLAIVE_HEAD + json.dumps(NEWS) + "\n\n" + '{"name": "x", "parameters": {"type": "object",}}'
    with pytest.raises(DeclarationError) as e:
        parse_text_declarations(text)
    assert str(e.value) == ("after 'Use them if required -': declaration 2 is not valid JSON: Expecting "
                            "property name enclosed in double quotes (line 4, column 47 of the system text)")


def test_non_json_after_the_marker_is_an_error():
    with pytest.raises(DeclarationError, match=r"expected JSON declarations after 'Use them if required -', "
                                               r"found 'get_weather\(city\)'"):
        parse_text_declarations(GLAIVE_HEAD + "get_weather(city)")


def test_render_then_parse_round_trips():
    tools = normalize_tools([NEWS, ORDER])
    text = render_text_declarations(tools)
    assert text.startswith(TEXT_PREAMBLE + "\n{\n    \"name\": \"get_news_headlines\"")
    parsed, rest = parse_text_declarations(text)
    assert normalize_tools(parsed) == tools
    assert rest == "You have access to the following functions."


# -------------------------------------------------------------------------------- normalization


def test_normalize_fills_missing_type_and_empty_parameters_and_drops_unknown_keys():
    untyped = {"name": "search", "parameters": {"properties": {"q": {"type": "string"}}}, "returns": {"x": 1}}
    noparams = {"name": "ping", "description": "Ping"}
    assert normalize_tools([untyped, noparams]) == [
        wrap({"name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}),
        wrap({"name": "ping", "description": "Ping", "parameters": {"type": "object", "properties": {}}}),
    ]


@pytest.mark.parametrize(("tools", "reason"), [
    ([{"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "float"}}}}],
     "tool 'f': parameters are not a valid JSON Schema (Draft 2020-12): 'float' is not valid under any of "
     "the given schemas at /properties/a/type"),
    ([{"name": "f", "parameters": {"type": "object", "required": "a"}}],
     "tool 'f': parameters are not a valid JSON Schema (Draft 2020-12): 'a' is not of type 'array' at "
     "/required"),
    ([{"name": "f", "parameters": {"type": "string"}}],
     "tool 'f': parameters must be an object schema (\"type\": \"object\"), got 'string'"),
    ([{"name": "f", "parameters": {"q": {"type": "str", "default": "x"}}}],
     "tool 'f': parameters have neither \"type\" nor \"properties\"; not a JSON Schema of an object"),
    ([{"name": "f", "parameters": "{}"}], "tool 'f': parameters must be a JSON Schema object"),
    ([{"name": "f b"}], "tool name 'f b' (declaration 1) must match ^[a-zA-Z0-9_-]{1,64}$"),
    ([{"name": "a" * 65}], f"tool name '{'a' * 65}' (declaration 1) must match ^[a-zA-Z0-9_-]{{1,64}}$"),
    ([{"description": "nameless"}], "declaration 1 is not a function declaration (no 'name')"),
    (["get_weather"], "declaration 1 is not an object"),
    ([NEWS, QUOTE, NEWS], "tool 'get_news_headlines' is declared twice"),
    ([{"name": "f", "description": 3}], "tool 'f': description must be a string"),
])
def test_bad_declarations_are_rejected_with_a_reason(tools, reason):
    with pytest.raises(DeclarationError) as e:
        normalize_tools(tools)
    assert str(e.value) == reason
    assert prepare_prompt(Prompt("s", 0, [{"role": "user", "content": "x"}], tools, "openai"),
                          "structured") == Rejected(reason)


def test_deeply_nested_schema_within_the_limit_is_accepted_and_validates():
    leaf: dict = {"type": "string"}
    for _ in range(20):
        leaf = {"type": "object", "properties": {"n": leaf}, "required": ["n"]}
    [tool] = normalize_tools([{"name": "deep", "parameters": leaf}])
    args: object = "x"
    for _ in range(20):
        args = {"n": args}
    v = ToolValidator([tool])
    assert v.check_calls([call("deep", json.dumps(args))])[0].valid
    bad = json.dumps(args).replace('"x"', "1")
    [verdict] = v.check_calls([call("deep", bad)])
    assert verdict.errors == [{"path": "/n" * 20, "message": "1 is not of type 'string'"}]


def test_absurdly_nested_declarations_are_rejected_not_crashing():
    deep: dict = {"type": "string"}
    for _ in range(200):
        deep = {"type": "object", "properties": {"n": deep}}
    r = prepare_prompt(Prompt("s", 0, [{"role": "user", "content": "x"}], [{"name": "d", "parameters": deep}],
                              "openai"), "structured")
    assert r == Rejected("declarations are nested too deeply or hold values that are not JSON")
    r = prepare_prompt(Prompt("s", 0, [{"role": "user", "content": "x"}], [{"name": "d", "parameters": deep}],
                              "openai"), "structured", ToolLimits(max_declaration_bytes=10**7))
    assert isinstance(r, Rejected)
    text = GLAIVE_HEAD + '{"name": "d", "parameters": ' + "[" * 100_000 + "]" * 100_000 + "}"
    r = prepare_prompt(glaive_prompt(text), "structured", ToolLimits(max_declaration_bytes=10**7))
    assert r == Rejected("after 'Use them if required -': declaration 1 is nested too deeply")
    nested: dict = {"type": "string"}
    for _ in range(30):
        nested = {"type": "object", "properties": {"n": nested}}
    assert normalize_tools([{"name": "ok", "parameters": nested}])
    with pytest.raises(DeclarationError, match=r"^tool 'ok': parameters nest deeper than 64 levels$"):
        normalize_tools([{"name": "ok", "parameters": {"type": "object", "properties": {"n": deep}}}])


def test_ten_thousand_tools_are_rejected_before_any_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[int] = []
    real = declarations._normalize_tool
    monkeypatch.setattr(declarations, "_normalize_tool", lambda item, i, lim: checked.append(i) or real(item, i, lim))
    many = [{"name": f"f{i}", "parameters": {"type": "object", "properties": {}}} for i in range(10_000)]
    r1 = prepare_prompt(Prompt("s", 0, [{"role": "user", "content": "x"}], many, "openai"), "structured")
    block = "\n".join(json.dumps(t) for t in many)
    roomy = ToolLimits(max_declaration_bytes=10**7)
    r2 = prepare_prompt(glaive_prompt(GLAIVE_HEAD + block), "structured", roomy)
    r3 = prepare_prompt(glaive_prompt(GLAIVE_HEAD + block), "structured")
    assert checked == []  # no schema of the 10,000 was checked
    assert r1 == Rejected("10000 tools declared, over the limit of 512")
    assert r2 == Rejected("10000 tools declared, over the limit of 512")
    # the count includes the newline after the marker
    assert r3 == Rejected(f"declarations are {len(block) + 1} characters, over the 524288 limit")


def test_huge_row_declarations_are_rejected():
    big = [{"name": "f", "description": "x" * 600_000}]
    r = prepare_prompt(Prompt("s", 0, [{"role": "user", "content": "x"}], big, "openai"), "structured")
    assert r == Rejected(f"declarations are {len(json.dumps(big, separators=(',', ':')))} bytes, over the "
                         "524288 limit")


# ------------------------------------------------------------------------------- prepare_prompt


def test_structured_glaive_moves_declarations_out_of_the_system_text():
    system = GLAIVE_HEAD + json.dumps(NEWS, indent=4) + "\n\n" + json.dumps(QUOTE, indent=4)
    p = prepare_prompt(glaive_prompt(system, "News for France?"), "structured")
    expected_tools = [wrap(NEWS), wrap({**QUOTE, "parameters": {"type": "object", "properties": {}}})]
    assert p == Prepared(
        messages=[{"role": "system",
                   "content": "You are a helpful assistant with access to the following functions."},
                  {"role": "user", "content": "News for France?"}],
        tools=expected_tools, declared_tools=expected_tools, declared_from="text", mode="structured",
        shapes=(DeclarationShape.GLAIVE,))
    assert p.declared


def test_structured_drops_a_system_message_that_only_held_declarations():
    p = prepare_prompt(glaive_prompt("Use them if required -\n" + json.dumps(NEWS)), "structured")
    assert isinstance(p, Prepared)
    assert p.messages == [{"role": "user", "content": "Hi"}]
    assert p.tools == [wrap(NEWS)]


def test_text_mode_keeps_glaive_text_intact_and_sends_no_tools():
    system = GLAIVE_HEAD + json.dumps(NEWS, indent=4)
    prompt = glaive_prompt(system)
    p = prepare_prompt(prompt, "text")
    assert p == Prepared(prompt.messages, None, [wrap(NEWS)], "text", "text", (DeclarationShape.GLAIVE,))


def test_text_mode_renders_row_tools_into_the_system_message():
    msgs = [{"role": "system", "content": "You are a travel agent."}, {"role": "user", "content": "Weather?"}]
    p = prepare_prompt(Prompt("o", 3, msgs, [wrap(NEWS)], "openai"), "text")
    assert isinstance(p, Prepared)
    assert p.tools is None and p.declared_tools == [wrap(NEWS)] and p.declared_from == "row"
    assert p.messages[1:] == msgs[1:]
    assert p.messages[0]["content"] == "You are a travel agent.\n\n" + render_text_declarations([wrap(NEWS)])
    # without a system message one is added
    p2 = prepare_prompt(Prompt("o", 3, msgs[1:], [wrap(NEWS)], "openai"), "text")
    assert p2.messages == [{"role": "system", "content": render_text_declarations([wrap(NEWS)])}, *msgs[1:]]
    # the audit compares like with like: structured mode parses the same declarations back
    back = prepare_prompt(Prompt("o", 3, p2.messages, None, "openai"), "structured")
    assert back.tools == [wrap(NEWS)]
    assert back.messages == [{"role": "system", "content": "You have access to the following functions."},
                             *msgs[1:]]


def test_structured_row_tools_pass_through_and_text_in_system_is_left_alone():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]
    p = prepare_prompt(Prompt("o", 0, msgs, [wrap(NEWS)], "openai"), "structured")
    assert p == Prepared(msgs, [wrap(NEWS)], [wrap(NEWS)], "row", "structured", (DeclarationShape.TOOLS_FIELD,))


def test_prompt_without_tools_is_prepared_with_none():
    msgs = [{"role": "user", "content": "2+2?"}]
    assert prepare_prompt(Prompt("o", 0, msgs, None, "openai"), "structured") == \
        Prepared(msgs, None, [], None, "structured")


# ---------------------------------------------------------------------------- call validation


def test_call_verdicts_exact():
    v = ToolValidator(normalize_tools([NEWS, QUOTE, ORDER]))
    good_order = {"customer": {"name": "Jane", "address": {"city": "Springfield"}},
                  "items": [{"product_id": "SKU-1", "quantity": 2}, {"product_id": "SKU-2", "quantity": 1}],
                  "shipping": "express"}
    calls = [
        call("get_news_headlines", '{"country": "France"}'),                       # 0 valid
        call("get_random_quote", "{}"),                                            # 1 valid, no parameters
        call("create_order", json.dumps(good_order)),                              # 2 valid, nested
        call("get_weather", '{"city": "Paris"}'),                                  # 3 undeclared
        call("get_news_headlines", "{'country': 'France'}"),                       # 4 not JSON
        call("get_news_headlines", '{"country": 7}'),                              # 5 wrong type
        call("create_order", json.dumps({**good_order, "shipping": "drone"})),      # 6 enum
        call("get_news_headlines", "{}"),                                          # 7 missing required
        call("create_order", json.dumps({**good_order, "coupon": "X"})),            # 8 additionalProperties
        call("create_order", json.dumps({**good_order, "items": [
            {"product_id": "SKU-1", "quantity": 0}, {"product_id": "SKU-2", "qty": 1}]})),  # 9 array items
        call("get_news_headlines", '["France"]'),                                  # 10 not an object
        call("get_news_headlines", ""),                                            # 11 empty
        call("get_news_headlines", {"country": "Peru"}),                            # 12 parsed dict accepted
        call("get_news_headlines", 5),                                             # 13 not a string
        {"id": "x", "type": "function"},                                           # 14 no function
        {"function": {"arguments": "{}"}},                                         # 15 no name
    ]
    verdicts = v.check_calls(calls)
    assert {x.format for x in verdicts} == {"structured"}
    # the decoded arguments are recorded (null when they do not decode) for comparisons across modes
    assert [x.arguments for x in verdicts] == [
        {"country": "France"}, {}, good_order, {"city": "Paris"}, None, {"country": 7},
        {**good_order, "shipping": "drone"}, {}, {**good_order, "coupon": "X"},
        {**good_order, "items": [{"product_id": "SKU-1", "quantity": 0}, {"product_id": "SKU-2", "qty": 1}]},
        ["France"], None, {"country": "Peru"}, None, None, None]
    got = [{k: d[k] for k in ("index", "name", "valid", "errors")} for d in (x.to_dict() for x in verdicts)]
    assert got == [
        {"index": 0, "name": "get_news_headlines", "valid": True, "errors": []},
        {"index": 1, "name": "get_random_quote", "valid": True, "errors": []},
        {"index": 2, "name": "create_order", "valid": True, "errors": []},
        {"index": 3, "name": "get_weather", "valid": False,
         "errors": [{"path": "", "message": "tool 'get_weather' was not declared"}]},
        {"index": 4, "name": "get_news_headlines", "valid": False,
         "errors": [{"path": "", "message": "arguments are not valid JSON: unexpected character, expected a "
                                            "string key: line 1 column 2 (char 1)"}]},
        {"index": 5, "name": "get_news_headlines", "valid": False,
         "errors": [{"path": "/country", "message": "7 is not of type 'string'"}]},
        {"index": 6, "name": "create_order", "valid": False,
         "errors": [{"path": "/shipping", "message": "'drone' is not one of ['standard', 'express']"}]},
        {"index": 7, "name": "get_news_headlines", "valid": False,
         "errors": [{"path": "", "message": "'country' is a required property"}]},
        {"index": 8, "name": "create_order", "valid": False,
         "errors": [{"path": "",
                     "message": "Additional properties are not allowed ('coupon' was unexpected)"}]},
        {"index": 9, "name": "create_order", "valid": False,
         "errors": [{"path": "/items/0/quantity", "message": "0 is less than the minimum of 1"},
                    {"path": "/items/1",
                     "message": "Additional properties are not allowed ('qty' was unexpected)"},
                    {"path": "/items/1", "message": "'quantity' is a required property"}]},
        {"index": 10, "name": "get_news_headlines", "valid": False,
         "errors": [{"path": "", "message": "arguments must be a JSON object, got array"}]},
        {"index": 11, "name": "get_news_headlines", "valid": False,
         "errors": [{"path": "", "message": "arguments are not valid JSON: Input is a zero-length, empty "
                                            "document: line 1 column 1 (char 0)"}]},
        {"index": 12, "name": "get_news_headlines", "valid": True, "errors": []},
        {"index": 13, "name": "get_news_headlines", "valid": False,
         "errors": [{"path": "", "message": "arguments must be a JSON string, got number"}]},
        {"index": 14, "name": None, "valid": False,
         "errors": [{"path": "", "message": "tool call has no 'function' object"}]},
        {"index": 15, "name": None, "valid": False,
         "errors": [{"path": "", "message": "tool call has no function name"}]},
    ]
    assert orjson.loads(orjson.dumps(got)) == got  # the record can hold it as is


def test_json_pointer_escapes_and_error_cap():
    tool = normalize_tools([{"name": "f", "parameters": {"type": "object", "properties": {
        "a/b": {"type": "integer"}, "c~d": {"type": "integer"}, "e": {"type": "integer"}}}}])
    v = ToolValidator(tool, ToolLimits(max_errors_per_call=2))
    [verdict] = v.check_calls([call("f", json.dumps({"a/b": "x", "c~d": "y", "e": "z"}))])
    assert verdict.errors == [{"path": "/a~1b", "message": "'x' is not of type 'integer'"},
                              {"path": "/c~0d", "message": "'y' is not of type 'integer'"}]


def test_huge_arguments_are_invalid_not_a_crash():
    v = ToolValidator(normalize_tools([NEWS]))
    huge = json.dumps({"country": "x" * (1 << 20)})
    [verdict] = v.check_calls([call("get_news_headlines", huge)])
    assert verdict.to_dict() == {"index": 0, "name": "get_news_headlines", "valid": False, "errors": [
        {"path": "", "message": f"arguments are {len(huge)} characters, over the 1048576 limit"}],
        "format": "structured", "arguments": None}
    long_value = json.dumps({"country": 1, "pad": "y" * 5000})
    tool = normalize_tools([{"name": "g", "parameters": {"type": "object",
                                                         "properties": {"pad": {"type": "integer"}}}}])
    [verdict] = ToolValidator(tool).check_calls([call("g", long_value)])
    assert len(verdict.errors[0]["message"]) == 300  # messages quoting the value are truncated
    [verdict] = v.check_calls([call("x" * 100_000, "{}")])  # a hallucinated name is recorded truncated
    assert verdict.to_dict() == {"index": 0, "name": "x" * 128, "valid": False, "errors": [
        {"path": "", "message": f"tool {'x' * 128!r} was not declared"}], "format": "structured", "arguments": {}}


def test_unresolvable_ref_is_an_invalid_call_with_a_reason():
    tool = normalize_tools([{"name": "r", "parameters": {"type": "object", "properties": {
        "x": {"$ref": "#/$defs/missing"}}}}])
    [verdict] = ToolValidator(tool).check_calls([call("r", '{"x": 1}')])
    assert not verdict.valid
    assert verdict.errors[0]["message"].startswith("the declared schema could not be applied: ")


def test_validators_are_shared_per_tool_set_and_schema():
    a = ToolValidator.for_tools(normalize_tools([NEWS, QUOTE]))
    b = ToolValidator.for_tools(normalize_tools([NEWS, QUOTE]))
    c = ToolValidator.for_tools(normalize_tools([NEWS]))
    assert a is b and a is not c
    assert a._by_name["get_news_headlines"] is c._by_name["get_news_headlines"]


# ---------------------------------------------------------------------------------------- leaks


@pytest.mark.parametrize(("text", "found"), [
    ("<|tool_calls_section_begin|> <|tool_call_begin|> functions.get:0 <|tool_call_argument_begin|> {} "
     "<|tool_call_end|> <|tool_calls_section_end|>",
     ["<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
      "<|tool_call_end|>", "<|tool_calls_section_end|>"]),
    ("x<|tool_call_section_begin|>y<|tool_call_section_end|>", ["<|tool_call_section_begin|>",
                                                                "<|tool_call_section_end|>"]),
    ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get\n```json\n{}\n```<｜tool▁call▁end｜>"
     "<｜tool▁calls▁end｜>",
     ["<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
      "<｜tool▁calls▁end｜>"]),
    ('<tool_call>\n{"name": "get", "arguments": {}}\n</tool_call>\n<tool_call>',
     ["<tool_call>", "</tool_call>"]),
    ("I will use the tool_call API <tool_calls> and |tool_call_begin| without brackets", []),
    ("", []),
    (None, []),
])
def test_scan_leaks(text, found):
    assert scan_leaks(text) == found


# ---------------------------------------------------------------------------- responses, policy


def test_check_response_parallel_calls_and_leaks_in_both_fields():
    p = prepare_prompt(glaive_prompt(GLAIVE_HEAD + json.dumps(NEWS)), "structured")
    response = {"content": "Sure <|tool_call_begin|>", "reasoning": "think <tool_call>",
                "tool_calls": [call("get_news_headlines", '{"country": "Peru"}', "a"),
                               call("get_news_headlines", '{"country": 1}', "b")]}
    check = check_response(p, response)
    assert (check.declared, check.called, check.invalid_calls, check.leaked) == (True, True, 1, True)
    record = check.to_record()
    assert record == {
        "declared": True, "called": True, "invalidCalls": 1, "leaked": True,
        "calls": [{"index": 0, "name": "get_news_headlines", "valid": True, "errors": [],
                   "format": "structured", "arguments": {"country": "Peru"}},
                  {"index": 1, "name": "get_news_headlines", "valid": False,
                   "errors": [{"path": "/country", "message": "1 is not of type 'string'"}],
                   "format": "structured", "arguments": {"country": 1}}],
        "leaks": {"content": ["<|tool_call_begin|>"], "reasoning": ["<tool_call>"]}, "prose": False}
    assert ResponseCheck.from_record(orjson.loads(orjson.dumps(record))) == check
    assert [policy(check, m) for m in ("drop", "keep", "flag")] == ["drop", "keep", "flag"]


def test_check_response_clean_and_undeclared():
    plain = prepare_prompt(Prompt("o", 0, [{"role": "user", "content": "hi"}], None, "openai"), "structured")
    clean = check_response(plain, {"content": "Hello", "reasoning": None})
    assert clean.to_record() == {"declared": False, "called": False, "invalidCalls": 0, "leaked": False,
                                 "calls": [], "leaks": {}, "prose": False}
    assert policy(clean, "drop") == "keep"
    stray = check_response(plain, {"content": "", "tool_calls": [call("f", "{}")]})
    assert stray.invalid_calls == 1 and policy(stray, "drop") == "drop"
    leak_only = check_response(plain, {"content": "<tool_call>{}</tool_call>"})
    assert (leak_only.invalid_calls, leak_only.leaked, policy(leak_only, "flag")) == (0, True, "flag")
