"""Docs and examples against the code: the spec reference is current and complete, every condition
reason the operator can write is explained, every example is accepted by the cluster's CRD and by
the spec model, and the cluster objects built from the examples pass Kubernetes' own schemas.
"""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path
from typing import Any

import derived  # hack/derived.py
import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel
from specdoc import spec_reference_markdown  # hack/specdoc.py

from eyrie.jobs.cli import COMMANDS
from eyrie.jobs.spec import DatasetGenerationSpec, DatasetGenerationStatus, load_spec
from eyrie.operator import children, conditions

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
OPERATING = (ROOT / "docs/operating.md").read_text()
REFERENCE = (ROOT / derived.SPEC_REFERENCE_PATH).read_text()
CHART_VALUES = yaml.safe_load((ROOT / "charts/eyrie/values.yaml").read_text())
KUBE = "1.28.0"


def crd_schema() -> dict[str, Any]:
    """The schema the API server enforces: the chart's CRD copy (identical to crds/)."""
    crd = yaml.safe_load((ROOT / derived.CHART_CRD_PATH).read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def docs_of(kind: str) -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == kind:
                out.append((path, doc))
    return out


# ----------------------------------------------------------------------------- spec reference


def test_spec_reference_is_current():
    assert spec_reference_markdown() == REFERENCE, f"docs/spec-reference.md is stale: run `{derived.REFRESH}`"


def model_paths(model: type[BaseModel], prefix: str) -> set[str]:
    """Every YAML path of a model, from pydantic's own field table (not from the JSON schema)."""
    out = set()
    for name, field in model.model_fields.items():
        key = field.serialization_alias or field.alias or name
        out.add(f"{prefix}.{key}")
        stack = [field.annotation]
        while stack:
            t = stack.pop()
            if isinstance(t, type) and issubclass(t, BaseModel):
                ann = field.annotation
                origins = {typing.get_origin(ann), *map(typing.get_origin, typing.get_args(ann))}
                suffix = "[]" if list in origins else ".<name>" if dict in origins else ""
                out |= model_paths(t, f"{prefix}.{key}{suffix}")
            else:
                stack.extend(typing.get_args(t))
    return out


def reference_paths(text: str) -> set[str]:
    paths, section = set(), None
    for line in text.splitlines():
        if m := re.match(r"^### `([^`]+)`$", line):
            section = m.group(1)
        elif section and (m := re.match(r"^\| `([A-Za-z0-9]+)`", line)):
            paths.add(f"{section}.{m.group(1)}")
    return paths


def test_spec_reference_lists_every_field_of_the_models_and_nothing_else():
    expected = model_paths(DatasetGenerationSpec, "spec") | model_paths(DatasetGenerationStatus, "status")
    assert {"spec.budget.maxUSD", "spec.sources[].limit", "spec.extraction.tolerations[].effect",
            "status.conditions[].lastTransitionTime", "status.spentUSD"} <= expected
    assert reference_paths(REFERENCE) == expected


def test_spec_reference_states_defaults_limits_and_money():
    assert ("| `maxConcurrency` | integer | `16` | >= 1, <= 100000 | Requests in flight at once, over all "
            "workers. |") in REFERENCE
    assert '| `maxUSD` (required) | decimal string (USD, e.g. `"12.50"`) |' in REFERENCE
    assert "| `format` | `openai` \\| `sharegpt` \\| `glaive` | `openai` |" in REFERENCE
    assert "- `spec.output`: output.uri is immutable once set (`self.uri == oldSelf.uri`)" in REFERENCE


# ------------------------------------------------------------------------------ operating guide


def written_reasons() -> set[str]:
    """Every literal condition reason in the operator's decisions: p.cond(..., reason), _fail(..., reason),
    conditions.make(..., reason), plus the stop-reason table."""
    from eyrie.operator import reconcile

    tree = ast.parse(Path(reconcile.__file__).read_text())
    reasons: set[str] = set(reconcile.STOP_REASONS.values()) | {reconcile.USER_SUSPENDED}

    def literals(node: ast.AST) -> set[str]:
        return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}

    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        f = call.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        pos = {"cond": 2, "_fail": 2, "make": 2}.get(name)
        if pos is not None and len(call.args) > pos:
            reasons |= literals(call.args[pos])
    return reasons


