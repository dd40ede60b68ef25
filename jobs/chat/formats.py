"""Chat formats: the text a target model saw (prompt) and generated (response) for one API answer.

`chatFormat: auto` renders with the tokenizer's own chat template: the prompt is
`apply_chat_template(messages, tools=<tools as sent>, add_generation_prompt=True)`, the whole is the
same call with the assistant message appended and `add_generation_prompt=False`; the response is
the whole minus the prompt, cut after its end-of-turn marker (anything a template prints after it,
such as a newline, was never generated). The assistant message carries the reasoning under both
`reasoning_content` and `reasoning`, the content, and `tool_calls` whose `arguments` is the exact
string returned. A template that fails on string arguments is tried once more with the arguments
parsed into objects (flag `arguments_as_dict`; the check that decoding gives back the returned
arguments then decides whether the sample is kept). Templates are given `thinking` and
`enable_thinking` (the names Kimi/DeepSeek and Qwen templates read).

Named formats are for tokenizers without a usable template (`kimi-k2.5`, `deepseek-v3` (V3.1),
`deepseek-v4`, `qwen3`). They are written from each family's documented facts, render the prompt
exactly as the family's template or encoder does and the response as the model generates it, so
the whole is prompt + response by construction. Each family's end-of-turn token, which providers
strip, closes the response (`<|im_end|>` for Kimi and Qwen, `<｜end▁of▁sentence｜>` for DeepSeek)
unless the answer was cut off (`finish_reason: length`, flag `truncated`).

Every format also lists the special markers that must be single token IDs and the text pieces
(reasoning, content, each call's arguments, in order) that decoding the response must give back.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from eyrie.jobs.chat import kimi
from eyrie.jobs.chat.tokenizers import LoadedTokenizer, TokenizerError

Message = dict[str, Any]


class FormatError(ValueError):
    """This conversation cannot be rendered; `reason` is the exclusion reason counted for it."""

    def __init__(self, message: str, reason: str = "template_error"):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # byte-for-byte as returned
    id: str | None = None


@dataclass(frozen=True)
class Turn:
    """One generated assistant answer, as the API returned it."""

    reasoning: str = ""
    content: str = ""
    calls: tuple[Call, ...] = ()
    finished: bool = True  # False when cut off by max_tokens: no end-of-turn was generated


@dataclass(frozen=True)
class Rendering:
    prompt: str  # what the model was given
    whole: str  # prompt + response (+ whatever a template prints after the end of turn)
    pieces: tuple[tuple[str, str], ...]  # (label, text) the response must decode back to, in order
    flags: tuple[str, ...] = ()
    end_markers: tuple[str, ...] = ()  # the response ends after the last of these (auto)


# ------------------------------------------------------------------------------ message helpers


def text_of(content: Any, where: str) -> str:
    """Message content as text: a string, or OpenAI content parts of type text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                out.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise FormatError(f"{where}: content part of type {kind!r} is not supported (text only)")
        return "".join(out)
    raise FormatError(f"{where}: content must be a string or a list of parts")


def _reasoning_of(msg: Message) -> str:
    r = msg.get("reasoning_content")
    if r is None:
        r = msg.get("reasoning")
    return r if isinstance(r, str) else ""


def _args_text(args: Any) -> str:
    """History arguments as a template prints them: a string as is, an object as JSON."""
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def _calls_of(msg: Message, where: str) -> list[tuple[str | None, str, str]]:
    """(id, name, arguments text) of a history assistant message's tool calls."""
    out = []
    for j, tc in enumerate(msg.get("tool_calls") or ()):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise FormatError(f"{where}.tool_calls[{j}]: needs function.name")
        out.append((tc.get("id"), fn["name"], _args_text(fn.get("arguments", ""))))
    return out


