"""Each returned tool call checked: declared name, arguments parse as JSON and validate against the schema."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jsonschema_rs
import orjson
from jsonschema import Draft202012Validator
from referencing.exceptions import Unresolvable

from eyrie.jobs.jsonvalues import canonical_json, json_depth, json_pointer, json_type_name
from eyrie.jobs.tools.declarations import (
    CACHE_MAX_KEY_BYTES,
    DEFAULT_LIMITS,
    MAX_NAME_CHARS,
    ToolLimits,
)
from eyrie.jobs.tools.textcalls import CallFormat, TextCall

# ------------------------------------------------------------------------------ call validation

# Both validators implement Draft 2020-12 and pass its official test suite; where the suite leaves
# room they differ: regexes (ECMA-262 there, Python's `re` here), float `multipleOf`, `uniqueItems`
# over numbers and booleans, dialect switches and identifiers, and references (a cycle of local ones
# is a RecursionError here, "valid" there; remote ones must never be fetched). A schema holding one of
# these keys anywhere (a property so named too: cheap caution) is judged by python-jsonschema alone.
_OWN_READING = frozenset({"pattern", "patternProperties", "multipleOf", "uniqueItems", "$schema", "$id", "$anchor",
                          "$ref", "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor",
                          "$vocabulary"})
_FAST_FAILS = (ValueError, TypeError, OverflowError, RecursionError)  # values jsonschema-rs cannot take


def _read_alike(schema: Any) -> bool:
    """Would both validators read this schema the same way (no key of `_OWN_READING`)?"""
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if k in _OWN_READING:
                    return False
                todo.append(v)
        elif isinstance(node, list):
            todo.extend(node)
    return True


class _Schema:
    """One declared schema, compiled for both validators.

    jsonschema-rs (compiled Rust, ~20x faster) says whether the arguments are valid; when it says
    they are not, python-jsonschema lists the errors, so the record's paths and messages are the ones
    eyrie always wrote, and its verdict stands (an answer is invalid only if it finds an error).
    A schema jsonschema-rs cannot compile or may read differently (`_read_alike`) is judged by
    python-jsonschema alone."""

    __slots__ = ("fast", "slow")

    def __init__(self, schema: Any):
        self.slow = Draft202012Validator(schema)
        self.fast: jsonschema_rs.Validator | None = None
        if _read_alike(schema):
            try:  # offline: never fetch a reference; formats are annotations, as for python-jsonschema here
                self.fast = jsonschema_rs.Draft202012Validator(schema, validate_formats=False, offline=True)
            except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, *_FAST_FAILS):
                self.fast = None

    def errors(self, value: Any, most: int, cap: int, plain: bool = True) -> list[dict[str, str]]:
        """Up to `most` errors (path, message cut at `cap`); [] when the arguments are valid.
        `plain`: the value holds JSON's own types only (False: a Python literal's tuple, say, which
        jsonschema-rs would read as an array and python-jsonschema does not)."""
        if self.fast is not None and plain:
            try:
                if self.fast.is_valid(value):
                    return []
            except _FAST_FAILS:  # a value it cannot convert (a non-string key, say): ask the other
                pass
        return [{"path": json_pointer(e.absolute_path), "message": error_message(e)[:cap]}
                for e in itertools.islice(self.slow.iter_errors(value), most)]


def error_message(e: Any) -> str:
    """jsonschema's message; for a missing required property, the arguments given in its place that
    the schema does not declare (in `properties` or `required`; a renamed argument: `price` for
    `original_price`) named beside it."""
    if e.validator != "required" or not isinstance(e.instance, dict) or not isinstance(e.schema, dict):
        return e.message
    if e.schema.get("additionalProperties") is False:  # jsonschema names the extra ones itself
        return e.message
    props, required = e.schema.get("properties"), e.schema.get("required")
    declared = {*(props if isinstance(props, dict) else ()), *(required if isinstance(required, list) else ())}
    extra = [k for k in e.instance if k not in declared][:5]
    if not extra:
        return e.message
    return f"{e.message} (the call has {', '.join(map(repr, extra))}, which the schema does not declare)"


def _compile(key: bytes) -> _Schema:
    return _Schema(orjson.loads(key))


_compile_cached = lru_cache(maxsize=4096)(_compile)


def _compiled(key: bytes) -> _Schema:
    """One compiled validator per distinct schema (keyed by its canonical JSON)."""
    return _compile_cached(key) if len(key) <= CACHE_MAX_KEY_BYTES else _compile(key)


@dataclass(slots=True)
class CallVerdict:
    """One tool call's verdict; `errors` are JSON Pointer paths into the arguments with messages.

    `format`: where the call came from (`structured`: the provider's `tool_calls`; else the text
    format it was written in). `arguments`: the decoded arguments (None when they do not decode),
    so two answers' calls can be compared without reading the response again."""

    index: int
    name: str | None
    valid: bool
    errors: list[dict[str, str]]
    format: str = CallFormat.STRUCTURED.value
    arguments: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "valid": self.valid, "errors": self.errors,
                "format": self.format, "arguments": self.arguments}


