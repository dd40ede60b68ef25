"""The three row formats (`openai`, `sharegpt`, `glaive`): one decoded row -> its messages and tools, for
`turns: last` (up to the last user turn) or `turns: all` (the whole conversation, via `calls`); the one
reading of each format, for sources and for any other file that holds such rows."""

from __future__ import annotations

import re
from typing import Any

import orjson

from eyrie.jobs.contract.prompt import BadRow, Prompt
from eyrie.jobs.jsonvalues import json_depth, json_type_name
from eyrie.jobs.sources.calls import calls_from, openai_calls, outside_calls, whole_conversation
from eyrie.jobs.sources.errors import RowError
from eyrie.jobs.tools import textcalls

MAX_ROW_DEPTH = 128  # JSON nesting levels; orjson refuses to serialise past 255


_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_SHAREGPT_ROLES = {
    "system": "system",
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "model": "assistant",
    "function_call": "assistant",
    "tool": "tool", "observation": "tool", "function_response": "tool", "ipython": "tool",
}


def _field(row: dict[str, Any], name: str) -> Any:
    if name not in row or row[name] is None:
        raise RowError(f"missing field {name!r}")
    return row[name]


def _maybe_json(value: Any, what: str) -> Any:
    """Parquet dumps often store nested fields as JSON text; accept both forms."""
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError as e:
            raise RowError(f"{what} is a string but not JSON: {e}") from None
    return value


def _clean_message(m: Any, i: int) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise RowError(f"message {i} is not an object")
    role = m.get("role")
    if role not in _ROLES:
        raise RowError(f"message {i} has unknown role {role!r}")
    # Parquet struct columns fill absent keys with None; an API may reject e.g. "name": null.
    return {k: v for k, v in m.items() if v is not None}


def _up_to_last_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation up to and including the last user turn: the answer to it is what we buy."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "user":
            return messages[: i + 1]
    raise RowError("no user turn")