def native_ids(messages: list[Message], make_id: Callable[[str, int], str]) -> list[Message]:
    """Rewrite history call ids (and the tool results that cite them) into the model's own form."""
    mapping: dict[str, str] = {}
    out = []
    for msg in messages:
        if msg.get("role") == "assistant" and msg.get("tool_calls"):
            calls = []
            for j, tc in enumerate(msg["tool_calls"]):
                fn = tc.get("function") or {}
                new = make_id(str(fn.get("name")), j)
                if tc.get("id") is not None:
                    mapping[str(tc["id"])] = new
                calls.append({**tc, "id": new})
            msg = {**msg, "tool_calls": calls}
        elif msg.get("role") == "tool" and str(msg.get("tool_call_id")) in mapping:
            msg = {**msg, "tool_call_id": mapping[str(msg["tool_call_id"])]}
        out.append(msg)
    return out


def _dump(obj: Any) -> str:
    """Jinja's `tojson` in transformers: json.dumps, non-ASCII kept, default separators."""
    return json.dumps(obj, ensure_ascii=False)


# --------------------------------------------------------------------------------------- formats


class ChatFormat(ABC):
    name: ClassVar[str]
    markers: ClassVar[tuple[str, ...]] = ()  # special markers that must be one token ID each
    expected_ids: ClassVar[Mapping[str, int]] = {}  # markers whose IDs the family fixes
    default_thinking: ClassVar[bool] = False  # thinking when the request says nothing

    @property
    def sha256(self) -> str:
        """What the manifest records as the template hash: the code that writes this format."""
        h = hashlib.sha256(self.name.encode())
        for path in (Path(__file__), Path(kimi.__file__)):
            h.update(path.read_bytes())
        return h.hexdigest()

    @abstractmethod
    def render(self, messages: list[Message], tools: list[dict[str, Any]] | None, turn: Turn,
               thinking: bool) -> Rendering: ...


def _piece_list(turn: Turn, reasoning: str | None = None, content: str | None = None,
                args: list[str] | None = None) -> tuple[tuple[str, str], ...]:
    r = turn.reasoning if reasoning is None else reasoning
    c = turn.content if content is None else content
    a = [c.arguments for c in turn.calls] if args is None else args
    return (("reasoning", r), ("content", c), *((f"tool_calls[{i}].arguments", x) for i, x in enumerate(a)))


def _last_user_turn(messages: list[Message]) -> None:
    if not messages or messages[-1].get("role") not in ("user", "tool", "developer"):
        last = messages[-1].get("role") if messages else "nothing"
        raise FormatError(f"request.messages must end with a user or tool message to be answered, not {last}")


