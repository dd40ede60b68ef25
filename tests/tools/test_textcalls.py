"""Tool calls written as text, read the way each model family writes them.

The answers here are written by the test (or rendered by the families' official chat templates, or
taken from the datasets' own rows), never produced by the code under test: exact counts per format,
validity verdicts equal to a structured call's, several calls per answer, malformed and unclosed
blocks, hostile sizes, prose without a call, and the leak-vs-call distinction by mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from eyrie.jobs.reconstruct import kimi_facts as kimi
from eyrie.jobs.sources import Prompt
from eyrie.jobs.tools.checks import ResponseCheck, check_response, policy
from eyrie.jobs.tools.declarations import normalize_tools, prepare_prompt
from eyrie.jobs.tools.textcalls import TEXT_FORMATS, TextCallLimits, find_calls, mentions
from eyrie.jobs.tools.validation import ToolValidator
from tests.reference_helpers import reference

DATA = Path(__file__).parents[1] / "data" / "tools"

WEATHER = {"name": "get_weather", "description": "Get the weather",
           "parameters": {"type": "object", "required": ["city"],
                          "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}}}}
BMI = {"name": "calculate_bmi", "description": "Calculate the Body Mass Index",
       "parameters": {"type": "object", "required": ["weight", "height"],
                      "properties": {"weight": {"type": "number"}, "height": {"type": "number"}}}}
TOOLS = normalize_tools([WEATHER, BMI])
NAMES = frozenset({"get_weather", "calculate_bmi"})
SYSTEM = ("You are a helpful assistant with access to the following functions. Use them if required -\n"
          + json.dumps(WEATHER) + "\n" + json.dumps(BMI))


def prepared(mode: str):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Weather in Paris?"}]
    return prepare_prompt(Prompt("g", 0, msgs, None, "glaive"), mode)


def shape(text: str, names=NAMES) -> list[tuple[str, str | None, Any, str | None]]:
    return [(c.format.value, c.name, c.arguments, c.problem) for c in find_calls(text, names)]


def text_check(content: str, reasoning: str | None = None) -> ResponseCheck:
    return check_response(prepared("text"), {"content": content, "reasoning": reasoning})


# ------------------------------------------------------------------------- each family, real examples


def test_glaive_functioncall_as_the_dataset_writes_it():
    # glaive-function-calling-v2's own assistant turns (tests/data/tools/glaive.jsonl row 0, and the
    # quickstart's glaive sample): arguments are a single-quoted string of JSON, then <|endoftext|>
    row = json.loads((DATA / "glaive.jsonl").read_text().splitlines()[0])
    turn = row["chat"].split("ASSISTANT: ")[1].split("\n\n\nFUNCTION RESPONSE")[0]
    assert turn == ("<functioncall> {\"name\": \"get_news_headlines\", \"arguments\": '{\"country\": "
                    "\"United States\"}'} <|endoftext|>")
    assert shape(turn, {"get_news_headlines"}) == [
        ("glaive", "get_news_headlines", '{"country": "United States"}', None)]
    answer = ("<functioncall> {\"name\": \"calculate_bmi\", \"arguments\": '{\"weight\": 70, \"height\": 1.75}'} "
              "<|endoftext|>")
    check = text_check(answer)
    assert [(v.format, v.name, v.valid, v.arguments) for v in check.calls] == [
        ("glaive", "calculate_bmi", True, {"weight": 70, "height": 1.75})]
    # an apostrophe inside the single-quoted arguments (not a Python literal) still reads
    quoted = "<functioncall> {\"name\": \"get_weather\", \"arguments\": '{\"city\": \"L'Aquila\"}'}"
    assert shape(quoted) == [("glaive", "get_weather", '{"city": "L\'Aquila"}', None)]


def test_hermes_and_qwen_tool_call_blocks():
    # Qwen3's official template renders calls as <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
    template = reference("qwen3/chat_template.jinja").read_text()
    calls = [{"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": c}}}
             for c in ("Paris", "Rome")]
    msgs = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "Both.", "tool_calls": calls}]
    out, _ = render_jinja_template(conversations=[msgs], tools=TOOLS, chat_template=template,
                                   add_generation_prompt=False)
    answer = out[0].rsplit("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")
    assert answer.count("<tool_call>") == 2
    assert shape(answer) == [("hermes", "get_weather", {"city": "Paris"}, None),
                             ("hermes", "get_weather", {"city": "Rome"}, None)]
    # hermes-function-calling-v1 rows write a Python literal with the arguments first
    row = json.loads((DATA / "hermes.jsonl").read_text().splitlines()[0])
    gpt = row["conversations"][2]["value"]
    assert gpt.startswith("<tool_call>\n{'arguments': ")
    assert shape(gpt, {"get_camera_live_feed"}) == [
        ("hermes", "get_camera_live_feed", {"camera_id": "cam-42", "stream_quality": "1080p"}, None)]


def kimi_answer(calls: list[tuple[str, str]], content: str = "Checking both.") -> str:
    """What Kimi K2.5 generated for these calls: its official template's rendering of the turn."""
    template = reference("kimi-k2.5/chat_template.jinja").read_text()
    tools = kimi.deep_sort(TOOLS)
    tc = [{"id": f"functions.{n}:{i}", "type": "function", "function": {"name": n, "arguments": a}}
          for i, (n, a) in enumerate(calls)]
    msgs = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": content, "tool_calls": tc}]
    out, _ = render_jinja_template(conversations=[msgs], tools=tools, chat_template=template,
                                   add_generation_prompt=False, tools_ts_str=kimi.tools_typescript(tools))
    return out[0].rsplit("<|im_middle|><think></think>", 1)[1].removesuffix("<|im_end|>")


