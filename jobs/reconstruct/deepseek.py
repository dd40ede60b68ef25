"""DeepSeek V3.1 and V4 (DSML) chat formats."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from eyrie.jobs.reconstruct.base import (
    THINK,
    THINK_END,
    ChatFormat,
    FormatError,
    Message,
    Rendering,
    Turn,
    calls_of,
    check_last_turn,
    piece_list,
    reasoning_of,
    text_of,
    tojson,
)

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
    `<｜end▁of▁sentence｜>`. Earlier turns' reasoning is dropped.

    The official template ignores `tools`; providers declare them in the system prompt in one of two
    ways, the variants: `vllm` (vLLM's DeepSeek-V3.1 tool template: the block joined to the system
    prompt by a blank line, `Where:` followed by a blank line, parameters through `tojson`) and
    `card` (the model card's tool-description block, appended directly, parameters through Python's
    `json.dumps`)."""

    name = "deepseek-v3"
    history_rewritten = "its template drops the reasoning of earlier assistant turns"
    markers = (DS_BOS, DS_EOS, DS_USER, DS_ASSISTANT, THINK, THINK_END, DS_CALLS_BEGIN, DS_CALLS_END,
               DS_CALL_BEGIN, DS_CALL_END, DS_SEP, DS_OUT_BEGIN, DS_OUT_END)
    variants: ClassVar[Mapping[str, str]] = {
        "vllm": "vLLM's tool template: the tool block after a blank line",
        "card": "the model card's tool-description block, appended directly"}

    def _tools_text(self, tools: list[dict[str, Any]]) -> str:
        card = self.variant == "card"
        text = "## Tools\nYou have access to the following tools:\n"
        for t in tools:
            fn = t.get("function") or {}
            params = fn.get("parameters") or {}
            text += (f"\n### {fn.get('name', '')}\nDescription: {fn.get('description') or ''}\n\n"
                     f"Parameters: {json.dumps(params) if card else tojson(params)}\n")
        return text + (
            "\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
            f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}tool_call_name{DS_SEP}tool_call_arguments{DS_CALL_END}"
            "{{additional_tool_calls}}" f"{DS_CALLS_END}\n\nWhere:\n" + ("" if card else "\n") +
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
        check_last_turn(messages)
        system = "\n\n".join(text_of(m.get("content"), f"request.messages[{i}]")
                             for i, m in enumerate(messages) if m.get("role") == "system")
        if tools:
            system += ("" if self.variant == "card" else "\n\n") + self._tools_text(tools)
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
                    out.append(DS_ASSISTANT + THINK_END)
                calls = [(n, a) for _i, n, a in calls_of(m, where)]
                if not calls and not is_tool and THINK_END in body:
                    body = body.split(THINK_END, 1)[1]
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
            out.append(DS_ASSISTANT + (THINK if thinking else THINK_END))
        prompt = "".join(out)
        thinks = thinking and not after_tool
        response = turn.reasoning + ("" if turn.cut_in_reasoning else THINK_END) if thinks else ""
        response += turn.content + self._calls([(c.name, c.arguments) for c in turn.calls])
        response += DS_EOS if turn.finished else ""
        return Rendering(prompt, prompt + response, piece_list(turn, reasoning=turn.reasoning if thinks else ""))


class DeepSeekV4(ChatFormat):
    """DeepSeek V4 (its `encoding_dsv4` facts): BOS; tools appended to the first system message
    (one with empty content is added when there is none) as a `## Tools` section; tool results merged
    into the user turn as `<tool_result>...</tool_result>` blocks; `<｜Assistant｜>` + `<think>` or
    `</think>` after the last user turn; tool calls in DSML (`<｜DSML｜tool_calls>` / `invoke` /
    `parameter` elements, each argument re-encoded: strings verbatim, others as JSON, flag
    `arguments_reencoded`); `<｜end▁of▁sentence｜>` closes the turn. Earlier turns' reasoning is
    dropped unless tools are declared."""

    name = "deepseek-v4"
    markers = (DS_BOS, DS_EOS, DS_USER, DS_ASSISTANT, THINK, THINK_END, DS_DSML)

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
        schemas = "\n".join(tojson(t.get("function") or {}) for t in tools)
        return self.TOOLS_TEMPLATE.format(d=DS_DSML, ts=THINK, te=THINK_END, schemas=schemas)

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
            f"{v if isinstance(v, str) else tojson(v)}</{DS_DSML}parameter>" for k, v in parsed.items())

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
        check_last_turn(messages)
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
                    out.append(DS_ASSISTANT + (THINK if opens else THINK_END))
            elif role == "assistant":
                think = ""
                if thinking and (not drop or i > last_user):
                    think = reasoning_of(m) + THINK_END
                calls = [(n, a) for _i, n, a in calls_of(m, where)]
                out.append(think + text_of(m.get("content"), where) + self._calls(calls, where) + DS_EOS)
            else:
                raise FormatError(f"{where}: role {role!r} is not supported by {self.name}")
        prompt = "".join(out)
        response = turn.reasoning + ("" if turn.cut_in_reasoning else THINK_END) if thinking else ""
        params = [self._params(c.arguments, f"response.tool_calls[{j}]") for j, c in enumerate(turn.calls)]
        response += turn.content + self._calls([(c.name, c.arguments) for c in turn.calls], "response.tool_calls")
        response += DS_EOS if turn.finished else ""
        flags = ("arguments_reencoded",) if turn.calls else ()
        return Rendering(prompt, prompt + response,
                         piece_list(turn, reasoning=turn.reasoning if thinking else "", args=params), flags)

