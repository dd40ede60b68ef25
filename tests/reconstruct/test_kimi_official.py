"""Kimi K2.5 against Moonshot's official chat template, rendered with Jinja the way transformers
renders it (the synthetic vocabulary has Kimi's real special ids, so token ids compare exactly):
no default system prompt in the current revision (the release revision's is a named variant),
history call ids printed as given, the answer's call ids the ones the API returned, and history
reasoning read only from `reasoning_content`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from eyrie.jobs.reconstruct import kimi_facts as kimi
from eyrie.jobs.reconstruct.base import Rendering, Turn
from eyrie.jobs.reconstruct.formats import resolve_format
from eyrie.jobs.reconstruct.kimi import KimiK25
from eyrie.jobs.reconstruct.reconstructor import Excluded, Reconstructor, Sample
from eyrie.jobs.reconstruct.tokenizers import LoadedTokenizer, load_tokenizer
from eyrie.jobs.spec import TargetSpec
from tests.reference_helpers import reference

SYNTHETIC = Path(__file__).parents[1] / "data" / "kimi_synthetic"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get weather",
    "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Time now",
                                         "parameters": {"type": "object", "properties": {}}}}
PARIS, ROME = '{"city": "Paris"}', '{"city": "Rome"}'
# What the release revision of the K2.5 template added (the model card's template at launch).
RELEASE_BLOCK = ("{%- if messages[0]['role'] != 'system' -%}<|im_system|>system<|im_middle|>"
                 f"{kimi.DEFAULT_SYSTEM_PROMPT}<|im_end|>{{%- endif -%}}\n")


@pytest.fixture(scope="module")
def current() -> str:
    return reference("kimi-k2.5/chat_template.jinja").read_text()


@pytest.fixture(scope="module")
def release(current) -> str:
    anchor = "{%- for message in hist_msgs -%}"
    assert current.count(anchor) == 1
    return current.replace(anchor, RELEASE_BLOCK + anchor)


@pytest.fixture(scope="module")
def tok() -> LoadedTokenizer:
    return load_tokenizer(TargetSpec(model="m", tokenizer=str(SYNTHETIC)))


def official(template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *,
             gen: bool, **kw: Any) -> str:
    """What a provider running the official template renders (Kimi's tokenizer sorts the tools and
    passes their TypeScript declaration as `tools_ts_str`)."""
    extra: dict[str, Any] = {}
    if tools:
        tools = kimi.deep_sort(tools)
        extra["tools_ts_str"] = kimi.tools_typescript(tools)
    out, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                   add_generation_prompt=gen, **extra, **kw)
    return out[0]


def call(name: str, args: str, cid: str | None) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def record(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *, reasoning: str = "",
           content: str = "", calls: list[dict[str, Any]] | None = None, thinking: bool | None = None,
           usage: dict[str, Any] | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {"model": "m", "messages": messages, **({"tools": tools} if tools else {})}
    if thinking is not None:
        request["reasoning"] = {"enabled": thinking}
    return {"sample_id": "s", "source": "src", "row": 0, "status": "ok", "policy": "keep", "request": request,
            "response": {"reasoning": reasoning, "content": content, "tool_calls": calls or [],
                         "finish_reason": "tool_calls" if calls else "stop"}, "usage": usage}


def kept(result: Sample | Excluded) -> Sample:
    assert isinstance(result, Sample), result
    return result


def named(tok: LoadedTokenizer, variant: str | None = None) -> Reconstructor:
    return Reconstructor(resolve_format("kimi-k2.5", tok, variant), tok)


CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {
    "plain": ([{"role": "user", "content": "Hi 👋"}], None),
    "system": ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], None),
    "tools": ([{"role": "user", "content": "Weather in Paris?"}], [WEATHER, TIME]),
    "named_and_parts": ([{"role": "user", "name": "ana", "content": [{"type": "text", "text": "a"},
                                                                   {"type": "text", "text": "b"}]},
                         {"role": "assistant", "name": "bot", "content": "ok", "reasoning_content": "r"},
                         {"role": "system", "content": "Later system note."},
                         {"role": "user", "content": "again"}], None),
}


@pytest.mark.parametrize("case", sorted(CONVERSATIONS))
@pytest.mark.parametrize("variant", ["current", "release"])
def test_prompt_equals_the_official_template_of_each_revision(tok, current, release, case, variant):
    """Defect 1: the current revision inserts no default system prompt; the release one did, and
    which a provider serves is a named variant of the format."""
    messages, tools = CONVERSATIONS[case]
    template = current if variant == "current" else release
    s = kept(named(tok, variant)(record(messages, tools, content="Hello.")))
    assert s.input_ids[:s.n_prompt] == tok.encode(official(template, messages, tools, gen=True))
    assert (kimi.DEFAULT_SYSTEM_PROMPT in tok.decode(s.input_ids)) == (variant == "release" and case != "system")


def test_the_default_variant_is_the_current_revision(tok):
    fmt = resolve_format("kimi-k2.5", tok)
    assert (fmt.variant, list(fmt.variants)) == ("current", ["current", "release"])
    assert fmt.sha256 != resolve_format("kimi-k2.5", tok, "release").sha256  # the hash names the variant


HISTORY = [
    {"role": "user", "content": "What time is it, twice?"},
    {"role": "assistant", "content": "", "reasoning_content": "Call it.",
     "tool_calls": [call("get_time", "{}", "functions.get_time:0")]},
    {"role": "tool", "tool_call_id": "functions.get_time:0", "content": "10:00"},
    {"role": "assistant", "content": "", "reasoning_content": "Again.",
     "tool_calls": [call("get_time", "{}", "functions.get_time:1")]},
    {"role": "tool", "tool_call_id": "functions.get_time:1", "name": "get_time", "content": "10:01"},
    {"role": "assistant", "content": "It is 10:01.", "reasoning_content": "Done."},
    {"role": "user", "content": "And the weather in Paris and Rome?"},
]


def test_history_call_ids_are_printed_as_given(tok, current):
    """Defect 2: `functions.get_time:1` stays `:1` in the call and its `## Return of` line (the
    per-turn counter made it `:0`)."""
    s = kept(named(tok)(record(HISTORY, [WEATHER, TIME], content="Sure.")))
    prompt = official(current, HISTORY, [WEATHER, TIME], gen=True)
    assert "## Return of functions.get_time:1\n" in prompt
    assert s.input_ids[:s.n_prompt] == tok.encode(prompt)


def test_the_answers_call_ids_are_the_ones_the_api_returned(tok, current):
    """Defect 3: Kimi numbers calls across the conversation (two earlier calls: this answer's are :2
    and :3) and the API returns those ids; the whole is what the template renders with them."""
    calls = [call("get_weather", PARIS, "functions.get_weather:2"),
             call("get_weather", ROME, "functions.get_weather:3")]
    s = kept(named(tok)(record(HISTORY, [WEATHER, TIME], reasoning="Both cities.", calls=calls)))
    whole = official(current, [*HISTORY, {"role": "assistant", "content": "", "reasoning_content": "Both cities.",
                                          "tool_calls": calls}], [WEATHER, TIME], gen=False)
    assert s.input_ids == tok.encode(whole)
    assert s.flags == ()
    response = tok.decode(s.input_ids[s.n_prompt:])
    assert "functions.get_weather:2" in response and "functions.get_weather:3" in response


def test_ids_a_gateway_replaced_are_counted_across_the_conversation_and_flagged(tok, current):
    calls = [call("get_weather", PARIS, "call_9f2c"), call("get_weather", ROME, None)]
    s = kept(named(tok)(record(HISTORY, [WEATHER, TIME], reasoning="Both cities.", calls=calls)))
    native = [call("get_weather", PARIS, "functions.get_weather:2"),
              call("get_weather", ROME, "functions.get_weather:3")]
    whole = official(current, [*HISTORY, {"role": "assistant", "content": "", "reasoning_content": "Both cities.",
                                          "tool_calls": native}], [WEATHER, TIME], gen=False)
    assert s.input_ids == tok.encode(whole)
    assert s.flags == ("call_id_inferred",)


class _Renumbering(KimiK25):
    """The old behaviour: the answer's ids numbered from 0 within the answer."""

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, turn: Turn,
               thinking: bool) -> Rendering:
        r = super().render(messages, tools, turn, thinking)
        response = r.whole[len(r.prompt):]
        for j, c in enumerate(turn.calls):
            response = response.replace(str(c.id), f"functions.{c.name}:{j}")
        return Rendering(r.prompt, r.prompt + response, r.pieces, r.flags)


