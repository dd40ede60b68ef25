"""spec.pilot: what a pilot needs is checked at validation, naming the field; its verdict document (pilot.json)
reads back as written; its key changes with what the verdict was decided for."""

from __future__ import annotations

import pytest

from eyrie.jobs.contract import pilot as pilot_contract
from eyrie.jobs.contract.fingerprint import pilot_key
from eyrie.jobs.contract.progress import Outcome, Stage, parse_progress
from eyrie.jobs.spec import SpecError, parse_spec
from eyrie.jobs.store import open_store

pytestmark = pytest.mark.unit

BASE = {"sources": [{"name": "a", "uri": "x.jsonl"}], "target": {"model": "m", "tokenizer": "builtin:tiny-chat"},
        "api": {"baseUrl": "simulated"}, "budget": {"maxUSD": "1.5"}, "output": {"uri": "file:///tmp/x"},
        "extraction": {"enabled": True}, "pilot": {"prompts": 20}}


def spec(**over):
    doc = {**BASE, **over}
    return parse_spec(doc).spec


def problems(doc) -> dict[str, str]:
    with pytest.raises(SpecError) as e:
        parse_spec(doc)
    return dict(e.value.problems)


def test_a_pilot_gets_its_defaults_from_the_gate_and_evaluate():
    s = spec(pilot={})
    assert s.pilot_prompts() == s.tools.gate.canary_samples == 200
    assert s.pilot_heldout() == 40  # a fifth, as `eyrie evaluate` holds out
    assert s.pilot.compare == ["otherMode"] and s.pilot.policy == "report" and s.pilot.margin == 0
    assert s.pilot.training.steps == 300 and s.pilot.training.tokens_per_step == 256
    assert spec(tools={"gate": {"canarySamples": 30}}, pilot={}).pilot_prompts() == 30


def test_a_pilot_with_extraction_off_is_refused_naming_the_field():
    p = problems({**BASE, "extraction": {"enabled": False}})
    assert "extraction.enabled: true" in p["spec.pilot"]
    # the same path in a whole resource
    p = problems({"apiVersion": "eyrie.dev/v1alpha1", "kind": "DatasetGeneration",
                  "spec": {**BASE, "extraction": {"enabled": False}}})
    assert "extraction.enabled: true" in p["spec.pilot"]


def test_a_pilot_larger_than_the_sources_can_hold_is_refused_where_knowable():
    limited = [{"name": "a", "uri": "x.jsonl", "limit": 8}, {"name": "b", "uri": "y.jsonl", "limit": 10}]
    p = problems({**BASE, "sources": limited})
    assert "20" in p["spec.pilot.prompts"] and "18 rows" in p["spec.pilot.prompts"]
    assert spec(sources=limited, pilot={"prompts": 18}).pilot_prompts() == 18
    # a source without a limit: not knowable here (the pilot's preflight counts the tool-declaring prompts)
    assert spec(sources=[*limited[:1], {"name": "b", "uri": "y.jsonl"}]).pilot_prompts() == 20


@pytest.mark.parametrize("pilot,field,words", [
    ({"prompts": 5}, "spec.pilot.prompts", "leave 4 to train"),
    ({"prompts": 20, "heldout": 16}, "spec.pilot.prompts", "raise pilot.prompts to 21 or lower pilot.heldout"),
    ({"prompts": 20, "heldout": 20}, "spec.pilot.heldout", "leaves none to train on"),
])
def test_too_few_prompts_for_a_heldout_set_are_refused(pilot, field, words):
    assert words in problems({**BASE, "pilot": pilot})[field]


@pytest.mark.parametrize("margin", [-0.1, 7, 12.5])
def test_a_margin_out_of_range_is_refused(margin):
    assert "spec.pilot.margin" in problems({**BASE, "pilot": {"prompts": 20, "margin": margin}})
    assert spec(pilot={"prompts": 20, "margin": 6.99}).pilot.margin == 6.99


def test_what_a_pilot_cannot_compare_is_refused():
    assert "generation.answers: regenerate" in problems({**BASE, "generation": {"answers": "dataset"}})["spec.pilot"]
    assert "named twice" in problems({**BASE, "pilot": {"compare": ["otherMode", "otherMode"]}})["spec.pilot.compare"]
    assert "spec.pilot.compare" in problems({**BASE, "pilot": {"compare": []}})
    assert "spec.pilot.policy" in problems({**BASE, "pilot": {"policy": "warn"}})


def test_the_pilot_key_changes_with_what_the_verdict_decides_for():
    base = spec()
    assert pilot_key(base) == pilot_key(spec())
    assert pilot_key(base) != pilot_key(spec(tools={"mode": "text"}))  # the run's own data
    assert pilot_key(base) != pilot_key(spec(pilot={"prompts": 21}))
    assert pilot_key(base) != pilot_key(spec(pilot={"prompts": 20, "policy": "require"}))
    assert pilot_key(base) != pilot_key(spec(api={"baseUrl": "simulated", "sampling": {"temperature": 0.5}}))
    # not what the verdict does not depend on
    assert pilot_key(base) == pilot_key(spec(budget={"maxUSD": "9"}))
    assert pilot_key(base) == pilot_key(spec(tools={"mode": "audit"}))  # audit runs generate structured


def test_the_verdict_reads_back_as_written(tmp_path):
    store = open_store(f"file://{tmp_path}")
    assert pilot_contract.read_verdict(store) is None
    span = pilot_contract.Span(value=2.5, low=2.1, high=2.9)
    v = pilot_contract.PilotVerdict(
        key="0123456789abcdef", policy="require", margin=0.1, passed=False, proceed=False, sentence="worse",
        own=pilot_contract.Option.TEXT, best_alternative=pilot_contract.Option.STRUCTURED,
        options=[pilot_contract.OptionResult(option="text", own=True, accepted_length=span, projected_usd="1.5"),
                 pilot_contract.OptionResult(option="structured", own=False, accepted_length=span, minus_own=span,
                                             separated=True, switch='{"spec":{"tools":{"mode":"structured"}}}')],
        prompts=20, heldout=4, spent_usd="0.01", evaluation="pilot/structured/evaluation.json")
    pilot_contract.write_verdict(store, v)
    assert pilot_contract.read_verdict(store) == v
    assert b'"spentUSD"' in store.get("pilot.json") and b'"projectedUSD"' in store.get("pilot.json")


def test_progress_holds_the_pilot_stage_and_its_spend_apart():
    p = parse_progress({"attempt": "1", "stage": "pilot", "outcome": "PilotFailed", "spentUSD": "0.02",
                        "pilotUSD": "0.02", "pilot": {"step": "decided", "prompts": 20, "answers": 40,
                                                      "answersPlanned": 40, "spentUSD": "0.02", "passed": False,
                                                      "proceed": False, "verdict": "worse"}})
    assert p.stage == Stage.PILOT and p.outcome == Outcome.PILOT_FAILED and p.pilot.step == "decided"
    assert p.to_json()["pilotUSD"] == "0.02"
