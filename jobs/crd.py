"""The CustomResourceDefinition, generated from the pydantic spec model (never edited by hand).

pydantic emits JSON Schema with $refs, anyOf-with-null and titles; Kubernetes wants a structural
schema: every node typed, no $ref, no type unions. `structural()` does that conversion; the CEL
rules and printer columns are declared here, next to the schema they constrain.
"""

from __future__ import annotations

from typing import Any

import yaml

from eyrie.jobs.spec import (
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAME,
    VERSION,
    DatasetGenerationSpec,
    DatasetGenerationStatus,
)

KEEP = ("description", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
        "maxLength", "pattern", "minItems", "maxItems", "enum", "format")

# CEL rules keyed by the path of the object they sit on.
VALIDATIONS: dict[tuple[str, ...], list[dict[str, str]]] = {
    ("budget",): [{"rule": "double(self.maxUSD) > 0.0", "message": "budget.maxUSD must be greater than 0",
                   "fieldPath": ".maxUSD"}],
    ("output",): [{"rule": "self.uri == oldSelf.uri", "message": "output.uri is immutable once set",
                   "fieldPath": ".uri"}],
}

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Spent", "type": "string", "jsonPath": ".status.spentUSD"},
    {"name": "Budget", "type": "string", "jsonPath": ".spec.budget.maxUSD"},
    {"name": "Done", "type": "integer", "jsonPath": ".status.samples.done"},
    # the pilot's verdict: tokens accepted per step by the drafter of the run's own data, and of the best alternative
    {"name": "Accepted", "type": "number", "jsonPath": ".status.pilot.runAccepted"},
    {"name": "Alt", "type": "string", "jsonPath": ".status.pilot.bestOption", "priority": 1},
    {"name": "AltAccepted", "type": "number", "jsonPath": ".status.pilot.bestAccepted"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def structural(node: dict[str, Any], defs: dict[str, Any], path: tuple[str, ...] = ()) -> dict[str, Any]:
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return structural(merged, defs, path)
    if "anyOf" in node:
        variants = [v for v in node["anyOf"] if v.get("type") != "null"]
        extra = {k: v for k, v in node.items() if k != "anyOf"}
        if len(variants) == 1:
            return structural({**variants[0], **extra}, defs, path)
        # a genuine union (e.g. layers: "auto" | [ids]): Kubernetes cannot type it structurally
        out = {"x-kubernetes-preserve-unknown-fields": True}
        if "description" in extra:
            out["description"] = extra["description"]
        return out
    out: dict[str, Any] = {k: node[k] for k in KEEP if k in node}
    # JSON Schema 2020 writes `exclusiveMinimum: 0`; Kubernetes' OpenAPI v3 wants `minimum: 0` plus a boolean
    for bound, flag in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(out.get(flag), (int, float)) and not isinstance(out[flag], bool):
            out[bound], out[flag] = out[flag], True
    if "const" in node:
        out["enum"] = [node["const"]]
    typ = node.get("type") or ("string" if "enum" in node or "const" in node else None)
    if typ is None:
        return {**out, "x-kubernetes-preserve-unknown-fields": True}
    out["type"] = typ
    if "default" in node and isinstance(node["default"], (str, int, float, bool)):
        out["default"] = node["default"]
    if typ == "object":
        props = node.get("properties")
        if props:
            out["properties"] = {k: structural(v, defs, (*path, k)) for k, v in props.items()}
            if node.get("required"):
                out["required"] = list(node["required"])
        elif isinstance(node.get("additionalProperties"), dict):
            out["additionalProperties"] = structural(node["additionalProperties"], defs, path)
        else:
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif typ == "array":
        out["items"] = structural(node.get("items", {}), defs, path)
    if path in VALIDATIONS:
        out["x-kubernetes-validations"] = VALIDATIONS[path]
    return out


def _schema(model: type) -> dict[str, Any]:
    js = model.model_json_schema(by_alias=True, mode="validation")
    return structural(js, js.get("$defs", {}))


def build_crd() -> dict[str, Any]:
    spec = _schema(DatasetGenerationSpec)
    spec["description"] = "What to generate, from which prompts, with which model, under which budget."
    status = _schema(DatasetGenerationStatus)
    status["description"] = "Observed state; phase is a summary, conditions are the truth."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL,
                      "singular": KIND.lower(), "shortNames": [SHORT_NAME], "categories": ["all"]},
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "A dataset of target-model responses, token ids and hidden states "
                                   "for training an EAGLE-3 drafter.",
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": spec,
                        "status": status,
                    },
                    "required": ["spec"],
                }},
            }],
        },
    }


def crd_yaml() -> str:
    return "# Generated by `eyrie crd` from jobs/spec.py; do not edit.\n" + yaml.safe_dump(
        build_crd(), sort_keys=False, width=100)
