"""`chatFormat: auto`: the tokenizer's own chat template."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from eyrie.jobs.reconstruct import kimi_facts as kimi
from eyrie.jobs.reconstruct.base import ChatFormat, FormatError, Message, Rendering, Turn, piece_list
from eyrie.jobs.reconstruct.deepseek import DS_EOS
from eyrie.jobs.reconstruct.kimi import completion_call_ids
from eyrie.jobs.reconstruct.tokenizers import LoadedTokenizer

# End-of-turn markers an `auto` template may close the assistant turn with.
END_OF_TURN = ("<|im_end|>", DS_EOS, "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


@dataclass
class TemplateFormat(ChatFormat):
    """`chatFormat: auto`: the tokenizer's own chat template."""

    tokenizer: LoadedTokenizer
    markers_found: tuple[str, ...] = field(init=False)
    end_markers: tuple[str, ...] = field(init=False)
    kimi_ids: bool = field(init=False)
    default_thinking: bool = field(init=False)
    prints_call_ids: bool = field(init=False)
    variant: str | None = None

    name = "auto"

    def __post_init__(self) -> None:
        tpl = self.tokenizer.chat_template or ""
        self.markers_found = tuple(t for t in self.tokenizer.added if t in tpl)
        eos = self.tokenizer.eos_token
        ends = [m for m in END_OF_TURN if m in self.tokenizer.added and m in tpl]
        if eos and eos not in ends and eos in tpl:
            ends.append(eos)
        self.end_markers = tuple(ends)
        self.kimi_ids = kimi.CALL_ARG_BEGIN in tpl  # Kimi templates print the model's call ids
        self.prints_call_ids = self.kimi_ids
        self.default_thinking = self._template_thinking_default()

    def _template_thinking_default(self) -> bool:
        """What the template does for a request that says nothing about thinking: its generation
        prompt with no switch given equals the one with thinking on (Qwen3: on) or off (DeepSeek-V3.1:
        off). A template whose prompt does not depend on the switch (or that fails on the probe)
        defaults to off: then only returned reasoning says the model thought."""
        probe = [{"role": "user", "content": "probe"}]

        def prompt(**kw: bool) -> str | None:
            try:
                return self.tokenizer.apply_chat_template(probe, add_generation_prompt=True, **kw)
            except Exception:
                return None

        plain, on, off = prompt(), prompt(thinking=True, enable_thinking=True), prompt(thinking=False,
                                                                                         enable_thinking=False)
        return plain is not None and plain == on and on != off

    @property  # type: ignore[override]
    def markers(self) -> tuple[str, ...]:
        return self.markers_found

    @property
    def sha256(self) -> str:
        return self.tokenizer.template_sha256 or ""

    @staticmethod
    def _assistant(turn: Turn, ids: list[str | None]) -> Message:
        msg: Message = {"role": "assistant", "content": turn.content, "reasoning_content": turn.reasoning,
                        "reasoning": turn.reasoning}
        if turn.calls:
            msg["tool_calls"] = [{"id": cid, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                 for cid, c in zip(ids, turn.calls, strict=True)]
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
        msgs = list(messages)  # history as given: templates print call ids as they are
        ids: list[str | None] = [c.id for c in turn.calls]
        flags: tuple[str, ...] = ()
        returned: list[str | None] | None = None
        if self.kimi_ids:
            kimi_ids, inferred = completion_call_ids(messages, turn)
            ids = list(kimi_ids)
            flags = ("call_id_inferred",) if inferred else ()
            returned = [c.id if kimi.is_native_call_id(c.id) else None for c in turn.calls]
        assistant = self._assistant(turn, ids)
        try:
            prompt, whole = self._both(msgs, tools, assistant, thinking)
        except Exception as first:
            if not (turn.calls or any(m.get("tool_calls") for m in msgs)):
                raise FormatError(f"the chat template failed: {type(first).__name__}: {first}") from None
            try:
                prompt, whole = self._both(_dict_args(msgs), tools, _dict_args([assistant])[0], thinking)
            except Exception:
                raise FormatError(f"the chat template failed: {type(first).__name__}: {first}") from None
            flags = (*flags, "arguments_as_dict")
        return Rendering(prompt, whole, piece_list(turn, ids=returned), flags, self.end_markers)


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
