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
from functools import lru_cache
from typing import Any, Literal

import jsonschema_rs
import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from eyrie.jobs.errors import EyrieError
from eyrie.jobs.jsonvalues import canonical_json, json_depth, json_pointer, json_type_name
from eyrie.jobs.sources import Prompt

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


def parse_text_declarations(system_text: str, limits: ToolLimits = DEFAULT_LIMITS) -> tuple[list[Any], str]:
    """Find function declarations written into a system prompt; return (declarations, the rest).

    Understood: glaive's `... Use them if required -` followed by one or more JSON objects or a JSON
    list (separated by whitespace; text after the last one is kept), and Hermes' `<tools>...</tools>`
    block. The declaration block and the `Use them if required -` marker are removed; the sentence
    before the marker ("You are a helpful assistant with access to the following functions.") stays,
    since it remains true when the tools arrive natively. Returns the raw declarations (normalise
    them with `normalize_tools`); ([], system_text) when there are none. Raises DeclarationError
    when a block is there but does not parse.
    """
    found: list[Any] = []
    text = system_text
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
        text = _join(text[: m.start()], text[end:])
    block = _find_tools_block(text)
    if block:
        start, end = block
        if end - start > limits.max_declaration_bytes:
            raise DeclarationError(f"<tools> block is {end - start} characters, over the "
                                   f"{limits.max_declaration_bytes} limit")
        found.extend(_tools_block(text, start, end))
        text = _join(text[: start - len("<tools>")], text[end + len("</tools>"):])
    return found, (text if found else system_text)


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
    answers are validated against them. `declared_from` says where they came from.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    declared_tools: list[dict[str, Any]]
    declared_from: Literal["row", "text"] | None
    mode: Mode

    @property
    def declared(self) -> bool:
        return bool(self.declared_tools)


@dataclass
class Rejected:
    """A prompt that must not be sent (declarations unusable); recorded with `reason`, never paid."""

    reason: str


def prepare_prompt(prompt: Prompt, mode: Mode, limits: ToolLimits = DEFAULT_LIMITS) -> Prepared | Rejected:
    """Decide how a prompt's tools are sent.

    Tools given structurally by the row win; otherwise system messages are searched for text
    declarations (glaive, Hermes). `structured`: tools go in `tools` and the declaration text leaves
    the system message (dropped if nothing else is left), so the model sees them once, natively.
    `text`: nothing goes in `tools`; text declarations stay as they were, row tools are rendered
    into the system message the glaive way (for A/B audits).
    """
    try:
        messages = list(prompt.messages)
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
        else:
            raw, stripped = [], []
            for m in messages:
                content = m.get("content")
                if m.get("role") == "system" and isinstance(content, str):
                    found, rest = parse_text_declarations(content, limits)
                    raw.extend(found)
                    if found and not rest:
                        continue
                    m = {**m, "content": rest} if found else m
                stripped.append(m)
            origin = "text" if raw else None
            if mode == "structured":
                messages = stripped
        declared = normalize_tools(raw, limits)
    except DeclarationError as e:
        return Rejected(str(e))
    except (RecursionError, orjson.JSONEncodeError):  # orjson refuses depth > 255 or non-JSON values
        return Rejected("declarations are nested too deeply or hold values that are not JSON")
    if not declared:
        return Prepared(messages, None, [], None, mode)
    if mode == "structured":
        return Prepared(messages, declared, declared, origin, mode)
    if origin == "row":
        messages = _with_text_declarations(messages, declared)
    return Prepared(messages, None, declared, origin, mode)


def _with_text_declarations(messages: list[dict[str, Any]],
                            tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    text = render_text_declarations(tools)
    first = messages[0] if messages else None
    if first and first.get("role") == "system" and isinstance(first.get("content"), str):
        return [{**first, "content": _join(first["content"], text)}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