def test_every_condition_reason_the_operator_writes_is_explained():
    reasons = written_reasons()
    assert {"BudgetExceeded", "ToolSemanticsDrift", "InsufficientCredits", "SuspendedByUser", "SecretNotFound",
            "OutputUnreachable", "WaitingForAdmission", "ManifestWritten", "PermanentError", "GenerationFailed",
            "ExtractionFailed", "Stopping", "Resumed"} <= reasons
    table = [line for line in OPERATING.splitlines() if line.startswith("| `")]
    missing = sorted(r for r in reasons if not any(f"`{r}`" in row for row in table))
    assert missing == [], f"docs/operating.md explains no condition reason {missing}"


def test_every_condition_type_is_in_the_table():
    types = {v for k, v in vars(conditions).items() if k.isupper() and isinstance(v, str)}
    assert types == {"SecretsReady", "OutputReachable", "OutputMatchesSpec", "Queued", "Suspended", "Succeeded",
                     "Failed", "ProvidersChecked", "PodsHealthy", "PilotPassed"}
    rows = {line.split("|")[1].strip() for line in OPERATING.splitlines() if line.startswith("| `")}
    assert {t for t in types if f"`{t}`" in rows} == types


def run_outputs() -> set[Path]:
    """Where the examples' runs write (a relative output.uri is taken next to the spec, as load_spec resolves
    it): a folder there exists only after someone ran that example, so a name in it is no repository path."""
    uris = (load_spec(path).spec.output.uri for path, _ in docs_of("DatasetGeneration"))
    return {Path(uri) for uri in uris if "://" not in uri}


def test_repository_paths_named_in_the_docs_exist():
    text = OPERATING + REFERENCE
    named = set(re.findall(r"(?<![\w/.-])(?:\./)?((?:examples|charts|crds|images|docs|operator|jobs)/[\w./-]*[\w/])",
                           text))  # as written, or relative to the current directory (./examples/...)
    assert {"examples/openrouter-kimi.yaml", "charts/eyrie/files/rbac.json", "images/extractor.Dockerfile"} <= named
    outputs = run_outputs()

    def a_run_output(name: str) -> bool:
        p = ROOT / name
        return any(p == out or out in p.parents for out in outputs)

    produced = {p for p in named if a_run_output(p)}
    # the ones the docs name as what a quickstart writes, whether or not it has run in this checkout
    assert {"examples/eyrie-out/quickstart", "examples/eyrie-out/quickstart-impostor"} <= produced
    missing = sorted(p for p in named - produced if not (ROOT / p).exists())
    assert missing == []


def test_eyrie_commands_in_the_docs_exist():
    # commands as typed: at the start of a line (after any VAR=value) or in `code`
    used = set(re.findall(r"(?m)(?:^\s*(?:[A-Z_]+=\S+\s+)*|`)eyrie ([a-z]+)", OPERATING))
    assert {"run", "validate", "operator", "export", "audit", "crd"} <= used
    assert used <= set(COMMANDS)


# ------------------------------------------------------------------------------------- examples


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_a_known_kind(path):
    kinds = [d.get("kind") for d in yaml.safe_load_all(path.read_text()) if d]
    assert len(kinds) == 1 and kinds[0] in ("DatasetGeneration", "Secret")


@pytest.mark.parametrize("path", [p for p, _ in docs_of("DatasetGeneration")], ids=lambda p: p.name)
def test_dataset_examples_pass_the_crd_schema_and_the_spec_model(path):
    doc = yaml.safe_load(path.read_text())
    # Kubernetes' OpenAPI v3 schemas follow draft-4 semantics (boolean exclusiveMinimum)
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft4Validator(crd_schema()).iter_errors(doc)]
    assert errors == []
    assert load_spec(path).metadata.name == doc["metadata"]["name"]


