"""Generations a user already has, read back for `eyrie audit --from FILE`: one JSON object a line
(`.jsonl`, or `.jsonl.gz`), each a prompt and the answer a provider gave to it. Nothing is sent.

The prompt, first of:
- `request`: the chat-completions body as sent (`messages`, and `tools` when they were structured);
- `messages` (+ `tools`): an openai row; `conversations`: a sharegpt row; `system` + `chat`: a glaive
  row (functions as text in the system prompt, the prompt being the first USER turn) -- read by the
  same code that reads such rows as a source (`sources.prompt_from_row`).
The answer, first of:
- `response`: a chat.completion object (or an OpenAI batch line's `{"status_code", "body": {...}}`),
  or an assistant message (`content`, `reasoning`, `tool_calls`) with `usage` beside it;
- `choices` at the top level: the row is a chat.completion itself;
- `content` / `reasoning` / `tool_calls` at the top level, with `usage`, `provider`, `model`;
- else the conversation's last turn, when the assistant wrote it: training data's usual shape (OpenAI
  fine-tuning `{"messages": [system, user, assistant]}`, ShareGPT `{"conversations": [..., {"from":
  "gpt"}]}`, SpecForge's `conversations` of role/content messages); the turns before it are the prompt.
A row whose request carried `tools` is a structured-mode answer; otherwise a text-mode one.

Rows are numbered from 1, as an editor shows the file's lines. A row that cannot be read is a
`RowProblem` naming the row and what is wrong; reading goes on.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from eyrie.jobs import sources
from eyrie.jobs.api import ApiError
from eyrie.jobs.api.errors import Retryable  # what parse_completion raises for a body that is no answer
from eyrie.jobs.api.sse import parse_completion
from eyrie.jobs.contract.records import Response
from eyrie.jobs.errors import InputError
from eyrie.jobs.jsonvalues import json_type_name
from eyrie.jobs.tools import textcalls

MAX_LINE_BYTES = 64 << 20  # one recorded row; longer ones are named, not read


class RecordedFileError(InputError, RuntimeError):
    """The file cannot be read at all (missing, unreadable, not gzip)."""


@dataclass(slots=True)
class RecordedRow:
    """One row read back: the prompt, which mode it was sent in, and the answer (or the provider's
    error, for a request that failed)."""

    line: int
    prompt: sources.Prompt
    mode: str  # "text" | "structured"
    response: Response | None
    usage: dict[str, Any] | None
    error: str | None = None
    model: str | None = None  # the model that answered, as the row says (the response's, else the request's)


@dataclass(slots=True)
class RowProblem:
    line: int
    error: str


_MESSAGE_KEYS = ("content", "reasoning", "reasoning_content", "tool_calls", "reasoning_details")


def _open(path: Path) -> IO[bytes]:
    try:
        f: IO[bytes] = path.open("rb")
    except OSError as e:
        raise RecordedFileError(f"--from {path}: {e.strerror or e}") from None
    if f.read(2) == b"\x1f\x8b":
        f.seek(0)
        return gzip.open(f)  # type: ignore[return-value]
    f.seek(0)
    return f


def _prompt(raw: dict[str, Any], name: str, line: int) -> tuple[sources.Prompt | sources.BadRow, str] | str:
    """(the prompt, its tools mode), or why the row holds none."""
    request = raw.get("request")
    if request is not None:
        if not isinstance(request, dict):
            return "'request' is not an object"
        row, fmt = request, "openai"
    elif "messages" in raw:
        row, fmt = raw, "openai"
    elif "conversations" in raw:
        row, fmt = raw, "sharegpt"
    elif "system" in raw and "chat" in raw:
        row, fmt = raw, "glaive"
    elif "prompt" in raw or "completion" in raw:
        return "a completion-style row ('prompt'/'completion'): no chat messages to read the declared tools " \
               "from; expected 'request' (a chat-completions body), 'messages', 'conversations' or 'system' and 'chat'"
    else:
        return "no prompt: expected 'request' (a chat-completions body), 'messages', 'conversations' or " \
               "'system' and 'chat'"
    prompt = sources.prompt_from_row(name, fmt, line - 1, row)
    return prompt, "structured" if isinstance(prompt, sources.Prompt) and prompt.tools else "text"


def _completion(raw: dict[str, Any]) -> dict[str, Any] | str:
    """The answer as a chat.completion object, whatever shape the row gives it in."""
    resp = raw.get("response")
    if resp is not None:
        if not isinstance(resp, dict):
            return "'response' is not an object"
        if isinstance(resp.get("body"), dict) and "status_code" in resp:  # an OpenAI batch output line
            resp = resp["body"]
        if "choices" in resp or "error" in resp:
            return resp
        if any(k in resp for k in _MESSAGE_KEYS):
            return {"choices": [{"message": resp, "finish_reason": resp.get("finish_reason")}],
                    "usage": resp.get("usage", raw.get("usage")), "provider": raw.get("provider"),
                    "model": raw.get("model")}
        return "'response' holds neither 'choices' nor an assistant message"
    if "choices" in raw:
        return raw
    if any(k in raw for k in _MESSAGE_KEYS):
        message = {k: raw[k] for k in _MESSAGE_KEYS if k in raw}
        return {"id": raw.get("id"), "choices": [{"message": message, "finish_reason": raw.get("finish_reason")}],
                "usage": raw.get("usage"), "provider": raw.get("provider"), "model": raw.get("model")}
    return ("no answer: expected 'response', 'choices', 'content'/'reasoning'/'tool_calls', or a conversation "
            "whose last turn is the assistant's")


_ANSWER_SPEAKERS = frozenset({"assistant", "gpt", "chatgpt", "model", "function_call"})


def _last_turn_answer(raw: dict[str, Any]) -> dict[str, Any] | None:
    """A training row whose conversation ends with the assistant's turn, as a row whose `response` is
    that turn and whose prompt is the turns before it (None: not such a row). SpecForge keeps
    `conversations` as role/content messages: those are read as `messages`."""
    key = "messages" if "messages" in raw else "conversations" if "conversations" in raw else None
    if key is None or "request" in raw:
        return None
    turns = raw[key]
    if isinstance(turns, str):  # a Parquet dump's JSON text
        try:
            turns = orjson.loads(turns)
        except orjson.JSONDecodeError:
            return None
    if not isinstance(turns, list) or len(turns) < 2 or not isinstance(turns[-1], dict):
        return None
    last = turns[-1]
    if last.get("role", last.get("from")) not in _ANSWER_SPEAKERS:
        return None
    text = last.get("content", last.get("value"))
    message: dict[str, Any] = {"content": text}
    if last.get("from") == "function_call" and isinstance(text, str):  # glaive's ShareGPT: the call as JSON
        message = {"content": None, "tool_calls": _function_call(text)}
    for k in ("reasoning_content", "reasoning", "tool_calls"):
        if last.get(k) is not None:
            message[k] = last[k]
    row = {k: v for k, v in raw.items() if k != key}
    roles = key == "messages" or all(isinstance(t, dict) and "role" in t for t in turns)
    row["messages" if roles else "conversations"] = turns[:-1]
    return {**row, "response": message}


def _function_call(text: str) -> list[dict[str, Any]]:
    """A ShareGPT `function_call` turn's call(s) as OpenAI `tool_calls` (read by `textcalls`, as a
    source reads them); a call that does not read stays one, with no name, for the check to judge."""
    try:
        found = textcalls.object_calls(textcalls.CallFormat.STRUCTURED, textcalls.call_object(text))
    except textcalls.TextCallError:
        return [{"id": "call_0", "type": "function", "function": {"name": None, "arguments": text}}]
    return [{"id": c.id or f"call_{j}", "type": "function", "function": {"name": c.name, "arguments": _json(c)}}
            for j, c in enumerate(found)]


def _json(c: textcalls.TextCall) -> str | None:
    """A call's arguments as JSON text (None: it has none that are JSON values: the check says so)."""
    if isinstance(c.arguments, str) or c.problem is not None:
        return c.arguments
    try:
        return orjson.dumps(c.arguments).decode()
    except TypeError:
        return None


