"""progress.json as one typed document: the driver writes `contract.progress.Progress`, and the CLI, the report
and the operator read the same model; the sample counts have one definition (`SampleCounts`), the status's too."""

from __future__ import annotations

import pickle
import sys
from decimal import Decimal
from pathlib import Path

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from fault_helpers import simple_rows, spec_doc, write_rows, write_spec

from eyrie.jobs import spec as spec_module
from eyrie.jobs.cli.run import LiveProgress, Shown
from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import layout
from eyrie.jobs.contract.progress import (
    Outcome,
    Progress,
    ProgressError,
    RunFigures,
    load_progress,
    parse_progress,
)
from eyrie.jobs.generate.budget.coordinator import Counts, RequestResult
from eyrie.jobs.generate.driver import run_generation
from eyrie.jobs.report.data import collect
from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess
from eyrie.jobs.spec import DatasetGenerationStatus, load_spec
from eyrie.jobs.status import SampleCounts
from eyrie.jobs.store import open_output


def test_the_sample_counts_have_one_definition():
    assert spec_module.SampleCounts is SampleCounts
    assert DatasetGenerationStatus.model_fields["samples"].annotation == SampleCounts | None
    assert Progress.model_fields["samples"].annotation is SampleCounts
    counts = Counts()
    for obs in (RequestResult("ok"), RequestResult("ok", policy="drop"), RequestResult("rejected"),
                RequestResult("failed", error_kind="http-500")):
        counts.add(obs)
    s = counts.samples(7)
    assert isinstance(s, SampleCounts) and s.dump() == {"total": 7, "done": 1, "rejected": 1, "discarded": 1,
                                                         "failed": 1}
    assert (s.finished, s.missing) == (4, 3)


def test_keys_another_writer_adds_are_kept():
    doc = {"attempt": "1", "outcome": "Running", "spentUSD": "0.5", "newSection": {"x": 1}}
    p = parse_progress(doc)
    assert p.model_extra == {"newSection": {"x": 1}} and p.to_json()["newSection"] == {"x": 1}


WRITTEN = sorted((Path(__file__).parents[1] / "data" / "progress").glob("*.json"))


def test_the_written_documents_are_there():
    """The byte-for-byte test below is parametrized by these files: none found would pass it silently."""
    assert {p.stem for p in WRITTEN} >= {"abandoned", "accepted", "agentic", "bad_rows", "variants"}


@pytest.mark.parametrize("path", WRITTEN, ids=[p.stem for p in WRITTEN])
def test_a_document_the_driver_wrote_reads_back_byte_for_byte(path):
    """progress.json as `eyrie run` wrote it (tests/data/progress: a template variant chosen with its forecast,
    bad rows, agentic conversations, a stop's abandoned requests, an accepted fingerprint change): every section
    typed, and written again the same bytes (nulls its writer wrote included)."""
    raw = path.read_bytes()
    p = parse_progress(orjson.loads(raw))
    assert p.model_extra == {}
    assert orjson.dumps(p.to_json(), option=orjson.OPT_INDENT_2) == raw


def test_the_sections_are_typed():
    by = {p.stem: parse_progress(orjson.loads(p.read_bytes())) for p in WRITTEN}
    v = by["variants"]
    assert v.tools.per_tool and v.tools.per_tool["get_weather"].calls == 25 and v.tools.call_rate == 0.833333
    assert v.template_variants and v.template_variants.pinned is None
    assert v.template_variants.by_provider["eyrie-simulator"].variant == "vllm"
    assert v.forecast_figures and v.forecast_figures.at_canary and v.forecast_figures.mean == v.forecast
    assert v.fingerprints and all(f.paid >= 0 for f in v.fingerprints.values())
    bad = by["bad_rows"].bad_rows
    assert bad and bad.count == 3 and [b.row for b in bad.first] == [2, 3, 4]
    assert (a := by["abandoned"].abandoned) and (a.reconciled, a.reconciled_usd) == (6, Decimal("0.001572"))
    assert (ag := by["agentic"].agentic) and ag.turns_regenerated == 24 and ag.ended == {"done": 4}
    fp = by["accepted"].fingerprint
    assert fp and fp.previous != fp.id and fp.accepted == ["target.model", "api.sampling.temperature"]
    assert (r := by["accepted"].resume) and r.attempt == 2 and r.paid is not None