class KimiK25(ChatFormat):
    """Kimi K2.5 (thinking). Tools are declared first, as TypeScript, in a `tool_declare` system
    message; a default system prompt follows when none is given; the generation prompt is
    `<|im_assistant|>assistant<|im_middle|><think>`; the response is reasoning + `</think>` + content
    + the tool-call section + `<|im_end|>`. Earlier turns' reasoning is dropped (`<think></think>`)
    up to the last assistant answer without tool calls. Call ids become `functions.NAME:IDX`."""

    name = "kimi-k2.5"
    markers = (kimi.IM_END, kimi.IM_USER, kimi.IM_ASSISTANT, kimi.IM_SYSTEM, kimi.IM_MIDDLE,
               kimi.SECTION_BEGIN, kimi.SECTION_END, kimi.CALL_BEGIN, kimi.CALL_ARG_BEGIN, kimi.CALL_END,
               kimi.THINK, kimi.THINK_END)
    expected_ids = kimi.EXPECTED_IDS
    default_thinking = True

    @staticmethod
    def _section(calls: list[tuple[str, str]]) -> str:
        body = "".join(f"{kimi.CALL_BEGIN}{cid}{kimi.CALL_ARG_BEGIN}{args}{kimi.CALL_END}" for cid, args in calls)
        return f"{kimi.SECTION_BEGIN}{body}{kimi.SECTION_END}" if calls else ""

    def render(self, messages: list[Message], tools: list[dict[str, Any]] | None, turn: Turn,
               thinking: bool) -> Rendering:
        _last_user_turn(messages)
        msgs = native_ids(messages, kimi.native_call_id)
        out: list[str] = []
        flags: list[str] = []
        if tools:
            try:
                decl = kimi.tools_typescript(kimi.deep_sort(tools))
            except kimi.ToolDeclarationError:
                decl = ""
            if not decl:
                decl = json.dumps(kimi.deep_sort(tools), ensure_ascii=False, separators=(",", ":"))
                flags.append("tools_declared_as_json")
            out.append(f"{kimi.IM_SYSTEM}tool_declare{kimi.IM_MIDDLE}{decl}{kimi.IM_END}")
        if msgs[0].get("role") != "system":
            out.append(f"{kimi.IM_SYSTEM}system{kimi.IM_MIDDLE}{kimi.DEFAULT_SYSTEM_PROMPT}{kimi.IM_END}")
        last_plain = max((i for i, m in enumerate(msgs) if m.get("role") == "assistant" and not m.get("tool_calls")),
                         default=-1)
        for i, m in enumerate(msgs):
            where = f"request.messages[{i}]"
            role = m.get("role")
            body = text_of(m.get("content"), where)
            if role == "assistant":
                think = _reasoning_of(m) if i > last_plain else ""
                calls = [(cid or "", args) for cid, _n, args in _calls_of(m, where)]
                out.append(f"{kimi.IM_ASSISTANT}assistant{kimi.IM_MIDDLE}{kimi.THINK}{think}{kimi.THINK_END}"
                           f"{body}{self._section(calls)}{kimi.IM_END}")
            elif role == "user":
                out.append(f"{kimi.IM_USER}{m.get('name') or 'user'}{kimi.IM_MIDDLE}{body}{kimi.IM_END}")
            elif role == "tool":
                out.append(f"{kimi.IM_SYSTEM}{m.get('name') or 'tool'}{kimi.IM_MIDDLE}"
                           f"## Return of {m.get('tool_call_id') or ''}\n{body}{kimi.IM_END}")
            elif role == "system":
                out.append(f"{kimi.IM_SYSTEM}{m.get('name') or 'system'}{kimi.IM_MIDDLE}{body}{kimi.IM_END}")
            else:
                raise FormatError(f"{where}: role {role!r} is not supported by {self.name}")
        out.append(f"{kimi.IM_ASSISTANT}assistant{kimi.IM_MIDDLE}{kimi.THINK}")
        if not thinking:
            out.append(kimi.THINK_END)
        prompt = "".join(out)
        calls = [(kimi.native_call_id(c.name, j), c.arguments) for j, c in enumerate(turn.calls)]
        cut_in_reasoning = not turn.finished and not turn.content and not turn.calls
        response = ""
        if thinking:
            response = turn.reasoning + ("" if cut_in_reasoning else kimi.THINK_END)
        response += turn.content + self._section(calls) + (kimi.IM_END if turn.finished else "")
        return Rendering(prompt, prompt + response, _piece_list(turn, reasoning=turn.reasoning if thinking else ""),
                         tuple(flags))


DS_BOS = "<｜begin▁of▁sentence｜>"
DS_EOS = "<｜end▁of▁sentence｜>"
DS_USER = "<｜User｜>"
DS_ASSISTANT = "<｜Assistant｜>"
DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
DS_CALLS_END = "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
DS_CALL_END = "<｜tool▁call▁end｜>"
DS_SEP = "<｜tool▁sep｜>"
DS_OUT_BEGIN = "<｜tool▁output▁begin｜>"
DS_OUT_END = "<｜tool▁output▁end｜>"
DS_DSML = "｜DSML｜"


