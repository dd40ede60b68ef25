"""Tool calls a model wrote as text, read in the formats models write them: one reading per format.

Answers of `tools.mode: text` (`checks.check_response`) and dataset rows whose assistant turns carry
calls as text (`sources/`: glaive `<functioncall>`, Hermes `<tool_call>`) both go through this
module, so a format is read one way. Pure: no I/O.

The formats (`CallFormat`), each with its own parser:
- glaive (`parse_glaive`): `<functioncall> {"name": ..., "arguments": '{...}'}`, glaive-function-calling-v2's
  convention (arguments often a single-quoted string of JSON); one call object (or a list of them)
  after each marker.
- hermes (`parse_hermes`): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, Hermes and
  Qwen2.5/Qwen3 (their chat templates); JSON, or the Python literal hermes-function-calling rows use.
- kimi (`parse_kimi`): Kimi K2/K2.5's native section `<|tool_calls_section_begin|>` + per call
  `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGS<|tool_call_end|>` +
  `<|tool_calls_section_end|>` (the K2.5 chat template; `NAME:IDX` ids and the singular
  `<|tool_call_section_begin|>` spelling too); also `functions.NAME:IDX{...}` with the markers gone
  (a server that decodes with special tokens skipped), when NAME is declared.
- deepseek (`parse_deepseek`): `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS
  <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>` (DeepSeek-V3.1's template) and the older V3/R1 form
  `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>`.
- json (`parse_json`): a bare or ```json-fenced JSON object whose `name` is a declared function:
  `{"name", "arguments"|"parameters"}`, `{"type": "function", "function": {...}}`,
  `{"function_call": {...}}`, `{"tool_calls": [...]}`, or an array of such objects; a fenced block
  naming a declared function whose brackets never balance is an unreadable call (below).

A block that opens a call but cannot be read (never closed, not JSON, no name) is still a call, with
its `problem`: the model tried to call, and the check counts the attempt as invalid.

Limits (`TextCallLimits`): only the first `max_text_chars` of a text are read; at most `max_calls`
calls per text; a call's text is tried as a Python literal (ast is not linear) only up to
`max_literal_chars`. Every scan is linear in the text: markers are found with str.find, each part of
the text is read by at most one parser, JSON spans are found in one pass over brackets and quotes.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from operator import attrgetter
from typing import Any

import orjson

from eyrie.jobs.errors import EyrieError
from eyrie.jobs.reconstruct import kimi_facts as kimi
from eyrie.jobs.reconstruct.deepseek import DS_CALL_BEGIN, DS_CALL_END, DS_CALLS_BEGIN, DS_CALLS_END, DS_SEP


class CallFormat(StrEnum):
    """How a call reached eyrie: the provider's `tool_calls`, or the text format it was written in."""

    STRUCTURED = "structured"
    GLAIVE = "glaive"
    HERMES = "hermes"
    KIMI = "kimi"
    DEEPSEEK = "deepseek"
    JSON = "json"


GLAIVE_CALL = "<functioncall>"
GLAIVE_END = "<|endoftext|>"
HERMES_BEGIN, HERMES_END = "<tool_call>", "</tool_call>"
# K2's templates and parsers accept the singular spelling of the section markers as well.
KIMI_SECTION_BEGINS = (kimi.SECTION_BEGIN, "<|tool_call_section_begin|>")
KIMI_SECTION_ENDS = (kimi.SECTION_END, "<|tool_call_section_end|>")

STRUCTURED_SUBJECT = "tool call"  # what a problem of a provider's `tool_calls` entry is said of


@dataclass(frozen=True)
class TextCallLimits:
    """Caps that keep a hostile answer or row cheap to read."""

    max_text_chars: int = 4 << 20  # characters of one text read; calls after them are not seen
    max_calls: int = 64  # calls read per text; more are reported as one problem
    max_literal_chars: int = 1 << 20  # a call's text is tried as a Python literal only below this
    max_id_chars: int = 256  # a Kimi call id (functions.NAME:IDX)


DEFAULT_TEXT_LIMITS = TextCallLimits()


class TextCallError(EyrieError, ValueError):
    """A call object that cannot be read; the message is a predicate ("has no function name") that
    a caller puts after what it names ("turn 2 <tool_call> 0")."""