def parse_row(raw: Any, name: str, line: int) -> RecordedRow | RowProblem:
    """One decoded row (pure)."""
    if isinstance(raw, ValueError):
        return RowProblem(line, str(raw))
    if not isinstance(raw, dict):
        return RowProblem(line, f"row is a JSON {json_type_name(raw)}, not an object")
    if not any(k in raw for k in ("response", "choices", *_MESSAGE_KEYS)):
        raw = _last_turn_answer(raw) or raw
    got = _prompt(raw, name, line)
    if isinstance(got, str):
        return RowProblem(line, got)
    prompt, mode = got
    if isinstance(prompt, sources.BadRow):
        return RowProblem(line, prompt.reason)
    doc = _completion(raw)
    if isinstance(doc, str):
        return RowProblem(line, doc)
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else None
    model = _model(raw, doc)
    try:
        response, usage = parse_completion(doc)
    except ApiError as e:  # the provider's error instead of an answer: a failed request, not a bad row
        return RecordedRow(line, prompt, mode, None, usage, error=f"{type(e).__name__}: {e}", model=model)
    except Retryable as e:
        if e.kind == "error-body" or doc.get("error"):  # the provider's error too, a transient one
            return RecordedRow(line, prompt, mode, None, usage, error=e.message, model=model)
        return RowProblem(line, f"answer: {e.message}")
    for key in ("content", "reasoning"):
        if response.get(key) is not None and not isinstance(response.get(key), str):
            return RowProblem(line, f"answer: {key} is a JSON {json_type_name(response[key])}, not a string")
    return RecordedRow(line, prompt, mode, response, usage, model=model)