class DeepSeekV3(ChatFormat):
    """DeepSeek V3.1: BOS + the system prompts (joined by a blank line) + the tool list;
    `<｜User｜>` turns; `<｜Assistant｜>` + `<think>` (thinking) or `</think>`; tool calls as
    `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>...
    <｜tool▁calls▁end｜>`; tool results as `<｜tool▁output▁begin｜>...<｜tool▁output▁end｜>` after
    which the answer follows directly (no header, no reasoning); every assistant turn ends in
    `<｜end▁of▁sentence｜>`. Earlier turns' reasoning is dropped."""

    name = "deepseek-v3"
    markers = (DS_BOS, DS_EOS, DS_USER, DS_ASSISTANT, kimi.THINK, kimi.THINK_END, DS_CALLS_BEGIN, DS_CALLS_END,
               DS_CALL_BEGIN, DS_CALL_END, DS_SEP, DS_OUT_BEGIN, DS_OUT_END)

    @staticmethod
    def _tools_text(tools: list[dict[str, Any]]) -> str:
        text = "## Tools\nYou have access to the following tools:\n"
        for t in tools:
            fn = t.get("function") or {}
            text += (f"\n### {fn.get('name', '')}\nDescription: {fn.get('description') or ''}\n\n"
                     f"Parameters: {_dump(fn.get('parameters') or {})}\n")
        return text + (
            "\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
            f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}tool_call_name{DS_SEP}tool_call_arguments{DS_CALL_END}"
            "{{additional_tool_calls}}" f"{DS_CALLS_END}\n\nWhere:\n\n"
            "- `tool_call_name` must be an exact match to one of the available tools\n"
            "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
            "- For multiple tool calls, chain them directly without separators or spaces\n")

    @staticmethod
    def _calls(calls: list[tuple[str, str]]) -> str:
        if not calls:
            return ""
        return DS_CALLS_BEGIN + "".join(f"{DS_CALL_BEGIN}{n}{DS_SEP}{a}{DS_CALL_END}" for n, a in calls) + DS_CALLS_END

    def render(self, messages: list[Message], tools: list[dict[str, Any]] | None, turn: Turn,
               thinking: bool) -> Rendering:
        _last_user_turn(messages)
        system = "\n\n".join(text_of(m.get("content"), f"request.messages[{i}]")
                             for i, m in enumerate(messages) if m.get("role") == "system")
        if tools:
            system += "\n\n" + self._tools_text(tools)
        out = [DS_BOS, system]
        last_user = is_tool = False
        for i, m in enumerate(messages):
            where = f"request.messages[{i}]"
            role = m.get("role")
            body = text_of(m.get("content"), where)
            if role == "user":
                out.append(DS_USER + body)
                last_user, is_tool = True, False
            elif role == "assistant":
                if last_user:
                    out.append(DS_ASSISTANT + kimi.THINK_END)
                calls = [(n, a) for _i, n, a in _calls_of(m, where)]
                if not calls and not is_tool and kimi.THINK_END in body:
                    body = body.split(kimi.THINK_END, 1)[1]
                out.append(body + self._calls(calls) + DS_EOS)
                last_user = is_tool = False
            elif role == "tool":
                out.append(DS_OUT_BEGIN + body + DS_OUT_END)
                last_user, is_tool = False, True
            elif role != "system":
                raise FormatError(f"{where}: role {role!r} is not supported by {self.name}")
        after_tool = is_tool
        if after_tool and turn.reasoning:
            raise FormatError(f"{self.name}: the model does not reason after a tool result, "
                              "but this answer carries reasoning")
        if not after_tool:
            out.append(DS_ASSISTANT + (kimi.THINK if thinking else kimi.THINK_END))
        prompt = "".join(out)
        thinks = thinking and not after_tool
        cut_in_reasoning = not turn.finished and not turn.content and not turn.calls
        response = turn.reasoning + ("" if cut_in_reasoning else kimi.THINK_END) if thinks else ""
        response += turn.content + self._calls([(c.name, c.arguments) for c in turn.calls])
        response += DS_EOS if turn.finished else ""
        return Rendering(prompt, prompt + response, _piece_list(turn, reasoning=turn.reasoning if thinks else ""))


