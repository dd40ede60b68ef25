import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import jsonschema
import pytest
import yaml

from eyrie.jobs.crd import build_crd, crd_yaml
from eyrie.jobs.spec import SpecError, load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = {"sources": [{"name": "a", "uri": "x.jsonl"}], "target": {"model": "m"},
           "api": {"baseUrl": "simulated"}, "budget": {"maxUSD": "1.5"}, "output": {"uri": "file:///tmp/x"}}


def problems(doc) -> dict[str, str]:
    with pytest.raises(SpecError) as e:
        parse_spec(doc)
    return dict(e.value.problems)


def test_minimal_spec_gets_defaults_and_round_trips_in_camel_case():
    dg = parse_spec(MINIMAL)
    assert dg.spec.budget.max_usd == Decimal("1.5")
    assert dg.spec.tools.mode == "structured" and dg.spec.tools.gate.canary_samples == 200
    dumped = dg.dump()["spec"]
    # the spec is never rewritten: a simulated run without prices uses the simulator's price list
    assert dumped["budget"] == {"maxUSD": "1.5", "onForecastOver": "warn"}
    assert dg.spec.budget.pricing is None
    assert (dg.spec.effective_pricing().input_per_million, dg.spec.effective_pricing().output_per_million) == (
        Decimal("0.60"), Decimal("2.50"))
    assert dumped["api"]["maxConcurrency"] == 16
    assert parse_spec(dumped).spec == dg.spec


def test_every_wrong_field_is_named_at_once():
    bad = {"sources": [{"name": "a", "uri": "x.jsonl", "fromat": "openai", "limit": 0}],
           "target": {"model": "m", "chatFormat": "llama"},
           "api": {"baseUrl": "https://openrouter.ai/api/v1", "maxConcurrency": -1},
           "budget": {"maxUSD": "-5"}, "output": {"uri": "http://x"}, "extra": 1}
    p = problems(bad)
    assert p["spec.sources[0].fromat"] == "unknown field"
    assert "greater than or equal to 1" in p["spec.sources[0].limit"]
    assert "spec.target.chatFormat" in p
    assert "spec.api.maxConcurrency" in p
    assert p["spec.budget.maxUSD"] == "must be greater than 0"
    assert "s3://" in p["spec.output.uri"]
    assert p["spec.extra"] == "unknown field"


@pytest.mark.parametrize("value,ok", [("0.02", True), (5, True), ("0", False), ("abc", False),
                                      ("NaN", False), (True, False)])
def test_money(value, ok):
    doc = {**MINIMAL, "budget": {"maxUSD": value}}
    if ok:
        assert parse_spec(doc).spec.budget.max_usd == Decimal(str(value))
    else:
        assert "spec.budget.maxUSD" in problems(doc)


def test_cross_field_rules_name_the_field():
    real = {**MINIMAL, "api": {"baseUrl": "https://openrouter.ai/api/v1"}}
    assert "reservations need prices" in problems(real)["spec.budget.pricing"]
    priced = {**real, "budget": {"maxUSD": "1", "pricing": {"inputPerMillion": "1", "outputPerMillion": "1"}}}
    sub = {**priced, "generation": {"ray": {"mode": "Submit"}}}
    assert "spec.generation.ray.address" in problems(sub)
    dup = {**MINIMAL, "sources": [{"name": "a", "uri": "x"}, {"name": "a", "uri": "y"}]}
    assert "duplicate" in problems(dup)["spec.sources"]
    agentic = {**MINIMAL, "generation": {"turns": "all", "answers": "dataset"}}
    assert "each row's answer to its prompt (turns: last)" in problems(agentic)["spec.generation.answers"]


@pytest.mark.parametrize("ray", [{"mode": "RayJob", "image": "ray:1"}, {"mode": "Submit", "address": "http://ray:8265"}])
def test_the_simulator_is_refused_for_cluster_modes(ray):
    """The simulator binds the driver's loopback: remote Ray workers could never reach it."""
    message = problems({**MINIMAL, "generation": {"ray": ray}})["spec.api.baseUrl"]
    assert f"simulated cannot run with generation.ray.mode {ray['mode']}" in message
    assert "loopback" in message
    assert parse_spec({**MINIMAL, "generation": {"ray": {"mode": "Local"}}}).spec.api.base_url == "simulated"


