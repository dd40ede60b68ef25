"""`eyrie report OUTPUT [--html FILE]`: arguments in, the report's tables (and page) out."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from eyrie.jobs.errors import InputError
from eyrie.jobs.report import collect
from eyrie.jobs.report.terminal import console_for, print_report
from eyrie.jobs.store import open_store


def report_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="eyrie report", description="What a run bought: spend, samples, tool "
                                 "semantics, the audit, reconstruction, extraction and fidelity.")
    ap.add_argument("output", help="the run's output (file://, a path or s3://; S3 via EYRIE_S3_* env)")
    ap.add_argument("--html", metavar="FILE", help="also write the report as one self-contained HTML page")
    ap.add_argument("--endpoint", help="S3 endpoint (default: $EYRIE_S3_ENDPOINT)")
    args = ap.parse_args(argv)
    store = open_store(args.output, args.endpoint)
    data = collect(store)
    if data.progress is None and data.manifest is None and data.audit is None:
        raise InputError(f"{store.uri}: no progress.json, manifest.json or audit.json there; is this a run's output?")
    print_report(data, console_for())
    if args.html:
        from eyrie.jobs.report.html import render

        path = Path(args.html)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(data), encoding="utf-8")
        Console(stderr=True).print(f"report written to {path}", markup=False)
    return 0
