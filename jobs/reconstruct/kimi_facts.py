"""Kimi (Moonshot K2 / K2.5) facts: tokenizer layout, special-token IDs, tool declarations.

Written from the published facts of the Kimi repositories (tokenizer_config.json, the tiktoken
tokenizer's pre-tokenization pattern, the K2.5 chat template and its TypeScript-style tool
declaration), not copied from them.
"""

from __future__ import annotations

import json
import re
from typing import Any

from eyrie.jobs.errors import EyrieError

# Pre-tokenization pattern of Kimi's tiktoken tokenizer (Han runs, cased words with English
# contractions, 1-3 digit groups, punctuation runs, newlines, spaces). `&&` is class intersection.
PAT_STR = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])

# Kimi's tokenizer reserves this many special IDs right after the base vocabulary (+2: BOS/EOS
# style slots at the end); IDs without a name in added_tokens_decoder are `<|reserved_token_N|>`.
NUM_RESERVED_SPECIAL = 256 + 2
# Kimi's tokenizer splits runs longer than this (whitespace or not) before BPE (tiktoken limit).
MAX_RUN_CHARS = 25_000
MAX_ENCODE_CHARS = 400_000

IM_END = "<|im_end|>"
IM_USER = "<|im_user|>"
IM_ASSISTANT = "<|im_assistant|>"
IM_SYSTEM = "<|im_system|>"
IM_MIDDLE = "<|im_middle|>"
SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
CALL_ARG_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
THINK = "<think>"
THINK_END = "</think>"

# The IDs Kimi K2/K2.5 checkpoints were trained with; a tokenizer that disagrees is the wrong one.
EXPECTED_IDS: dict[str, int] = {
    IM_END: 163586,
    IM_USER: 163587,
    IM_ASSISTANT: 163588,
    IM_SYSTEM: 163594,
    SECTION_BEGIN: 163595,
    SECTION_END: 163596,
    CALL_BEGIN: 163597,
    CALL_ARG_BEGIN: 163598,
    CALL_END: 163599,
    IM_MIDDLE: 163601,
}

# The system turn the release revision of the K2.5 template inserted when the conversation had
# none; the current revision inserts nothing.
DEFAULT_SYSTEM_PROMPT = "You are Kimi, an AI assistant created by Moonshot AI."

_NATIVE_ID = re.compile(r"functions\.[^\s:]+:\d+")


def native_call_id(name: str, index: int) -> str:
    """Kimi's own call id: `functions.NAME:IDX`, IDX counting the calls of the whole conversation
    (the model generates it; the API returns it as the call's id)."""
    return f"functions.{name}:{index}"


def is_native_call_id(cid: object) -> bool:
    """Is `cid` an id the model generated (`functions.NAME:IDX`), not one a gateway made (`call_...`)?"""
    return isinstance(cid, str) and _NATIVE_ID.fullmatch(cid) is not None


