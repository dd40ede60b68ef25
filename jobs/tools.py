"""Tool semantics of one sample: declarations -> OpenAI `tools`, call validation, leaked markers, policy.

Pure: no I/O. The generation job calls `prepare_prompt` before paying for a request (a `Rejected`
row is recorded and never sent), `check_response` on each answer (the verdicts go into the record's
`checks`) and `policy` to decide whether the sample is kept. The run-level gate is in `gate.py`.

Why structured: the model was trained to see tools in its chat template's native declaration, and a
provider only parses native tool calls back into `tool_calls` when the tools were sent as the API's
`tools` parameter. Declarations left as prose change how often and how the model calls them.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from referencing.exceptions import Unresolvable

from eyrie.jobs.sources import Prompt, json_depth, json_type_name

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
    max_errors_per_call: int = 10
    max_message_chars: int = 300


DEFAULT_LIMITS = ToolLimits()


class DeclarationError(ValueError):
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


def _canonical(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


# Caches are keyed by canonical JSON; big keys are not cached so hostile rows cannot fill memory.
CACHE_MAX_KEY_BYTES = 32 * 1024


def _schema_problem(key: bytes) -> str | None:
    """check_schema once per distinct schema: real datasets repeat the same few thousand tools."""
    return _schema_problem_cached(key) if len(key) <= CACHE_MAX_KEY_BYTES else _schema_problem_uncached(key)


def _schema_problem_uncached(key: bytes) -> str | None:
    try:
        Draft202012Validator.check_schema(orjson.loads(key))
    except SchemaError as e:  # check_schema already raises the best-matching error
        where = _pointer(e.absolute_path) or "(root)"
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
    problem = _schema_problem(_canonical(params))
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
            size = len(_canonical(prompt.tools))
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


# ------------------------------------------------------------------------------ call validation


def _compile(key: bytes) -> Draft202012Validator:
    return Draft202012Validator(orjson.loads(key))


_compile_cached = lru_cache(maxsize=4096)(_compile)


def _compiled(key: bytes) -> Draft202012Validator:
    """One compiled validator per distinct schema (keyed by its canonical JSON)."""
    return _compile_cached(key) if len(key) <= CACHE_MAX_KEY_BYTES else _compile(key)


def _pointer(path: Sequence[Any]) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


@dataclass(slots=True)
class CallVerdict:
    """One tool call's verdict; `errors` are JSON Pointer paths into the arguments with messages."""

    index: int
    name: str | None
    valid: bool
    errors: list[dict[str, str]]

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "valid": self.valid, "errors": self.errors}


class ToolValidator:
    """Validates tool calls against one declared tool set; build it once per set (`for_tools`)."""

    def __init__(self, tools: Sequence[dict[str, Any]], limits: ToolLimits = DEFAULT_LIMITS):
        self.limits = limits
        self._by_name = {t["function"]["name"]: _compiled(_canonical(t["function"]["parameters"]))
                         for t in tools}

    @classmethod
    def for_tools(cls, tools: Sequence[dict[str, Any]]) -> ToolValidator:
        """The validator for this tool set (default limits), cached per distinct set."""
        key = _canonical(tools)
        return _validator_cached(key) if len(key) <= 8 * CACHE_MAX_KEY_BYTES else cls(tools)

    def _bad(self, i: int, name: str | None, message: str) -> CallVerdict:
        return CallVerdict(i, name, False, [{"path": "", "message": message}])

    def check_calls(self, tool_calls: Sequence[Any] | None) -> list[CallVerdict]:
        """A verdict per call, in order. Never raises on anything a provider could return."""
        out = []
        for i, call in enumerate(tool_calls or ()):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict):
                out.append(self._bad(i, None, "tool call has no 'function' object"))
                continue
            name = fn.get("name")
            if not isinstance(name, str):
                out.append(self._bad(i, None, "tool call has no function name"))
                continue
            out.append(self._check(i, name[:MAX_NAME_CHARS], fn.get("arguments")))
        return out

    def _check(self, i: int, name: str, args: Any) -> CallVerdict:
        validator = self._by_name.get(name)
        if validator is None:
            return self._bad(i, name, f"tool {name!r} was not declared")
        cap = self.limits.max_message_chars
        if isinstance(args, str):
            if len(args) > self.limits.max_argument_chars:
                return self._bad(i, name, f"arguments are {len(args)} characters, over the "
                                          f"{self.limits.max_argument_chars} limit")
            try:
                value = orjson.loads(args)
            except orjson.JSONDecodeError as e:
                return self._bad(i, name, f"arguments are not valid JSON: {e}"[:cap])
        elif isinstance(args, dict):  # a provider that returns parsed arguments
            value = args
        else:
            return self._bad(i, name, f"arguments must be a JSON string, got {json_type_name(args)}")
        if not isinstance(value, dict):
            return self._bad(i, name, f"arguments must be a JSON object, got {json_type_name(value)}")
        most = self.limits.max_errors_per_call
        try:
            errors = [{"path": _pointer(e.absolute_path), "message": e.message[:cap]}
                      for e in itertools.islice(validator.iter_errors(value), most)]
        except (Unresolvable, RecursionError) as e:
            return self._bad(i, name, f"the declared schema could not be applied: {e}"[:cap])
        return CallVerdict(i, name, not errors, errors)