@dataclass(slots=True)
class TextCall:
    """One call found in a text, at `text[start:end]` (the span its parser read). Never changed
    once made (not frozen only because a frozen dataclass costs five times as much to make, and
    every answer's calls are made).

    `arguments` as written: the text between markers (kimi, deepseek) or a string value
    (glaive's `'{...}'`), both JSON text to decode; or the value of an object's `arguments`
    (an object, usually). `item` is the call's place in a list written in one block (None: the
    block held one object). `problem` (with `arguments` None) says why the block is not a call
    that can be checked. `json_values`: `arguments` is known to hold JSON's own types only (JSON
    text decoded, or a string), so a validator need not prove it (False: not known, a literal's
    value say)."""

    format: CallFormat
    name: str | None
    arguments: Any
    start: int
    end: int
    problem: str | None = None
    id: str | None = None
    item: int | None = None
    json_values: bool = False

    def message(self) -> str:
        """The problem as a verdict states it ("<tool_call> block is never closed")."""
        subject = STRUCTURED_SUBJECT if self.format is CallFormat.STRUCTURED else FORMATS[self.format].subject
        return f"{subject} {self.problem}"


_START = attrgetter("start")  # sort key: calls in text order


# ------------------------------------------------------------------------------ call objects

# glaive: {"name": "f", "arguments": '{"q": "it's"}'}: a quoted string that is not a Python literal
_GLAIVE_QUOTED = re.compile(r"""\{\s*"name"\s*:\s*"([^"]+)"\s*,\s*"arguments"\s*:\s*'(.*)'\s*\}""", re.S)


_MISS = object()


def _quick_object(text: str) -> Any:
    """`text` as JSON, or as glaive's own shape when a literal would read it the same (nothing to
    unescape): the cheap readings, tried before ast (which compiles: 100x the cost); else _MISS."""
    if "'" in text:  # glaive's shape first: a text it matches is never JSON (a value cannot open with ')
        m = _GLAIVE_QUOTED.fullmatch(text)
        if m and "\\" not in text and "'" not in m.group(2):
            return {"name": m.group(1), "arguments": m.group(2)}
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return _MISS


def call_object(text: str, limits: TextCallLimits = DEFAULT_TEXT_LIMITS) -> Any:
    """A call written as text: JSON, else a Python literal (Hermes and glaive rows use single quotes),
    else glaive's `"arguments": '...'` with a quote inside. Raises TextCallError. A literal may hold
    values JSON has not (sets, bytes): whoever writes the arguments out says so (the validator's
    verdict, sources' bad row)."""
    text = text.strip()
    value = _quick_object(text)
    return value if value is not _MISS else _literal_object(text, limits)


def _literal_object(text: str, limits: TextCallLimits) -> Any:
    """`call_object` past the cheap readings (`text` stripped): a literal, or glaive's quoted shape."""
    if len(text) > limits.max_literal_chars:
        raise TextCallError(f"is {len(text)} characters, over the {limits.max_literal_chars} limit")
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    m = _GLAIVE_QUOTED.fullmatch(text)
    if m:
        return {"name": m.group(1), "arguments": m.group(2)}
    raise TextCallError(f"is neither JSON nor a literal: {text[:80]!r}")


def call_parts(obj: Any) -> tuple[str, Any, str | None]:
    """(name, arguments, id) of one call object: `{"name", "arguments"|"parameters"}` or OpenAI's
    `{"id", "type", "function": {...}}`. No arguments means none (`{}`). Raises TextCallError."""
    call_id = None
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict):
        call_id = obj.get("id")
        obj = obj["function"]
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise TextCallError("has no function name")
    return obj["name"], _arguments(obj), str(call_id) if call_id else None


def _arguments(fn: dict[str, Any]) -> Any:
    """A call object's arguments: `arguments`, else `parameters` (some models' word), else none."""
    return fn["arguments"] if "arguments" in fn else fn.get("parameters", {})


def object_calls(fmt: CallFormat, value: Any, start: int = 0, end: int = 0, json_values: bool = False,
                 ) -> list[TextCall]:
    """The calls of one decoded call object, or of a list of them (parallel calls); an item that is
    not a call is one with its problem. Arguments stay as decoded (from a literal, maybe not JSON;
    `json_values`: `value` holds JSON's own types only)."""
    items, listed = (value, True) if isinstance(value, list) else ([value], False)
    if not items:
        return [TextCall(fmt, None, None, start, end, "holds no call")]
    out = []
    for j, obj in enumerate(items):
        item = j if listed else None
        try:
            name, args, cid = call_parts(obj)
        except TextCallError as e:
            out.append(TextCall(fmt, None, None, start, end, str(e), item=item))
            continue
        out.append(TextCall(fmt, name, args, start, end, None, cid, item, json_values))
    return out


