"""Facts about decoded JSON values that several stages use (sources, tools): below every stage, so
none of them reaches sideways into another for them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number",
               bool: "boolean", type(None): "null"}


def json_depth(node: Any, limit: int) -> int:
    """Nesting depth of a JSON value, iteratively (a hostile row must not blow the stack); stops
    counting past `limit`."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        value, d = stack.pop()
        if d > limit:
            return d
        deepest = max(deepest, d)
        if isinstance(value, dict):
            stack.extend((v, d + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, d + 1) for v in value)
    return deepest


def json_type_name(value: Any) -> str:
    """The JSON name of a decoded value's type, for messages ("array", not "list")."""
    return _JSON_TYPES.get(type(value), type(value).__name__)


def canonical_json(value: Any) -> bytes:
    """A value's JSON with sorted keys: equal values give equal bytes (cache keys, hashes, comparisons)."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def json_pointer(path: Sequence[Any]) -> str:
    """A path into a JSON value as an RFC 6901 pointer ("" for the root), for messages."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)