def _model(raw: dict[str, Any], doc: dict[str, Any]) -> str | None:
    """Who answered: the answer's `model` (what the provider says served it), else the request's, else
    the row's."""
    request = raw.get("request")
    for value in (doc.get("model"), request.get("model") if isinstance(request, dict) else None, raw.get("model")):
        if isinstance(value, str) and value.strip():
            return value.strip()[:200]
    return None


_WRAPPERS = tuple(m for ms in textcalls.NATIVE_MARKERS.values() for m in ms)
_RESULT_PREFIX = "FUNCTION RESPONSE:"  # glaive's result turn, which text-mode datasets keep as a user turn


def structured_history(prompt: sources.Prompt, declared: frozenset[str]) -> sources.Prompt | str:
    """`prompt` as a structured request must carry it (pure): calls that earlier assistant turns wrote
    as text (any format `textcalls` reads) become their `tool_calls`, and the turns answering them
    (tool messages, or user turns holding glaive's `FUNCTION RESPONSE:` or Hermes' `<tool_response>`)
    `tool` messages, checked as a whole conversation is (`sources.whole_conversation`: every call
    answered). A string says why the prompt cannot be sent so: an earlier call that does not read,
    a result that answers no call. A prompt without earlier calls comes back as it is."""
    out: list[dict[str, Any]] = []
    changed = False
    after_call = False
    for i, m in enumerate(prompt.messages):
        content = m.get("content")
        role = m.get("role")
        if role == "assistant" and isinstance(content, str) and not m.get("tool_calls"):
            found = textcalls.find_calls(content, declared)
            if found:
                bad = next((c for c in found if c.problem is not None or c.name is None), None)
                if bad is not None:
                    return f"message {i}: its earlier call cannot be sent structured ({bad.message()})"
                calls = [{"id": c.id or f"call_{i}_{j}", "type": "function",
                          "function": {"name": c.name, "arguments": c.arguments if isinstance(c.arguments, str)
                                       else orjson.dumps(c.arguments).decode()}} for j, c in enumerate(found)]
                rest = sources.outside_calls(content, found)
                for marker in _WRAPPERS:  # a native section's begin and end, left around its calls
                    rest = rest.replace(marker, "")
                rest = rest.strip()
                out.append({**m, "content": rest or None, "tool_calls": calls})
                changed = after_call = True
                continue
        if role == "user" and after_call and isinstance(content, str) and (
                content.lstrip().startswith(_RESULT_PREFIX) or "<tool_response>" in content):
            text = content.lstrip()
            text = text[len(_RESULT_PREFIX):].strip() if text.startswith(_RESULT_PREFIX) else text
            out.append({"role": "tool", "content": text})
            continue
        after_call = after_call and role == "tool"
        out.append(m)
    if not changed:
        return prompt
    try:
        messages = sources.whole_conversation(out)
    except ValueError as e:
        return f"its earlier calls cannot be sent structured: {e}"
    return sources.Prompt(prompt.source, prompt.row, messages, prompt.tools, prompt.fmt)


def recorded_path(path: str | Path) -> Path:
    return Path(str(path).removeprefix("file://")).expanduser()


def iter_lines(path: str | Path) -> Iterator[tuple[int, bytes] | RowProblem]:
    """(row number, the line) of every line that is not blank; a truncated or corrupt `.gz` ends
    with a RowProblem (what was read before it stands)."""
    with _open(recorded_path(path)) as f:
        line = 0
        try:
            for raw_line in f:
                line += 1
                if raw_line.strip():
                    yield line, raw_line
        except (OSError, EOFError) as e:
            yield RowProblem(line + 1, f"the file is corrupt from here on ({type(e).__name__}: {e})")


def first_byte(path: str | Path) -> bytes:
    """The file's first byte that is not whitespace (b"" for none; read through gzip): `[` is a JSON
    array someone meant as JSON lines."""
    with _open(recorded_path(path)) as f:
        try:
            while chunk := f.read(1 << 16):
                if stripped := chunk.lstrip():
                    return stripped[:1]
        except (OSError, EOFError):
            return b""
    return b""


def parse_line(raw_line: bytes, name: str, line: int) -> RecordedRow | RowProblem:
    if len(raw_line) > MAX_LINE_BYTES:
        return RowProblem(line, f"row is {len(raw_line):,} bytes, over the {MAX_LINE_BYTES:,} limit")
    return parse_row(sources.decode_line(raw_line), name, line)


def read_recorded(path: str | Path, name: str | None = None) -> Iterator[RecordedRow | RowProblem]:
    """Every row of the file, in order; `name` is the source name its prompts get (default: the
    file's name), which their sample ids hash."""
    name = name or recorded_path(path).name
    for item in iter_lines(path):
        yield item if isinstance(item, RowProblem) else parse_line(item[1], name, item[0])
