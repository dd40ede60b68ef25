"""What a run's output store says, as the operator reads it on each pass: progress.json, whether a manifest that
closes the run exists (and the report), how many extraction pods have finished, the bound fingerprint and the
pilot's verdict. Synchronous (the store's clients are): `handlers.observe` runs it in a thread."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from eyrie.jobs.contract import layout
from eyrie.jobs.contract.fingerprint import read_doc as read_fingerprint
from eyrie.jobs.contract.pilot import read_verdict
from eyrie.jobs.contract.progress import Outcome, Progress, load_progress
from eyrie.jobs.spec import DatasetGenerationSpec
from eyrie.jobs.store import NotFound, Store

from . import children
from .observed import pilot_judgement
from .reconcile import PilotJudgement


@dataclass(frozen=True)
class OutputState:
    progress: Progress | None
    manifest_url: str | None
    summaries: int
    extraction_bytes: int
    fidelity: dict[str, Any] | None = None
    report_url: str | None = None
    fingerprint: dict[str, Any] | None = None
    pilot: PilotJudgement | None = None


def read_output(store: Store, spec: DatasetGenerationSpec) -> OutputState:
    """progress.json, whether a complete manifest (and the report) exists, how many pods have finished."""
    prog = load_progress(store)  # ProgressError, a JSON error: the caller says the output is unreadable
    manifest_url, nbytes, fidelity = None, 0, None
    try:
        manifest = orjson.loads(store.get(layout.MANIFEST))
        # with extraction on, only a manifest that includes it closes the run
        if not spec.extraction.enabled or manifest.get("extraction"):
            manifest_url = store.url(layout.MANIFEST)
            nbytes = int((manifest.get("extraction") or {}).get("bytes") or 0)
            fidelity = manifest.get("fidelity")
    except NotFound:
        pass
    summaries = 0
    if spec.extraction.enabled and prog is not None and prog.outcome == Outcome.DONE:
        n = children.extraction_count(spec)
        summaries = sum(1 for i in range(n) if store.exists(layout.summary_key(i, n)))
    report_url = store.url(layout.REPORT) if store.exists(layout.REPORT) else None
    pilot = pilot_judgement(read_verdict(store), spec) if spec.pilot is not None else None
    return OutputState(prog, manifest_url, summaries, nbytes, fidelity, report_url, read_fingerprint(store), pilot)
