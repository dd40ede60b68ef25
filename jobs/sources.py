"""Prompt readers: JSONL, JSONL.gz and Parquet rows in the `openai`, `sharegpt` and `glaive` formats.

Two readings of a row: the conversation up to its last user turn (`generation.turns: last`, the
answer to it is what is bought), or the whole conversation (`turns: all`, every assistant turn is
regenerated; see `eyrie.jobs.generate.sending.conversation`). A whole conversation is normalized to the
OpenAI form: assistant `tool_calls` (each with an id and `arguments` as a string) and `tool`
messages with the `tool_call_id` they answer, whatever the row used (sharegpt `function_call` /
`observation`, glaive `<functioncall>` / `FUNCTION RESPONSE:`, Hermes `<tool_call>` /
`<tool_response>` text, OpenAI's older `function_call` / `function`). A result with no call to
answer, or a call never answered, makes the row a bad row.

A source yields one `Prompt` per good row and one `BadRow` per row it cannot use, so a single bad row
is counted and reported (with its 0-based row number) instead of stopping a paid run. Only a source
that cannot be opened at all raises `SourceError`; `check_source` finds that before any request.

Row numbers are stable: for JSONL they are the 0-based line index (blank lines keep their number but
yield nothing), for Parquet the 0-based row index. They feed the sample id, so they must not shift.
"""

from __future__ import annotations

import bisect
import gzip
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import orjson

from eyrie.jobs.contract.prompt import BadRow, Prompt
from eyrie.jobs.errors import EyrieError
from eyrie.jobs.jsonvalues import json_depth, json_type_name
from eyrie.jobs.spec import SourceSpec
from eyrie.jobs.store import NotFound, StoreError, open_uri
from eyrie.jobs.tools import textcalls

PARQUET_BATCH_ROWS = 1024


class SourceError(EyrieError, RuntimeError):
    """A source that cannot be read at all (missing, unreadable, unsupported); names source and URI."""


class _RowError(EyrieError, ValueError):
    """Internal: a row-level problem, turned into a BadRow by the reader."""


# ------------------------------------------------------------------------------------------ I/O


def _is_parquet(uri: str) -> bool:
    return uri.rstrip("/").lower().endswith(".parquet")


def check_source(source: SourceSpec, endpoint: str | None = None) -> None:
    """Raise SourceError if the source's file is missing or unreadable; cheap (an open, no download).

    Call it for every source before the first paid request so a typo in a URI costs nothing.
    """
    _open_binary(source, endpoint).close()


def _open_binary(source: SourceSpec, endpoint: str | None) -> IO[bytes]:
    """A seekable binary stream over the file (`store.open_uri`: from disk, or from S3 range by range)."""
    uri = source.uri
    try:
        return open_uri(uri, endpoint)
    except NotFound:
        raise SourceError(f"source {source.name!r}: {uri} does not exist or is not a file") from None
    except StoreError as e:
        raise SourceError(f"source {source.name!r}: cannot read {uri}: {e}") from None


MARK_ROWS = 4096  # a scan notes where every MARK_ROWS-th row starts; a shard's reader seeks there


@dataclass(frozen=True)
class Mark:
    """Where a source's row number `taken` (0-based among the rows that count: not blank lines)
    starts: its row number, and its byte offset in a plain JSONL file or its row group in a Parquet
    file; `pos` None in a .gz file, which is read from its start."""

    taken: int
    row: int
    pos: int | None


START = Mark(0, 0, 0)


@dataclass(frozen=True)
class SourceIndex:
    """A source's rows (its `limit` applied) and marks to start reading at; small: one mark per
    MARK_ROWS rows (per row group for Parquet), whatever the file's size."""

    name: str
    rows: int
    marks: tuple[Mark, ...] = (START,)

    def mark_for(self, taken: int) -> Mark:
        """The last mark at or before row `taken`."""
        i = bisect.bisect_right([m.taken for m in self.marks], taken) - 1
        return self.marks[max(0, i)]


