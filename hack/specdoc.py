"""The spec reference (docs/spec-reference.md), rendered from the pydantic models in `spec.py`.

Every field, its YAML path, type, default, limits and description come from the model's JSON
schema, so the reference cannot list a field the API does not have or miss one it has.
`python hack/derived.py` writes it; a test fails when the committed file is stale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eyrie.jobs.crd import PRINTER_COLUMNS, VALIDATIONS
from eyrie.jobs.spec import (
    API_VERSION,
    KIND,
    MONEY_PATTERN,
    PLURAL,
    SHORT_NAME,
    DatasetGenerationSpec,
    DatasetGenerationStatus,
)

LIMITS = (("minimum", ">= {}"), ("exclusiveMinimum", "> {}"), ("maximum", "<= {}"), ("exclusiveMaximum", "< {}"),
          ("minLength", "at least {} characters"), ("maxLength", "at most {} characters"),
          ("minItems", "at least {} items"), ("maxItems", "at most {} items"))


@dataclass(frozen=True)
class Field:
    path: str
    type: str
    required: bool
    default: str
    limits: str
    description: str


@dataclass(frozen=True)
class Section:
    path: str
    description: str
    fields: tuple[Field, ...]


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Follow a $ref (keeping sibling keys such as a field's own description) and drop `| null`."""
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        extra = {k: v for k, v in node.items() if k != "$ref"}
        # the field's description wins over the model's docstring
        return _resolve({**target, **extra, "modelDescription": target.get("description", "")}, defs)
    if "anyOf" in node:
        variants = [v for v in node["anyOf"] if v.get("type") != "null"]
        if len(variants) == 1:
            extra = {k: v for k, v in node.items() if k != "anyOf"}
            return _resolve({**variants[0], **extra}, defs)
    return node


def _code(value: Any) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`' if value == "" or value.strip() != value else f"`{value}`"
    return f"`{value}`"


def _type(node: dict[str, Any], defs: dict[str, Any]) -> str:
    node = _resolve(node, defs)
    if "anyOf" in node:
        return " or ".join(_type(v, defs) for v in node["anyOf"] if v.get("type") != "null")
    if "const" in node:
        return _code(node["const"])
    if "enum" in node:
        return " \\| ".join(_code(v) for v in node["enum"])
    typ = node.get("type")
    if typ == "string" and node.get("pattern") == MONEY_PATTERN:
        return 'decimal string (USD, e.g. `"12.50"`)'
    if typ == "array":
        return f"list of {_type(node.get('items', {}), defs)}"
    if typ == "object":
        if "properties" in node:
            return "object"
        extra = node.get("additionalProperties")
        return f"map of string to {_type(extra, defs)}" if isinstance(extra, dict) else "object"
    return {"integer": "integer", "number": "number", "boolean": "boolean", "string": "string"}.get(typ or "", "any")


def _limits(node: dict[str, Any]) -> str:
    out = [fmt.format(node[k]) for k, fmt in LIMITS if k in node]
    if "pattern" in node and node["pattern"] != MONEY_PATTERN:
        out.append(f"matches `{node['pattern']}`")
    return ", ".join(out)


def _object_of(node: dict[str, Any], defs: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The object schema a field holds (directly, as list items or map values, or as the object form of
    a union such as `sort: "price" | {by, partition}`) and the path suffix to reach it."""
    node = _resolve(node, defs)
    for variant in node.get("anyOf", ()):
        if (child := _object_of(variant, defs)) is not None:
            return child
    if node.get("type") == "object" and "properties" in node:
        return node, ""
    if node.get("type") == "array":
        items = _resolve(node.get("items", {}), defs)
        if items.get("type") == "object" and "properties" in items:
            return items, "[]"
    if node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict):
        values = _resolve(node["additionalProperties"], defs)
        if values.get("type") == "object" and "properties" in values:
            return values, ".<name>"  # a map of objects: one section for its values
    return None


def sections(schema: dict[str, Any], path: str, defs: dict[str, Any] | None = None,
             description: str = "") -> list[Section]:
    """One section per object in the schema, depth first, in declaration order."""
    defs = schema.get("$defs", {}) if defs is None else defs
    required = set(schema.get("required", []))
    fields, children = [], []
    for name, raw in schema.get("properties", {}).items():
        node = _resolve(raw, defs)
        default = _code(node["default"]) if "default" in node and node["default"] is not None else ""
        fields.append(Field(f"{path}.{name}", _type(raw, defs), name in required, default, _limits(node),
                            " ".join(str(node.get("description", "")).split())))
        child = _object_of(raw, defs)
        if child is not None:
            obj, suffix = child
            intro = obj.get("modelDescription") or ""
            children.extend(sections(obj, f"{path}.{name}{suffix}", defs, " ".join(intro.split())))
    return [Section(path, description, tuple(fields)), *children]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(section: Section) -> list[str]:
    lines = ["| field | type | default | limits | description |", "|---|---|---|---|---|"]
    for f in section.fields:
        name = f"`{f.path.rsplit('.', 1)[-1]}`" + (" (required)" if f.required else "")
        lines.append(f"| {name} | {f.type} | {f.default} | {_cell(f.limits)} | {_cell(f.description)} |")
    return lines


def spec_reference_markdown() -> str:
    spec = DatasetGenerationSpec.model_json_schema(by_alias=True, mode="validation")
    status = DatasetGenerationStatus.model_json_schema(by_alias=True, mode="serialization")
    out = [
        "<!-- Generated from jobs/spec.py by `python hack/derived.py`; do not edit. -->",
        f"# `{KIND}` spec reference",
        "",
        f"`apiVersion: {API_VERSION}`, `kind: {KIND}` (plural `{PLURAL}`, short name `{SHORT_NAME}`). "
        "Field names are camelCase; unknown fields are rejected, by `eyrie validate` and by the API "
        "server alike. A field marked required must be set when its parent object is present.",
        "",
        "## Spec",
    ]
    for sec in sections(spec, "spec"):
        out += ["", f"### `{sec.path}`", ""]
        if sec.description:
            out += [sec.description, ""]
        out += _table(sec)
    out += ["", "## Checks the API server makes (CEL rules in the CRD)", ""]
    for where, rules in VALIDATIONS.items():
        for rule in rules:
            out.append(f"- `spec.{'.'.join(where)}`: {rule['message']} (`{rule['rule']}`)")
    out += ["", "## Status", "", "Written by the operator; `phase` is a summary, `conditions` are the truth "
            "(docs/operating.md explains every condition reason)."]
    for sec in sections(status, "status"):
        out += ["", f"### `{sec.path}`", ""]
        if sec.description:
            out += [sec.description, ""]
        out += _table(sec)
    out += ["", "## Columns of `kubectl get dsg`", "", "| column | from |", "|---|---|"]
    out += [f"| {c['name']} | `{c['jsonPath']}` |" for c in PRINTER_COLUMNS]
    return "\n".join(out) + "\n"
