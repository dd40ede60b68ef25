"""`eyrie run | validate | crd`: the run's stages end to end, and the manifest that closes a run."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from eyrie.jobs import records
from eyrie.jobs.coordinator import Outcome
from eyrie.jobs.spec import DatasetGeneration, DatasetGenerationSpec, load_spec
from eyrie.jobs.store import NotFound, Store, open_output

EXIT_CODES = {Outcome.DONE: 0, Outcome.FAILED: 1, Outcome.BUDGET_EXHAUSTED: 3,
              Outcome.TOOL_SEMANTICS_DRIFT: 4, Outcome.INSUFFICIENT_CREDITS: 5, Outcome.STOPPED: 6}
STAGES = ("generate", "samples", "all")
SAMPLES_SUMMARY = "samples/summary.json"

err = Console(stderr=True)


class ProgressBar:
    """done/total, $ spent vs budget, requests/s, retries and errors, live on the terminal."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._p = Progress(
            TextColumn("[bold]generating"), BarColumn(), MofNCompleteColumn(),
            TextColumn("${task.fields[spent]} / ${task.fields[budget]}"),
            TextColumn("{task.fields[rps]:.1f} req/s"),
            TextColumn("retries {task.fields[retries]}"), TextColumn("errors {task.fields[errors]}"),
            TimeElapsedColumn(), console=err, transient=False, disable=not enabled)
        self._t0: float | None = None  # the first update: sending starts after preflight
        self._task = self._p.add_task("gen", total=None, spent="0", budget="?", rps=0.0, retries=0, errors=0)

    def __enter__(self) -> ProgressBar:
        self._p.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._p.__exit__(*exc)

    def update(self, snap: dict) -> None:
        s = snap["samples"]
        finished = s["done"] + s["dropped"] + s["failed"]
        if self._t0 is None:
            self._t0 = time.monotonic()
        rps = snap.get("requests", 0) / max(1e-3, time.monotonic() - self._t0)  # this attempt's requests
        self._p.update(self._task, total=s["total"], completed=finished, spent=snap["spentUSD"],
                       budget=snap["maxUSD"], rps=rps, retries=snap.get("retries", 0),
                       errors=sum(snap.get("errors", {}).values()))


def _read_json(store: Store, key: str) -> Any:
    try:
        return orjson.loads(store.get(key))
    except NotFound:
        return None


