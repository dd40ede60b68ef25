"""Qwen3's chat format (hybrid thinking)."""

from __future__ import annotations

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
    template_reasoning,
    text_of,
    tojson,
)


class Qwen3(ChatFormat):
    """Qwen3 (hybrid thinking): ChatML turns `<|im_start|>ROLE\\n...<|im_end|>\\n`; tools listed in the
    system turn inside `<tools></tools>`; calls as `<tool_call>\\n{"name": ..., "arguments": ARGS}\\n
    </tool_call>`; tool results as `<tool_response>` blocks in a user turn; the answer after the last
    real user query carries `<think>\\nREASONING\\n</think>\\n\\n` (reasoning stripped of newlines at
    its ends, content of leading newlines, as the template does).

    Variants: `release` (the template published with the models) and `later` (the Hub's later
    revision, which adds `is string` guards). They render the same text for OpenAI requests, whose
    content reaches the template as text: detection reports both as fitting and keeps the first."""

    name = "qwen3"
    history_rewritten = ("its template drops the reasoning of assistant turns before the last user query, "
                         "so a packed sequence is not what the model saw")
    variants: ClassVar[Mapping[str, str]] = {"release": "the template published with the models",
                                             "later": "the later revision with `is string` guards"}
    markers = ("<|im_start|>", "<|im_end|>", THINK, THINK_END, "<tool_call>", "</tool_call>",
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
        check_last_turn(messages)
        texts = [text_of(m.get("content"), f"request.messages[{i}]") for i, m in enumerate(messages)]
        out = []
        first_system = messages[0].get("role") == "system"
        if tools:
            out.append("<|im_start|>system\n" + (texts[0] + "\n\n" if first_system else "") + self.TOOLS_HEAD
                       + "".join("\n" + tojson(t) for t in tools) + self.TOOLS_TAIL)
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
                given = template_reasoning(m)
                reasoning = given if isinstance(given, str) else ""
                if given is None and THINK_END in body:
                    reasoning = body.split(THINK_END)[0].rstrip("\n").split(THINK)[-1].lstrip("\n")
                    body = body.split(THINK_END)[-1].lstrip("\n")
                if i > last_query and reasoning:
                    r, c = reasoning.strip("\n"), body.lstrip("\n")
                    head = f"<|im_start|>assistant\n<think>\n{r}\n</think>\n\n{c}"
                else:
                    head = f"<|im_start|>assistant\n{body}"
                calls = [(n, a) for _i, n, a in calls_of(m, f"request.messages[{i}]")]
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
        response = ""
        if thinking:
            response = f"<think>\n{reasoning}" + ("" if turn.cut_in_reasoning else "\n</think>\n\n")
        response += content + self._calls([(c.name, c.arguments) for c in turn.calls], turn.content)
        response += "<|im_end|>" if turn.finished else ""
        # the returned pieces as they are: a piece found only once trimmed is flagged by the check
        return Rendering(prompt, prompt + response, piece_list(turn, reasoning=turn.reasoning if thinking else ""))

