"""Token reconstruction with exact IDs and masks: Kimi K2.5 (synthetic tiktoken vocabulary with the
real special IDs), DeepSeek-V4's real tokenizer, a Qwen3 tokenizer built from Qwen's tiktoken ranks
with a Qwen3-style template; and every way a sample is excluded."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from eyrie.jobs.reconstruct.base import ChatFormat, Rendering, Turn
from eyrie.jobs.reconstruct.formats import resolve_format
from eyrie.jobs.reconstruct.reconstructor import Excluded, Reconstructor, Sample
from eyrie.jobs.reconstruct.tokenizers import LoadedTokenizer, TiktokenBackend, load_tokenizer
from eyrie.jobs.spec import TargetSpec
from tests.tokenizer_helpers import qwen3_folder

KIMI = Path(__file__).parents[1] / "data" / "kimi_synthetic"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get weather",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "City name"}, "unit": {"type": "string", "enum": ["c", "f"]}}}}}
PARIS, ROME = '{"city": "Paris"}', '{"city": "Rome", "unit": "c"}'


def call(name: str, args: str, cid: str | None = None) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def rec(messages: list[dict[str, Any]], *, reasoning: str | None = None, content: str | None = None,
        calls: list[dict[str, Any]] | None = None, tools: list[dict[str, Any]] | None = None,
        finish: str = "stop", usage: dict[str, Any] | None = None, reasoning_req: dict[str, Any] | None = None,
        status: str = "ok", policy: str = "keep", sid: str = "s1", logprobs: Any = None) -> dict[str, Any]:
    request: dict[str, Any] = {"model": "m", "messages": messages}
    if tools:
        request["tools"] = tools
    if reasoning_req is not None:
        request["reasoning"] = reasoning_req
    response: dict[str, Any] = {"reasoning": reasoning, "content": content, "tool_calls": calls or [],
                                "finish_reason": finish}
    if logprobs is not None:
        response["logprobs"] = logprobs
    return {"sample_id": sid, "source": "src", "row": 3, "status": status, "policy": policy,
            "request": request, "response": response, "usage": usage}


def kept(result: Sample | Excluded) -> Sample:
    assert isinstance(result, Sample), result
    return result


def excluded(result: Sample | Excluded, reason: str) -> Excluded:
    assert isinstance(result, Excluded), result
    assert result.reason == reason, result
    assert result.message.startswith(f"sample {result.sample_id} (src row 4): ")  # 1-based
    return result


# ----------------------------------------------------------------------------------------- Kimi


@pytest.fixture(scope="module")
def kimi_tok() -> LoadedTokenizer:
    return load_tokenizer(TargetSpec(model="m", tokenizer=str(KIMI)))


@pytest.fixture(scope="module")
def kimi_named(kimi_tok) -> Reconstructor:
    return Reconstructor(resolve_format("kimi-k2.5", kimi_tok), kimi_tok)


@pytest.fixture(scope="module")
def kimi_auto(kimi_tok) -> Reconstructor:
    return Reconstructor(resolve_format("auto", kimi_tok), kimi_tok)


def b(text: str) -> list[int]:
    """The synthetic Kimi vocabulary has only byte tokens (and merges of `zq`, absent from these texts)."""
    return list(text.encode())


END, USER, ASSISTANT, SYSTEM, MIDDLE = 163586, 163587, 163588, 163594, 163601
SECTION, SECTION_END, CALL, ARG, CALL_END, THINK, THINK_END = 163595, 163596, 163597, 163598, 163599, 163606, 163607
DECL = ('# Tools\n\n## functions\nnamespace functions {\n// Get weather\ntype get_weather = (_: {\n'
        '  // City name\n  city: string,\n  unit?: "c" | "f"\n}) => any;\n}\n')
K_TOOLS = [SYSTEM, *b("tool_declare"), MIDDLE, *b(DECL), END]
K_DEFAULT_SYSTEM = [SYSTEM, *b("system"), MIDDLE, *b("You are Kimi, an AI assistant created by Moonshot AI."), END]
K_GEN = [ASSISTANT, *b("assistant"), MIDDLE, THINK]


def k_turn(role: str, text: str, marker: int) -> list[int]:
    return [marker, *b(role), MIDDLE, *b(text), END]


def k_call(cid: str, args: str) -> list[int]:
    return [CALL, *b(cid), ARG, *b(args), CALL_END]


def test_kimi_single_tool_call_exact_ids_and_mask(kimi_named):
    response = [*b("Need the tool."), THINK_END, *b("Checking."), SECTION,
                *k_call("functions.get_weather:0", PARIS), SECTION_END, END]
    r = rec([{"role": "user", "content": "Weather in Paris? 🌧️"}], reasoning="Need the tool.", content="Checking.",
            calls=[call("get_weather", PARIS, "functions.get_weather:0")], tools=[WEATHER],
            usage={"prompt_tokens": 9, "completion_tokens": len(response)})
    s = kept(kimi_named(r))
    prompt = [*K_TOOLS, *k_turn("user", "Weather in Paris? 🌧️", USER), *K_GEN]
    assert s.input_ids == prompt + response
    assert s.loss_mask == [0] * len(prompt) + [1] * len(response)
    assert (s.n_prompt, s.n_tokens, s.flags, s.completion_gap) == (len(prompt), len(prompt) + len(response), (), 0)
    assert s.prompt_gap == len(prompt) - 9


def test_kimi_text_mode_call_stays_content_with_the_tokens_the_model_wrote(kimi_named):
    """tools.mode text: no `tools` sent, the model writes its native section into the content and the
    provider passes it on unparsed. The sample holds exactly those tokens (the markers as their
    special ids, the same the model emits for a structured call), as content: no call is made up."""
    section = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
               f"<|tool_call_argument_begin|>{PARIS}<|tool_call_end|><|tool_calls_section_end|>")
    system = "You have access to the following functions. Use them if required -\n{\"name\": \"get_weather\"}"
    r = rec([{"role": "system", "content": system}, {"role": "user", "content": "Weather in Paris?"}],
            reasoning="Need the tool.", content="Checking." + section)
    s = kept(kimi_named(r))
    response = [*b("Need the tool."), THINK_END, *b("Checking."), SECTION,
                *k_call("functions.get_weather:0", PARIS), SECTION_END, END]
    prompt = [*k_turn("system", system, SYSTEM), *k_turn("user", "Weather in Paris?", USER), *K_GEN]
    assert s.input_ids == prompt + response
    assert s.segments[2] == s.n_tokens  # no tool-call segment: the call is part of the content


def test_kimi_multi_turn_parallel_history_call_ids_printed_as_given(kimi_named):
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "", "reasoning_content": "Two cities.",
         "tool_calls": [call("get_weather", PARIS, "call_a"), call("get_weather", ROME, "call_b")]},
        {"role": "tool", "tool_call_id": "call_a", "name": "get_weather", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "call_b", "content": "Rain"},
    ]
    s = kept(kimi_named(rec(history, reasoning="Both known.", content="Paris: sun. Rome: rain ☔")))
    prompt = [*k_turn("system", "Be brief.", SYSTEM), *k_turn("user", "Weather in Paris and Rome?", USER),
              ASSISTANT, *b("assistant"), MIDDLE, THINK, *b("Two cities."), THINK_END, SECTION,
              *k_call("call_a", PARIS), *k_call("call_b", ROME), SECTION_END, END,
              *k_turn("get_weather", "## Return of call_a\nSunny", SYSTEM),
              *k_turn("tool", "## Return of call_b\nRain", SYSTEM), *K_GEN]
    response = [*b("Both known."), THINK_END, *b("Paris: sun. Rome: rain ☔"), END]
    assert s.input_ids == prompt + response
    assert s.loss_mask == [0] * len(prompt) + [1] * len(response)


def test_kimi_parallel_calls_with_empty_reasoning_and_empty_content(kimi_named):
    r = rec([{"role": "user", "content": "Both?"}], reasoning="", content=None, reasoning_req={"effort": "high"},
            calls=[call("get_weather", PARIS, "functions.get_weather:0"),
                   call("get_weather", ROME, "functions.get_weather:1")], tools=[WEATHER])
    s = kept(kimi_named(r))
    response = [THINK_END, SECTION, *k_call("functions.get_weather:0", PARIS),
                *k_call("functions.get_weather:1", ROME), SECTION_END, END]
    assert s.input_ids[s.n_prompt:] == response
    assert s.input_ids[:s.n_prompt] == [*K_TOOLS, *k_turn("user", "Both?", USER), *K_GEN]


def test_kimi_thinking_disabled_and_whitespace_only_content(kimi_named):
    s = kept(kimi_named(rec([{"role": "user", "content": "Say nothing"}], content="   ",
                            reasoning_req={"enabled": False})))
    assert s.input_ids == [*k_turn("user", "Say nothing", USER), *K_GEN, THINK_END, *b("   "), END]
    assert s.n_prompt == len(s.input_ids) - 4


def test_kimi_earlier_reasoning_is_dropped_and_non_ascii_survives(kimi_named):
    history = [{"role": "user", "content": "Hi"},
               {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"},
               {"role": "user", "content": "2+2? 数学 ✓"}]
    s = kept(kimi_named(rec(history, reasoning="Add. 加法", content="4 ✅")))
    prompt = [*k_turn("user", "Hi", USER),
              ASSISTANT, *b("assistant"), MIDDLE, THINK, THINK_END, *b("Hello!"), END,
              *k_turn("user", "2+2? 数学 ✓", USER), *K_GEN]
    assert s.input_ids == [*prompt, *b("Add. 加法"), THINK_END, *b("4 ✅"), END]


def test_kimi_auto_template_matches_the_named_format_for_tool_call_turns(kimi_tok, kimi_auto):
    # the synthetic folder's template is the release revision (it inserts the default system prompt)
    release = Reconstructor(resolve_format("kimi-k2.5", kimi_tok, "release"), kimi_tok)
    records = [
        rec([{"role": "user", "content": "Weather in Paris? 🌧️"}], reasoning="Need the tool.", content="Checking.",
            calls=[call("get_weather", PARIS, "call_abc")], tools=[WEATHER]),
        rec([{"role": "user", "content": "Both?"}], reasoning="", reasoning_req={"effort": "high"},
            calls=[call("get_weather", PARIS), call("get_weather", ROME)], tools=[WEATHER]),
    ]
    for r in records:
        assert kept(kimi_auto(r)).input_ids == kept(release(r)).input_ids


def test_kimi_auto_template_that_blanks_the_final_reasoning_is_caught(kimi_auto):
    # K2.5's template renders the last answer without tool calls as history (`<think></think>`): the
    # reasoning the model generated would be lost, so the sample is excluded, naming the piece.
    e = excluded(kimi_auto(rec([{"role": "user", "content": "Hi"}], reasoning="Greeting.", content="Hello")),
                 "decode_mismatch")
    assert e.message.endswith("the returned reasoning is not in the decoded response")


def test_kimi_truncated_answer_keeps_what_was_generated(kimi_named, kimi_auto):
    r = rec([{"role": "user", "content": "Think long"}], reasoning="Let me thi", finish="length")
    s = kept(kimi_named(r))
    assert s.input_ids[s.n_prompt:] == b("Let me thi")  # no </think>, no <|im_end|>: never generated
    assert s.flags == ("truncated",)
    excluded(kimi_auto(r), "truncated")


def test_kimi_logprobs_are_compared_token_by_token(kimi_named):
    ok = kept(kimi_named(rec([{"role": "user", "content": "Hi"}], content="Hé", reasoning_req={"enabled": False},
                             logprobs={"content": [{"token": "H", "logprob": -0.1},
                                                   {"token": "Ã", "bytes": [195], "logprob": -0.2},
                                                   {"token": "©", "bytes": [169], "logprob": -0.3}]})))
    assert (ok.logprobs, ok.flags) == ("match", ())
    bad = kept(kimi_named(rec([{"role": "user", "content": "Hi"}], content="Hé", reasoning_req={"enabled": False},
                              logprobs={"content": [{"token": "Hé", "logprob": -0.1}]})))
    assert (bad.logprobs, bad.flags) == ("mismatch", ("logprob_mismatch",))


def test_kimi_token_count_gap_is_reported_and_a_large_one_flagged(kimi_named):
    small = kept(kimi_named(rec([{"role": "user", "content": "Hi"}], content="Hello", reasoning="x",
                                usage={"completion_tokens": 10})))
    assert (small.completion_gap, small.flags) == (len("x") + 1 + len("Hello") + 1 - 10, ())
    large = kept(kimi_named(rec([{"role": "user", "content": "Hi"}], content="Hello", reasoning="x",
                                usage={"completion_tokens": 40})))
    assert (large.completion_gap, large.flags) == (8 - 40, ("token_count_gap",))


def test_kimi_hidden_reasoning_cannot_be_rebuilt(kimi_named):
    excluded(kimi_named(rec([{"role": "user", "content": "Hi"}], content="Hello",
                            usage={"completion_tokens": 90, "completion_tokens_details": {"reasoning_tokens": 80}})),
             "reasoning_missing")
    excluded(kimi_named(rec([{"role": "user", "content": "Hi"}], content="Hello",
                            reasoning_req={"effort": "high", "exclude": True})), "reasoning_missing")


# ---------------------------------------------------------------------------- DeepSeek-V4 (real)


@pytest.fixture(scope="module")
def ds_tok() -> LoadedTokenizer:
    return load_tokenizer(TargetSpec(model="m", tokenizer="bundled:deepseek-v4"))


BOS, EOS, DS_USER, DS_ASSISTANT, DS_THINK, DS_THINK_END, DSML = 0, 1, 128803, 128804, 128821, 128822, 128825
V4_TOOLS = (
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
    'writing a "<｜DSML｜tool_calls>" block like the following:\n\n<｜DSML｜tool_calls>\n'
    '<｜DSML｜invoke name="$TOOL_NAME">\n<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">'
    "$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\nString parameters should be specified as is and set "
    '`string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format '
    'and set `string="false"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your '
    "complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, "
    "output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n"
    '{"name": "get_weather", "description": "Get weather", "parameters": {"type": "object", "required": '
    '["city"], "properties": {"city": {"type": "string", "description": "City name"}, "unit": {"type": '
    '"string", "enum": ["c", "f"]}}}}\n\nYou MUST strictly follow the above defined tool name and parameter '
    "schemas to invoke tool calls.\n")


def test_deepseek_v4_tool_call_in_dsml_exact(ds_tok):
    rc = Reconstructor(resolve_format("deepseek-v4", ds_tok), ds_tok)
    r = rec([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris? 🌧️"}],
            reasoning="Need the tool.", content="", tools=[WEATHER], reasoning_req={"effort": "high"},
            calls=[call("get_weather", '{"city": "Paris", "days": 2}', "call_1")])
    s = kept(rc(r))
    prompt_text = ("<｜begin▁of▁sentence｜>Be brief.\n\n" + V4_TOOLS
                   + "<｜User｜>Weather in Paris? 🌧️<｜Assistant｜><think>")
    assert ds_tok.decode(s.input_ids[:s.n_prompt]) == prompt_text
    assert s.input_ids[:s.n_prompt] == ds_tok.encode(prompt_text)
    assert s.input_ids[0] == BOS
    assert s.input_ids[s.n_prompt - 10:s.n_prompt] == [DS_USER, 58565, 295, 11111, 33, 73369, 103, 10759,
                                                         DS_ASSISTANT, DS_THINK]
    dsml = ('\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
            '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
            '<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n'
            '</｜DSML｜invoke>\n</｜DSML｜tool_calls>')
    response = s.input_ids[s.n_prompt:]
    assert response == [50249, 270, 4105, 16, DS_THINK_END, *ds_tok.encode(dsml), EOS]
    assert response.count(DSML) == 8
    assert s.loss_mask == [0] * s.n_prompt + [1] * len(response)
    assert s.flags == ("arguments_reencoded",)


def test_deepseek_v4_multi_turn_drops_earlier_reasoning_in_chat_and_thinking_modes(ds_tok):
    rc = Reconstructor(resolve_format("deepseek-v4", ds_tok), ds_tok)
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
               {"role": "assistant", "content": "Hello! 👋", "reasoning_content": "greet"},
               {"role": "user", "content": "Sunny, 21°C 🌞?"}]
    chat = kept(rc(rec(history, content="Yes.")))
    head = "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>Hello! 👋<｜end▁of▁sentence｜><｜User｜>"
    assert ds_tok.decode(chat.input_ids[:chat.n_prompt]) == head + "Sunny, 21°C 🌞?<｜Assistant｜></think>"
    question = [DS_USER, *ds_tok.encode("Sunny, 21°C 🌞?")]
    assert chat.input_ids[chat.n_prompt - len(question) - 2:chat.n_prompt] == [*question, DS_ASSISTANT, DS_THINK_END]
    assert chat.input_ids[chat.n_prompt:] == [*ds_tok.encode("Yes."), EOS]
    think = kept(rc(rec(history, reasoning="Weather talk.", content="Yes.")))
    assert ds_tok.decode(think.input_ids[:think.n_prompt]) == head + "Sunny, 21°C 🌞?<｜Assistant｜><think>"
    assert think.input_ids[think.n_prompt:] == [*ds_tok.encode("Weather talk."), DS_THINK_END,
                                                *ds_tok.encode("Yes."), EOS]


def test_deepseek_v4_tool_results_join_the_user_turn_in_call_order(ds_tok):
    rc = Reconstructor(resolve_format("deepseek-v4", ds_tok), ds_tok)
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": "", "reasoning_content": "Two.",
                "tool_calls": [call("get_weather", PARIS, "c1"), call("get_weather", ROME, "c2")]},
               {"role": "tool", "tool_call_id": "c2", "content": "Rain"},
               {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}]
    s = kept(rc(rec(history, reasoning="Done.", content="Paris sunny, Rome rain.", tools=[WEATHER])))
    tail = ('<｜User｜>Weather?<｜Assistant｜><think>Two.</think>\n\n<｜DSML｜tool_calls>\n'
            '<｜DSML｜invoke name="get_weather">\n'
            '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
            '</｜DSML｜invoke>\n<｜DSML｜invoke name="get_weather">\n'
            '<｜DSML｜parameter name="city" string="true">Rome</｜DSML｜parameter>\n'
            '<｜DSML｜parameter name="unit" string="true">c</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
            '</｜DSML｜tool_calls><｜end▁of▁sentence｜>'
            '<｜User｜><tool_result>Sunny</tool_result>\n\n<tool_result>Rain</tool_result><｜Assistant｜><think>')
    prompt_text = "<｜begin▁of▁sentence｜>\n\n" + V4_TOOLS + tail  # tools go into an empty system message
    assert s.input_ids[:s.n_prompt] == ds_tok.encode(prompt_text)
    assert s.input_ids[s.n_prompt:] == [*ds_tok.encode("Done."), DS_THINK_END,
                                        *ds_tok.encode("Paris sunny, Rome rain."), EOS]


def test_deepseek_v3_format_works_with_the_v4_tokenizer(ds_tok):
    rc = Reconstructor(resolve_format("deepseek-v3", ds_tok), ds_tok)
    s = kept(rc(rec([{"role": "user", "content": "Weather in Paris? 🌧️"}], reasoning="Need the tool.",
                    calls=[call("get_weather", '{"city": "Paris", "days": 2}')], tools=[WEATHER])))
    assert s.input_ids[s.n_prompt:] == [50249, 270, 4105, 16, DS_THINK_END, 128806, 128808, 1133, 65, 50219, 128814,
                                        *ds_tok.encode('{"city": "Paris", "days": 2}'), 128809, 128807, EOS]
    assert s.input_ids[s.n_prompt - 10:s.n_prompt] == [DS_USER, 58565, 295, 11111, 33, 73369, 103, 10759,
                                                         DS_ASSISTANT, DS_THINK]
    # after a tool result the answer follows directly, without a header
    after = kept(rc(rec([{"role": "user", "content": "Paris?"},
                         {"role": "assistant", "tool_calls": [call("get_weather", PARIS, "c1")]},
                         {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}], content="Sunny.")))
    assert ds_tok.decode(after.input_ids) == (
        "<｜begin▁of▁sentence｜><｜User｜>Paris?<｜Assistant｜></think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
        'get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'
        "<｜tool▁output▁begin｜>Sunny<｜tool▁output▁end｜>Sunny.<｜end▁of▁sentence｜>")
    assert after.input_ids[after.n_prompt:] == [*ds_tok.encode("Sunny."), EOS]


# ------------------------------------------------------------------------------------------ Qwen3

# A Qwen3-style template, written from the Qwen3 template's documented behaviour.
QWEN_TEMPLATE = "".join([
    "{%- macro text(c) -%}{%- if c is string -%}{{ c }}{%- elif c -%}",
    "{%- for p in c -%}{{ p.text }}{%- endfor -%}{%- endif -%}{%- endmacro -%}",
    "{%- if tools -%}{{- '<|im_start|>system\\n' -}}",
    "{%- if messages[0].role == 'system' -%}{{- text(messages[0].content) + '\\n\\n' -}}{%- endif -%}",
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' -}}",
    "{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}",
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}",
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within ' -}}",
    "{{- '<tool_call></tool_call> XML tags:\\n<tool_call>\\n' -}}",
    "{{- '{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' -}}",
    "{%- elif messages[0].role == 'system' -%}",
    "{{- '<|im_start|>system\\n' + text(messages[0].content) + '<|im_end|>\\n' -}}{%- endif -%}",
    "{%- set ns = namespace(multi=true, last=messages|length - 1) -%}",
    "{%- for m in messages[::-1] -%}{%- set i = messages|length - 1 - loop.index0 -%}{%- set c = text(m.content) -%}",
    "{%- if ns.multi and m.role == 'user' and not (c.startswith('<tool_response>') and c.endswith('</tool_response>'))",
    " -%}{%- set ns.multi = false -%}{%- set ns.last = i -%}{%- endif -%}{%- endfor -%}",
    "{%- for m in messages -%}{%- set c = text(m.content) -%}",
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) -%}",
    "{{- '<|im_start|>' + m.role + '\\n' + c + '<|im_end|>\\n' -}}",
    "{%- elif m.role == 'assistant' -%}",
    "{%- set r = m.reasoning_content if m.reasoning_content is string else '' -%}",
    "{%- if loop.index0 > ns.last and (loop.last or r) -%}",
    "{{- '<|im_start|>assistant\\n<think>\\n' + r.strip('\\n') + '\\n</think>\\n\\n' + c.lstrip('\\n') -}}",
    "{%- else -%}{{- '<|im_start|>assistant\\n' + c -}}{%- endif -%}",
    "{%- for tc in m.tool_calls or [] -%}{%- if (loop.first and c) or not loop.first -%}{{- '\\n' -}}{%- endif -%}",
    "{{- '<tool_call>\\n{\"name\": \"' + tc.function.name + '\", \"arguments\": ' -}}",
    "{%- if tc.function.arguments is string -%}{{- tc.function.arguments -}}",
    "{%- else -%}{{- tc.function.arguments | tojson -}}{%- endif -%}{{- '}\\n</tool_call>' -}}{%- endfor -%}",
    "{{- '<|im_end|>\\n' -}}",
    "{%- elif m.role == 'tool' -%}",
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}",
    "{{- '\\n<tool_response>\\n' + c + '\\n</tool_response>' -}}",
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}",
    "{%- endif -%}{%- endfor -%}",
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}",
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}",
    "{%- endif -%}{%- endif -%}",
])


@pytest.fixture(scope="module")
def qwen_tok(tmp_path_factory) -> LoadedTokenizer:
    folder = qwen3_folder(tmp_path_factory.mktemp("qwen3"), QWEN_TEMPLATE)
    return load_tokenizer(TargetSpec(model="m", tokenizer=str(folder)))


IM_START, IM_END, Q_THINK, Q_THINK_END, TOOL_CALL, TOOL_CALL_END = 151644, 151645, 151667, 151668, 151657, 151658


def test_qwen_tokenizer_has_qwen3_special_ids(qwen_tok):
    assert {m: qwen_tok.token_id(m) for m in ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
                                               "</tool_call>", "<tool_response>", "</tool_response>")} == {
        "<|im_start|>": 151644, "<|im_end|>": 151645, "<think>": 151667, "</think>": 151668,
        "<tool_call>": 151657, "</tool_call>": 151658, "<tool_response>": 151665, "</tool_response>": 151666}
    assert qwen_tok.encode("Hello world") == [9707, 1879]


QWEN_CASES = {
    "single_call": rec([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris? 🌧️"}],
                       reasoning="Need the tool.", content="", tools=[WEATHER],
                       calls=[call("get_weather", PARIS, "call_1")]),
    "parallel_calls_with_content": rec([{"role": "user", "content": "Both?"}], reasoning="Two cities.",
                                       content="Checking both.", tools=[WEATHER],
                                       calls=[call("get_weather", PARIS), call("get_weather", ROME)]),
    "multi_turn_tools": rec([{"role": "user", "content": "Weather?"},
                             {"role": "assistant", "content": "", "reasoning_content": "Call it.",
                              "tool_calls": [call("get_weather", PARIS, "c1"), call("get_weather", ROME, "c2")]},
                             {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
                             {"role": "tool", "tool_call_id": "c2", "content": "Rain"}],
                            reasoning="Both known.", content="Paris: sun ☀️; Rome: rain.", tools=[WEATHER]),
    "multi_turn_chat": rec([{"role": "user", "content": "Hi"},
                            {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"},
                            {"role": "user", "content": "数学: 2+2?"}], reasoning="", content="4",
                           reasoning_req={"effort": "low"}),
    "whitespace_content": rec([{"role": "user", "content": "Spaces"}], reasoning="ok", content="   "),
}


@pytest.mark.parametrize("case", sorted(QWEN_CASES))
def test_qwen3_named_format_equals_the_qwen3_template(qwen_tok, case):
    named = kept(Reconstructor(resolve_format("qwen3", qwen_tok), qwen_tok)(QWEN_CASES[case]))
    auto = kept(Reconstructor(resolve_format("auto", qwen_tok), qwen_tok)(QWEN_CASES[case]))
    assert named.input_ids == auto.input_ids
    assert named.n_prompt == auto.n_prompt
    assert named.input_ids[-1] == IM_END  # the template's "\n" after <|im_end|> was never generated


def test_qwen3_single_call_exact(qwen_tok):
    s = kept(Reconstructor(resolve_format("qwen3", qwen_tok), qwen_tok)(QWEN_CASES["single_call"]))
    prompt_text = (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
        "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + json.dumps(WEATHER, ensure_ascii=False)
        + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
        "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris? 🌧️<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert s.input_ids[:s.n_prompt] == qwen_tok.encode(prompt_text)
    assert s.input_ids[s.n_prompt:] == [Q_THINK, *qwen_tok.encode("\nNeed the tool.\n"), Q_THINK_END,
                                        *qwen_tok.encode("\n\n"), TOOL_CALL,
                                        *qwen_tok.encode('\n{"name": "get_weather", "arguments": ' + PARIS + "}\n"),
                                        TOOL_CALL_END, IM_END]
    assert s.loss_mask == [0] * s.n_prompt + [1] * (s.n_tokens - s.n_prompt)


def test_qwen3_reasoning_newlines_are_normalized_and_flagged(qwen_tok):
    # the template trims newlines around the reasoning: "\nThink.\n" still appears verbatim, "\n\nThink."
    # only trimmed, which is kept but flagged
    for reasoning, flags in (("\nThink.\n", ()), ("\n\nThink.", ("whitespace_normalized",))):
        r = rec([{"role": "user", "content": "Hi"}], reasoning=reasoning, content="\nHello")
        for fmt in ("qwen3", "auto"):
            s = kept(Reconstructor(resolve_format(fmt, qwen_tok), qwen_tok)(r))
            assert s.flags == flags
            assert qwen_tok.decode(s.input_ids[s.n_prompt:]) == "<think>\nThink.\n</think>\n\nHello<|im_end|>"


# ---------------------------------------------------------------- splitting is the same as whole


def test_tokenizing_the_halves_equals_tokenizing_the_whole(kimi_tok, kimi_named, ds_tok, qwen_tok):
    pairs = [(kimi_tok, kimi_named, rec([{"role": "user", "content": "Hi"}], reasoning="r", content="c"))]
    pairs += [(ds_tok, Reconstructor(resolve_format(f, ds_tok), ds_tok),
               rec([{"role": "user", "content": "Weather in Paris? 🌧️"}], reasoning="Need it.", content="ok",
                   calls=[call("get_weather", PARIS)], tools=[WEATHER])) for f in ("deepseek-v3", "deepseek-v4")]
    pairs += [(qwen_tok, Reconstructor(resolve_format("qwen3", qwen_tok), qwen_tok), r) for r in QWEN_CASES.values()]
    disabled = rec([{"role": "user", "content": "Hi"}], content="Hello", reasoning_req={"enabled": False})
    pairs.append((qwen_tok, Reconstructor(resolve_format("qwen3", qwen_tok), qwen_tok), disabled))
    for tok, rc, r in pairs:
        s = kept(rc(r))
        assert tok.encode(tok.decode(s.input_ids)) == s.input_ids


# ------------------------------------------------------------------------------ exclusion reasons


def with_template(tok: LoadedTokenizer, template: str) -> LoadedTokenizer:
    backend = tok.backend
    assert isinstance(backend, TiktokenBackend)
    return dataclasses.replace(tok, chat_template=template, _safe={},
                               backend=TiktokenBackend(backend.enc, template, backend.template_tokens))


SIMPLE = ("{%- for m in messages -%}<|im_user|>{{ m.role }}<|im_middle|>{{ m.content }}"
          "{%- for tc in m.tool_calls or [] -%}<|tool_call_begin|>{{ tc.function.arguments }}{%- endfor -%}"
          "<|im_end|>{%- endfor -%}{%- if add_generation_prompt -%}<|im_user|>assistant<|im_middle|>{%- endif -%}")


def test_a_template_that_raises_is_excluded_with_its_message(kimi_tok):
    tok = with_template(kimi_tok, "{{ raise_exception('no tools for you') }}")
    e = excluded(Reconstructor(resolve_format("auto", tok), tok)(rec([{"role": "user", "content": "Hi"}],
                                                                      content="Hello")), "template_error")
    assert "no tools for you" in e.message


def test_a_template_that_needs_argument_objects_gets_them(kimi_tok):
    tok = with_template(kimi_tok, SIMPLE.replace("{{ tc.function.arguments }}",
                                                 "{{ tc.function.arguments.items() | list | length }}"
                                                 "{{ tc.function.arguments | tojson }}"))
    s = kept(Reconstructor(resolve_format("auto", tok), tok)(rec([{"role": "user", "content": "Hi"}],
                                                                  calls=[call("get_weather", PARIS)])))
    assert s.flags == ("arguments_as_dict",)
    assert s.input_ids[s.n_prompt - 11:] == [USER, *b("assistant"), MIDDLE, CALL, *b("1" + PARIS), END]
    assert s.n_tokens - s.n_prompt == 1 + len("1" + PARIS) + 1


def test_a_response_that_decodes_differently_is_excluded(kimi_tok):
    tok = with_template(kimi_tok, SIMPLE.replace("{{ m.content }}", "{{ m.content | upper }}"))
    e = excluded(Reconstructor(resolve_format("auto", tok), tok)(rec([{"role": "user", "content": "HI"}],
                                                                      content="Hello")), "decode_mismatch")
    assert e.message.endswith("the returned content is not in the decoded response")


def test_a_prompt_that_is_not_a_prefix_is_excluded(kimi_tok):
    tok = with_template(kimi_tok, SIMPLE.replace("assistant<|im_middle|>{%- endif", "model<|im_middle|>{%- endif"))
    e = excluded(Reconstructor(resolve_format("auto", tok), tok)(rec([{"role": "user", "content": "Hi"}],
                                                                      content="Hello")), "prefix_mismatch")
    assert "not a prefix" in e.message


class ZqFormat(ChatFormat):
    """A toy format whose marker `zq` is one token alone but merges into `zqz` in context."""

    name = "zq"
    markers = ("zq",)

    def render(self, messages, tools, turn: Turn, thinking: bool) -> Rendering:
        return Rendering("<|im_end|>", "<|im_end|>" + turn.content, (("content", turn.content),))


def test_a_marker_that_is_not_one_token_in_context_is_excluded(kimi_tok):
    assert kimi_tok.token_id("zq") == 256
    e = excluded(Reconstructor(ZqFormat(), kimi_tok)(rec([{"role": "user", "content": "x"}], content="zqz")),
                 "marker_split")
    assert "'zq'" in e.message


def test_a_sample_longer_than_the_tokenizer_allows_is_excluded(kimi_tok):
    short = dataclasses.replace(kimi_tok, max_length=15, _safe={})
    e = excluded(Reconstructor(resolve_format("kimi-k2.5", short), short)(rec([{"role": "user", "content": "Hi"}],
                                                                               content="Hello")), "too_long")
    assert e.message.endswith("more than the tokenizer's maximum 15")


@pytest.mark.parametrize("record, reason", [
    (rec([{"role": "user", "content": "Hi"}], status="failed"), "status_failed"),
    (rec([{"role": "user", "content": "Hi"}], status="rejected"), "status_rejected"),
    (rec([{"role": "user", "content": "Hi"}], content="x", policy="drop"), "policy_drop"),
    ({**rec([{"role": "user", "content": "Hi"}]), "response": None}, "no_response"),
    (rec([{"role": "user", "content": "Hi"}], content="x", finish="content_filter"), "content_filter"),
    (rec([{"role": "user", "content": "Hi"}], calls=[call("", "{}")]), "malformed_response"),
    (rec([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey"}], content="x"), "template_error"),
    (rec([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], content="x"),
     "template_error"),
])
def test_records_that_give_no_sample_are_counted_by_reason(kimi_named, record, reason):
    excluded(kimi_named(record), reason)


def test_a_flagged_record_is_kept_with_the_flag(kimi_named):
    s = kept(kimi_named(rec([{"role": "user", "content": "Hi"}], content="x", reasoning="y", policy="flag")))
    assert s.flags == ("tool_policy_flag",)


# -------------------------------------------- chatFormat auto: the thinking default is the template's


def _with_template(src: Path, folder: Path, template: str) -> LoadedTokenizer:
    """A copy of tokenizer folder `src` whose chat template is `template`."""
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((src / name).read_bytes())
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template}))
    return load_tokenizer(TargetSpec(model="m", tokenizer=str(folder)))


SILENT = [  # neither the answer (no reasoning) nor the request says whether the model thought
    rec([{"role": "user", "content": "Hi"}], content="Hello!"),
    rec([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Paris?"}], content="",
        calls=[call("get_weather", PARIS, "c1")]),
    rec([{"role": "user", "content": "Paris?"}, {"role": "assistant", "content": "",
                                                 "tool_calls": [call("get_weather", PARIS, "c1")]},
         {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}, {"role": "user", "content": "So?"}],
        content="Sunny."),
]


def _provider_prompt(tok: LoadedTokenizer, r: dict[str, Any]) -> list[int]:
    """What a provider that passes no thinking switch renders: the template's own default."""
    return tok.encode(tok.apply_chat_template(r["request"]["messages"], tools=r["request"].get("tools"),
                                              add_generation_prompt=True))


