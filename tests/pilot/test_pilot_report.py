"""The pilot in the report: its verdict row (ok passed, warn not passed and went on, bad suspended) and its
page section (each option's drafter, the difference to the run's own, the whole dataset's cost, the command
that switches), opened in headless Chromium."""

from __future__ import annotations

import io
import json
from decimal import Decimal
from pathlib import Path

import pytest
from rich.console import Console

from eyrie.jobs.contract.pilot import Option, PilotVerdict, write_verdict
from eyrie.jobs.intervals import Estimate
from eyrie.jobs.pilot.verdict import Measured, decide
from eyrie.jobs.report import collect, publish
from eyrie.jobs.report.terminal import print_report
from eyrie.jobs.report.verdict import verdict
from tests.report.test_report import READY, _full_store, find_browser, open_page


def pilot_verdict(own_len: float, policy: str) -> PilotVerdict:
    measured = [Measured(Option.TEXT, Estimate(own_len, own_len - 0.2, own_len + 0.2, 40), 160, Decimal("12.5")),
                Measured(Option.STRUCTURED, Estimate(4.75, 4.5, 5.0, 40), 160, Decimal("11.75"))]
    diff = Estimate(4.75 - own_len, 4.75 - own_len - 0.3, 4.75 - own_len + 0.3, 40)
    return decide(key="k", own=Option.TEXT, measured=measured, minus_own={Option.STRUCTURED: diff}, policy=policy,
                  margin=0.25, prompts=200, heldout=40, spent_usd=Decimal("0.125"), adopted=200,
                  evaluation="pilot/structured/evaluation.json", name="demo")


@pytest.mark.unit
@pytest.mark.parametrize("own_len,policy,status", [(5.0, "require", "ok"), (2.0, "report", "warn"),
                                                   (2.0, "require", "bad")])
def test_the_pilot_row_says_what_the_pilot_decided(tmp_path, own_len, policy, status):
    store = _full_store(tmp_path / "out")
    write_verdict(store, pilot_verdict(own_len, policy))
    data = collect(store)
    line = {v.key: v for v in verdict(data)}["pilot"]
    assert line.status == status and all(f in line.text for f in line.figures.values())
    assert line.figures["own"] == f"{own_len:.3f}" and line.figures["best"] == "4.750"
    assert "the pilot's answers cost $0.125" in line.text
    console = Console(record=True, width=240, file=io.StringIO())
    print_report(data, console)
    assert "The pilot" in console.export_text()


PILOT = """JSON.stringify({
  order: ['verdict', 'sample', 'pilot', 'acceptance'].map(id => (document.getElementById(id) ||
    {getBoundingClientRect: () => ({top: -1})}).getBoundingClientRect().top),
  line: (l => ({status: l.className, text: l.querySelector('dd').textContent}))(
    document.querySelector("#verdict [data-line='pilot']")),
  sentence: document.querySelector('#pilot p.verdict').textContent,
  patch: (document.querySelector('#pilot code.patch') || {}).textContent || '',
  rows: Array.from(document.querySelectorAll('#pilot tr[data-option]')).map(r => ({
    option: r.dataset.option, own: r.dataset.own, cells: Array.from(r.cells).map(c => c.textContent)})),
})"""


@pytest.mark.integration
def test_the_pilot_section_renders_in_chromium(tmp_path):
    if find_browser() is None:
        pytest.fail("headless chromium is needed for this test (hack/test-deps.sh installs Debian's `chromium`)")
    store = _full_store(tmp_path / "out")
    v = pilot_verdict(2.0, "require")
    write_verdict(store, v)
    page = Path(publish(store).removeprefix("file://"))
    result = open_page(page, PILOT, READY)
    assert result.errors == [], result.errors
    got = json.loads(result.value)
    verdict_top, sample_top, pilot_top, acceptance_top = got["order"]
    assert verdict_top < sample_top < pilot_top and acceptance_top == -1  # no evaluation.json in this store
    assert got["line"]["status"] == "bad" and "failed, the run suspended" in got["line"]["text"]
    assert got["sentence"] == v.sentence and got["patch"] == v.patch and v.patch.startswith("kubectl patch dsg demo")
    assert [(r["option"], r["own"]) for r in got["rows"]] == [("text", "true"), ("structured", "false")]
    text, structured = (r["cells"] for r in got["rows"])
    assert text[2] == "2.00 [1.80, 2.20]" and text[3] == "-" and text[5] == "$12.50"
    assert structured[2] == "4.75 [4.50, 5.00]" and structured[3] == "+2.75 [+2.45, +3.05]"
    assert structured[4] == "yes" and structured[5] == "$11.75"