def scan_source(source: SourceSpec, endpoint: str | None = None) -> SourceIndex:
    """Count a source's rows and mark where to seek, streaming (memory flat in the file's size;
    Parquet reads only the footer). Raises SourceError when the file cannot be read at all."""
    limit = source.limit
    f = _open_binary(source, endpoint)
    with f:
        if _is_parquet(source.uri):
            pf = _parquet_file(source, f)
            marks, first = [], 0
            for g in range(pf.metadata.num_row_groups):
                if limit is not None and first >= limit:
                    break
                marks.append(Mark(first, first, g))
                first += pf.metadata.row_group(g).num_rows
            rows = first if limit is None else min(first, limit)
            return SourceIndex(source.name, rows, tuple(marks) or (START,))
        stream, seekable = _text_stream(f)
        marks, taken, offset, after = [START], 0, 0, 0  # after: the row number after the last line
        for i, _line in _lines(stream):
            if limit is not None and taken >= limit:
                break
            if seekable and taken and taken % MARK_ROWS == 0:
                marks.append(Mark(taken, after, offset))  # blank lines before row i keep their numbers
            taken += 1
            after = i + 1
            if seekable:
                offset = stream.tell()
        return SourceIndex(source.name, taken, tuple(marks))


def _text_stream(f: IO[bytes]) -> tuple[IO[bytes], bool]:
    """The lines' stream (gunzipped when the file is gzip) and whether it can seek to a mark."""
    magic = f.read(2)
    f.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=f), False  # type: ignore[return-value]
    return f, True


def _lines(stream: IO[bytes], first_row: int = 0) -> Iterator[tuple[int, bytes | _RowError]]:
    """(row number, line) of every non-blank line; a corrupt .gz ends with one _RowError."""
    i = first_row - 1
    try:
        while line := stream.readline():
            i += 1
            if line.strip():
                yield i, line.rstrip(b"\r\n")
    except (OSError, EOFError) as e:  # a truncated .gz: report it like a bad row, keep the rest
        yield i + 1, _RowError(f"the file is corrupt from here on ({type(e).__name__}: {e})")


def _raw_rows(source: SourceSpec, endpoint: str | None, mark: Mark = START) -> Iterator[tuple[int, Any]]:
    """(row number, undecoded line, Parquet row or _RowError) in file order, from `mark`."""
    f = _open_binary(source, endpoint)
    with f:
        if _is_parquet(source.uri):
            yield from _parquet_rows(source, f, mark)
            return
        stream, seekable = _text_stream(f)
        if seekable and mark.pos:
            stream.seek(mark.pos)
        yield from _lines(stream, mark.row if seekable else 0)