def _block_calls(fmt: CallFormat, text: str, start: int, end: int, limits: TextCallLimits) -> list[TextCall]:
    """`call_object`'s reading of one block, as calls (JSON's readings known to hold JSON values)."""
    stripped = text.strip()
    value = _quick_object(stripped)
    if value is not _MISS:
        return object_calls(fmt, value, start, end, json_values=True)
    try:
        value = _literal_object(stripped, limits)
    except TextCallError as e:
        return [TextCall(fmt, _named(text), None, start, end, str(e))]
    return object_calls(fmt, value, start, end)


_NAME_FIELD = re.compile(r"""["']name["']\s*:\s*["']([A-Za-z0-9_.-]{1,64})["']""")


def _named(text: str) -> str | None:
    """The name a broken call object gives itself, if it reads as one (for per-tool counts)."""
    m = _NAME_FIELD.search(text, 0, 4096)
    return m.group(1) if m else None


# --------------------------------------------------------------------------------- JSON spans

_JSON_EVENT = re.compile(r'[{}\[\]"\\]')
_OPENS = "{["


def _brackets(text: str, start: int, stop: int) -> Iterator[tuple[int, bool]]:
    """(position, opens?) of every bracket of text[start:stop] outside JSON strings. Quotes start a
    string only inside brackets, so prose quotes do not; a closer with nothing open is skipped, a
    mismatched one still closes (broken JSON, read as such)."""
    depth, in_str, skip = 0, False, -1
    for m in _JSON_EVENT.finditer(text, start, stop):
        p = m.start()
        if p == skip:
            continue
        c = text[p]
        if in_str:
            if c == "\\":
                skip = p + 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = depth > 0
        elif c in _OPENS:
            depth += 1
            yield p, True
        elif c != "\\" and depth:
            depth -= 1
            yield p, False


def _json_end(text: str, start: int, stop: int) -> int:
    """The end of the bracketed JSON value opening at `text[start]`, or -1 if it does not close
    before `stop` (glaive's single-quoted strings hold balanced braces)."""
    depth = 0
    for p, opens in _brackets(text, start, stop):
        depth += 1 if opens else -1
        if depth == 0:
            return p + 1
    return -1


def _outer_spans(text: str, start: int, stop: int) -> list[tuple[int, int]]:
    """The outermost balanced `{...}`/`[...]` spans in `text[start:stop]`, in one pass. An opener
    that never closes (prose, a cut answer) stays open without hiding the spans after it."""
    stack: list[int] = []
    pairs: list[tuple[int, int]] = []
    for p, opens in _brackets(text, start, stop):
        if opens:
            stack.append(p)
        else:
            pairs.append((stack.pop(), p + 1))
    # pairs close in order of their end and nest properly: going back from the last, a pair is
    # outermost exactly when it starts before every outermost pair kept so far
    outer, first = [], stop
    for a, b in reversed(pairs):
        if a < first:
            outer.append((a, b))
            first = a
    outer.reverse()
    return outer


# ----------------------------------------------------------------------------------- parsers


def parse_glaive(text: str, limits: TextCallLimits = DEFAULT_TEXT_LIMITS) -> list[TextCall]:
    """glaive's `<functioncall> {...}`: the object after each marker, read up to the next marker,
    `<|endoftext|>` or the end of the text."""
    out: list[TextCall] = []
    p = text.find(GLAIVE_CALL)
    while p != -1 and len(out) <= limits.max_calls:
        body = p + len(GLAIVE_CALL)
        nxt = text.find(GLAIVE_CALL, body)
        stop = len(text) if nxt == -1 else nxt
        eot = text.find(GLAIVE_END, body, stop)
        stop = stop if eot == -1 else eot
        a = body
        while a < stop and text[a].isspace():
            a += 1
        whole = text[a:stop].rstrip()
        value = _quick_object(whole)  # the usual case: the object is all there is before the next marker
        if value is not _MISS:
            out.extend(object_calls(CallFormat.GLAIVE, value, p, a + len(whole), json_values=True))
            p = nxt
            continue
        b = _json_end(text, a, stop) if a < stop and text[a] in _OPENS else -1
        if b == -1:  # not bracketed, or never closed: the whole rest is what was written
            b = stop
        out.extend(_block_calls(CallFormat.GLAIVE, text[a:b], p, b, limits))
        p = nxt
    return out