def test_verification_compares_the_call_ids(tok):
    calls = [call("get_weather", PARIS, "functions.get_weather:2")]
    e = Reconstructor(_Renumbering(), tok)(record(HISTORY, [WEATHER, TIME], reasoning="Paris.", calls=calls))
    assert isinstance(e, Excluded) and e.reason == "decode_mismatch", e
    assert e.message.endswith("the returned tool_calls[0].id is not in the decoded response")


TOOL_ROUND = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "Checking.", "reasoning": "Only under reasoning.",
     "tool_calls": [call("get_weather", PARIS, "functions.get_weather:0")]},
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "Sunny"},
]


def test_history_reasoning_under_other_names_is_rendered_as_the_template_does(tok, current):
    """The template reads `reasoning_content` only, and transformers fills it from `reasoning` (or
    `thinking`) when it is null or missing; a null with nothing else prints as Jinja prints None."""
    s = kept(named(tok)(record(TOOL_ROUND, [WEATHER], reasoning="Sunny it is.", content="Sunny.")))
    prompt = official(current, TOOL_ROUND, [WEATHER], gen=True)
    assert "<think>Only under reasoning.</think>" in prompt
    assert s.input_ids[:s.n_prompt] == tok.encode(prompt)
    for variant in ({"reasoning_content": None}, {"reasoning": None, "reasoning_content": None},
                    {"reasoning": None, "thinking": "under thinking"}, {"reasoning": None}):
        round_ = [TOOL_ROUND[0], {**TOOL_ROUND[1], **variant}, TOOL_ROUND[2]]
        s = kept(named(tok)(record(round_, [WEATHER], reasoning="Sunny it is.", content="Sunny.")))
        assert s.input_ids[:s.n_prompt] == tok.encode(official(current, round_, [WEATHER], gen=True)), variant


