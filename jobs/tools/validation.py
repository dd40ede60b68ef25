"""Each returned tool call checked: declared name, arguments parse as JSON and validate against the schema."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import orjson
from jsonschema import Draft202012Validator
from referencing.exceptions import Unresolvable

from eyrie.jobs.sources import json_type_name
from eyrie.jobs.tools.declarations import (
    CACHE_MAX_KEY_BYTES,
    DEFAULT_LIMITS,
    MAX_NAME_CHARS,
    ToolLimits,
    _canonical,
    _pointer,
)

Mode = Literal["structured", "text"]
Policy = Literal["keep", "drop", "flag"]
# ------------------------------------------------------------------------------ call validation


def _compile(key: bytes) -> Draft202012Validator:
    return Draft202012Validator(orjson.loads(key))


_compile_cached = lru_cache(maxsize=4096)(_compile)


def _compiled(key: bytes) -> Draft202012Validator:
    """One compiled validator per distinct schema (keyed by its canonical JSON)."""
    return _compile_cached(key) if len(key) <= CACHE_MAX_KEY_BYTES else _compile(key)



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