def parse_hermes(text: str, limits: TextCallLimits = DEFAULT_TEXT_LIMITS) -> list[TextCall]:
    """Hermes/Qwen `<tool_call>...</tool_call>` blocks; one opened and not closed before the next
    opens (or the text ends) is a call with a problem."""
    out: list[TextCall] = []
    p = text.find(HERMES_BEGIN)
    close = -2  # the first closing tag at or after the current block; found once, reused
    while p != -1 and len(out) <= limits.max_calls:
        body = p + len(HERMES_BEGIN)
        if close != -1 and close < body:
            close = text.find(HERMES_END, body)
        if close == -1:
            out.append(TextCall(CallFormat.HERMES, _named(text[body:body + 4096]), None, p, len(text),
                                "is never closed"))
            break
        nxt = text.find(HERMES_BEGIN, body, close)
        if nxt != -1:
            out.append(TextCall(CallFormat.HERMES, _named(text[body:nxt]), None, p, nxt, "is never closed"))
            p = nxt
            continue
        end = close + len(HERMES_END)
        out.extend(_block_calls(CallFormat.HERMES, text[body:close], p, end, limits))
        p = text.find(HERMES_BEGIN, end)
    return out


_KIMI_ID = re.compile(r"\s*(?:functions\.)?(.+):(\d+)\s*", re.S)
_KIMI_STRIPPED = re.compile(r"functions\.([A-Za-z0-9_-]{1,64}):(\d{1,9})")


def _kimi_call(text: str, start: int, end: int, limits: TextCallLimits) -> TextCall:
    """`<|tool_call_begin|>ID<|tool_call_argument_begin|>ARGS<|tool_call_end|>` at text[start:end]."""
    inner = text[start + len(kimi.CALL_BEGIN):end - len(kimi.CALL_END)]
    head, sep, args = inner.partition(kimi.CALL_ARG_BEGIN)
    if not sep:
        return TextCall(CallFormat.KIMI, None, None, start, end, f"has no {kimi.CALL_ARG_BEGIN}")
    if len(head) > limits.max_id_chars:
        return TextCall(CallFormat.KIMI, None, None, start, end,
                        f"has a call id of {len(head)} characters, over the {limits.max_id_chars} limit")
    m = _KIMI_ID.fullmatch(head)
    call_id = head.strip()
    name = m.group(1) if m else call_id
    return TextCall(CallFormat.KIMI, name or None, args.strip(), start, end,
                    None if name else "has no function name", call_id or None)


_NAME_CHARS = 64
_CUT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # a name read from a cut call: a plain identifier, or none


def _kimi_cut_name(head: str) -> str | None:
    """The function a cut Kimi call names (`functions.NAME:IDX` before its argument marker, or all
    there is), so a call `maxTokens` cut counts for its function."""
    head = head.partition(kimi.CALL_ARG_BEGIN)[0][: 2 * _NAME_CHARS]
    m = _KIMI_ID.fullmatch(head)
    name = m.group(1).strip() if m else ""
    return name if _CUT_NAME.fullmatch(name) else None


def _deepseek_cut_name(head: str) -> str | None:
    """The function a cut DeepSeek call names: `NAME<｜tool▁sep｜>` (V3.1), `function<｜tool▁sep｜>NAME\\n` (V3/R1)."""
    first, sep, rest = head[: 2 * _NAME_CHARS].partition(DS_SEP)
    if not sep:
        return None
    name = rest.partition("\n")[0].strip() if first.strip() == "function" else first.strip()
    return name if _CUT_NAME.fullmatch(name) else None