def test_full_resource_and_wrong_kind():
    dg = parse_spec({"apiVersion": "eyrie.dev/v1alpha1", "kind": "DatasetGeneration",
                     "metadata": {"name": "n"}, "spec": MINIMAL})
    assert dg.metadata.name == "n"
    assert "kind" in problems({"kind": "Job", "spec": MINIMAL})


def test_load_spec_resolves_sources_next_to_the_file(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(MINIMAL))
    dg = load_spec(f)
    assert dg.spec.sources[0].uri == str(tmp_path / "x.jsonl")
    assert dg.metadata.name == "s"
    (tmp_path / "bad.yaml").write_text("a: [")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(tmp_path / "bad.yaml")


def test_committed_crd_is_exactly_the_generated_one():
    committed = (ROOT / "crds" / "datasetgenerations.eyrie.dev.yaml").read_text()
    assert committed == crd_yaml(), "CRD drifted from jobs/spec.py: run `eyrie crd > crds/...yaml`"


def _walk(node, path="$"):
    yield path, node
    for k, v in node.get("properties", {}).items():
        yield from _walk(v, f"{path}.{k}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_crd_schema_is_structural_with_rules_and_columns():
    crd = build_crd()
    v = crd["spec"]["versions"][0]
    schema = v["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node, path
        assert node.get("type") or node.get("x-kubernetes-preserve-unknown-fields"), path
    spec = schema["properties"]["spec"]
    assert spec["properties"]["budget"]["x-kubernetes-validations"][0]["rule"] == "double(self.maxUSD) > 0.0"
    assert spec["properties"]["output"]["x-kubernetes-validations"][0]["rule"] == "self.uri == oldSelf.uri"
    assert [c["name"] for c in v["additionalPrinterColumns"]] == ["Phase", "Spent", "Budget", "Done", "Accepted", "Alt",
                                                                  "AltAccepted", "Age"]
    assert v["subresources"] == {"status": {}}
    assert crd["spec"]["names"]["shortNames"] == ["dsg"] and crd["spec"]["names"]["categories"] == ["all"]


def test_examples_validate_against_the_model_and_the_crd_schema():
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert examples
    for ex in examples:
        doc = yaml.safe_load(ex.read_text())
        if doc.get("kind") != "DatasetGeneration":
            continue
        load_spec(ex)
        jsonschema.Draft4Validator(schema).validate(doc)  # Kubernetes' OpenAPI v3 schemas are draft-4 style


@pytest.mark.integration
def test_cli_validate_and_crd(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**MINIMAL, "budget": {"maxUSD": "-1"}}))
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "validate", str(bad)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "spec.budget.maxUSD: must be greater than 0" in r.stderr
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "validate", str(ROOT / "examples/quickstart.yaml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "crd"], capture_output=True, text=True)
    assert r.returncode == 0 and yaml.safe_load(r.stdout.split("\n", 1)[1])["kind"] == "CustomResourceDefinition"


@pytest.mark.parametrize("sampling,pricing,max_usd,ok", [
    ({"maxTokens": 4096}, None, "0.01", False),  # the simulator's $2.50/M: one answer may cost $0.01024
    ({"maxTokens": 4096}, None, "0.0103", True),
    ({"maxTokens": 1000, "reasoning": {"maxTokens": 3000}}, {"inputPerMillion": "0.6", "outputPerMillion": "2.5"},
     "0.009", False),  # reasoning tokens are reserved on top of maxTokens
    ({"maxTokens": 32768}, {"inputPerMillion": "0.6", "outputPerMillion": "2.5"}, "0.05", False),
    ({"maxTokens": 32768}, {"inputPerMillion": "0.6", "outputPerMillion": "2.5"}, "0.09", True),
])
def test_a_budget_that_cannot_pay_one_answer_is_refused_at_validation(sampling, pricing, max_usd, ok):
    """maxTokens x the output price alone over maxUSD: no request can ever be sent, so the spec is
    refused before anything runs, naming the levers (maxTokens, maxUSD)."""
    doc = {**MINIMAL, "api": {"baseUrl": "simulated", "sampling": sampling},
           "budget": {"maxUSD": max_usd, **({"pricing": pricing} if pricing else {})}}
    if ok:
        parse_spec(doc)
        return
    p = problems(doc)
    why = p["spec.budget.maxUSD"]
    assert "api.sampling.maxTokens" in why and "lower" in why and "raise budget.maxUSD" in why, why
