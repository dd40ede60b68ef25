"""The progress log off a terminal (`LiveProgress("log")`): a line at once, then one per `every_s` while the
snapshots come, never more often. The quickstart's end-to-end test sees this only when its generating lasts long
enough (a quiet machine answers its 45 prompts in under 5 s); here the clock is the test's."""

from __future__ import annotations

import io
import sys
from decimal import Decimal
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).parents[1]))
from screen import elapsed_s, progress_lines

from eyrie.jobs.cli import run as cli_run
from eyrie.jobs.contract.progress import Outcome, Progress, Stage
from eyrie.jobs.status import SampleCounts


def test_the_log_says_where_the_run_is_once_per_interval(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(cli_run.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    with cli_run.LiveProgress("log", Console(file=out, width=100), every_s=5) as log:
        for t, done in ((0, 0), (1, 3), (4.9, 9), (5.0, 10), (9.0, 20), (10.1, 25), (12, 45)):
            now[0] = 100.0 + t
            log.update(Progress(attempt="a1", stage=Stage.GENERATE, outcome=Outcome.RUNNING, max_usd=Decimal(1),
                                samples=SampleCounts(total=45, done=done)))
    lines = progress_lines(out.getvalue())
    assert [(elapsed_s(m), int(m.group(5))) for m in lines] == [(0, 0), (5, 10), (10, 25)], out.getvalue()
    assert all(m.group(6) == "45" for m in lines)