def _tools_field(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = _maybe_json(row.get("tools"), "'tools'")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RowError("'tools' must be a list of objects")
    return tools


Parsed = tuple[list[dict[str, Any]], list[dict[str, Any]] | None]


def _openai(row: dict[str, Any], whole: bool) -> Parsed:
    messages = _maybe_json(_field(row, "messages"), "'messages'")
    if not isinstance(messages, list):
        raise RowError("'messages' must be a list")
    msgs = [_clean_message(m, i) for i, m in enumerate(messages)]
    return (whole_conversation(msgs) if whole else _up_to_last_user(msgs)), _tools_field(row)


def _sharegpt_turn(turn: Any, i: int) -> tuple[str, Any]:
    """(from, value) of sharegpt turn `i`, with a known speaker."""
    if not isinstance(turn, dict):
        raise RowError(f"turn {i} is not an object")
    who, value = turn.get("from"), turn.get("value")
    if who not in _SHAREGPT_ROLES:
        raise RowError(f"turn {i} has unknown 'from' {who!r}")
    return who, value


def _sharegpt(row: dict[str, Any], whole: bool) -> Parsed:
    conv = _maybe_json(_field(row, "conversations"), "'conversations'")
    if not isinstance(conv, list):
        raise RowError("'conversations' must be a list")
    if whole:
        return _sharegpt_whole(conv, row.get("system")), _tools_field(row)
    msgs: list[dict[str, Any]] = []
    system = row.get("system")  # LLaMA-Factory's sharegpt variant keeps it beside the turns
    if isinstance(system, str) and system.strip():
        msgs.append({"role": "system", "content": system})
    for i, turn in enumerate(conv):
        who, value = _sharegpt_turn(turn, i)
        if not isinstance(value, str):
            raise RowError(f"turn {i} has no string 'value'")
        msgs.append({"role": _SHAREGPT_ROLES[who], "content": value})
    return _up_to_last_user(msgs), _tools_field(row)


_GLAIVE_USER = re.compile(r"(?:^|\s)USER:[ \t]*")
_GLAIVE_NEXT = re.compile(r"\s(?:ASSISTANT|USER|FUNCTION RESPONSE):")


def glaive_first_user(chat: str) -> str:
    """The first `USER:` turn of a glaive `chat` text (up to the next speaker tag)."""
    m = _GLAIVE_USER.search(chat)
    if not m:
        raise RowError("no USER turn in 'chat'")
    rest = chat[m.end():]
    end = _GLAIVE_NEXT.search(rest)
    text = (rest[: end.start()] if end else rest).replace("<|endoftext|>", "").strip()
    if not text:
        raise RowError("the first USER turn in 'chat' is empty")
    return text


def _glaive(row: dict[str, Any], whole: bool) -> Parsed:
    system, chat = _field(row, "system"), _field(row, "chat")
    if not isinstance(system, str) or not isinstance(chat, str):
        raise RowError("'system' and 'chat' must be strings")
    msgs: list[dict[str, Any]] = []
    text = system.strip().removeprefix("SYSTEM:").strip()
    if text:  # declarations stay in the text; declarations.prepare_prompt decides how to send them
        msgs.append({"role": "system", "content": text})
    if whole:
        return msgs + _glaive_whole(chat), None
    msgs.append({"role": "user", "content": glaive_first_user(chat)})
    return msgs, None


def _sharegpt_whole(conv: list[Any], system: Any) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    offset = 0
    if isinstance(system, str) and system.strip():
        msgs.append({"role": "system", "content": system})
        offset = -1
    for i, turn in enumerate(conv):
        who, value = _sharegpt_turn(turn, i)
        if who == "function_call":
            calls = calls_from(value, f"call_{i}", f"turn {i} (function_call)")
            if msgs and msgs[-1]["role"] == "assistant" and not msgs[-1].get("tool_calls"):
                msgs[-1] = {**msgs[-1], "tool_calls": calls}  # the text before the call, then the call
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": calls})
            continue
        if not isinstance(value, str):
            raise RowError(f"turn {i} has no string 'value'")
        msgs.append({"role": _SHAREGPT_ROLES[who], "content": value})
    return whole_conversation([{k: v for k, v in m.items() if v is not None or k == "content"}
                               for m in msgs], "turn", offset)


_GLAIVE_SPEAKER = re.compile(r"(?:^|(?<=\s))(USER|ASSISTANT|FUNCTION RESPONSE):")


def _glaive_whole(chat: str) -> list[dict[str, Any]]:
    """A glaive `chat` text as messages: `<functioncall> {...}` ends an assistant turn with a call,
    `FUNCTION RESPONSE:` answers it."""
    parts = _GLAIVE_SPEAKER.split(chat)
    msgs: list[dict[str, Any]] = []
    for k in range(1, len(parts) - 1, 2):
        who, text = parts[k], parts[k + 1].replace("<|endoftext|>", "").strip()
        if who == "USER":
            msgs.append({"role": "user", "content": text})
        elif who == "FUNCTION RESPONSE":
            msgs.append({"role": "tool", "content": text})
        elif textcalls.GLAIVE_CALL in text:
            n = len(msgs)
            found = textcalls.parse_glaive(text)
            what = f"ASSISTANT turn {n} <functioncall>"
            if len(found) == 1 and found[0].item is None and found[0].problem is not None:
                raise RowError(f"{what} {found[0].problem}")
            calls = openai_calls(found, f"call_{n}", lambda j, what=what: f"{what}[{j}]")
            if after := outside_calls(text, found)[found[0].start:].strip():
                raise RowError(f"{what}: text after the call, {after[:40]!r}, would be lost")
            msgs.append({"role": "assistant", "content": text[:found[0].start].strip() or None, "tool_calls": calls})
        else:
            msgs.append({"role": "assistant", "content": text})
    return whole_conversation(msgs, "speaker turn")


_FORMATS = {"openai": _openai, "sharegpt": _sharegpt, "glaive": _glaive}


def prompt_from_row(source: str, fmt: str, row: int, raw: Any, *, whole: bool = False,
                    answer: bool = False) -> Prompt | BadRow:
    """One decoded row of a dataset in format `fmt` (openai, sharegpt, glaive) as a Prompt, or a
    BadRow saying what is wrong: the one reading of each format, for sources and for any other file
    that holds such rows (`eyrie audit --from`). `answer`: also the row's own answer (`original_answer`)."""
    try:
        if isinstance(raw, RowError):
            raise raw
        if not isinstance(raw, dict):
            raise RowError(f"row is a JSON {json_type_name(raw)}, not an object")
        if json_depth(raw, MAX_ROW_DEPTH) > MAX_ROW_DEPTH:
            raise RowError(f"row nests deeper than {MAX_ROW_DEPTH} levels")
        messages, tools = _FORMATS[fmt](raw, whole)
        given = original_answer(fmt, raw, messages) if answer and not whole else None
    except RowError as e:
        return BadRow(source, row, str(e))
    return Prompt(source, row, messages, tools, fmt, given)


def original_answer(fmt: str, raw: dict[str, Any], prompt: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The dataset's own answer to `prompt` (what `_FORMATS[fmt]` read from `raw` for turns: last): the
    assistant turn right after the prompt's user turn, read as a whole conversation is (calls written as
    text, glaive `<functioncall>` or Hermes `<tool_call>`, become OpenAI calls); None when the row has no
    assistant turn there. A row whose whole conversation does not read (a call never answered before a
    later turn) is a bad row: its answer cannot be taken as it is."""
    whole, _tools = _FORMATS[fmt](raw, True)
    users = [i for i, m in enumerate(whole) if m["role"] == "user"]
    asked = sum(1 for m in prompt if m["role"] == "user")  # the prompt ends with this many users' turns
    if asked > len(users):
        return None
    after = users[asked - 1] + 1
    if after >= len(whole) or whole[after]["role"] != "assistant":
        return None
    m = whole[after]
    out = {"role": "assistant", "content": m.get("content"),
           "reasoning_content": m.get("reasoning_content") or m.get("reasoning")}
    if m.get("tool_calls"):
        out["tool_calls"] = m["tool_calls"]
    return out