def decode_line(line: bytes) -> Any:
    """One JSONL line decoded, or a ValueError (not raised) naming what is wrong with it."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as e:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as u:
            return _RowError(f"invalid UTF-8 at byte {u.start}")
        return _RowError(f"invalid JSON: {e}")


def _parquet_file(source: SourceSpec, f: IO[bytes]) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(f)
    except (pa.ArrowException, OSError) as e:
        raise SourceError(f"source {source.name!r}: {source.uri} is not a readable Parquet file: {e}"
                          ) from None


def _parquet_rows(source: SourceSpec, f: IO[bytes], mark: Mark = START) -> Iterator[tuple[int, Any]]:
    pf = _parquet_file(source, f)
    groups = list(range(mark.pos or 0, pf.metadata.num_row_groups))
    i = mark.row
    for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=groups):
        for row in batch.to_pylist():
            yield i, row
            i += 1


# ------------------------------------------------------------------------------------- formats

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
        raise _RowError(f"missing field {name!r}")
    return row[name]


def _maybe_json(value: Any, what: str) -> Any:
    """Parquet dumps often store nested fields as JSON text; accept both forms."""
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError as e:
            raise _RowError(f"{what} is a string but not JSON: {e}") from None
    return value


def _clean_message(m: Any, i: int) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise _RowError(f"message {i} is not an object")
    role = m.get("role")
    if role not in _ROLES:
        raise _RowError(f"message {i} has unknown role {role!r}")
    # Parquet struct columns fill absent keys with None; an API may reject e.g. "name": null.
    return {k: v for k, v in m.items() if v is not None}


def _up_to_last_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation up to and including the last user turn: the answer to it is what we buy."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "user":
            return messages[: i + 1]
    raise _RowError("no user turn")


def _tools_field(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = _maybe_json(row.get("tools"), "'tools'")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise _RowError("'tools' must be a list of objects")
    return tools


Parsed = tuple[list[dict[str, Any]], list[dict[str, Any]] | None]


def _openai(row: dict[str, Any], whole: bool) -> Parsed:
    messages = _maybe_json(_field(row, "messages"), "'messages'")
    if not isinstance(messages, list):
        raise _RowError("'messages' must be a list")
    msgs = [_clean_message(m, i) for i, m in enumerate(messages)]
    return (whole_conversation(msgs) if whole else _up_to_last_user(msgs)), _tools_field(row)


def _sharegpt_turn(turn: Any, i: int) -> tuple[str, Any]:
    """(from, value) of sharegpt turn `i`, with a known speaker."""
    if not isinstance(turn, dict):
        raise _RowError(f"turn {i} is not an object")
    who, value = turn.get("from"), turn.get("value")
    if who not in _SHAREGPT_ROLES:
        raise _RowError(f"turn {i} has unknown 'from' {who!r}")
    return who, value


def _sharegpt(row: dict[str, Any], whole: bool) -> Parsed:
    conv = _maybe_json(_field(row, "conversations"), "'conversations'")
    if not isinstance(conv, list):
        raise _RowError("'conversations' must be a list")
    if whole:
        return _sharegpt_whole(conv, row.get("system")), _tools_field(row)
    msgs: list[dict[str, Any]] = []
    system = row.get("system")  # LLaMA-Factory's sharegpt variant keeps it beside the turns
    if isinstance(system, str) and system.strip():
        msgs.append({"role": "system", "content": system})
    for i, turn in enumerate(conv):
        who, value = _sharegpt_turn(turn, i)
        if not isinstance(value, str):
            raise _RowError(f"turn {i} has no string 'value'")
        msgs.append({"role": _SHAREGPT_ROLES[who], "content": value})
    return _up_to_last_user(msgs), _tools_field(row)


_GLAIVE_USER = re.compile(r"(?:^|\s)USER:[ \t]*")
_GLAIVE_NEXT = re.compile(r"\s(?:ASSISTANT|USER|FUNCTION RESPONSE):")


def glaive_first_user(chat: str) -> str:
    """The first `USER:` turn of a glaive `chat` text (up to the next speaker tag)."""
    m = _GLAIVE_USER.search(chat)
    if not m:
        raise _RowError("no USER turn in 'chat'")
    rest = chat[m.end():]
    end = _GLAIVE_NEXT.search(rest)
    text = (rest[: end.start()] if end else rest).replace("<|endoftext|>", "").strip()
    if not text:
        raise _RowError("the first USER turn in 'chat' is empty")
    return text


def _glaive(row: dict[str, Any], whole: bool) -> Parsed:
    system, chat = _field(row, "system"), _field(row, "chat")
    if not isinstance(system, str) or not isinstance(chat, str):
        raise _RowError("'system' and 'chat' must be strings")
    msgs: list[dict[str, Any]] = []
    text = system.strip().removeprefix("SYSTEM:").strip()
    if text:  # declarations stay in the text; declarations.prepare_prompt decides how to send them
        msgs.append({"role": "system", "content": text})
    if whole:
        return msgs + _glaive_whole(chat), None
    msgs.append({"role": "user", "content": glaive_first_user(chat)})
    return msgs, None


# ------------------------------------------------------------------------- whole conversations

_HERMES_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.S)


def _openai_call(name: str, args: Any, call_id: str, what: str) -> dict[str, Any]:
    """One call in OpenAI form; `arguments` stays the dataset's text when it is text."""
    if not isinstance(args, str):
        try:
            args = orjson.dumps(args).decode()
        except TypeError:
            raise _RowError(f"{what}: arguments are not JSON values") from None
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _as_call(obj: Any, call_id: str, what: str) -> dict[str, Any]:
    """A call object (any shape `textcalls.call_parts` reads) in OpenAI form."""
    try:
        name, args, given = textcalls.call_parts(obj)
    except textcalls.TextCallError as e:
        raise _RowError(f"{what} {e}") from None
    return _openai_call(name, args, given or call_id, what)