@pytest.mark.parametrize("family, default", [("deepseek-v3.1", False), ("qwen3", True)])
@pytest.mark.parametrize("reported", [False, True])
def test_auto_thinking_default_comes_from_the_template_and_no_sample_is_lost(
        family, default, reported, ds_tok, qwen_tok, tmp_path):
    from tests.reference_helpers import reference

    template = reference(f"{family}/chat_template.jinja").read_text()
    src = ds_tok.folder if family == "deepseek-v3.1" else qwen_tok.folder
    tok = _with_template(src, tmp_path / family, template)
    rebuild = Reconstructor(resolve_format("auto", tok), tok)
    assert rebuild.fmt.default_thinking is default
    for r in SILENT:
        want = _provider_prompt(tok, r)
        if reported:
            r = {**r, "usage": {"prompt_tokens": len(want)}}
        s = kept(rebuild(r))
        assert s.input_ids[:s.n_prompt] == want
        assert s.prompt_gap in (None, 0) and "thinking_inferred" not in s.flags


def test_the_other_reading_is_taken_when_the_providers_count_says_so(qwen_tok):
    """Qwen3 thinks unless told not to; a provider that switched thinking off without the request
    saying so rendered `<think>\\n\\n</think>\\n\\n` in the prompt: its prompt_tokens tell."""
    rebuild = Reconstructor(resolve_format("auto", qwen_tok), qwen_tok)
    r = SILENT[0]
    off = qwen_tok.encode(qwen_tok.apply_chat_template(r["request"]["messages"], add_generation_prompt=True,
                                                       enable_thinking=False))
    s = kept(rebuild({**r, "usage": {"prompt_tokens": len(off)}}))
    assert (s.input_ids[:s.n_prompt], s.prompt_gap, s.flags) == (off, 0, ("thinking_inferred",))
    s = kept(rebuild({**r, "usage": {"prompt_tokens": len(off) + 7}}))  # neither fits: the template's default
    assert (s.prompt_gap, s.flags) == (len(_provider_prompt(qwen_tok, r)) - len(off) - 7, ())
    # the provider's reading found over the canary comes first: also where it reports no count
    found = Reconstructor(resolve_format("auto", qwen_tok), qwen_tok, unsaid=False)
    for usage in ({}, {"prompt_tokens": len(off)}):
        s = kept(found({**r, "usage": usage}))
        assert (s.input_ids[:s.n_prompt], s.flags) == (off, ("thinking_inferred",))
    s = kept(found({**r, "request": {**r["request"], "reasoning": {"enabled": True}}}))  # said: no inference
    assert s.input_ids[:s.n_prompt] == _provider_prompt(qwen_tok, r) and s.flags == ()