def _marked_calls(fmt: CallFormat, text: str, span: tuple[int, int], begin: str, end_marker: str,
                  read: Any, limits: TextCallLimits, out: list[TextCall], cut_name: Any = None) -> None:
    """Calls `begin ... end_marker` inside text[span]; `read(text, start, end, limits)` reads one.
    A call opened again (or not closed) before its end marker is a call with a problem, named by
    `cut_name(what follows its begin)` when it got as far as its name (a cut answer's last call)."""
    p, stop = text.find(begin, *span), span[1]
    close = -2  # the first end marker after the current call's begin; found once, reused

    def cut(a: int, b: int) -> TextCall:
        name = cut_name(text[a + len(begin):b]) if cut_name is not None else None
        return TextCall(fmt, name, None, a, b, "is never closed")

    while p != -1 and len(out) <= limits.max_calls:
        body = p + len(begin)
        if close != -1 and close < body:
            close = text.find(end_marker, body, stop)
        if close == -1:
            out.append(cut(p, stop))
            return
        nxt = text.find(begin, body, close)
        if nxt != -1:
            out.append(cut(p, nxt))
            p = nxt
            continue
        end = close + len(end_marker)
        out.append(read(text, p, end, limits))
        p = text.find(begin, end, stop)


def _any_of(*markers: str) -> re.Pattern[str]:
    """One search for the earliest of a few markers (no two of which can start at one place)."""
    return re.compile("|".join(map(re.escape, markers)))


_KIMI_OPENS = _any_of(*KIMI_SECTION_BEGINS, kimi.CALL_BEGIN)
_KIMI_CLOSES = _any_of(*KIMI_SECTION_ENDS)
_DS_OPENS = _any_of(DS_CALLS_BEGIN, DS_CALL_BEGIN)
_DS_CLOSES = _any_of(DS_CALLS_END)


def _sections(text: str, opens: re.Pattern[str], closes: re.Pattern[str]) -> list[tuple[int, int]]:
    """Spans of the native sections (from a section's begin or a call's, `opens`, to the first of
    `closes` after it, or to the text's end when unclosed); a call marker outside any section (its
    section begin lost) opens one of its own. Each search starts where the last ended: linear."""
    spans: list[tuple[int, int]] = []
    o = opens.search(text)
    while o is not None:
        c = closes.search(text, o.end())
        if c is None:
            spans.append((o.start(), len(text)))
            break
        spans.append((o.start(), c.end()))
        o = opens.search(text, c.end())
    return spans


def parse_kimi(text: str, declared: Collection[str] = (), limits: TextCallLimits = DEFAULT_TEXT_LIMITS,
               ) -> tuple[list[TextCall], list[tuple[int, int]]]:
    """Kimi K2's native call sections, and (NAME declared, no section) `functions.NAME:IDX{...}` left
    by a decoder that dropped the markers; returns (calls, the spans of the sections)."""
    out: list[TextCall] = []
    spans = _sections(text, _KIMI_OPENS, _KIMI_CLOSES) \
        if kimi.CALL_BEGIN in text or "section_begin|>" in text else []
    for span in spans:
        _marked_calls(CallFormat.KIMI, text, span, kimi.CALL_BEGIN, kimi.CALL_END, _kimi_call, limits, out,
                      _kimi_cut_name)
    if declared and not spans and "functions." in text:  # a decoder that drops markers drops them all
        for a, b in _gaps(spans, 0, len(text)):
            objects = dict(_outer_spans(text, a, b)) if text.find("functions.", a, b) != -1 else {}
            for m in _KIMI_STRIPPED.finditer(text, a, b):
                o = m.end()
                while o < b and text[o].isspace():
                    o += 1
                if m.group(1) in declared and o in objects and text[o] == "{" and len(out) <= limits.max_calls:
                    out.append(TextCall(CallFormat.KIMI, m.group(1), text[o:objects[o]], m.start(), objects[o],
                                        id=m.group(0)))
    out.sort(key=_START)
    return out, spans


def _deepseek_fenced(rest: str) -> tuple[str, str] | None:
    """(name, arguments) of V3/R1's `NAME\\n```json\\nARGS\\n```` after `function<｜tool▁sep｜>`."""
    first, nl, body = rest.partition("\n")
    body = body.strip()
    if not nl or not body.startswith("```") or not body.endswith("```") or len(body) < 6:
        return None
    body = body[3:-3]
    lang, nl, args = body.partition("\n")
    if not nl or lang.strip() not in ("", "json"):
        return None
    return first.strip(), args.strip()