_validator_cached = lru_cache(maxsize=1024)(lambda key: ToolValidator(orjson.loads(key)))


# ---------------------------------------------------------------------------------------- leaks

# Native tool-call markers a provider should have parsed into `tool_calls` (and stripped).
LEAK_MARKERS: dict[str, tuple[str, ...]] = {
    "kimi": ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_section_begin|>",
             "<|tool_call_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
             "<|tool_call_end|>"),
    "deepseek": ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
                 "<｜tool▁calls▁end｜>"),
    "hermes": ("<tool_call>", "</tool_call>"),
}
_LEAK_RE = re.compile("|".join(re.escape(m) for ms in LEAK_MARKERS.values()
                               for m in sorted(ms, key=len, reverse=True)))


def scan_leaks(text: str | None) -> list[str]:
    """The distinct native tool-call markers in `text`, in order of first appearance."""
    if not text or "tool" not in text:
        return []
    return list(dict.fromkeys(_LEAK_RE.findall(text)))


# ------------------------------------------------------------------------------ response checks


@dataclass
class ResponseCheck:
    """Everything the tool checks found in one answer; `to_record()` goes into `Record["checks"]`."""

    declared: bool
    calls: list[CallVerdict] = field(default_factory=list)
    leaks: dict[str, list[str]] = field(default_factory=dict)  # field ("content"/"reasoning") -> markers

    @property
    def called(self) -> bool:
        return bool(self.calls)

    @property
    def invalid_calls(self) -> int:
        return sum(not v.valid for v in self.calls)

    @property
    def leaked(self) -> bool:
        return bool(self.leaks)

    def to_record(self) -> dict[str, Any]:
        return {"declared": self.declared, "called": self.called, "invalidCalls": self.invalid_calls,
                "leaked": self.leaked, "calls": [v.to_dict() for v in self.calls], "leaks": self.leaks}

    @classmethod
    def from_record(cls, checks: dict[str, Any]) -> ResponseCheck:
        """Read back what `to_record` wrote (audits and resumed metrics read persisted records)."""
        return cls(bool(checks["declared"]),
                   [CallVerdict(c["index"], c["name"], c["valid"], c["errors"]) for c in checks["calls"]],
                   dict(checks["leaks"]))


def check_response(prepared: Prepared, response: dict[str, Any]) -> ResponseCheck:
    """Validate an answer's tool calls against what was declared and scan its text for leaks."""
    validator = ToolValidator.for_tools(prepared.declared_tools)
    check = ResponseCheck(prepared.declared, validator.check_calls(response.get("tool_calls")))
    for key in ("content", "reasoning"):
        value = response.get(key)
        found = scan_leaks(value if isinstance(value, str) else None)
        if found:
            check.leaks[key] = found
    return check


def policy(check: ResponseCheck, on_invalid_call: Policy) -> Policy:
    """`tools.onInvalidCall` applied to one answer: clean answers are kept; invalid calls and leaks
    get the configured treatment (drop: kept in generations, excluded from samples; flag: kept, marked)."""
    if check.invalid_calls == 0 and not check.leaked:
        return "keep"
    return on_invalid_call