def test_kimi_native_section_from_the_official_template():
    answer = kimi_answer([("get_weather", '{"city": "Paris"}'), ("calculate_bmi", '{"weight": 80, "height": 1.8}')])
    assert answer.startswith("Checking both.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0")
    found = find_calls(answer, NAMES)
    assert [(c.format.value, c.name, c.arguments, c.id) for c in found] == [
        ("kimi", "get_weather", '{"city": "Paris"}', "functions.get_weather:0"),
        ("kimi", "calculate_bmi", '{"weight": 80, "height": 1.8}', "functions.calculate_bmi:1")]
    assert [v.valid for v in text_check(answer).calls] == [True, True]
    # spacing and newlines between markers (as served by some engines), ids without `functions.`,
    # the singular section spelling, and the markers dropped by a decoder skipping special tokens
    loose = ("<|tool_call_section_begin|>\n<|tool_call_begin|>\nget_weather:3<|tool_call_argument_begin|>\n"
             '{"city": "Oslo"}\n<|tool_call_end|>\n<|tool_call_section_end|>')
    assert shape(loose) == [("kimi", "get_weather", '{"city": "Oslo"}', None)]
    assert shape('Calling functions.get_weather:0 {"city": "Rome"} now.') == [
        ("kimi", "get_weather", '{"city": "Rome"}', None)]
    assert shape('functions.lookup:0 {"q": 1}') == []  # not declared: prose, not a call