def _deepseek_call(text: str, start: int, end: int, limits: TextCallLimits) -> TextCall:
    """`<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>` (V3.1), or V3/R1's
    `TYPE<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```` form."""
    inner = text[start + len(DS_CALL_BEGIN):end - len(DS_CALL_END)]
    head, sep, rest = inner.partition(DS_SEP)
    if not sep:
        return TextCall(CallFormat.DEEPSEEK, None, None, start, end, f"has no {DS_SEP}")
    fenced = _deepseek_fenced(rest) if head.strip() == "function" else None
    name, args = fenced if fenced is not None else (head.strip(), rest.strip())
    if not name:
        return TextCall(CallFormat.DEEPSEEK, None, None, start, end, "has no function name")
    return TextCall(CallFormat.DEEPSEEK, name, args, start, end)


def parse_deepseek(text: str, limits: TextCallLimits = DEFAULT_TEXT_LIMITS,
                   ) -> tuple[list[TextCall], list[tuple[int, int]]]:
    """DeepSeek's native calls (V3.1 and the older V3/R1 form); returns (calls, the sections' spans)."""
    if DS_CALL_BEGIN not in text and DS_CALLS_BEGIN not in text:
        return [], []
    spans = _sections(text, _DS_OPENS, _DS_CLOSES)
    out: list[TextCall] = []
    for span in spans:
        _marked_calls(CallFormat.DEEPSEEK, text, span, DS_CALL_BEGIN, DS_CALL_END, _deepseek_call, limits, out,
                      _deepseek_cut_name)
    return out, spans


def _json_calls(value: Any, declared: Collection[str], start: int, end: int) -> list[TextCall]:
    """The calls a JSON value holds when it is shaped like calls and names a declared function."""
    wrapped = isinstance(value, dict) and ("tool_calls" in value or "function_call" in value)
    if wrapped:
        value = value.get("tool_calls", value.get("function_call"))
    listed = isinstance(value, list)
    shaped = []  # (name, the call's object, its id): call_parts' reading of each
    for obj in value if listed else (value,):
        if not isinstance(obj, dict):
            continue
        fn, cid = obj, None
        if isinstance(obj.get("function"), dict):
            fn, cid = obj["function"], obj.get("id")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            continue
        if "description" in fn and "arguments" not in fn:
            continue  # a declaration echoed back, not a call
        shaped.append((name, fn, cid))
    if not (wrapped and shaped) and not any(name in declared for name, _fn, _cid in shaped):
        return []
    return [TextCall(CallFormat.JSON, name, _arguments(fn), start, end, None, str(cid) if cid else None,
                     j if listed else None, True)
            for j, (name, fn, cid) in enumerate(shaped)]


def _json_spans(text: str, start: int, stop: int) -> list[tuple[int, int, Any]]:
    """`_outer_spans` with each span's value (_MISS: not decoded yet), and a fast path for the usual
    answer (prose, then one JSON value, fenced or not, then prose without brackets): when the text
    from its first opener to its last closer is valid JSON, that is the one outermost span."""
    a, a2 = text.find("{", start, stop), text.find("[", start, stop)
    if a == -1 or (a2 != -1 and a2 < a):
        a = a2
    b = max(text.rfind("}", start, stop), text.rfind("]", start, stop)) + 1
    if a != -1 and b > a:
        try:
            return [(a, b, orjson.loads(text[a:b]))]
        except orjson.JSONDecodeError:
            pass
    return [(a, b, _MISS) for a, b in _outer_spans(text, start, stop)]


def parse_json(text: str, declared: Collection[str], start: int = 0, stop: int | None = None,
               limits: TextCallLimits = DEFAULT_TEXT_LIMITS) -> list[TextCall]:
    """Bare or fenced JSON calls in text[start:stop]: outermost JSON values naming a declared
    function (once one does, its siblings count too: a call to an undeclared one is a call). A
    span that names one but is not valid JSON is a call with a problem."""
    stop = len(text) if stop is None else stop
    if not declared or text.find('"name"', start, stop) == -1:
        return []
    out: list[TextCall] = []
    for a, b, value in _json_spans(text, start, stop):
        if text.find('"name"', a, b) == -1:
            continue
        if value is _MISS:
            try:
                value = orjson.loads(text[a:b])
            except orjson.JSONDecodeError as e:
                name = _named(text[a:b])
                if name in declared:
                    out.append(TextCall(CallFormat.JSON, name, None, a, b, f"is not valid JSON: {e}"))
                continue
        out.extend(_json_calls(value, declared, a, b))
        if len(out) > limits.max_calls:
            break
    if text.find("```", start, stop) != -1:
        out = sorted([*out, *_unbalanced_fences(text, start, stop, declared, out)], key=_START)
    return out