class DeepSeekV4(ChatFormat):
    """DeepSeek V4 (its `encoding_dsv4` facts): BOS; tools appended to the first system message
    (one with empty content is added when there is none) as a `## Tools` section; tool results merged
    into the user turn as `<tool_result>...</tool_result>` blocks; `<｜Assistant｜>` + `<think>` or
    `</think>` after the last user turn; tool calls in DSML (`<｜DSML｜tool_calls>` / `invoke` /
    `parameter` elements, each argument re-encoded: strings verbatim, others as JSON, flag
    `arguments_reencoded`); `<｜end▁of▁sentence｜>` closes the turn. Earlier turns' reasoning is
    dropped unless tools are declared."""

    name = "deepseek-v4"
    markers = (DS_BOS, DS_EOS, DS_USER, DS_ASSISTANT, kimi.THINK, kimi.THINK_END, DS_DSML)

    TOOLS_TEMPLATE = (
        "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke "
        'tools by writing a "<{d}tool_calls>" block like the following:\n\n<{d}tool_calls>\n'
        '<{d}invoke name="$TOOL_NAME">\n<{d}parameter name="$PARAMETER_NAME" string="true|false">'
        "$PARAMETER_VALUE</{d}parameter>\n...\n</{d}invoke>\n<{d}invoke name=\"$TOOL_NAME2\">\n...\n"
        "</{d}invoke>\n</{d}tool_calls>\n\nString parameters should be specified as is and set "
        '`string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON '
        'format and set `string="false"`.\n\nIf thinking_mode is enabled (triggered by {ts}), you MUST '
        "output your complete reasoning inside {ts}...{te} BEFORE any tool calls or final response.\n\n"
        "Otherwise, output directly after {te} with tool calls or final response.\n\n"
        "### Available Tool Schemas\n\n{schemas}\n\nYou MUST strictly follow the above defined tool name "
        "and parameter schemas to invoke tool calls.\n")

    def _tools_text(self, tools: list[dict[str, Any]]) -> str:
        schemas = "\n".join(_dump(t.get("function") or {}) for t in tools)
        return self.TOOLS_TEMPLATE.format(d=DS_DSML, ts=kimi.THINK, te=kimi.THINK_END, schemas=schemas)

    @staticmethod
    def _params(args: str, where: str) -> str:
        try:
            parsed = json.loads(args)
        except ValueError:
            parsed = {"arguments": args}
        if not isinstance(parsed, dict):
            raise FormatError(f"{where}: arguments must be a JSON object for DSML, got {type(parsed).__name__}")
        return "\n".join(
            f'<{DS_DSML}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
            f"{v if isinstance(v, str) else _dump(v)}</{DS_DSML}parameter>" for k, v in parsed.items())

    def _calls(self, calls: list[tuple[str, str]], where: str) -> str:
        if not calls:
            return ""
        invokes = "\n".join(f'<{DS_DSML}invoke name="{n}">\n{self._params(a, where)}\n</{DS_DSML}invoke>'
                            for n, a in calls)
        return f"\n\n<{DS_DSML}tool_calls>\n{invokes}\n</{DS_DSML}tool_calls>"

    @staticmethod
    def _merge_tools(messages: list[Message]) -> list[Message]:
        """Tool results join the user turn (V4 has no tool role); consecutive user turns merge too;
        results are ordered as the calls were."""
        merged: list[Message] = []
        order: dict[str, int] = {}
        for i, m in enumerate(messages):
            role = m.get("role")
            where = f"request.messages[{i}]"
            if role == "assistant" and m.get("tool_calls"):
                order = {str(tc.get("id")): j for j, tc in enumerate(m["tool_calls"]) if tc.get("id")}
            if role == "tool":
                block = {"type": "tool_result", "text": text_of(m.get("content"), where),
                         "order": order.get(str(m.get("tool_call_id")), 0)}
            elif role == "user":
                block = {"type": "text", "text": text_of(m.get("content"), where)}
            else:
                merged.append(m)
                continue
            if merged and merged[-1].get("role") == "user" and "blocks" in merged[-1]:
                merged[-1]["blocks"].append(block)
            else:
                merged.append({"role": "user", "blocks": [block]})
        for m in merged:
            blocks = m.get("blocks")
            if blocks and sum(b["type"] == "tool_result" for b in blocks) > 1:
                results = iter(sorted((b for b in blocks if b["type"] == "tool_result"), key=lambda b: b["order"]))
                m["blocks"] = [next(results) if b["type"] == "tool_result" else b for b in blocks]
        return merged

    def render(self, messages: list[Message], tools: list[dict[str, Any]] | None, turn: Turn,
               thinking: bool) -> Rendering:
        _last_user_turn(messages)
        msgs = list(messages)
        if tools:
            if msgs[0].get("role") == "system":
                msgs[0] = {**msgs[0], "tools": tools}
            else:
                msgs.insert(0, {"role": "system", "content": "", "tools": tools})
        msgs = self._merge_tools(msgs)
        drop = not any(m.get("tools") for m in msgs)
        last_user = max((i for i, m in enumerate(msgs) if m.get("role") in ("user", "developer")), default=-1)
        out = [DS_BOS]
        for i, m in enumerate(msgs):
            where = f"request.messages[{i}]"
            role = m.get("role")
            if role == "system":
                out.append(text_of(m.get("content"), where))
                if m.get("tools"):
                    out.append("\n\n" + self._tools_text(m["tools"]))
            elif role in ("user", "developer"):
                if "blocks" in m:
                    out.append(DS_USER + "\n\n".join(
                        f"<tool_result>{b['text']}</tool_result>" if b["type"] == "tool_result" else b["text"]
                        for b in m["blocks"]))
                else:
                    out.append(DS_USER + text_of(m.get("content"), where))
                nxt = msgs[i + 1].get("role") if i + 1 < len(msgs) else "assistant"
                if nxt == "assistant":
                    opens = thinking and (not drop or i >= last_user)
                    out.append(DS_ASSISTANT + (kimi.THINK if opens else kimi.THINK_END))
            elif role == "assistant":
                think = ""
                if thinking and (not drop or i > last_user):
                    think = _reasoning_of(m) + kimi.THINK_END
                calls = [(n, a) for _i, n, a in _calls_of(m, where)]
                out.append(think + text_of(m.get("content"), where) + self._calls(calls, where) + DS_EOS)
            else:
                raise FormatError(f"{where}: role {role!r} is not supported by {self.name}")
        prompt = "".join(out)
        cut_in_reasoning = not turn.finished and not turn.content and not turn.calls
        response = turn.reasoning + ("" if cut_in_reasoning else kimi.THINK_END) if thinking else ""
        params = [self._params(c.arguments, f"response.tool_calls[{j}]") for j, c in enumerate(turn.calls)]
        response += turn.content + self._calls([(c.name, c.arguments) for c in turn.calls], "response.tool_calls")
        response += DS_EOS if turn.finished else ""
        flags = ("arguments_reencoded",) if turn.calls else ()
        return Rendering(prompt, prompt + response,
                         _piece_list(turn, reasoning=turn.reasoning if thinking else "", args=params), flags)