def test_deepseek_v31_from_the_official_template_and_the_older_form():
    template = reference("deepseek-v3.1/chat_template.jinja").read_text()
    tc = [{"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
          {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": 5}'}}]
    msgs = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": tc}]
    out, _ = render_jinja_template(conversations=[msgs], chat_template=template, add_generation_prompt=False,
                                   bos_token="<｜begin▁of▁sentence｜>")
    answer = out[0].split("<｜Assistant｜></think>", 1)[1].removesuffix("<｜end▁of▁sentence｜>")
    assert answer.startswith("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>")
    check = text_check(answer)
    assert [(v.format, v.name, v.valid, v.errors) for v in check.calls] == [
        ("deepseek", "get_weather", True, []),
        ("deepseek", "get_weather", False, [{"path": "/city", "message": "5 is not of type 'string'"}])]
    # DeepSeek-V3/R1: the call's type before the separator, the name after it, arguments fenced
    older = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calculate_bmi\n```json\n"
             '{"weight": 80, "height": 1.8}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    assert shape(older) == [("deepseek", "calculate_bmi", '{"weight": 80, "height": 1.8}', None)]


def test_bare_and_fenced_json_naming_a_declared_function():
    assert shape('{"name": "get_weather", "arguments": {"city": "Paris"}}') == [
        ("json", "get_weather", {"city": "Paris"}, None)]
    fenced = 'I will check.\n```json\n{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "C"}}\n```'
    assert shape(fenced) == [("json", "get_weather", {"city": "Oslo", "unit": "C"}, None)]
    openai = ('{"type": "function", "function": {"name": "calculate_bmi", "arguments": '
              '"{\\"weight\\": 1, \\"height\\": 2}"}}')
    assert shape(openai) == [("json", "calculate_bmi", '{"weight": 1, "height": 2}', None)]
    wrapped = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "A"}}, {"name": "fly", "arguments": {}}]}'
    assert [(n, a) for _f, n, a, _p in shape(wrapped)] == [("get_weather", {"city": "A"}), ("fly", {})]
    listed = '[{"name": "get_weather", "arguments": {"city": "A"}}, {"name": "teleport", "arguments": {}}]'
    check = text_check(listed)
    assert [(v.name, v.valid) for v in check.calls] == [("get_weather", True), ("teleport", False)]
    assert check.calls[1].errors == [{"path": "", "message": "tool 'teleport' was not declared"}]
    # JSON that is not a call: data naming no declared function, a declaration echoed back
    assert shape('{"name": "Paris", "population": 2100000}') == []
    assert shape(json.dumps(WEATHER)) == []



def test_fenced_json_whose_brackets_never_balance_is_an_invalid_call():
    """A fenced call missing a closer (or cut before the closing fence) is an attempt that failed,
    not "no call": its inner arguments object balances, but names no function."""
    unclosed = '{"name": "get_weather", "arguments": {"city": "Paris"}'
    for text in (f"Checking.\n```json\n{unclosed}\n```\nDone.", f"```\n{unclosed}\n```",
                 f"Checking.\n```json\n{unclosed}"):  # cut before the closing fence
        (got,) = shape(text)
        assert got[:3] == ("json", "get_weather", None), text
        assert got[3].startswith("is not valid JSON: "), got
        check = text_check(text)
        assert (check.called, check.invalid_calls) == (True, 1)
        assert check.calls[0].errors[0]["message"].startswith("JSON tool call is not valid JSON"), check.calls[0]
    # a list missing its closer around a whole call object: that object is the call
    assert shape('```json\n[{"name": "calculate_bmi", "arguments": {"weight": 1, "height": 2}}\n```') == [
        ("json", "calculate_bmi", {"weight": 1, "height": 2}, None)]
    # a balanced fenced call and a fence of data naming no declared function are read as before
    assert shape(f"```json\n{unclosed}}}\n```") == [("json", "get_weather", {"city": "Paris"}, None)]
    assert shape('```json\n{"name": "Paris", "population": {"2020": 2100000}\n```') == []
    # two fences: the broken one is a call with a problem, the good one a valid call, in text order
    two = f"```json\n{unclosed}\n```\nor\n```json\n{unclosed}}}\n```"
    assert [(n, p is None) for _f, n, _a, p in shape(two)] == [("get_weather", False), ("get_weather", True)]


# ----------------------------------------------------------------------------- counts and verdicts


def test_exact_counts_per_format_over_a_fake_answer_set():
    """An independent fake: 12 answers written by hand, with the counts they hold."""
    glaive = "<functioncall> {\"name\": \"get_weather\", \"arguments\": '{\"city\": \"Paris\"}'}"
    hermes = '<tool_call>\n{"name": "calculate_bmi", "arguments": {"weight": 80, "height": 1.8}}\n</tool_call>'
    kimi_ = (f"{kimi.SECTION_BEGIN}{kimi.CALL_BEGIN}functions.get_weather:0{kimi.CALL_ARG_BEGIN}"
             f'{{"city": "Rome"}}{kimi.CALL_END}{kimi.SECTION_END}')
    ds = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": 7}<｜tool▁call▁end｜>'
          '<｜tool▁calls▁end｜>')
    js = '```json\n{"name": "calculate_bmi", "arguments": {"weight": "80"}}\n```'
    answers = [glaive, hermes, kimi_, ds, js,
               hermes + "\n" + hermes,  # two calls in one answer
               "Let me call two tools.\n" + kimi_ + "\nAnd also:\n" + js,  # two formats in one answer
               "The weather in Paris is sunny.",  # no call
               "I could use get_weather for that, but I know it: sunny.",  # prose only
               '<tool_call>{"name": "get_weather", "arguments": {"city": "X"}}',  # never closed
               "<functioncall> nonsense",  # not an object
               "Config: {\"a\": [1, 2, {\"b\": \"c\"}]} and a stray { brace"]  # JSON, not a call
    checks = [text_check(a) for a in answers]
    formats: dict[str, int] = {}
    for c in checks:
        for v in c.calls:
            formats[v.format] = formats.get(v.format, 0) + 1
    assert formats == {"glaive": 2, "hermes": 4, "kimi": 2, "deepseek": 1, "json": 2}
    assert [len(c.calls) for c in checks] == [1, 1, 1, 1, 1, 2, 2, 0, 0, 1, 1, 0]
    assert [c.invalid_calls for c in checks] == [0, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0]
    assert [c.prose for c in checks] == [False] * 8 + [True] + [False] * 3
    assert [c.leaked for c in checks] == [False] * 12  # text mode: markers are calls, never leaks
    assert checks[9].calls[0].errors == [{"path": "", "message": "<tool_call> block is never closed"}]
    assert checks[9].calls[0].name == "get_weather"  # named for per-tool counts, though unreadable
    assert checks[10].calls[0].errors == [
        {"path": "", "message": "<functioncall> is neither JSON nor a literal: 'nonsense'"}]
    assert checks[4].calls[0].errors == [
        {"path": "/weight", "message": "'80' is not of type 'number'"},
        {"path": "", "message": "'height' is a required property"}]
    assert [policy(c, "drop") for c in checks].count("drop") == 5


def test_a_text_call_is_judged_exactly_like_the_structured_one():
    validator = ToolValidator.for_tools(TOOLS)
    cases = ['{"city": "Paris"}', '{"city": 1, "unit": "K"}', "{}", '["Paris"]', '{"city": "P",}']
    for args in cases:
        structured = validator.check_calls([{"id": "c", "type": "function",
                                             "function": {"name": "get_weather", "arguments": args}}])
        written = find_calls(f"{kimi.CALL_BEGIN}functions.get_weather:0{kimi.CALL_ARG_BEGIN}{args}{kimi.CALL_END}",
                             NAMES)
        text = validator.check_text_calls(written)
        assert [(v.valid, v.errors, v.arguments) for v in text] == \
            [(v.valid, v.errors, v.arguments) for v in structured], args
        assert text[0].format == "kimi" and structured[0].format == "structured"


def test_malformed_and_unclosed_blocks_are_invalid_calls():
    cases = {
        "<tool_call>": "<tool_call> block is never closed",
        '<tool_call>{"name": "get_weather"}<tool_call>{"name": "get_weather", "arguments": {"city": "A"}}</tool_call>':
            "<tool_call> block is never closed",
        "<tool_call>{'name': 'get_weather', 'arguments': {'city': {1, 2}}}</tool_call>":
            "arguments are not JSON values",
        '<tool_call>{"arguments": {}}</tool_call>': "<tool_call> block has no function name",
        "<tool_call>[]</tool_call>": "<tool_call> block holds no call",
        f"{kimi.SECTION_BEGIN}{kimi.CALL_BEGIN}functions.get_weather:0{kimi.CALL_ARG_BEGIN}{{":
            "Kimi tool call is never closed",
        f"{kimi.CALL_BEGIN}functions.get_weather:0{{}}{kimi.CALL_END}":
            "Kimi tool call has no <|tool_call_argument_begin|>",
        "<｜tool▁call▁begin｜>get_weather {}<｜tool▁call▁end｜>": "DeepSeek tool call has no <｜tool▁sep｜>",
        '{"name": "get_weather", "arguments": {"city": "A"]}': "JSON tool call is not valid JSON",
    }
    for text, message in cases.items():
        check = text_check(text)
        assert check.called and check.invalid_calls >= 1, text
        assert check.calls[0].errors[0]["message"].startswith(message), (text, check.calls[0].errors)
        assert check.calls[0].arguments is None
    # a well-formed call after an unclosed one is still read
    assert [v.valid for v in text_check(list(cases)[1]).calls] == [False, True]


def test_leak_in_structured_mode_call_in_text_mode():
    answer = kimi_answer([("get_weather", '{"city": "Paris"}')], content="")
    structured = check_response(prepared("structured"), {"content": answer, "reasoning": "use <tool_call>"})
    assert (structured.called, structured.leaked, sorted(structured.leaks)) == (False, True, ["content", "reasoning"])
    assert policy(structured, "drop") == "drop"
    text = check_response(prepared("text"), {"content": answer, "reasoning": "use <tool_call>"})
    assert (text.called, text.leaked, text.invalid_calls, policy(text, "drop")) == (True, False, 0, "keep")
    # a structured call the provider returns anyway is read in both modes
    tc = [{"id": "x", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "A"}'}}]
    both = check_response(prepared("text"), {"content": answer, "tool_calls": tc})
    assert [v.format for v in both.calls] == ["structured", "kimi"] and [v.index for v in both.calls] == [0, 1]


def test_no_call_in_prose_only_answers():
    prose = [
        "Sure! The weather in Paris is sunny.",
        "You can call get_weather_report yourself.",  # a longer word, not the declared name
        'Use the "name" field: {"name": "Alice", "age": 3}',
        "I would write <functioncall> here if I had to.",
        "[1, 2, 3] and {unbalanced",
        "`tool_call` tags <tools> are described in your prompt",
    ]
    checks = [text_check(p) for p in prose]
    assert [len(c.calls) for c in checks] == [0, 0, 0, 1, 0, 0]  # a bare marker is an attempt
    assert [c.prose for c in checks] == [False, False, False, False, False, False]
    assert text_check("Calling calculate_bmi needs your height.").prose
    assert not mentions("calculate_bmi_v2 and xcalculate_bmi", NAMES)
    many = {f"tool_{i}" for i in range(100)}
    assert mentions("then tool_42.", many) and not mentions("tool_420", many)


# --------------------------------------------------------------------------------- record contract


def test_record_contract():
    check = text_check('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>')
    record = orjson.loads(orjson.dumps(check.to_record()))
    assert record == {"declared": True, "called": True, "invalidCalls": 0, "leaked": False, "prose": False,
                      "leaks": {}, "calls": [{"index": 0, "name": "get_weather", "valid": True, "errors": [],
                                              "format": "hermes", "arguments": {"city": "Paris"}}]}
    assert ResponseCheck.from_record(record) == check


# -------------------------------------------------------------------------------------- hostile input


def test_hostile_sizes_stay_bounded():
    limits = TextCallLimits()
    # many opened blocks, closed only at the end: one problem per block up to the cap, then one
    # "past the limit"; never closed at all: one call, the rest of the text
    opened = "<tool_call>" * 200_000
    found = find_calls(opened + "</tool_call>", NAMES)
    assert len(found) == limits.max_calls + 1 and found[-1].problem.startswith("is past the limit of 64")
    assert [(c.problem, c.end) for c in find_calls(opened, NAMES)] == [("is never closed", len(opened))]
    # a long run of unmatched brackets and quotes around a real call: still found, in one pass
    noise = "{[" * 300_000 + '"' * 1000 + "\\" * 7
    real = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert shape(noise + " " + real) == [("json", "get_weather", {"city": "Paris"}, None)]
    for marker in (kimi.CALL_BEGIN, "<｜tool▁call▁begin｜>", "<functioncall> {", "functions.get_weather:0{"):
        assert len(find_calls(marker * 100_000, NAMES)) <= limits.max_calls + 1
    # many sections, a marker that never appears: linear (each marker is looked for once)
    sections = (kimi.SECTION_BEGIN + kimi.SECTION_END) * 100_000
    assert find_calls(sections, NAMES) == []
    # arguments nested past the limit: an invalid call whose record can still be written
    deep = "[" * 200 + "]" * 200
    [verdict] = text_check(f'<tool_call>{{"name": "get_weather", "arguments": {{"city": {deep}}}}}</tool_call>').calls
    assert verdict.errors == [{"path": "", "message": "arguments nest deeper than 128 levels"}]
    orjson.dumps(verdict.to_dict())
    # text past max_text_chars is not read; a huge call object is not tried as a literal
    small = TextCallLimits(max_text_chars=100, max_literal_chars=50)
    assert find_calls("x" * 100 + '<tool_call>{"name": "get_weather"}</tool_call>', NAMES, small) == []
    literal = "{'name': 'get_weather', 'arguments': {'city': '" + "y" * 60 + "'}}"
    [big] = find_calls(f"<tool_call>{literal}</tool_call>", NAMES, TextCallLimits(max_literal_chars=50))
    assert big.problem == f"is {len(literal)} characters, over the 50 limit"


@pytest.mark.parametrize("text", ["", None, "<", "functions.", "```json\n```", "<tool_call></tool_call>"])
def test_degenerate_texts(text):
    found = find_calls(text, NAMES)
    assert all(c.problem for c in found)


def test_a_cut_off_call_to_a_declared_function_names_it():
    """`maxTokens` cuts a Kimi call after its id: the call names a declared function, so it counts
    for that function (invalid: never closed), not as a call to an undeclared one; the same for
    DeepSeek's and Hermes' cut calls, and for a call cut before its argument marker."""
    cut = {
        f"Let me look.{kimi.SECTION_BEGIN}{kimi.CALL_BEGIN}functions.get_weather:0{kimi.CALL_ARG_BEGIN}{{\"ci":
            ("get_weather", "Kimi tool call is never closed"),
        f"{kimi.SECTION_BEGIN}{kimi.CALL_BEGIN} functions.get_weather:3 ": ("get_weather", "Kimi tool call is never"),
        f"{kimi.CALL_BEGIN}get_weather:0{kimi.CALL_ARG_BEGIN}{{}}": ("get_weather", "Kimi tool call is never closed"),
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\"":
            ("get_weather", "DeepSeek tool call is never closed"),
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Par': ("get_weather", "<tool_call> block is never"),
    }
    for text, (name, message) in cut.items():
        check = text_check(text)
        assert [(v.name, v.valid) for v in check.calls] == [(name, False)], (text, check.calls)
        assert check.calls[0].errors[0]["message"].startswith(message), (text, check.calls[0].errors)
    # a call opened again before it closed keeps its name too
    twice = (f"{kimi.SECTION_BEGIN}{kimi.CALL_BEGIN}functions.get_weather:0{kimi.CALL_BEGIN}functions.get_weather:1"
             f"{kimi.CALL_ARG_BEGIN}{{\"city\": \"A\"}}{kimi.CALL_END}{kimi.SECTION_END}")
    assert [(v.name, v.valid) for v in text_check(twice).calls] == [("get_weather", False), ("get_weather", True)]


# ---------------------------------------------------------------------------------------- the registry


def test_every_text_format_has_one_entry_that_every_reader_takes():
    """A format is one entry of `textcalls.FORMATS`: find_calls reads it, a verdict names it, leak detection knows
    its markers, the audit has its row, the simulator writes it and weighs it. A format missing from any of them
    fails here, naming the reader."""
    from eyrie.jobs.generate.audit import stats
    from eyrie.jobs.simulator import text as simtext
    from eyrie.jobs.simulator.config import SimulatedTextFormats
    from eyrie.jobs.tools.leaks import LEAK_MARKERS
    from eyrie.jobs.tools.textcalls import FORMATS, NATIVE_MARKERS, CallFormat

    names = [f.value for f in TEXT_FORMATS]
    assert set(CallFormat) - {CallFormat.STRUCTURED} == set(FORMATS), "a CallFormat without its entry"
    assert all(key is entry.name and entry.subject for key, entry in FORMATS.items())
    assert list(stats.FORMATS) == ["structured", *names], "the audit's rows"
    assert list(simtext.FORMATS) == names, "the simulator's formats"
    assert set(simtext.WRITERS) == set(names), "the simulator's writers"
    weights = SimulatedTextFormats.model_json_schema(by_alias=True)["properties"]
    assert set(weights) == set(names), "the simulator's weights (SimulatedTextFormats)"
    assert LEAK_MARKERS == NATIVE_MARKERS == {f.name.value: f.markers for f in FORMATS.values() if f.markers}


@pytest.mark.parametrize("fmt", [f.value for f in TEXT_FORMATS])
def test_each_format_as_the_simulator_writes_it_is_read_back_as_that_format(fmt):
    """The simulator's coding of a format (its own writer) read by eyrie's (the registry's reader), one call and
    two: every entry of the registry, a new one too."""
    from eyrie.jobs.simulator.text import PlannedCall, write_calls
    from eyrie.jobs.tools.textcalls import CallFormat

    one = [PlannedCall("get_weather", '{"city": "Paris"}', True)]
    two = [*one, PlannedCall("calculate_bmi", '{"weight": 70, "height": 1.8}', True)]
    for calls in (one, two):
        if fmt == "glaive" and len(calls) > 1:
            continue  # glaive writes one call per turn
        found = find_calls(f"Let me check.\n{write_calls(fmt, calls)}", NAMES)
        assert [(c.format, c.name, c.problem) for c in found] == [(CallFormat(fmt), c.name, None) for c in calls]
        assert [orjson.loads(c.arguments) if isinstance(c.arguments, str) else c.arguments for c in found] == \
            [json.loads(c.arguments) for c in calls]


def test_a_problem_is_said_of_its_formats_subject():
    from eyrie.jobs.tools.textcalls import CallFormat, TextCall

    assert TextCall(CallFormat.HERMES, None, None, 0, 3, "is never closed").message() == \
        "<tool_call> block is never closed"
    assert TextCall(CallFormat.STRUCTURED, "f", None, 0, 0, "has no name").message() == "tool call has no name"