def test_thinking_off_drops_reasoning_after_the_last_plain_answer_too(tok, current):
    round_ = [TOOL_ROUND[0], {**TOOL_ROUND[1], "reasoning_content": "kept only when thinking"}, TOOL_ROUND[2]]
    for thinking in (True, False):
        s = kept(named(tok)(record(round_, [WEATHER], content="Sunny.", thinking=thinking)))
        assert s.input_ids[:s.n_prompt] == tok.encode(official(current, round_, [WEATHER], gen=True,
                                                               thinking=thinking))


def test_auto_with_the_official_template_equals_the_named_format(tok, current, tmp_path):
    folder = tmp_path / "kimi"
    shutil.copytree(SYNTHETIC, folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": current}))
    auto_tok = load_tokenizer(TargetSpec(model="m", tokenizer=str(folder)))
    auto = Reconstructor(resolve_format("auto", auto_tok), auto_tok)
    assert auto.fmt.default_thinking  # the template opens <think> when nothing is said
    for calls in ([call("get_weather", PARIS, "functions.get_weather:2")], [call("get_weather", ROME, "call_1")]):
        r = record(HISTORY, [WEATHER, TIME], reasoning="One city.", calls=calls)
        a, n = kept(auto(r)), kept(named(tok)(r))
        assert (a.input_ids, a.n_prompt, a.flags) == (n.input_ids, n.n_prompt, n.flags)
