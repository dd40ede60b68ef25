"""Kimi K2.5's chat format, written from its official template's behaviour."""

from __future__ import annotations

import json
from typing import Any

from eyrie.jobs.reconstruct import kimi_facts as kimi
from eyrie.jobs.reconstruct.base import (
    ChatFormat,
    FormatError,
    Message,
    Rendering,
    Turn,
    _calls_of,
    _last_user_turn,
    _piece_list,
    _reasoning_of,
    native_ids,
    text_of,
)


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