def _openai_calls(found: list[textcalls.TextCall], first_id: str, what: Callable[[int], str]) -> list[dict[str, Any]]:
    """Calls read from a row's text in OpenAI form; the first one that cannot be read makes the
    row a bad row (`what(j)` names call j)."""
    out = []
    for j, c in enumerate(found):
        if c.problem is not None or c.name is None:
            raise _RowError(f"{what(j)} {c.problem}")
        out.append(_openai_call(c.name, c.arguments, c.id or f"{first_id}_{j}", what(j)))
    return out


def _calls_from(value: Any, first_id: str, what: str) -> list[dict[str, Any]]:
    """A call or a list of parallel calls (an object, or its text) in OpenAI form."""
    if isinstance(value, str):
        try:
            value = textcalls.call_object(value)
        except textcalls.TextCallError as e:
            raise _RowError(f"{what} {e}") from None
    found = textcalls.object_calls(textcalls.CallFormat.STRUCTURED, value)
    if len(found) == 1 and found[0].problem == "holds no call":
        raise _RowError(f"{what} holds no call")
    return _openai_calls(found, first_id, lambda j: f"{what}[{j}]")


def _hermes_calls(m: dict[str, Any], where: str, first_id: str) -> dict[str, Any]:
    """An assistant message whose content carries Hermes `<tool_call>` blocks -> structured calls."""
    content = m.get("content")
    if m.get("tool_calls") or not isinstance(content, str) or textcalls.HERMES_BEGIN not in content:
        return m
    found = textcalls.parse_hermes(content)
    if any(c.problem == "is never closed" for c in found):
        raise _RowError(f"{where}: <tool_call> is never closed")
    calls = _openai_calls(found, first_id, lambda j: f"{where} <tool_call> {j}")
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
    unanswered (datasets often end at a call): no later turn needs their results. Raises _RowError naming the
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
                    raise _RowError(f"{where}: a tool result answers {what}")
                pending.pop(str(cid))
                out.append({**r, "tool_call_id": str(cid)})
            continue
        if pending:
            cid, name = next(iter(pending.items()))
            raise _RowError(f"{where}: tool call {cid!r} ({name}) is never answered")
        if role == "assistant":
            if not seen_user:
                raise _RowError(f"{where}: an assistant turn before any user turn")
            if out and out[-1]["role"] == "assistant":
                raise _RowError(f"{where}: two assistant turns in a row")
            if isinstance(m.get("function_call"), dict):
                m = {**{k: v for k, v in m.items() if k != "function_call"},
                     "tool_calls": [m["function_call"]]}
            m = _hermes_calls(m, where, f"call_{i + offset}")
            if m.get("tool_calls") is not None:
                calls = m["tool_calls"]
                if not isinstance(calls, list):
                    raise _RowError(f"{where}: 'tool_calls' must be a list")
                calls = [_as_call(c, f"call_{i + offset}_{j}", f"{where} tool_calls[{j}]")
                         for j, c in enumerate(calls)]
                for c in calls:
                    if c["id"] in pending:
                        raise _RowError(f"{where}: two calls share the id {c['id']!r}")
                    pending[c["id"]] = c["function"]["name"]
                m = {**m, "tool_calls": calls} if calls else {k: v for k, v in m.items() if k != "tool_calls"}
        elif role == "user":
            seen_user = True
        out.append(m)
    # calls left open by the last turn are fine: nothing after them needs their results
    if not seen_user:
        raise _RowError("no user turn")
    return out


