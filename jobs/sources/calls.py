"""Whole conversations in OpenAI form: tool calls however a row wrote them (structured, OpenAI's older
`function_call`, Hermes `<tool_call>` text) become assistant `tool_calls` with ids and string `arguments`,
each result a `tool` message with the `tool_call_id` it answers. Calls written as text are read by
`tools.textcalls`, the one parser answers go through too."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from eyrie.jobs.sources.errors import RowError
from eyrie.jobs.tools import textcalls

_HERMES_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.S)


def _openai_call(name: str, args: Any, call_id: str, what: str) -> dict[str, Any]:
    """One call in OpenAI form; `arguments` stays the dataset's text when it is text."""
    if not isinstance(args, str):
        try:
            args = orjson.dumps(args).decode()
        except TypeError:
            raise RowError(f"{what}: arguments are not JSON values") from None
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _as_call(obj: Any, call_id: str, what: str) -> dict[str, Any]:
    """A call object (any shape `textcalls.call_parts` reads) in OpenAI form."""
    try:
        name, args, given = textcalls.call_parts(obj)
    except textcalls.TextCallError as e:
        raise RowError(f"{what} {e}") from None
    return _openai_call(name, args, given or call_id, what)


def openai_calls(found: list[textcalls.TextCall], first_id: str, what: Callable[[int], str]) -> list[dict[str, Any]]:
    """Calls read from a row's text in OpenAI form; the first one that cannot be read makes the
    row a bad row (`what(j)` names call j)."""
    out = []
    for j, c in enumerate(found):
        if c.problem is not None or c.name is None:
            raise RowError(f"{what(j)} {c.problem}")
        out.append(_openai_call(c.name, c.arguments, c.id or f"{first_id}_{j}", what(j)))
    return out


def calls_from(value: Any, first_id: str, what: str) -> list[dict[str, Any]]:
    """A call or a list of parallel calls (an object, or its text) in OpenAI form."""
    if isinstance(value, str):
        try:
            value = textcalls.call_object(value)
        except textcalls.TextCallError as e:
            raise RowError(f"{what} {e}") from None
    found = textcalls.object_calls(textcalls.CallFormat.STRUCTURED, value)
    if len(found) == 1 and found[0].problem == "holds no call":
        raise RowError(f"{what} holds no call")
    return openai_calls(found, first_id, lambda j: f"{what}[{j}]")


def _hermes_calls(m: dict[str, Any], where: str, first_id: str) -> dict[str, Any]:
    """An assistant message whose content carries Hermes `<tool_call>` blocks -> structured calls."""
    content = m.get("content")
    if m.get("tool_calls") or not isinstance(content, str) or textcalls.HERMES_BEGIN not in content:
        return m
    found = textcalls.parse_hermes(content)
    if any(c.problem == "is never closed" for c in found):
        raise RowError(f"{where}: <tool_call> is never closed")
    calls = openai_calls(found, first_id, lambda j: f"{where} <tool_call> {j}")
    rest = outside_calls(content, found).strip()
    return {**m, "content": rest or None, "tool_calls": calls}


def outside_calls(text: str, found: list[textcalls.TextCall]) -> str:
    """`text` without the spans its calls were read from."""
    parts, pos = [], 0
    for c in found:
        if c.start >= pos:
            parts.append(text[pos:c.start])
            pos = c.end
    return "".join(parts) + text[pos:]


def _split_results(m: dict[str, Any]) -> list[dict[str, Any]]:
    """One tool message per Hermes `<tool_response>` block (parallel results in one turn)."""
    content = m.get("content")
    if not isinstance(content, str) or "<tool_response>" not in content:
        return [m]
    return [{**m, "content": b.strip()} for b in _HERMES_RESPONSE.findall(content)] or [m]


def whole_conversation(messages: list[dict[str, Any]], unit: str = "message",
                       offset: int = 0) -> list[dict[str, Any]]:
    """Normalize a whole conversation to OpenAI form and check that every call is answered.

    Calls without an id get `call_<message>_<j>`; a result without `tool_call_id` answers the
    oldest unanswered call of the assistant turn before it. Calls of the last turn may stay
    unanswered (datasets often end at a call): no later turn needs their results. Raises RowError naming the
    `unit` (message, turn) and its 0-based index (`offset` for rows that prepend a system message).
    """
    out: list[dict[str, Any]] = []
    pending: dict[str, str] = {}  # unanswered call id -> name, in call order
    seen_user = False
    for i, m in enumerate(messages):
        where = f"{unit} {i + offset}"
        role = m["role"]
        if role == "function":  # OpenAI's older function calling
            m = {**{k: v for k, v in m.items() if k != "role"}, "role": "tool"}
            role = "tool"
        if role == "tool":
            for r in _split_results(m):
                cid = r.get("tool_call_id")
                if cid is None:
                    cid = next(iter(pending), None)
                if cid is None or str(cid) not in pending:
                    what = "no call" if cid is None else f"call id {cid!r}, which no open call has"
                    raise RowError(f"{where}: a tool result answers {what}")
                pending.pop(str(cid))
                out.append({**r, "tool_call_id": str(cid)})
            continue
        if pending:
            cid, name = next(iter(pending.items()))
            raise RowError(f"{where}: tool call {cid!r} ({name}) is never answered")
        if role == "assistant":
            if not seen_user:
                raise RowError(f"{where}: an assistant turn before any user turn")
            if out and out[-1]["role"] == "assistant":
                raise RowError(f"{where}: two assistant turns in a row")
            if isinstance(m.get("function_call"), dict):
                m = {**{k: v for k, v in m.items() if k != "function_call"},
                     "tool_calls": [m["function_call"]]}
            m = _hermes_calls(m, where, f"call_{i + offset}")
            if m.get("tool_calls") is not None:
                calls = m["tool_calls"]
                if not isinstance(calls, list):
                    raise RowError(f"{where}: 'tool_calls' must be a list")
                calls = [_as_call(c, f"call_{i + offset}_{j}", f"{where} tool_calls[{j}]")
                         for j, c in enumerate(calls)]
                for c in calls:
                    if c["id"] in pending:
                        raise RowError(f"{where}: two calls share the id {c['id']!r}")
                    pending[c["id"]] = c["function"]["name"]
                m = {**m, "tool_calls": calls} if calls else {k: v for k, v in m.items() if k != "tool_calls"}
        elif role == "user":
            seen_user = True
        out.append(m)
    # calls left open by the last turn are fine: nothing after them needs their results
    if not seen_user:
        raise RowError("no user turn")
    return out
