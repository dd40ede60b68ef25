"""progress.json as one typed document: the driver writes `contract.progress.Progress`, and the CLI, the report
and the operator read the same model; the sample counts have one definition (`SampleCounts`), the status's too."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from fault_helpers import simple_rows, spec_doc, write_rows, write_spec

from eyrie.jobs import spec as spec_module
from eyrie.jobs.cli.run import LiveProgress, Shown
from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import layout
from eyrie.jobs.contract.progress import Progress, load_progress, parse_progress
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