_NOT_DECODED = object()


class ToolValidator:
    """Validates tool calls against one declared tool set; build it once per set (`for_tools`).

    A call written as text (`check_text_calls`) is judged exactly as a structured one: the same
    name lookup, argument decoding, limits and schema."""

    def __init__(self, tools: Sequence[dict[str, Any]], limits: ToolLimits = DEFAULT_LIMITS):
        self.limits = limits
        self._by_name = {t["function"]["name"]: _compiled(canonical_json(t["function"]["parameters"]))
                         for t in tools}
        self.names = frozenset(self._by_name)

    @classmethod
    def for_tools(cls, tools: Sequence[dict[str, Any]]) -> ToolValidator:
        """The validator for this tool set (default limits), cached per distinct set."""
        key = canonical_json(tools)
        return _validator_cached(key) if len(key) <= 8 * CACHE_MAX_KEY_BYTES else cls(tools)

    def _bad(self, i: int, name: str | None, message: str, fmt: str = CallFormat.STRUCTURED.value,
             arguments: Any = None) -> CallVerdict:
        return CallVerdict(i, name, False, [{"path": "", "message": message}], fmt, arguments)

    def check_calls(self, tool_calls: Sequence[Any] | None) -> list[CallVerdict]:
        """A verdict per structured call, in order. Never raises on anything a provider could return."""
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
            out.append(self._check(i, name[:MAX_NAME_CHARS], fn.get("arguments"), CallFormat.STRUCTURED.value))
        return out

    def check_text_calls(self, calls: Sequence[TextCall], first: int = 0) -> list[CallVerdict]:
        """A verdict per call found in text (`textcalls.find_calls`), numbered from `first`."""
        out = []
        for i, c in enumerate(calls, first):
            name = c.name[:MAX_NAME_CHARS] if c.name is not None else None
            fmt = str(c.format)  # a StrEnum's value (its `.value` is a property: 3x the cost)
            if c.problem is not None:
                out.append(self._bad(i, name, c.message()[: self.limits.max_message_chars], fmt))
            else:
                out.append(self._check(i, name or "", c.arguments, fmt, c.json_values))
        return out

    def _decode(self, args: Any, fmt: str) -> tuple[Any, str | None, bytes | None]:
        """(the arguments' value, or _NOT_DECODED with the reason; the value as JSON when it came
        decoded, else None). A provider returns the JSON text (some the object); a call written as
        text may hold any value."""
        cap = self.limits.max_message_chars
        most = self.limits.max_argument_depth
        if fmt == CallFormat.STRUCTURED and not isinstance(args, (str, dict)):
            return _NOT_DECODED, f"arguments must be a JSON string, got {json_type_name(args)}", None
        dumped = None
        if isinstance(args, str):
            if len(args) > self.limits.max_argument_chars:
                return _NOT_DECODED, (f"arguments are {len(args)} characters, over the "
                                      f"{self.limits.max_argument_chars} limit"), None
            deep = args.count("{") + args.count("[") > most  # cheap: nesting needs that many brackets
            try:
                args = orjson.loads(args)
            except orjson.JSONDecodeError as e:
                return _NOT_DECODED, f"arguments are not valid JSON: {e}"[:cap], None
        else:  # decoded already (a provider's object, a call written as text): JSON values, not too deep?
            try:
                dumped = orjson.dumps(args)
            except TypeError:  # sets, bytes, int keys, huge ints (a Python literal); orjson's depth cap
                return _NOT_DECODED, "arguments are not JSON values", None
            deep = dumped.count(b"{") + dumped.count(b"[") > most
        if deep and json_depth(args, most) > most:
            return _NOT_DECODED, f"arguments nest deeper than {most} levels", None
        return args, None, dumped

    def _check(self, i: int, name: str, args: Any, fmt: str, json_values: bool = False) -> CallVerdict:
        """`json_values`: `args` is known to hold JSON's own types only (`TextCall.json_values`)."""
        value, problem, dumped = self._decode(args, fmt)
        arguments = None if value is _NOT_DECODED else value
        validator = self._by_name.get(name)
        if validator is None:
            return self._bad(i, name, f"tool {name!r} was not declared", fmt, arguments)
        if problem is not None:
            return self._bad(i, name, problem, fmt)
        cap = self.limits.max_message_chars
        if not isinstance(value, dict):
            return self._bad(i, name, f"arguments must be a JSON object, got {json_type_name(value)}", fmt,
                             arguments)
        # decoded from JSON text (here or by the text call's reader): JSON's types only; else (a
        # provider's object, a literal written as text) only if it survives a round trip through JSON
        plain = dumped is None or json_values or orjson.loads(dumped) == value
        try:
            errors = validator.errors(value, self.limits.max_errors_per_call, cap, plain)
        except (Unresolvable, RecursionError) as e:
            return self._bad(i, name, f"the declared schema could not be applied: {e}"[:cap], fmt, arguments)
        return CallVerdict(i, name, not errors, errors, fmt, arguments)


_validator_cached = lru_cache(maxsize=1024)(lambda key: ToolValidator(orjson.loads(key)))