def deep_sort(obj: Any) -> Any:
    """Kimi's tokenizer sorts every mapping in `tools` by key before rendering."""
    if isinstance(obj, dict):
        return {k: deep_sort(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list):
        return [deep_sort(v) for v in obj]
    return obj


# ------------------------------------------------------------------ TypeScript-style declarations
#
# Kimi K2.5 declares tools as a TypeScript namespace rather than JSON:
#
#   # Tools
#
#   ## functions
#   namespace functions {
#   // Get the weather
#   type get_weather = (_: {
#     // City name
#     city: string,
#     unit?: "c" | "f"
#   }) => any;
#   }
#
# Required properties come first, each group sorted by name; descriptions and a few constraints
# become `//` comments; `$defs` become interfaces; integers are numbers.

_INDENT = "  "


class ToolDeclarationError(EyrieError, ValueError):
    """A tool schema the TypeScript-style declaration cannot express."""


_CONSTRAINTS = {"string": ("maxLength", "minLength", "pattern"), "number": ("maximum", "minimum"),
                "integer": ("maximum", "minimum"), "array": ("minItems", "maxItems")}
_UNION_NAMES = {"string": "string", "number": "number", "integer": "number", "boolean": "boolean",
                "null": "null", "object": "{}", "array": "Array<any>"}


def _comment(text: str, indent: str) -> str:
    return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


class _Refs:
    def __init__(self) -> None:
        self.defs: dict[str, Any] = {}
        self.self_ref = False

    def resolve(self, ref: str) -> str:
        if ref == "#":
            self.self_ref = True
            return "parameters"
        if ref.startswith("#/$defs/"):
            name = ref.split("/")[-1]
            if name not in self.defs:
                raise ToolDeclarationError(f"reference not found: {ref}")
            return name
        raise ToolDeclarationError(f"unsupported reference {ref!r}")


def _kind(schema: Any, refs: _Refs) -> str:
    if isinstance(schema, bool):
        return "any" if schema else "null"
    if not isinstance(schema, dict):
        raise ToolDeclarationError(f"not a JSON Schema object: {schema!r}")
    if "$ref" in schema:
        return "ref"
    if "anyOf" in schema:
        return "anyOf"
    if "enum" in schema:
        return "enum"
    if "type" in schema:
        t = schema["type"]
        return "union" if isinstance(t, list) else ("object" if t == "object" else
                                                     "array" if t == "array" else "scalar")
    if schema == {}:
        return "any"
    raise ToolDeclarationError(f"invalid JSON Schema object: {schema!r}")


def _doc(schema: Any, indent: str, kind: str) -> str:
    """Description and constraint comments written above a property or array item."""
    if not isinstance(schema, dict):
        return ""
    lines = []
    if schema.get("description"):
        lines.append(_comment(schema["description"], indent))
    allowed = _CONSTRAINTS.get(schema.get("type") if kind == "scalar" else kind, ())
    cons = sorted((k, schema[k]) for k in allowed if k in schema)
    if cons:
        lines.append(f"{indent}// " + ", ".join(f"{k}: {v}" for k, v in cons))
    return "".join(line + "\n" for line in lines)


def _check_enum(schema: dict[str, Any]) -> None:
    if "type" not in schema:
        return
    t = schema["type"]
    if isinstance(t, list):
        if len(t) == 2 and "null" in t:
            t = t[0] if t[0] != "null" else t[1]
        elif len(t) == 1:
            t = t[0]
        else:
            raise ToolDeclarationError(f"enum type {t} is not supported")
    checks = {"string": lambda v: isinstance(v, str), "number": lambda v: isinstance(v, (int, float)),
              "integer": lambda v: isinstance(v, int), "boolean": lambda v: isinstance(v, bool)}
    for v in schema["enum"]:
        if v is not None and t in checks and not checks[t](v):
            raise ToolDeclarationError(f"enum value {v!r} is not a {t}")


def _ts(schema: Any, indent: str, refs: _Refs) -> str:
    kind = _kind(schema, refs)
    if kind in ("any", "null"):
        return kind
    if kind == "ref":
        return refs.resolve(schema["$ref"])
    if kind == "anyOf":
        return " | ".join(_ts(s, indent, refs) for s in schema["anyOf"])
    if kind == "enum":
        _check_enum(schema)
        return " | ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in schema["enum"])
    if kind == "union":
        try:
            return " | ".join(_UNION_NAMES[t] for t in schema["type"])
        except KeyError as e:
            raise ToolDeclarationError(f"unknown type {e.args[0]!r} in a type list") from None
    if kind == "object":
        return _object(schema, indent, refs)
    if kind == "array":
        item = schema.get("items") or {}
        item_doc = _doc(item, indent + _INDENT, _kind(item, refs))
        if item_doc:
            return f"Array<\n{item_doc}{indent}{_INDENT}{_ts(item, indent + _INDENT, refs)}\n{indent}>"
        return f"Array<{_ts(item, indent, refs)}>"
    t = schema["type"]
    return "number" if t == "integer" else str(t)


def _prop(name: str, schema: Any, optional: bool, indent: str, refs: _Refs) -> str:
    text = _doc(schema, indent, _kind(schema, refs))
    default = schema.get("default") if isinstance(schema, dict) else None
    if default is not None:
        shown = repr(default) if isinstance(default, (int, float, bool)) else json.dumps(default, ensure_ascii=False)
        text += f"{indent}// Default: {shown}\n"
    return f"{text}{indent}{name}{'?' if optional else ''}: {_ts(schema, indent, refs)}"


def _register_defs(schema: dict[str, Any], refs: _Refs) -> None:
    for name, d in (schema.get("$defs") or {}).items():
        refs.defs[name] = d


def _object(schema: dict[str, Any], indent: str, refs: _Refs, *, sort: bool = True) -> str:
    _register_defs(schema, refs)
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    names = list(props)
    if sort:
        names = sorted(n for n in names if n in required) + sorted(n for n in names if n not in required)
    parts = [_prop(n, props[n], n not in required, indent + _INDENT, refs) for n in names]
    extra = schema.get("additionalProperties")
    if extra is not None:
        if extra is True:
            shown = "any"
        elif extra is False:
            shown = "never"
        elif isinstance(extra, dict):
            shown = _ts(extra, indent + _INDENT, refs)
        else:
            raise ToolDeclarationError(f"unknown additionalProperties {extra!r}")
        parts.append(f"{indent}{_INDENT}[k: string]: {shown}")
    if not parts:
        return "{}"
    return "{\n" + ",\n".join(parts) + f"\n{indent}}}"


def _function(fn: dict[str, Any]) -> str:
    refs = _Refs()
    params = fn.get("parameters") or {}
    if not isinstance(params, dict):
        raise ToolDeclarationError("parameters must be an object schema")
    body = _object(params, "", refs)  # registers $defs and notes self-references
    interfaces = []
    if refs.self_ref:
        props = params.get("properties") or {}
        required = set(params.get("required") or [])
        inner = ",\n".join(_prop(n, s, n not in required, _INDENT, refs) for n, s in props.items())
        interfaces.append("interface parameters {" + (f"\n{inner}\n" if inner else "") + "}")
        body = "parameters"
    for name, d in dict(refs.defs).items():
        desc = d.get("description", "") if isinstance(d, dict) else ""
        head = _comment(desc, "") + "\n" if desc else ""
        interfaces.append(f"{head}interface {name} {_ts(d, '', refs)}")
    desc = fn.get("description")
    lines = ["\n".join(interfaces), _comment(desc, "") if desc else "",
             f"type {fn.get('name', 'function')} = (_: {body}) => any;"]
    return "\n".join(line for line in lines if line)


def tools_typescript(tools: list[dict[str, Any]]) -> str:
    """The K2.5 tool declaration (the body of the `tool_declare` message); "" for no functions."""
    functions = [_function(t["function"]) for t in tools
                 if isinstance(t, dict) and t.get("type") == "function" and t.get("function")]
    if not functions:
        return ""
    return "# Tools\n\n## functions\nnamespace functions {\n" + "\n".join(functions) + "\n}\n"