def test_the_crd_schema_catches_what_the_api_server_would():
    doc = yaml.safe_load((ROOT / "examples/openrouter-kimi.yaml").read_text())
    validator = jsonschema.Draft4Validator(crd_schema())
    bad = {**doc, "spec": {**doc["spec"], "generation": {**doc["spec"]["generation"], "partRecords": 0}}}
    assert [e.message for e in validator.iter_errors(bad)] == ["0 is less than the minimum of 1"]
    bad = {**doc, "spec": {**doc["spec"], "tools": {**doc["spec"]["tools"], "mode": "xml"}}}
    assert [list(e.absolute_path) for e in validator.iter_errors(bad)] == [["spec", "tools", "mode"]]


@pytest.mark.parametrize("path", [p for p, _ in docs_of("Secret")], ids=lambda p: p.name)
def test_secret_templates_are_valid_and_hold_only_placeholders(path):
    doc = yaml.safe_load(path.read_text())
    kubernetes_validate.validate(doc, KUBE, strict=True)
    assert doc["stringData"] and all("REPLACE" in v for v in doc["stringData"].values())


def cluster_examples() -> list[tuple[Path, Any]]:
    out = []
    for path, _ in docs_of("DatasetGeneration"):
        dg = load_spec(path)
        if dg.spec.generation.ray.mode != "Local":
            out.append((path, dg))
    return out


def test_cluster_examples_reference_only_the_example_secrets_and_keys():
    secrets = {doc["metadata"]["name"]: set(doc["stringData"]) for _, doc in docs_of("Secret")}
    assert cluster_examples(), "no in-cluster example"
    for _, dg in cluster_examples():
        refs = {(e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
                for e in children.secret_env(dg.spec)}
        assert refs == {("openrouter", "api-key"), ("minio-creds", "accessKey"), ("minio-creds", "secretKey")}
        assert all(key in secrets.get(name, set()) for name, key in refs)


def test_cluster_examples_build_children_that_pass_kubernetes_schemas():
    for _, dg in cluster_examples():
        children.check_cluster_spec(dg.spec)
        name, ns = dg.metadata.name, "team-a"
        kubernetes_validate.validate(children.configmap(name, ns, dg.spec), KUBE, strict=True)
        job = children.extraction_job(name, ns, dg.spec)
        kubernetes_validate.validate(job, KUBE, strict=True)
        assert job["spec"]["template"]["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 8}}
        rayjob = children.rayjob(name, ns, dg.spec, "1")
        images = {c["image"] for group in (rayjob["spec"]["rayClusterSpec"]["headGroupSpec"],
                                           *rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"])
                  for c in group["template"]["spec"]["containers"]}
        assert images == {dg.spec.generation.ray.image}


def test_openrouter_kimi_example_is_what_its_name_says():
    dg = load_spec(ROOT / "examples/openrouter-kimi.yaml")
    s = dg.spec
    assert (s.target.model, s.target.tokenizer, s.target.chat_format) == (
        "moonshotai/kimi-k2.5", "moonshotai/Kimi-K2.5", "kimi-k2.5")
    assert s.api.base_url == "https://openrouter.ai/api/v1"
    assert s.api.provider is not None
    assert (s.api.provider.order, s.api.provider.allow_fallbacks, s.api.provider.require_parameters) == (
        ["moonshotai"], False, True)
    assert s.budget.pricing is not None and str(s.budget.max_usd) == "100.00"
    assert s.tools.mode == "structured" and s.tools.gate.enabled
    assert [src.format for src in s.sources] == ["glaive"]
    assert (s.extraction.enabled, s.extraction.engine, s.extraction.gpus_per_pod) == (True, "sglang", 8)
    assert s.output.uri.startswith("s3://") and s.output.endpoint == "http://minio.minio.svc:9000"
    assert s.output.credentials_secret_ref is not None and s.api.api_key_secret_ref is not None
    # the images of this release, as the chart names them
    workload = CHART_VALUES["workloadImages"]
    assert s.generation.ray.image == "{repository}:{tag}".format(**workload["rayWorker"])
    assert s.extraction.image == "{repository}:{tag}".format(**workload["extractor"])
