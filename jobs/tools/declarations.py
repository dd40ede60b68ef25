"""Tool declarations -> OpenAI `tools`: parsed from prompt text (glaive, lists, Hermes), normalised,
schema-checked, and the prompt prepared for the mode (structured: the API's `tools`; text: prose).

Pure: no I/O. A `Rejected` row is recorded and never sent.

Why structured: the model was trained to see tools in its chat template's native declaration, and a
provider only parses native tool calls back into `tool_calls` when the tools were sent as the API's
`tools` parameter. Declarations left as prose change how often and how the model calls them.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any, Literal

import jsonschema_rs
import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from eyrie.jobs.contract.prompt import Prompt
from eyrie.jobs.errors import EyrieError
from eyrie.jobs.jsonvalues import canonical_json, json_depth, json_pointer, json_type_name

Mode = Literal["structured", "text"]
Policy = Literal["keep", "drop", "flag"]

NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_NAME_CHARS = 128  # a called name is recorded up to this length (declared names are <= 64)
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
# The sentence glaive-function-calling-v2 puts before its declarations; text mode renders row tools
# after it so a text-mode prompt reads like the data the text convention came from.
GLAIVE_MARKER = "Use them if required -"
TEXT_PREAMBLE = f"You have access to the following functions. {GLAIVE_MARKER}"


@dataclass(frozen=True)
class ToolLimits:
    """Caps that keep absurd rows cheap to reject and absurd answers cheap to judge."""

    max_tools: int = 512
    max_declaration_bytes: int = 512 * 1024
    max_schema_depth: int = 64  # JSON nesting levels: about 30 nested object properties
    max_argument_chars: int = 1 << 20
    max_argument_depth: int = 128  # JSON nesting levels of a call's arguments (recorded parsed: orjson stops at 255)
    max_tool_result_chars: int = 1 << 20  # a dataset's tool result spliced back (turns: all)
    max_errors_per_call: int = 10
    max_message_chars: int = 300
    max_lead_in_chars: int = 160  # between "tools"/"functions" and the JSON a lead-in introduces
    max_lead_ins: int = 16  # lead-ins tried per message: prose full of "tools:" stays cheap to read


DEFAULT_LIMITS = ToolLimits()


class DeclarationError(EyrieError, ValueError):
    """Declarations that cannot be sent: the message names the declaration or tool and the problem."""


# --------------------------------------------------------------------------------- declarations

# No leading \s*: a regex that starts with one goes quadratic on long runs of whitespace.
_GLAIVE_RE = re.compile(r"Use them if required\s*-[ \t]*")
_WS = re.compile(r"\s*")
_DECODER = json.JSONDecoder()


def _json_values(text: str, pos: int, what: str) -> tuple[list[Any], int]:
    """Consecutive JSON objects/arrays from `pos` (whitespace between them); stop at other text."""
    values: list[Any] = []
    n = len(text)
    while True:
        while pos < n and text[pos].isspace():
            pos += 1
        if pos >= n or text[pos] not in "{[":
            return values, pos
        try:
            value, pos = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise DeclarationError(
                f"{what}: declaration {len(values) + 1} is not valid JSON: {e.msg} "
                f"(line {e.lineno}, column {e.colno} of the system text)") from None
        except RecursionError:
            raise DeclarationError(f"{what}: declaration {len(values) + 1} is nested too deeply") from None
        values.extend(value if isinstance(value, list) else [value])


def _tools_block(text: str, start: int, end: int) -> list[Any]:
    """A Hermes `<tools>` block: JSON, or the Python-literal repr that hermes-function-calling uses."""
    try:
        values, stop = _json_values(text[:end], start, "<tools> block")
        if not text[stop:end].strip():
            return values
        problem = f"<tools> block: unexpected text {text[stop:stop + 40].strip()!r} after the declarations"
    except DeclarationError as e:
        problem = str(e)
    try:
        value = ast.literal_eval(text[start:end].strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise DeclarationError(f"{problem} (and it is not a Python literal either)") from None
    return value if isinstance(value, list) else [value]


class DeclarationShape(StrEnum):
    """How a prompt declared its functions: what the audit reports per source."""

    TOOLS_FIELD = "tools-field"  # the row's (or recorded request's) `tools`, structurally
    GLAIVE = "glaive"  # "... Use them if required -" and JSON objects or a list (glaive-function-calling-v2)
    TOOLS_TAG = "tools-tag"  # Hermes' `<tools>...</tools>` block
    LEAD_IN = "lead-in-json"  # a JSON list or objects after a lead-in ("You have access to these tools: [...]")


SHAPE_TEXT = {
    DeclarationShape.TOOLS_FIELD: "the `tools` field",
    DeclarationShape.GLAIVE: "glaive's 'Use them if required -'",
    DeclarationShape.TOOLS_TAG: "a <tools> block",
    DeclarationShape.LEAD_IN: "JSON after a lead-in",
}


@dataclass(frozen=True)
class TextDeclarations:
    """Declarations found in one message's text: the raw declarations, the text without them, and
    the shapes they came in (empty: none found, `rest` is the text unchanged)."""

    found: list[Any]
    rest: str
    shapes: tuple[DeclarationShape, ...] = ()


def parse_text_declarations(system_text: str, limits: ToolLimits = DEFAULT_LIMITS) -> tuple[list[Any], str]:
    """(declarations, the rest) of `read_declarations`, for callers that need no shapes."""
    got = read_declarations(system_text, limits)
    return got.found, got.rest


def read_declarations(text: str, limits: ToolLimits = DEFAULT_LIMITS) -> TextDeclarations:
    """Find function declarations written into a message (a system prompt, or the first user turn).

    Understood, in this order: glaive's `... Use them if required -` followed by one or more JSON
    objects or a JSON list (separated by whitespace; text after the last one is kept); Hermes'
    `<tools>...</tools>` block; and a JSON list or JSON objects after a lead-in naming tools or
    functions and ending in `:`, `-` or a line break ("You have access to these tools: [...]",
    "Functions:\n{...}\n{...}", optionally fenced as ```json), whose first item is a declaration
    (`{"type": "function", "function": {...}}` or `{"name", "parameters"}`). The declaration block
    and the glaive marker (or the lead-in's `:`) are removed; the sentence before them stays, since
    it remains true when the tools arrive natively. Returns the raw declarations (normalise them with
    `normalize_tools`); nothing found: ([], text). Raises DeclarationError when a block is there but
    does not parse.
    """
    found: list[Any] = []
    shapes: list[DeclarationShape] = []
    original = text
    m = _GLAIVE_RE.search(text)
    if m:
        if len(text) - m.end() > limits.max_declaration_bytes:
            raise DeclarationError(f"declarations are {len(text) - m.end()} characters, over the "
                                   f"{limits.max_declaration_bytes} limit")
        values, end = _json_values(text, m.end(), f"after {GLAIVE_MARKER!r}")
        if not values and text[end:].strip():
            snippet = text[end:end + 40].strip()
            raise DeclarationError(f"expected JSON declarations after {GLAIVE_MARKER!r}, found {snippet!r}")
        found.extend(values)
        shapes.append(DeclarationShape.GLAIVE)
        text = _join(text[: m.start()], text[end:])
    block = _find_tools_block(text)
    if block:
        start, end = block
        if end - start > limits.max_declaration_bytes:
            raise DeclarationError(f"<tools> block is {end - start} characters, over the "
                                   f"{limits.max_declaration_bytes} limit")
        found.extend(_tools_block(text, start, end))
        shapes.append(DeclarationShape.TOOLS_TAG)
        text = _join(text[: start - len("<tools>")], text[end + len("</tools>"):])
    lead = _lead_in_block(text, limits)
    if lead is not None:
        values, cut, end = lead
        found.extend(values)
        shapes.append(DeclarationShape.LEAD_IN)
        head = text[:cut].rstrip()
        text = _join(head + "." if head[-1:].isalnum() else head, text[end:])
    if not found:
        return TextDeclarations([], original)
    return TextDeclarations(found, text, tuple(dict.fromkeys(shapes)))


@lru_cache(maxsize=8)
def _lead_in_re(max_chars: int) -> re.Pattern[str]:
    """"tools"/"functions", then up to `max_chars` on the same line (no bracket: "within <tools> tags:"
    is no lead-in), a `:` or a line break, an optional ```json fence, and JSON opening. Possessive,
    bounded repeats: each such word costs at most `max_chars` steps, so the scan is linear in the text."""
    return re.compile(r"\b(?:tools?|functions?)\b[^\n\[\]{}<>:]{0," + str(max_chars) + "}+"
                      r"(?P<cut>:[ \t]{0,8}+(?:\r?\n[ \t\r\n]{0,20}+)?|\r?\n[ \t\r\n]{0,20}+)"
                      r"(?P<fence>```(?:json)?[ \t]{0,8}+\r?\n[ \t]{0,20}+)?(?=[\[{])", re.IGNORECASE)


_FENCE_END = re.compile(r"[ \t]*\r?\n?[ \t]*```")


def _is_declaration(value: Any) -> bool:
    """The shapes a lead-in's JSON must open with to be read as declarations (not any JSON in prose)."""
    if not isinstance(value, dict):
        return False
    if value.get("type") == "function" and isinstance(value.get("function"), dict):
        return isinstance(value["function"].get("name"), str)
    return isinstance(value.get("name"), str) and "parameters" in value


def _lead_in_block(text: str, limits: ToolLimits) -> tuple[list[Any], int, int] | None:
    """(declarations, where the lead-in's `:` starts, where the block ends) of the first lead-in whose
    JSON opens with a declaration; None when there is none among the first `max_lead_ins` lead-ins.
    JSON that does not parse is an error only when it names a declaration (`"name"` near its start):
    other JSON-looking prose after "tools:" is prose."""
    for tried, m in enumerate(_lead_in_re(limits.max_lead_in_chars).finditer(text)):
        if tried >= limits.max_lead_ins:
            return None
        start = m.end()
        try:
            values, end = _json_values(text, start, "after a lead-in")
        except DeclarationError:
            if '"name"' in text[start:start + 200]:
                raise
            continue
        if not values or not _is_declaration(values[0]):
            continue
        if end - start > limits.max_declaration_bytes:
            raise DeclarationError(f"declarations are {end - start} characters, over the "
                                   f"{limits.max_declaration_bytes} limit")
        if m.group("fence") and (f := _FENCE_END.match(text, end)):
            end = f.end()
        return values, m.start("cut"), end
    return None


def _find_tools_block(text: str) -> tuple[int, int] | None:
    """(start, end) of the inside of the first `<tools>` tag that opens JSON/a literal and is closed.

    Skips the prose "within <tools> </tools> XML tags" that precedes the block in Hermes prompts.
    Linear in the text (str.find), whatever a hostile row holds.
    """
    at = text.find("<tools>")
    while at != -1:
        start = at + len("<tools>")
        first = _WS.match(text, start).end()
        if text[first:first + 1] in ("[", "{"):
            end = text.find("</tools>", start)
            return (start, end) if end != -1 else None
        at = text.find("<tools>", start)
    return None


def _join(head: str, tail: str) -> str:
    head, tail = head.rstrip(), tail.strip()
    return f"{head}\n\n{tail}" if head and tail else head or tail


# Caches are keyed by canonical JSON; big keys are not cached so hostile rows cannot fill memory.
CACHE_MAX_KEY_BYTES = 32 * 1024


def _schema_problem(key: bytes) -> str | None:
    """check_schema once per distinct schema: real datasets repeat the same few thousand tools."""
    return _schema_problem_cached(key) if len(key) <= CACHE_MAX_KEY_BYTES else _schema_problem_uncached(key)


def _meta_valid(schema: Any) -> bool:
    """A fast yes for `check_schema`: jsonschema-rs finds the schema valid against the Draft 2020-12
    meta-schema, and every regex in it compiles with Python's `re` (what python-jsonschema's format
    check of the meta-schema adds). False means "ask python-jsonschema", which words the problem; a
    `$schema` anywhere (jsonschema-rs would pick the meta-schema it names) always asks it."""
    if not isinstance(schema, dict):
        return False
    todo: list[Any] = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if "$schema" in node:
                return False
            for k, v in node.items():
                try:
                    if k == "pattern" and isinstance(v, str):
                        re.compile(v)
                    elif k == "patternProperties" and isinstance(v, dict):
                        for regex in v:
                            re.compile(regex)
                except (re.error, RecursionError, OverflowError):
                    return False
                todo.append(v)
        elif isinstance(node, list):
            todo.extend(node)
    try:
        return jsonschema_rs.meta.is_valid(schema)
    except (ValueError, TypeError, OverflowError, RecursionError):
        return False


def _schema_problem_uncached(key: bytes) -> str | None:
    schema = orjson.loads(key)
    if _meta_valid(schema):
        return None
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:  # check_schema already raises the best-matching error
        where = json_pointer(e.absolute_path) or "(root)"
        return f"{e.message[:200]} at {where}"
    except RecursionError:
        return "nested too deeply"
    return None


_schema_problem_cached = lru_cache(maxsize=4096)(_schema_problem_uncached)


def _normalize_tool(item: Any, index: int, limits: ToolLimits) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise DeclarationError(f"declaration {index + 1} is not an object")
    fn = item.get("function") if item.get("type") == "function" else item
    if not isinstance(fn, dict) or "name" not in fn:
        raise DeclarationError(f"declaration {index + 1} is not a function declaration (no 'name')")
    name = fn["name"]
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise DeclarationError(f"tool name {name!r} (declaration {index + 1}) must match {NAME_RE.pattern}")
    desc = fn.get("description")
    if desc is not None and not isinstance(desc, str):
        raise DeclarationError(f"tool {name!r}: description must be a string")
    params = fn.get("parameters")
    if params is None or params == {}:
        params = dict(EMPTY_PARAMETERS)
    elif not isinstance(params, dict):
        raise DeclarationError(f"tool {name!r}: parameters must be a JSON Schema object")
    elif "type" not in params:
        if "properties" not in params:  # e.g. xlam's {param: {"type": "str"}} maps
            raise DeclarationError(f"tool {name!r}: parameters have neither \"type\" nor \"properties\"; "
                                   "not a JSON Schema of an object")
        # Real dumps omit it; OpenAI-compatible APIs reject a parameters schema without it.
        params = {"type": "object", **params}
    elif params["type"] != "object":
        t = params["type"]
        got = repr(t) if isinstance(t, str) else f"a JSON {json_type_name(t)}"
        raise DeclarationError(f"tool {name!r}: parameters must be an object schema (\"type\": \"object\"), "
                               f"got {got}")
    if json_depth(params, limits.max_schema_depth) > limits.max_schema_depth:
        raise DeclarationError(f"tool {name!r}: parameters nest deeper than {limits.max_schema_depth} levels")
    problem = _schema_problem(canonical_json(params))
    if problem:
        raise DeclarationError(f"tool {name!r}: parameters are not a valid JSON Schema (Draft 2020-12): "
                               f"{problem}")
    out: dict[str, Any] = {"name": name}
    if desc is not None:
        out["description"] = desc
    out["parameters"] = params
    if isinstance(fn.get("strict"), bool):
        out["strict"] = fn["strict"]
    return {"type": "function", "function": out}


def normalize_tools(raw: Sequence[Any], limits: ToolLimits = DEFAULT_LIMITS) -> list[dict[str, Any]]:
    """Declarations in any accepted shape -> checked OpenAI tools; DeclarationError on the first problem.

    Accepted: `{"type": "function", "function": {...}}` and bare `{"name", "description",
    "parameters"}`. Only name, description, parameters and strict are kept (other keys, such as
    glaive's occasional `returns`, are not part of the API). No parameters -> an empty object schema.
    """
    if len(raw) > limits.max_tools:
        raise DeclarationError(f"{len(raw)} tools declared, over the limit of {limits.max_tools}")
    tools, seen = [], set()
    for i, item in enumerate(raw):
        tool = _normalize_tool(item, i, limits)
        name = tool["function"]["name"]
        if name in seen:
            raise DeclarationError(f"tool {name!r} is declared twice")
        seen.add(name)
        tools.append(tool)
    return tools


def render_text_declarations(tools: Sequence[dict[str, Any]]) -> str:
    """Tools as system-prompt text, the glaive way (what `parse_text_declarations` reads back)."""
    body = "\n\n".join(json.dumps(t["function"], indent=4, ensure_ascii=False) for t in tools)
    return f"{TEXT_PREAMBLE}\n{body}"


@dataclass
class Prepared:
    """What to send: `messages`, and `tools` for the request's `tools` parameter (None: not sent).

    `declared_tools` are the tools the model was told about either way (as text or structurally);
    answers are validated against them. `declared_from` says where they came from, `shapes` in which
    shapes they were written.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    declared_tools: list[dict[str, Any]]
    declared_from: Literal["row", "text"] | None
    mode: Mode
    shapes: tuple[DeclarationShape, ...] = ()

    @property
    def declared(self) -> bool:
        return bool(self.declared_tools)


@dataclass
class Rejected:
    """A prompt that must not be sent (declarations unusable); recorded with `reason`, never paid."""

    reason: str


def searched(messages: Sequence[dict[str, Any]]) -> list[int]:
    """Indexes of the messages text declarations are looked for in: every system message with text,
    and the first user message (where chat UIs without a system prompt get tools pasted)."""
    out, user_seen = [], False
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "user":
            if user_seen:
                continue
            user_seen = True
        elif role != "system":
            continue
        if isinstance(m.get("content"), str):
            out.append(i)
    return out


def may_declare(text: str, limits: ToolLimits = DEFAULT_LIMITS) -> bool:
    """False when `read_declarations` certainly finds nothing in `text` (a cheap look for its markers),
    for callers that cache readings by everything but a message that cannot declare."""
    return bool(_GLAIVE_RE.search(text) or "<tools>" in text or _lead_in_re(limits.max_lead_in_chars).search(text))


def prepare_prompt(prompt: Prompt, mode: Mode, limits: ToolLimits = DEFAULT_LIMITS) -> Prepared | Rejected:
    """Decide how a prompt's tools are sent.

    Tools given structurally by the row win; otherwise the system messages and the first user
    message are searched for text declarations (`read_declarations`). `structured`: tools go in
    `tools` and the declaration text leaves its message (a system message left empty is dropped), so
    the model sees them once, natively. `text`: nothing goes in `tools`; text declarations stay as
    they were, row tools are rendered into the system message the glaive way (for A/B audits).
    A first user message that holds nothing but declarations is rejected: no question is left.
    """
    try:
        messages = list(prompt.messages)
        shapes: list[DeclarationShape] = []
        if prompt.tools:
            if len(prompt.tools) > limits.max_tools:  # before serialising 10,000 of them
                raise DeclarationError(f"{len(prompt.tools)} tools declared, over the limit of "
                                       f"{limits.max_tools}")
            size = len(canonical_json(prompt.tools))
            if size > limits.max_declaration_bytes:
                raise DeclarationError(f"declarations are {size} bytes, over the "
                                       f"{limits.max_declaration_bytes} limit")
            raw: list[Any] = list(prompt.tools)
            origin: Literal["row", "text"] | None = "row"
            shapes.append(DeclarationShape.TOOLS_FIELD)
        else:
            raw = []
            stripped: list[dict[str, Any] | None] = list(messages)
            for i in searched(messages):
                m = messages[i]
                got = read_declarations(m["content"], limits)
                if not got.found:
                    continue
                raw.extend(got.found)
                shapes.extend(got.shapes)
                if got.rest:
                    stripped[i] = {**m, "content": got.rest}
                elif m.get("role") == "user":
                    raise DeclarationError("the first user message holds only tool declarations: no question "
                                           "is left to send")
                else:
                    stripped[i] = None
            origin = "text" if raw else None
            if mode == "structured":
                messages = [m for m in stripped if m is not None]
        declared = normalize_tools(raw, limits)
    except DeclarationError as e:
        return Rejected(str(e))
    except (RecursionError, orjson.JSONEncodeError):  # orjson refuses depth > 255 or non-JSON values
        return Rejected("declarations are nested too deeply or hold values that are not JSON")
    if not declared:
        return Prepared(messages, None, [], None, mode)
    kinds = tuple(dict.fromkeys(shapes))
    if mode == "structured":
        return Prepared(messages, declared, declared, origin, mode, kinds)
    if origin == "row":
        messages = with_text_declarations(messages, declared)
    return Prepared(messages, None, declared, origin, mode, kinds)


def with_text_declarations(messages: list[dict[str, Any]],
                           tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with `tools` described in the first system message (one made if there is none):
    what text mode sends for a row with tools (and what builtin:tiny-chat is trained to read)."""
    text = render_text_declarations(tools)
    first = messages[0] if messages else None
    if first and first.get("role") == "system" and isinstance(first.get("content"), str):
        return [{**first, "content": _join(first["content"], text)}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