class Qwen3(ChatFormat):
    """Qwen3 (hybrid thinking): ChatML turns `<|im_start|>ROLE\\n...<|im_end|>\\n`; tools listed in the
    system turn inside `<tools></tools>`; calls as `<tool_call>\\n{"name": ..., "arguments": ARGS}\\n
    </tool_call>`; tool results as `<tool_response>` blocks in a user turn; the answer after the last
    real user query carries `<think>\\nREASONING\\n</think>\\n\\n` (reasoning stripped of newlines at
    its ends, content of leading newlines, as the template does)."""

    name = "qwen3"
    markers = ("<|im_start|>", "<|im_end|>", kimi.THINK, kimi.THINK_END, "<tool_call>", "</tool_call>",
               "<tool_response>", "</tool_response>")
    default_thinking = True

    TOOLS_HEAD = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
    TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                  'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
                  '"arguments": <args-json-object>}\n</tool_call><|im_end|>\n')

    @staticmethod
    def _calls(calls: list[tuple[str, str]], content: str) -> str:
        return "".join(("\n" if (j == 0 and content) or j > 0 else "")
                       + f'<tool_call>\n{{"name": "{n}", "arguments": {a}}}\n</tool_call>'
                       for j, (n, a) in enumerate(calls))

    def render(self, messages: list[Message], tools: list[dict[str, Any]] | None, turn: Turn,
               thinking: bool) -> Rendering:
        _last_user_turn(messages)
        texts = [text_of(m.get("content"), f"request.messages[{i}]") for i, m in enumerate(messages)]
        out = []
        first_system = messages[0].get("role") == "system"
        if tools:
            out.append("<|im_start|>system\n" + (texts[0] + "\n\n" if first_system else "") + self.TOOLS_HEAD
                       + "".join("\n" + _dump(t) for t in tools) + self.TOOLS_TAIL)
        elif first_system:
            out.append(f"<|im_start|>system\n{texts[0]}<|im_end|>\n")
        last_query = len(messages)  # the answer being rendered sits at len(messages)
        for i in range(len(messages) - 1, -1, -1):
            t = texts[i]
            wrapped = t.startswith("<tool_response>") and t.endswith("</tool_response>")
            if messages[i].get("role") == "user" and not wrapped:
                last_query = i
                break
        for i, m in enumerate(messages):
            role, body = m.get("role"), texts[i]
            if role == "user" or (role == "system" and i > 0):
                out.append(f"<|im_start|>{role}\n{body}<|im_end|>\n")
            elif role == "assistant":
                given = m.get("reasoning_content", m.get("reasoning"))
                reasoning = given if isinstance(given, str) else ""
                if given is None and kimi.THINK_END in body:
                    reasoning = body.split(kimi.THINK_END)[0].rstrip("\n").split(kimi.THINK)[-1].lstrip("\n")
                    body = body.split(kimi.THINK_END)[-1].lstrip("\n")
                if i > last_query and reasoning:
                    r, c = reasoning.strip("\n"), body.lstrip("\n")
                    head = f"<|im_start|>assistant\n<think>\n{r}\n</think>\n\n{c}"
                else:
                    head = f"<|im_start|>assistant\n{body}"
                calls = [(n, a) for _i, n, a in _calls_of(m, f"request.messages[{i}]")]
                out.append(head + self._calls(calls, body) + "<|im_end|>\n")
            elif role == "tool":
                if i == 0 or messages[i - 1].get("role") != "tool":
                    out.append("<|im_start|>user")
                out.append(f"\n<tool_response>\n{body}\n</tool_response>")
                if i == len(messages) - 1 or messages[i + 1].get("role") != "tool":
                    out.append("<|im_end|>\n")
            elif role != "system":
                raise FormatError(f"request.messages[{i}]: role {role!r} is not supported by {self.name}")
        out.append("<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n"))
        prompt = "".join(out)
        reasoning, content = turn.reasoning.strip("\n"), turn.content.lstrip("\n")
        cut_in_reasoning = not turn.finished and not turn.content and not turn.calls
        response = ""
        if thinking:
            response = f"<think>\n{reasoning}" + ("" if cut_in_reasoning else "\n</think>\n\n")
        response += content + self._calls([(c.name, c.arguments) for c in turn.calls], turn.content)
        response += "<|im_end|>" if turn.finished else ""
        # the returned pieces as they are: a piece found only once trimmed is flagged by the check
        return Rendering(prompt, prompt + response, _piece_list(turn, reasoning=turn.reasoning if thinking else ""))


