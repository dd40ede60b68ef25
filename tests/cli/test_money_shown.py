"""Money as people read it (issue 32 section 3): every amount the CLI prints (the run's summary, the
provider probe's tables, the audit's verdict and tables, `eyrie report`, the report page) has at most
6 decimals, and a price per million tokens at most 4; off a terminal all of it fits 100 columns.
Real `eyrie` processes against the simulator."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from screen import AMOUNT, too_precise, too_wide

pytestmark = pytest.mark.integration  # tier (tests/conftest.py): `eyrie` as a process against the simulator

ROOT = Path(__file__).resolve().parents[2]


def test_too_precise_finds_what_it_should():
    assert too_precise("spent $0.0183648; $/answer 0.0003304125; $3.739842 per million") == [
        "$0.0183648", "$3.739842 per million", "0.0183648", "0.0003304125"]
    assert too_precise("spent $0.018365 of $1.00; $3.7398 per million; 84.9%, 1.743") == []
    url = "report: file:///tmp/" + "x" * 100 + "/report.html"
    assert too_wide(f"{'y' * 100}\n{url}\n{'z ' * 60}") == [("z " * 60).rstrip() + " "]


def eyrie(*args: str, cwd: Path) -> str:
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", *args], capture_output=True, text=True, cwd=cwd,
                       timeout=900)
    assert r.returncode == 0, (args, r.stderr[-3000:])
    return r.stdout + r.stderr


def test_every_amount_the_cli_prints_has_at_most_six_decimals(tmp_path):
    examples = shutil.copytree(ROOT / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("eyrie-out"))
    spec = str(examples / "quickstart-providers.yaml")  # probe prices and costs with 7-10 decimals
    out = examples / "eyrie-out" / "quickstart-providers"
    said = {
        "providers": eyrie("providers", spec, "--samples", "4", cwd=tmp_path),
        "run": eyrie("run", spec, "--until", "samples", "--no-progress", "--verbose", cwd=tmp_path),
        "audit": eyrie("audit", spec, "--samples", "4", cwd=tmp_path),
        "report": eyrie("report", str(out), cwd=tmp_path),
    }
    flat = {command: " ".join(text.split()) for command, text in said.items()}  # as read, not as wrapped
    assert "provider probe" in flat["providers"] and "provider probe" in flat["run"]
    assert "audit verdict" in flat["audit"] and "per million trained tokens" in flat["report"]
    for command, text in said.items():
        assert AMOUNT.search(text), command
        assert too_precise(flat[command]) == [], command
        # off a terminal every table fits 100 columns, its cells wrapped, never cut
        assert too_wide(text) == [] and "…" not in text, (command, too_wide(text))
    page = (out / "report.html").read_text()
    shown = re.sub(r"<script.*?</script>", "", page, flags=re.S)  # the plots' data are numbers, not text
    assert AMOUNT.search(shown) and too_precise(shown) == []

    from eyrie.jobs.report import collect
    from eyrie.jobs.report.html import figures
    from eyrie.jobs.store import open_store

    for _section, title, fig in figures(collect(open_store(f"file://{out}"))):  # what a plot writes as text
        labels = [title, *(t.name or "" for t in fig.data)]
        assert too_precise(" ".join(labels)) == [], labels
        if fig.layout.yaxis.tickprefix == "$":  # dollars on hover: at most 6 decimals too
            assert fig.layout.yaxis.hoverformat == ",.6~f", title