_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n")


def _unbalanced_fences(text: str, start: int, stop: int, declared: Collection[str],
                       found: list[TextCall]) -> list[TextCall]:
    """Fenced blocks (```json ... ```, or cut before the closing fence) holding JSON whose brackets
    never balance and naming a declared function: an attempted call, invalid. The spans read the
    block's balanced parts only (its arguments object, say), which name no call, so without this
    the attempt would count as no call at all. A block already holding a call is left alone."""
    out = []
    for m in _FENCE.finditer(text, start, stop):
        body_start = m.end()
        close = text.find("```", body_start, stop)
        end = stop if close == -1 else close
        body = text[body_start:end].strip()
        if not body.startswith(("{", "[")) or any(c.start < end and c.end > body_start for c in found):
            continue
        name = _named(body)
        if name not in declared:
            continue
        try:
            orjson.loads(body)
        except orjson.JSONDecodeError as e:
            out.append(TextCall(CallFormat.JSON, name, None, m.start(), end if close == -1 else close + 3,
                                f"is not valid JSON: {e}"))
    return out


# ------------------------------------------------------------------------------- all of them


def _gaps(spans: list[tuple[int, int]], start: int, stop: int) -> Iterator[tuple[int, int]]:
    """The parts of [start, stop) outside the sorted, disjoint `spans`."""
    pos = start
    for a, b in spans:
        if a > pos:
            yield pos, a
        pos = max(pos, b)
    if pos < stop:
        yield pos, stop


def _disjoint(calls: list[TextCall]) -> list[TextCall]:
    """Calls in text order; one inside another's span (a Hermes tag inside a glaive payload) is
    part of that call, not one of its own. Calls of one block share its span."""
    if len(calls) < 2:
        return calls[:]
    out: list[TextCall] = []
    end = -1
    for c in sorted(calls, key=_START):
        if c.start >= end or (out and (c.start, c.end) == (out[-1].start, out[-1].end)):
            out.append(c)
            end = max(end, c.end)
    return out


def _json_outside(text: str, declared: Collection[str], limits: TextCallLimits,
                  claimed: list[tuple[int, int]]) -> tuple[list[TextCall], list[tuple[int, int]]]:
    """`parse_json` on each part of the text outside the sorted `claimed` spans (`_gaps`) that
    holds a `"name"` (the registry's reader of loose JSON: it claims no span)."""
    out: list[TextCall] = []
    if not declared:
        return out, []
    for a, b in _gaps(claimed, 0, len(text)) if claimed else ((0, len(text)),):
        if text.find('"name"', a, b) != -1:
            out += parse_json(text, declared, a, b, limits)
    return out, []


# ---------------------------------------------------------------------------------- the registry


class Stage(IntEnum):
    """When a format is read in `find_calls`: native sections first (they claim their spans), then blocks
    opened by a marker, then what is left (a JSON object outside every claimed span)."""

    SECTION = 0
    BLOCK = 1
    LOOSE = 2


Spans = list[tuple[int, int]]
Reader = Callable[[str, Collection[str], TextCallLimits, Spans], tuple[list[TextCall], Spans]]


@dataclass(frozen=True)
class TextFormat:
    """Everything eyrie knows of one way models write a tool call as text: one entry of `FORMATS`, which every
    reader takes it from (`find_calls`, a verdict's messages, leak detection, the audit's table, the simulator's
    formats and weights; tests/tools/test_textcalls.py fails for a format one of them lacks)."""

    name: CallFormat
    subject: str
    """What a problem is said of, in a verdict's message ("<tool_call> block is never closed")."""
    markers: tuple[str, ...]
    """Its native markers: one in the text of a structured answer is a leak (`leaks.py`); () for none."""
    stage: Stage
    present: Callable[[str], bool] | None
    """Whether its markers can be in a text at all (a cheap test before the parser looks for them itself); None:
    always asked."""
    read: Reader
    """(text, declared names, limits, spans claimed so far) -> (calls, the spans it claims)."""