# End-of-turn markers an `auto` template may close the assistant turn with.
END_OF_TURN = ("<|im_end|>", DS_EOS, "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


@dataclass
class TemplateFormat(ChatFormat):
    """`chatFormat: auto`: the tokenizer's own chat template."""

    tokenizer: LoadedTokenizer
    markers_found: tuple[str, ...] = field(init=False)
    end_markers: tuple[str, ...] = field(init=False)
    kimi_ids: bool = field(init=False)

    name = "auto"
    default_thinking = True

    def __post_init__(self) -> None:
        tpl = self.tokenizer.chat_template or ""
        self.markers_found = tuple(t for t in self.tokenizer.added if t in tpl)
        eos = self.tokenizer.eos_token
        ends = [m for m in END_OF_TURN if m in self.tokenizer.added and m in tpl]
        if eos and eos not in ends and eos in tpl:
            ends.append(eos)
        self.end_markers = tuple(ends)
        self.kimi_ids = kimi.CALL_ARG_BEGIN in tpl  # Kimi templates print call ids: use its own form

    @property  # type: ignore[override]
    def markers(self) -> tuple[str, ...]:
        return self.markers_found

    @property
    def sha256(self) -> str:
        return self.tokenizer.template_sha256 or ""

    def _assistant(self, turn: Turn, make_id: Callable[[str, int], str] | None) -> Message:
        msg: Message = {"role": "assistant", "content": turn.content, "reasoning_content": turn.reasoning,
                        "reasoning": turn.reasoning}
        if turn.calls:
            msg["tool_calls"] = [{"id": make_id(c.name, j) if make_id else c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for j, c in enumerate(turn.calls)]
        return msg

    def _both(self, msgs: list[Message], tools: list[dict[str, Any]] | None, assistant: Message,
              thinking: bool) -> tuple[str, str]:
        kw = {"thinking": thinking, "enable_thinking": thinking}
        prompt = self.tokenizer.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, **kw)
        whole = self.tokenizer.apply_chat_template([*msgs, assistant], tools=tools, add_generation_prompt=False, **kw)
        return prompt, whole

    def render(self, messages: list[Message], tools: list[dict[str, Any]] | None, turn: Turn,
               thinking: bool) -> Rendering:
        if not turn.finished:
            raise FormatError("the answer was cut off (finish_reason length) and chatFormat auto always closes "
                              "the turn; use a named chatFormat to keep truncated answers", reason="truncated")
        make_id = kimi.native_call_id if self.kimi_ids else None
        msgs = native_ids(messages, make_id) if make_id else list(messages)
        assistant = self._assistant(turn, make_id)
        flags: tuple[str, ...] = ()
        try:
            prompt, whole = self._both(msgs, tools, assistant, thinking)
        except Exception as first:
            if not (turn.calls or any(m.get("tool_calls") for m in msgs)):
                raise FormatError(f"the chat template failed: {type(first).__name__}: {first}") from None
            try:
                prompt, whole = self._both(_dict_args(msgs), tools, _dict_args([assistant])[0], thinking)
            except Exception:
                raise FormatError(f"the chat template failed: {type(first).__name__}: {first}") from None
            flags = ("arguments_as_dict",)
        return Rendering(prompt, whole, _piece_list(turn), flags, self.end_markers)


def _dict_args(messages: list[Message]) -> list[Message]:
    """The same messages with every tool call's arguments parsed into an object (when it parses)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = []
            for tc in m["tool_calls"]:
                fn = dict(tc.get("function") or {})
                if isinstance(fn.get("arguments"), str):
                    with contextlib.suppress(ValueError):
                        fn["arguments"] = json.loads(fn["arguments"])
                calls.append({**tc, "function": fn})
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


NAMED: dict[str, type[ChatFormat]] = {f.name: f for f in (KimiK25, DeepSeekV3, DeepSeekV4, Qwen3)}


def resolve_format(name: str, tokenizer: LoadedTokenizer) -> ChatFormat:
    """`target.chatFormat` for this tokenizer, checked: a template exists (auto), every marker of the
    format is one token ID, and IDs the family fixes are where it expects them."""
    if name == "auto":
        if not tokenizer.chat_template:
            raise TokenizerError(
                f"target.chatFormat: auto needs a chat template, but tokenizer {tokenizer.name!r} has none; "
                f"set target.chatFormat to one of {sorted(NAMED)}")
        fmt: ChatFormat = TemplateFormat(tokenizer)
    elif name in NAMED:
        fmt = NAMED[name]()
    else:
        raise TokenizerError(f"target.chatFormat: unknown format {name!r}; use auto or one of {sorted(NAMED)}")
    for marker in fmt.markers:
        tid = tokenizer.token_id(marker)
        if tid is None:
            raise TokenizerError(
                f"target.chatFormat {name}: marker {marker!r} is not a single token in tokenizer "
                f"{tokenizer.name!r} (it encodes to {len(tokenizer.encode(marker))} IDs); "
                "is this the tokenizer of that model family?")
        want = fmt.expected_ids.get(marker)
        if want is not None and tid != want:
            raise TokenizerError(
                f"target.chatFormat {name}: tokenizer {tokenizer.name!r} gives {marker!r} ID {tid}, "
                f"but {name} models use {want}")
    return fmt