def finalize_manifest(spec: DatasetGenerationSpec, store: Store) -> dict:
    """Write manifest.json from what the stages left in the store (callable by the operator)."""
    progress = _read_json(store, records.PROGRESS) or {}
    keys = store.list()
    from eyrie.jobs.extract.summary import summarize  # torch-free: the operator calls this too

    extraction = summarize(store)
    pods = sum(1 for k in keys if k.startswith(f"{records.HIDDEN}/summary-"))
    manifest = {
        "apiVersion": "eyrie.dev/v1alpha1",
        "kind": "DatasetManifest",
        "specHash": spec.spec_hash(),
        "model": spec.target.model,
        "attempt": progress.get("attempt"),
        "spentUSD": progress.get("spentUSD"),
        "samples": progress.get("samples"),
        "tokens": progress.get("tokens"),
        "tools": progress.get("tools"),
        "reconstruction": _read_json(store, SAMPLES_SUMMARY),
        "extraction": {**extraction.to_manifest(), "pods": pods} if extraction else None,
        "files": {
            "generations": [k for k in keys if records.parse_part_key(k)],
            "samples": [k for k in keys if k.startswith(f"{records.SAMPLES}/shard-")],
            "hidden": [k for k in keys if k.startswith(f"{records.HIDDEN}/") and "summary-" not in k],
        },
        "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    store.put(records.MANIFEST, orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    return manifest


def run_stages(dg: DatasetGeneration, until: str = "all", *, progress: bool = True,
               inline: bool = False) -> tuple[str, str]:
    """generate -> samples (needs target.tokenizer) -> extract (needs extraction.enabled)."""
    from eyrie.jobs.generate import resolve_attempt, run_generation, write_progress

    spec = dg.spec
    store = open_output(spec)
    attempt = resolve_attempt()
    if spec.tools.mode == "text":
        print("eyrie: warning: tools.mode is text: functions reach the model only as prompt text, not as "
              "the API's `tools`; the model may call them less often or differently than it natively "
              "would. Use it for comparisons (`eyrie audit`), not for a dataset.", file=sys.stderr)
    if spec.tools.mode == "audit" and not store.exists(records.AUDIT):
        from eyrie.jobs.audit import AuditError, print_table, run_audit

        try:
            doc = run_audit(dg, spec.tools.gate.canary_samples)
            if progress:
                print_table(doc)
        except AuditError as e:
            print(f"eyrie: audit skipped: {e}", file=sys.stderr)
    with ProgressBar(progress) as bar:
        result = run_generation(dg, store, attempt, inline=inline, on_progress=bar.update)
    snap = {k: v for k, v in result.snapshot.items() if k not in ("outcome", "message")}
    if result.outcome != Outcome.DONE:
        write_progress(store, snap, attempt, "generate", outcome=result.outcome, message=result.message)
        return result.outcome, result.message
    stage = "generate"
    if spec.target.tokenizer and until in ("samples", "all"):
        from eyrie.jobs.samples import build_samples

        write_progress(store, snap, attempt, "samples", outcome=Outcome.RUNNING, message="")
        summary = build_samples(spec, store)
        store.put(SAMPLES_SUMMARY, orjson.dumps(summary.to_manifest(), option=orjson.OPT_INDENT_2))
        stage = "samples"
    if spec.extraction.enabled and until == "all":
        from eyrie.jobs.extract.run import run_extraction

        write_progress(store, snap, attempt, "extract", outcome=Outcome.RUNNING, message="")
        run_extraction(spec, store)
        stage = "extract"
    # "done" (and the manifest) only once every stage this spec needs has run
    needed = "extract" if spec.extraction.enabled else "samples" if spec.target.tokenizer else "generate"
    final_stage = "done" if stage == needed else stage
    write_progress(store, snap, attempt, final_stage, outcome=Outcome.DONE, message="")
    if final_stage == "done":
        finalize_manifest(spec, store)
    return Outcome.DONE, ""


def run_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="eyrie run", description="Run a DatasetGeneration spec.")
    ap.add_argument("spec", help="YAML file with a DatasetGeneration (or just its spec)")
    ap.add_argument("--until", choices=STAGES, default="all",
                    help="stop after this stage (the operator runs generation with --until samples)")
    ap.add_argument("--no-progress", action="store_true", help="no live progress bar")
    ap.add_argument("--inline", action="store_true",
                    help="run workers in this process instead of on Ray (debugging, benchmarks)")
    args = ap.parse_args(argv)
    dg = load_spec(args.spec)
    from eyrie.jobs.generate import PreflightError

    try:
        outcome, message = run_stages(dg, args.until, progress=not args.no_progress and err.is_terminal,
                                      inline=args.inline)
    except PreflightError as e:
        print(f"eyrie: cannot start: {e}", file=sys.stderr)
        return 2
    store = open_output(dg.spec)
    prog = _read_json(store, records.PROGRESS) or {}
    s = prog.get("samples", {})
    print(f"outcome: {outcome}  samples done {s.get('done')}/{s.get('total')} "
          f"(dropped {s.get('dropped')}, failed {s.get('failed')})  spent ${prog.get('spentUSD')} "
          f"of ${prog.get('maxUSD')}  output {store.uri}", file=sys.stderr)
    if message:
        print(f"why: {message}", file=sys.stderr)
    return EXIT_CODES.get(outcome, 1)


def validate_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="eyrie validate", description="Check a spec; name what is wrong.")
    ap.add_argument("spec")
    args = ap.parse_args(argv)
    dg = load_spec(args.spec)
    print(f"{args.spec}: valid DatasetGeneration {dg.metadata.name!r} "
          f"({len(dg.spec.sources)} sources, budget ${dg.spec.budget.max_usd}, output {dg.spec.output.uri})")
    return 0


def crd_main(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="eyrie crd", description="Print the CRD generated from the spec model.") \
        .parse_args(argv)
    from eyrie.jobs.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0
