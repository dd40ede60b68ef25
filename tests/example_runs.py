"""The README's examples as users run them: `eyrie run examples/NAME.yaml` as a process, on a copy of
examples/ (without any output of a local run: the output is written next to the spec). Each example
is run once per test session (tests/conftest.py's `example_run`): its output is shared, so a test
that writes into one works on a copy (`copy_output`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class ExampleRun(NamedTuple):
    result: subprocess.CompletedProcess
    out: Path  # the example's output folder
    seconds: float  # the process's wall time, start-up included


def run_example(base: Path, name: str, **kw) -> ExampleRun:
    """`eyrie run examples/NAME.yaml` under `base`, and the output folder; the run must succeed. Off a
    terminal, as CI runs it: its progress is the log's lines every few seconds (test_quickstart reads them)."""
    examples = shutil.copytree(ROOT / "examples", base / "examples", ignore=shutil.ignore_patterns("eyrie-out"))
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "run", str(examples / f"{name}.yaml")],
                       cwd=base, capture_output=True, text=True, timeout=900, **kw)
    assert r.returncode == 0, r.stderr[-3000:]
    return ExampleRun(r, examples / "eyrie-out" / name, time.monotonic() - start)


def copy_output(out: Path, to: Path) -> Path:
    """A private copy of a shared example's output (its report page and evaluation may be rewritten)."""
    return Path(shutil.copytree(out, to))
