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

import functools
import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from eyrie.jobs.errors import EyrieError

Message = dict[str, Any]

THINK = "<think>"  # the reasoning markers of Kimi, DeepSeek and Qwen alike
THINK_END = "</think>"


class FormatError(EyrieError, ValueError):
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

    @property
    def cut_in_reasoning(self) -> bool:
        """Cut off while still reasoning: the closing think marker was never generated."""
        return not self.finished and not self.content and not self.calls


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


def reasoning_of(msg: Message) -> str:
    r = msg.get("reasoning_content")
    if r is None:
        r = msg.get("reasoning")
    return r if isinstance(r, str) else ""


# The names a message's reasoning is given under; transformers (>= 5) fills `reasoning_content`, the
# one chat templates read, from the first of them that is not null before rendering.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def template_reasoning(msg: Message) -> str | None:
    """The reasoning a template rendered through transformers sees as `reasoning_content`, or None
    when the message gives none (then the template sees the field as it is: missing or null)."""
    v = next((msg[k] for k in REASONING_FIELDS if msg.get(k) is not None), None)
    return v if v is None or isinstance(v, str) else str(v)


def args_text(args: Any) -> str:
    """History arguments as a template prints them: a string as is, an object as JSON."""
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def calls_of(msg: Message, where: str) -> list[tuple[str | None, str, str]]:
    """(id, name, arguments text) of a history assistant message's tool calls."""
    out = []
    for j, tc in enumerate(msg.get("tool_calls") or ()):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise FormatError(f"{where}.tool_calls[{j}]: needs function.name")
        out.append((tc.get("id"), fn["name"], args_text(fn.get("arguments", ""))))
    return out


def jinja_text(msg: Message, key: str) -> str:
    """`{{ message[key] }}` as Jinja prints it: "" when the key is missing, "None" for null."""
    if key not in msg:
        return ""
    v = msg[key]
    return "None" if v is None else v if isinstance(v, str) else str(v)


def tojson(obj: Any) -> str:
    """Jinja's `tojson` in transformers: json.dumps, non-ASCII kept, default separators."""
    return json.dumps(obj, ensure_ascii=False)


# --------------------------------------------------------------------------------------- formats


class ChatFormat(ABC):
    name: ClassVar[str]
    markers: ClassVar[tuple[str, ...]] = ()  # special markers that must be one token ID each
    expected_ids: ClassVar[Mapping[str, int]] = {}  # markers whose IDs the family fixes
    default_thinking: bool = False  # thinking when neither the answer nor the request says
    # The template revisions a provider may serve, name -> what differs; the first is the default.
    # Which one a provider renders is detected over the canary from its usage.prompt_tokens.
    variants: ClassVar[Mapping[str, str]] = {}
    prints_call_ids: bool = False  # the response carries the API's call ids (Kimi)
    # Why a conversation's turns cannot be packed into one sample (the template rewrites earlier
    # turns, so the packed sequence is not what the model saw at each turn); None: may be packed,
    # each conversation still proven token by token (samples.pack).
    history_rewritten: ClassVar[str | None] = None

    def __init__(self, variant: str | None = None):
        self.variant = self.check_variant(variant)

    @classmethod
    def check_variant(cls, variant: str | None) -> str | None:
        """`variant` if this format declares it (None: the default one)."""
        if variant is None:
            return next(iter(cls.variants), None)
        if variant not in cls.variants:
            known = ", ".join(cls.variants) or "none"
            raise FormatError(f"chat format {cls.name} has no template variant {variant!r} (it has: {known})",
                              reason="unknown_variant")
        return variant

    def with_variant(self, variant: str) -> ChatFormat:
        """The same format rendering another of its template revisions."""
        return type(self)(variant)

    @functools.cached_property
    def sha256(self) -> str:
        """The template hash the manifest records: of what this format renders for a fixed probe
        conversation (with and without thinking) and of its parameters (the variant among them), so
        a change in the text it writes changes the hash and an edit that writes the same text does not."""
        h = hashlib.sha256(json.dumps({"name": self.name, "params": self.params()}, sort_keys=True).encode())
        for thinking in (False, True):
            r = self.render(PROBE_MESSAGES, PROBE_TOOLS, PROBE_TURN, thinking)
            h.update(b"\0" + r.prompt.encode() + b"\0" + r.whole.encode())
        return h.hexdigest()

    def params(self) -> dict[str, Any]:
        """The format's parameters beyond its name: the thinking default and the template variant."""
        return {"default_thinking": self.default_thinking, "variant": self.variant}

    @abstractmethod
    def render(self, messages: list[Message], tools: list[dict[str, Any]] | None, turn: Turn,
               thinking: bool) -> Rendering: ...


def piece_list(turn: Turn, reasoning: str | None = None, content: str | None = None,
                args: list[str] | None = None, ids: list[str | None] | None = None) -> tuple[tuple[str, str], ...]:
    """What decoding the response must give back, in order: reasoning, content, and per call its id
    (when the format prints the id the API returned) and its arguments."""
    r = turn.reasoning if reasoning is None else reasoning
    c = turn.content if content is None else content
    a = [c.arguments for c in turn.calls] if args is None else args
    i = [None] * len(a) if ids is None else ids
    calls = []
    for j, (cid, x) in enumerate(zip(i, a, strict=True)):
        if cid:
            calls.append((f"tool_calls[{j}].id", cid))
        calls.append((f"tool_calls[{j}].arguments", x))
    return (("reasoning", r), ("content", c), *calls)


def check_last_turn(messages: list[Message]) -> None:
    """A request can be answered only after a user, tool or developer message."""
    if not messages or messages[-1].get("role") not in ("user", "tool", "developer"):
        last = messages[-1].get("role") if messages else "nothing"
        raise FormatError(f"request.messages must end with a user or tool message to be answered, not {last}")



# A conversation that reaches every branch a format has: a system prompt, a tool, an earlier
# answer with reasoning and a call, its result, and a new question; the answer reasons and calls.
PROBE_TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {
    "name": "probe", "description": "d", "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                                       "required": ["q"]}}}]
PROBE_MESSAGES: list[Message] = [
    {"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
    {"role": "assistant", "content": "a1", "reasoning_content": "r1",
     "tool_calls": [{"id": "functions.probe:0", "type": "function",
                     "function": {"name": "probe", "arguments": '{"q": "x"}'}}]},
    {"role": "tool", "tool_call_id": "functions.probe:0", "content": "t1"}, {"role": "user", "content": "u2"}]
PROBE_TURN = Turn(reasoning="r2", content="a2", calls=(Call("probe", '{"q": "y"}', "functions.probe:1"),))
