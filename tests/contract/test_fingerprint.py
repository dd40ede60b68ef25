"""An output is bound to what produced it (issue 24, item 1): every record carries the fingerprint of
what shaped its answer, a run under another fingerprint refuses to start (exit 2, nothing sent) and
an accepted change labels the new answers, never mixing them silently; the manifest describes the
records, not the spec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parents[1]))
from fault_helpers import API_KEY, persisted, progress, simple_rows, spec_doc, write_rows, write_spec

from eyrie.jobs.contract import layout, records
from eyrie.jobs.contract.fingerprint import (
    FIELDS,
    Fingerprint,
    FingerprintChanged,
    audit_fingerprint,
    bind,
    bind_output,
    diff,
    fingerprint,
    write_doc,
)
from eyrie.jobs.errors import InputError
from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess
from eyrie.jobs.spec import parse_spec
from eyrie.jobs.store import open_store


def spec_of(**over):
    doc = spec_doc(Path("/p.jsonl"), "file:///out", "simulated")["spec"]
    for dotted, value in over.items():
        node = doc
        *head, last = dotted.split(".")
        for k in head:
            node = node.setdefault(k, {})
        node[last] = value
    return parse_spec(doc).spec


# ------------------------------------------------------------------------------------------- pure


@pytest.mark.parametrize("field,value", [
    ("budget.maxUSD", "99"), ("api.maxConcurrency", 3), ("api.requestsPerMinute", 60), ("api.maxRetries", 1),
    ("api.requestTimeoutSeconds", 5), ("api.stream", False), ("api.headers", {"X-Title": "x"}),
    ("generation.shards", 17), ("generation.partRecords", 9), ("generation.ray.workers", 4),
    ("tools.onInvalidCall", "keep"), ("tools.gate.canarySamples", 5), ("target.tokenizer", "bundled:deepseek-v4"),
    ("output.uri", "file:///elsewhere"), ("api.simulator.latencyMs", 500),
    ("sources", [{"name": "q", "uri": "/q.jsonl"}]),
])
def test_what_does_not_shape_an_answer_leaves_the_fingerprint(field, value):
    assert fingerprint(spec_of(**{field: value})).id == fingerprint(spec_of()).id


@pytest.mark.parametrize("field,value,name", [
    ("target.model", "moonshotai/kimi-k2.5", "target.model"),
    ("api.sampling.temperature", 0.2, "api.sampling.temperature"),
    ("api.sampling.maxTokens", 512, "api.sampling.maxTokens"),
    ("api.sampling.reasoning", {"effort": "low"}, "api.sampling.reasoning"),
    ("api.provider", {"order": ["moonshotai"], "allowFallbacks": False}, "api.provider"),
    ("api.simulator.seed", 7, "api.simulator"),
    ("tools.mode", "text", "tools.mode"),
    ("generation.turns", "all", "generation.turns"),
    ("target.chatFormat", "qwen3", "target.chatFormat"),
    ("target.templateVariant", "later", "target.templateVariant"),
    ("generation.answers", "dataset", "generation.answers"),
])
def test_what_shapes_an_answer_changes_the_fingerprint_by_name(field, value, name):
    before, after = fingerprint(spec_of()), fingerprint(spec_of(**{field: value}))
    assert before.id != after.id
    assert name in [c.field for c in diff(before.fields, after.fields)]


def test_another_address_of_a_real_api_is_the_same_provider_but_leaving_the_simulator_is_not():
    real = spec_of(**{"api.baseUrl": "http://127.0.0.1:8/v1"})
    assert fingerprint(real).id == fingerprint(spec_of(**{"api.baseUrl": "http://127.0.0.1:9/v1"})).id
    assert [c.field for c in diff(fingerprint(spec_of()).fields, fingerprint(real).fields)] == ["api.simulator"]


def test_audit_runs_generate_structured_and_the_audit_has_a_fingerprint_of_its_own():
    assert fingerprint(spec_of(**{"tools.mode": "audit"})).id == fingerprint(spec_of()).id
    assert audit_fingerprint(spec_of()).fields["tools.mode"] == "text+structured"
    assert audit_fingerprint(spec_of()).id != fingerprint(spec_of()).id


def test_agentic_policy_counts_only_for_whole_conversations():
    base = {"generation.turns": "all"}
    assert fingerprint(spec_of(**base)).id != fingerprint(spec_of(**base, **{"generation.maxTurns": 3})).id
    assert fingerprint(spec_of()).id == fingerprint(spec_of(**{"generation.maxTurns": 3})).id


def test_the_simulator_config_file_counts_by_what_it_says_not_where_it_lies(tmp_path):
    (tmp_path / "a.yaml").write_text("# faults for the demo\nfaultRate: 0.1\nfaults: ['500']\n")
    (tmp_path / "b.json").write_text('{"faults": ["500"], "faultRate": 0.1}')
    here, moved = (spec_of(**{"api.simulator.config": str(tmp_path / n)}) for n in ("a.yaml", "b.json"))
    assert fingerprint(here).fields["api.simulator"]["config"] == {"faultRate": 0.1, "faults": ["500"]}
    assert fingerprint(here).id == fingerprint(moved).id  # another path, the same behaviours
    assert fingerprint(here).id != fingerprint(spec_of()).id  # a file's faults against none
    (tmp_path / "a.yaml").write_text("faultRate: 0.2\nfaults: ['500']\n")  # the same spec, the file edited
    [change] = diff(fingerprint(moved).fields, fingerprint(here).fields)
    assert change.field == "api.simulator"
    assert '"faultRate":0.1' in change.describe().split(" -> ")[0]
    assert '"faultRate":0.2' in change.describe().split(" -> ")[1]


def test_a_resume_after_the_simulator_config_file_was_edited_is_refused(tmp_path):
    """What a run does first (`bind_output`, before anything is sent), against a store holding a record."""
    cfg = tmp_path / "sim.yaml"
    cfg.write_text("divergenceRate: 0\ntextCalls: {formats: {json: 1}}\n")
    spec = spec_of(**{"api.simulator.config": str(cfg)})
    store = open_store(f"file://{tmp_path}/out")
    write_doc(store, bind_output(store, spec, "1"))
    store.put(layout.part_key(0, 0), records.encode_part([{"sample_id": "s1", "status": "ok"}]))
    assert bind_output(store, spec, "2").kind == "same"
    cfg.write_text("divergenceRate: 0\ntextCalls: {formats: {xml: 1}}\n")
    with pytest.raises(FingerprintChanged) as refused:
        bind_output(store, spec, "2")
    assert [c.field for c in refused.value.refused] == ["api.simulator"]
    assert '"xml":1' in str(refused.value) and "--accept-changed api.simulator" in str(refused.value)
    assert bind_output(store, spec, "2", accept=["api.simulator"]).kind == "accepted"
    cfg.unlink()
    with pytest.raises(InputError, match=f"api.simulator.config: cannot read {cfg}"):
        bind_output(store, spec, "2")


OLD = fingerprint(spec_of())
NEW = fingerprint(spec_of(**{"target.model": "moonshotai/kimi-k2.5", "api.sampling.temperature": 0.2}))
DOC = {"version": 1, "current": OLD.id, "fingerprints": {OLD.id: {"fields": dict(OLD.fields), "since": "a1"}}}


def test_bind_new_same_and_replaced():
    new = bind(None, OLD, persisted=0, attempt="a1")
    assert new.kind == "new" and new.doc["current"] == OLD.id
    assert bind(DOC, OLD, persisted=5, attempt="a2").kind == "same"
    replaced = bind(DOC, NEW, persisted=0, attempt="a2")  # nothing kept under the old one: nothing to mix
    assert replaced.kind == "replaced" and replaced.doc["current"] == NEW.id


def test_bind_refuses_a_change_naming_each_field_old_and_new_and_both_ways_on():
    with pytest.raises(FingerprintChanged) as e:
        bind(DOC, NEW, persisted=5, attempt="a2", uri="file:///out")
    msg = str(e.value)
    assert 'target.model: "test/model" -> "moonshotai/kimi-k2.5"' in msg
    assert "api.sampling.temperature: unset -> 0.2" in msg
    assert "change output.uri" in msg
    assert "--accept-changed target.model api.sampling.temperature" in msg
    assert e.value.exit_code == 2
    # accepting one field leaves the other refused, and only that one is named
    with pytest.raises(FingerprintChanged) as e:
        bind(DOC, NEW, persisted=5, attempt="a2", accept=["target.model"])
    assert [c.field for c in e.value.refused] == ["api.sampling.temperature"]


def test_bind_accepts_by_field_prefix_or_by_the_new_id_and_keeps_the_history():
    by_fields = bind(DOC, NEW, persisted=5, attempt="a2", accept=["target.model", "api.sampling"])
    by_id = bind(DOC, NEW, persisted=5, attempt="a2", accept_id=NEW.id)
    for b in (by_fields, by_id):
        assert b.kind == "accepted" and b.previous == OLD.id
        assert b.doc["current"] == NEW.id and set(b.doc["fingerprints"]) == {OLD.id, NEW.id}
        entry = b.doc["fingerprints"][NEW.id]
        assert entry["accepted"] == ["target.model", "api.sampling.temperature"] and entry["previous"] == OLD.id
    assert "kept and labelled" in by_fields.note()


def test_accept_names_must_be_fingerprint_fields():
    with pytest.raises(InputError, match=r"budget\.maxUSD is not a fingerprint field"):
        bind(DOC, NEW, persisted=5, attempt="a2", accept=["budget.maxUSD"])


def test_an_output_without_a_fingerprint_but_with_records_is_refused_field_by_field():
    with pytest.raises(FingerprintChanged) as e:
        bind(None, OLD, persisted=3, attempt="a2")
    # generation.answers is left out while it is `regenerate`: absent on both sides, it is no change
    assert {c.field for c in e.value.refused} == set(FIELDS) - {"generation.answers"}
    assert "(not recorded)" in str(e.value)


def test_bought_answers_fingerprint_as_before_the_dataset_answers_field_existed():
    fields = fingerprint(spec_of()).fields
    assert "generation.answers" not in fields
    assert fingerprint(spec_of(**{"generation.answers": "dataset"})).fields["generation.answers"] == "dataset"


def test_fingerprint_ids_are_stable_text():
    fp = Fingerprint({"target.model": "m"})
    assert fp.id == Fingerprint({"target.model": "m"}).id and len(fp.id) == 12
    assert fp.to_json() == {"id": fp.id, "fields": {"target.model": "m"}}


# --------------------------------------------------------------------------------- runs (real HTTP)


def _run(spec: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EYRIE_API_KEY": API_KEY, "EYRIE_NO_RAY": "1"}
    return subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "run", str(spec), "--no-progress", *args],
                          capture_output=True, text=True, env=env, timeout=300)


def _edit(path: Path, tmp_path: Path, **over) -> Path:
    doc = yaml.safe_load(path.read_text())
    for dotted, value in over.items():
        node = doc["spec"]
        *head, last = dotted.split(".")
        for k in head:
            node = node.setdefault(k, {})
        node[last] = value
    return write_spec(tmp_path, doc)


@pytest.mark.integration
def test_a_changed_spec_is_refused_before_anything_is_sent_then_an_accepted_change_labels_new_answers(tmp_path):
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(8))
    out = f"file://{tmp_path}/out"
    with SimulatorProcess(SimulatorConfig()) as sim:
        first = write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, extra={"api.sampling.temperature": 1.0}))
        r = _run(first)
        assert r.returncode == 0, r.stderr[-3000:]
        before = sim.stats()["requests"]
        old_id = json.loads(open_store(out).get(layout.FINGERPRINT))["current"]
        prog1 = progress(open_store(out))
        write_rows(prompts, simple_rows(12))  # four more rows: a resume would send them
        changed = _edit(first, tmp_path, **{"target.model": "moonshotai/kimi-k2.5", "api.sampling.temperature": 0.2})

        r = _run(changed)
        assert r.returncode == 2, r.stderr[-3000:]
        assert 'target.model: "test/model" -> "moonshotai/kimi-k2.5"' in r.stderr
        assert "api.sampling.temperature: 1.0 -> 0.2" in r.stderr
        assert "Nothing was sent" in r.stderr and "change output.uri" in r.stderr
        assert "--accept-changed target.model api.sampling.temperature" in r.stderr
        assert "Traceback" not in r.stderr
        assert sim.stats()["requests"] == before  # refused: not one request, not even the audit's
        assert progress(open_store(out)) == prog1 and len(persisted(open_store(out))) == 8

        r = _run(changed, "--accept-changed", "target.model")  # half an acceptance is a refusal
        assert r.returncode == 2 and "api.sampling.temperature: 1.0 -> 0.2" in r.stderr
        assert "target.model:" not in r.stderr.split("these fields changed:")[1]
        assert sim.stats()["requests"] == before

        r = _run(changed, "--accept-changed", "target.model", "api.sampling")
        assert r.returncode == 0, r.stderr[-3000:]
        assert sim.stats()["requests"] == before + 4  # the earlier 8 answers are reused, not resent
    recs = persisted(open_store(out))
    new_id = json.loads(open_store(out).get(layout.FINGERPRINT))["current"]
    assert new_id != old_id
    labels = Counter((r["fingerprint"], r["request"]["model"], r["request"].get("temperature")) for r in recs)
    assert labels == {(old_id, "test/model", 1.0): 8, (new_id, "moonshotai/kimi-k2.5", 0.2): 4}
    said = " ".join(r.stderr.split())  # the summary wraps at 100 columns
    assert "resumed attempt 2: reused 8 answers" in said and "this attempt paid $" in said
    assert f"earlier ones keep {old_id}" in said
    # the manifest says what the records say: two models, per fingerprint counts and sampling
    manifest = json.loads(open_store(out).get(layout.MANIFEST))
    assert manifest["model"] is None and manifest["models"] == {"test/model": 8, "moonshotai/kimi-k2.5": 4}
    fps = manifest["fingerprints"]
    assert (fps[old_id]["done"], fps[new_id]["done"]) == (8, 4)
    assert fps[new_id]["sampling"] == [{"request": {"max_tokens": 256, "temperature": 0.2}, "records": 4}]
    assert fps[old_id]["models"] == {"test/model": 8}
    assert Decimal(fps[old_id]["paidUSD"]) + Decimal(fps[new_id]["paidUSD"]) == Decimal(manifest["paidUSD"])
    prog = progress(open_store(out))
    assert prog["fingerprint"] == {"id": new_id, "previous": old_id,
                                   "accepted": ["target.model", "api.sampling.temperature"]}
    assert prog["resume"]["attempt"] == 2 and prog["resume"]["reusedAnswers"] == 8
    assert prog["resume"]["requests"] == 4 and Decimal(prog["resume"]["paidUSD"]) == Decimal(fps[new_id]["paidUSD"])


@pytest.mark.integration
def test_a_budget_or_concurrency_change_resumes_without_asking(tmp_path):
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(6))
    out = f"file://{tmp_path}/out"
    with SimulatorProcess(SimulatorConfig()) as sim:
        first = write_spec(tmp_path, spec_doc(prompts, out, sim.base_url))
        assert _run(first).returncode == 0
        write_rows(prompts, simple_rows(9))
        again = _edit(first, tmp_path, **{"budget.maxUSD": "7.00", "api.maxConcurrency": 2, "generation.shards": 5})
        r = _run(again)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len({x["fingerprint"] for x in persisted(open_store(out))}) == 1
    assert len(persisted(open_store(out))) == 9
