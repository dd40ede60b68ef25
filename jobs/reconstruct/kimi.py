"""Kimi K2.5's chat format, written from its official template's behaviour."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from eyrie.jobs.reconstruct import kimi_facts as kimi
from eyrie.jobs.reconstruct.base import (
    ChatFormat,
    Message,
    Rendering,
    Turn,
    args_text,
    check_last_turn,
    jinja_text,
    piece_list,
    template_reasoning,
    text_of,
)


def completion_call_ids(messages: list[Message], turn: Turn) -> tuple[list[str], bool]:
    """The ids the model generated for this answer's calls, and whether any had to be inferred.
    Kimi numbers calls across the whole conversation and the API returns its ids as they are; an id
    a gateway replaced (`call_...`) is rebuilt as `functions.NAME:IDX`, IDX the count of earlier
    calls in the conversation."""
    earlier = sum(len(m.get("tool_calls") or ()) for m in messages if m.get("role") == "assistant")
    ids, inferred = [], False
    for j, c in enumerate(turn.calls):
        if kimi.is_native_call_id(c.id):
            ids.append(str(c.id))
        else:
            ids.append(kimi.native_call_id(c.name, earlier + j))
            inferred = True
    return ids, inferred


class KimiK25(ChatFormat):
    """Kimi K2.5 (thinking). Tools are declared first, as TypeScript, in a `tool_declare` system
    message; the generation prompt is `<|im_assistant|>assistant<|im_middle|><think>` (`<think></think>`
    with thinking off); the response is reasoning + `</think>` + content + the tool-call section +
    `<|im_end|>`. Earlier turns' reasoning is dropped (`<think></think>`) up to the last assistant
    answer without tool calls; later turns keep `reasoning_content` (the only field the template
    reads, filled by transformers from `thinking` or `reasoning` when null or missing), and drop it
    too with thinking off. History call ids are printed as given; the answer's are the ids the API
    returned.

    Variants: `current` (the template on the Hub now) inserts no system prompt; `release` (the
    template published with the model) inserted Kimi's default one when the first message is not a
    system message."""

    name = "kimi-k2.5"
    markers = (kimi.IM_END, kimi.IM_USER, kimi.IM_ASSISTANT, kimi.IM_SYSTEM, kimi.IM_MIDDLE,
               kimi.SECTION_BEGIN, kimi.SECTION_END, kimi.CALL_BEGIN, kimi.CALL_ARG_BEGIN, kimi.CALL_END,
               kimi.THINK, kimi.THINK_END)
    expected_ids = kimi.EXPECTED_IDS
    default_thinking = True
    variants: ClassVar[Mapping[str, str]] = {"current": "no default system prompt",
                "release": f"inserts the system prompt {kimi.DEFAULT_SYSTEM_PROMPT!r} when none is given"}
    prints_call_ids = True
    history_rewritten = ("its template drops the reasoning of earlier assistant turns (up to the last answer "
                         "without tool calls), so a packed sequence is not what the model saw")

    @staticmethod
    def _section(calls: list[tuple[str, str]]) -> str:
        body = "".join(f"{kimi.CALL_BEGIN}{cid}{kimi.CALL_ARG_BEGIN}{args}{kimi.CALL_END}" for cid, args in calls)
        return f"{kimi.SECTION_BEGIN}{body}{kimi.SECTION_END}" if calls else ""

    @staticmethod
    def _history_calls(m: Message) -> list[tuple[str, str]]:
        out = []
        for tc in m.get("tool_calls") or ():
            fn = (tc.get("function") if isinstance(tc, dict) else None) or {}
            out.append((jinja_text(tc, "id"), args_text(fn.get("arguments", ""))))
        return out

    def render(self, messages: list[Message], tools: list[dict[str, Any]] | None, turn: Turn,
               thinking: bool) -> Rendering:
        check_last_turn(messages)
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
        if self.variant == "release" and messages[0].get("role") != "system":
            out.append(f"{kimi.IM_SYSTEM}system{kimi.IM_MIDDLE}{kimi.DEFAULT_SYSTEM_PROMPT}{kimi.IM_END}")
        last_plain = max((i for i, m in enumerate(messages)
                          if m.get("role") == "assistant" and not m.get("tool_calls")), default=-1)
        for i, m in enumerate(messages):
            role = m.get("role")
            who = m.get("name") or role
            marker = kimi.IM_USER if role == "user" else kimi.IM_ASSISTANT if role == "assistant" else kimi.IM_SYSTEM
            body = text_of(m.get("content"), f"request.messages[{i}]")
            if role == "assistant":
                think = ""
                if i > last_plain and thinking:
                    given = template_reasoning(m)
                    think = jinja_text(m, "reasoning_content") if given is None else given
                body = f"{kimi.THINK}{think}{kimi.THINK_END}{body}{self._section(self._history_calls(m))}"
            elif role == "tool":
                body = f"## Return of {jinja_text(m, 'tool_call_id')}\n{body}"
            out.append(f"{marker}{who}{kimi.IM_MIDDLE}{body}{kimi.IM_END}")
        out.append(f"{kimi.IM_ASSISTANT}assistant{kimi.IM_MIDDLE}{kimi.THINK}")
        if not thinking:
            out.append(kimi.THINK_END)
        prompt = "".join(out)
        ids, inferred = completion_call_ids(messages, turn)
        if inferred:
            flags.append("call_id_inferred")
        calls = [(cid, c.arguments) for cid, c in zip(ids, turn.calls, strict=True)]
        response = ""
        if thinking:
            response = turn.reasoning + ("" if turn.cut_in_reasoning else kimi.THINK_END)
        response += turn.content + self._section(calls) + (kimi.IM_END if turn.finished else "")
        returned = [c.id if kimi.is_native_call_id(c.id) else None for c in turn.calls]
        return Rendering(prompt, prompt + response,
                         piece_list(turn, reasoning=turn.reasoning if thinking else "", ids=returned), tuple(flags))