def _sharegpt_whole(conv: list[Any], system: Any) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    offset = 0
    if isinstance(system, str) and system.strip():
        msgs.append({"role": "system", "content": system})
        offset = -1
    for i, turn in enumerate(conv):
        who, value = _sharegpt_turn(turn, i)
        if who == "function_call":
            calls = _calls_from(value, f"call_{i}", f"turn {i} (function_call)")
            if msgs and msgs[-1]["role"] == "assistant" and not msgs[-1].get("tool_calls"):
                msgs[-1] = {**msgs[-1], "tool_calls": calls}  # the text before the call, then the call
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": calls})
            continue
        if not isinstance(value, str):
            raise _RowError(f"turn {i} has no string 'value'")
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
                raise _RowError(f"{what} {found[0].problem}")
            calls = _openai_calls(found, f"call_{n}", lambda j, what=what: f"{what}[{j}]")
            if after := outside_calls(text, found)[found[0].start:].strip():
                raise _RowError(f"{what}: text after the call, {after[:40]!r}, would be lost")
            msgs.append({"role": "assistant", "content": text[:found[0].start].strip() or None, "tool_calls": calls})
        else:
            msgs.append({"role": "assistant", "content": text})
    return whole_conversation(msgs, "speaker turn")


_FORMATS = {"openai": _openai, "sharegpt": _sharegpt, "glaive": _glaive}


def iter_source(source: SourceSpec, endpoint: str | None = None, *, whole: bool = False, start: int = 0,
                stop: int | None = None, index: SourceIndex | None = None,
                answers: bool = False) -> Iterator[Prompt | BadRow]:
    """Stream a source's prompts in file order; bad rows come out as BadRow, never as an exception.

    `whole`: each Prompt holds the whole normalized conversation (`generation.turns: all`), not the
    conversation up to its last user turn.

    `limit` counts rows taken, bad rows included (a row is taken once it yields a Prompt or a
    BadRow; blank lines are not rows), so a limit of N always means the first N rows of the file.
    `start`/`stop` select rows by that count (a shard's slice); with the source's `index`
    (`scan_source`) the reader seeks to the slice instead of reading up to it. `answers`: each Prompt
    also carries the row's own answer (`generation.answers: dataset`).
    The S3 endpoint defaults to EYRIE_S3_ENDPOINT (see `store.open_store`). Raises SourceError when
    the file cannot be opened or is corrupt as a whole.
    """
    if source.limit is not None:
        stop = source.limit if stop is None else min(stop, source.limit)
    mark = index.mark_for(start) if index is not None else START
    taken = mark.taken
    for i, raw in _raw_rows(source, endpoint, mark):
        if stop is not None and taken >= stop:
            return
        taken += 1
        if taken <= start:
            continue
        if isinstance(raw, bytes):
            raw = decode_line(raw)  # error positions within the line
        yield prompt_from_row(source.name, source.format, i, raw, whole=whole, answer=answers)


def prompt_from_row(source: str, fmt: str, row: int, raw: Any, *, whole: bool = False,
                    answer: bool = False) -> Prompt | BadRow:
    """One decoded row of a dataset in format `fmt` (openai, sharegpt, glaive) as a Prompt, or a
    BadRow saying what is wrong: the one reading of each format, for sources and for any other file
    that holds such rows (`eyrie audit --from`). `answer`: also the row's own answer (`original_answer`)."""
    try:
        if isinstance(raw, _RowError):
            raise raw
        if not isinstance(raw, dict):
            raise _RowError(f"row is a JSON {json_type_name(raw)}, not an object")
        if json_depth(raw, MAX_ROW_DEPTH) > MAX_ROW_DEPTH:
            raise _RowError(f"row nests deeper than {MAX_ROW_DEPTH} levels")
        messages, tools = _FORMATS[fmt](raw, whole)
        given = original_answer(fmt, raw, messages) if answer and not whole else None
    except _RowError as e:
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