# Display order too: the audit's table and the simulator's weights list them so.
FORMATS: dict[CallFormat, TextFormat] = {f.name: f for f in (
    TextFormat(CallFormat.GLAIVE, "<functioncall>", (), Stage.BLOCK, None,
               lambda t, _d, lim, _c: (parse_glaive(t, lim), [])),
    TextFormat(CallFormat.HERMES, "<tool_call> block", (HERMES_BEGIN, HERMES_END), Stage.BLOCK, None,
               lambda t, _d, lim, _c: (parse_hermes(t, lim), [])),
    TextFormat(CallFormat.KIMI, "Kimi tool call",
               (*KIMI_SECTION_BEGINS, *KIMI_SECTION_ENDS, kimi.CALL_BEGIN, kimi.CALL_ARG_BEGIN, kimi.CALL_END),
               Stage.SECTION, lambda t: "<|" in t or "functions." in t,  # every Kimi marker opens with "<|"
               lambda t, d, lim, _c: parse_kimi(t, d, lim)),
    TextFormat(CallFormat.DEEPSEEK, "DeepSeek tool call", (DS_CALLS_BEGIN, DS_CALL_BEGIN, DS_SEP, DS_CALL_END,
                                                           DS_CALLS_END),
               Stage.SECTION, lambda t: not t.isascii(),  # DeepSeek's markers are not ASCII
               lambda t, _d, lim, _c: parse_deepseek(t, lim)),
    TextFormat(CallFormat.JSON, "JSON tool call", (), Stage.LOOSE, None,
               _json_outside),
)}
TEXT_FORMATS = tuple(FORMATS)  # the text formats, in display order
# Every marker of a native format: in structured mode, one in the text is a leak (leaks.py).
NATIVE_MARKERS: dict[str, tuple[str, ...]] = {f.name.value: f.markers for f in FORMATS.values() if f.markers}


# each stage's (present, read) pairs, in registry order: find_calls runs on every answer, so nothing is looked up
# per call
_SECTIONS, _BLOCKS, _LOOSE = (tuple((f.present, f.read) for f in FORMATS.values() if f.stage is stage)
                              for stage in (Stage.SECTION, Stage.BLOCK, Stage.LOOSE))


def find_calls(text: str | None, declared: Collection[str] = (),
               limits: TextCallLimits = DEFAULT_TEXT_LIMITS) -> list[TextCall]:
    """Every tool call written in `text`, in order, in any of the formats (`FORMATS`); `declared` are the
    function names the prompt declared (JSON objects and marker-less Kimi ids count only for those).
    More than `max_calls` calls end in one call whose problem says so."""
    if not text:
        return []
    text = text[: limits.max_text_chars]
    found: list[TextCall] = []
    claimed: Spans = []  # the native sections' spans, then every call's
    if "<" in text or "functions." in text:  # every marker of a section or a block
        for present, read in _SECTIONS:
            if present is None or present(text):
                calls, spans = read(text, declared, limits, claimed)
                found += calls
                claimed += spans
        for present, read in _BLOCKS:
            if present is None or present(text):
                found += read(text, declared, limits, claimed)[0]
        found = _disjoint(found)
        claimed = sorted([*claimed, *[(c.start, c.end) for c in found]])
    written: list[TextCall] = []
    for present, read in _LOOSE:
        if present is None or present(text):
            written += read(text, declared, limits, claimed)[0]
    if written:
        found = _disjoint([*found, *written])
    if len(found) > limits.max_calls:
        extra = found[limits.max_calls]
        found = [*found[: limits.max_calls],
                 TextCall(extra.format, None, None, extra.start, len(text),
                          f"is past the limit of {limits.max_calls} calls per answer (the rest are not read)")]
    return found


_WORD = re.compile(r"[A-Za-z0-9_-]+")


def mentions(text: str | None, names: Collection[str]) -> bool:
    """Is one of `names` written in `text` as a word of its own (a function described, not called)?
    Declared names are runs of `[A-Za-z0-9_-]`: a few are looked up directly, many against the
    text's words (one pass, whatever the number of names)."""
    if not text or not names:
        return False
    if len(names) > 16:
        return not set(_WORD.findall(text)).isdisjoint(names)
    for name in names:
        at = text.find(name)
        while at != -1:
            end = at + len(name)
            if (at == 0 or not _WORD.match(text, at - 1, at)) and (end == len(text) or not _WORD.match(text, end)):
                return True
            at = text.find(name, at + 1)
    return False