@pytest.mark.parametrize("section, field", [
    ({"tools": {"callRate": "often"}}, "tools.callRate"),
    ({"tools": {"perTool": {"f": {"calls": -1}}}}, "tools.perTool.f.calls"),
    ({"forecastUSD": "1", "forecast": {"meanUSD": "1", "p90USD": "x"}}, "forecast.p90USD"),
    ({"templateVariants": {"byProvider": {"p": {"how": "detected"}}}}, "templateVariants.byProvider.p.variant"),
    ({"fingerprint": {"previous": "abc"}}, "fingerprint.id"),
    ({"resume": {"attempt": 0}}, "resume.attempt"),
    ({"fingerprints": {"abc": {"paidUSD": "lots"}}}, "fingerprints.abc.paidUSD"),
    ({"models": {"m": "many"}}, "models.m"),
    ({"badRows": {"count": 1, "first": [{"row": "second"}], "file": "f"}}, "badRows.first.0.row"),
    ({"abandoned": {"requests": 1}}, "abandoned.bookedUSD"),
    ({"agentic": {"diverged": ["otherTool"]}}, "agentic.diverged"),
])
def test_a_malformed_section_is_refused_naming_the_field(section, field):
    with pytest.raises(ProgressError, match=rf"^progress.json: {field}: "):
        parse_progress({"attempt": "1", "outcome": "Running", **section})


def test_the_coordinators_figures_are_progress_fields_and_cross_ray_pickled():
    """`RunFigures` (the coordinator's snapshot) goes into `Progress` by field name, unvalidated
    (`model_copy`, as the driver's monitor does): each field must be Progress's, holding what reading it gives."""
    assert set(RunFigures.model_fields) <= set(Progress.model_fields)
    from eyrie.jobs.generate.budget.coordinator import RunCoordinator

    snap = RunCoordinator(Decimal(1), Decimal("0.25"), Counts(), 3, [0]).snapshot()
    assert pickle.loads(pickle.dumps(snap)) == snap and snap.outcome == Outcome.RUNNING
    copied = Progress(attempt="1", outcome=Outcome.DONE).model_copy(update=dict(snap))
    doc = copied.to_json()
    assert parse_progress(doc) == copied  # what it holds is what reading it validates
    assert (doc["spentUSD"], doc["maxUSD"], doc["tools"], doc["samples"]["total"]) == ("0.25", "1", {}, 3)


@pytest.mark.integration
def test_the_driver_writes_the_model_every_reader_reads(tmp_path):
    prompts = write_rows(tmp_path / "p.jsonl", simple_rows(8, tools_every=2))
    out = f"file://{tmp_path}/out"
    seen: list[Progress] = []
    with SimulatorProcess(SimulatorConfig()) as sim:
        dg = load_spec(write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, workers=2)))
        store = open_output(dg.spec)
        result = run_generation(dg, store, RunContext("p1"), sim.base_url, inline=True, on_progress=seen.append)
    doc = orjson.loads(store.get(layout.PROGRESS))
    written = parse_progress(doc)
    assert written.model_extra == {}, sorted(written.model_extra or {})  # every key the driver writes is typed
    assert written.to_json() == doc  # and read back as written, every digit
    assert written == load_progress(store) and result.snapshot.samples == written.samples
    assert written.samples == SampleCounts(total=8, done=8)
    assert seen and all(isinstance(p, Progress) for p in seen) and seen[-1].samples == written.samples
    with LiveProgress("off") as live:  # the CLI's bar and log read the same snapshots
        for p in seen:
            live.update(p)
    assert Shown.of(seen[-1]).finished == written.samples.finished == 8
    assert collect(store).samples == written.samples  # and the report
