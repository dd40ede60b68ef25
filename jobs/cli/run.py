"""`eyrie run | validate | crd` and `eyrie audit`: arguments in, a progress bar and a summary out."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import layout
from eyrie.jobs.contract.progress import Outcome, read_progress
from eyrie.jobs.pipeline import UNTIL, provider, run_stages
from eyrie.jobs.spec import load_spec
from eyrie.jobs.store import Store, open_output

EXIT_CODES = {Outcome.DONE: 0, Outcome.FAILED: 1, Outcome.BUDGET_EXHAUSTED: 3,
              Outcome.TOOL_SEMANTICS_DRIFT: 4, Outcome.INSUFFICIENT_CREDITS: 5, Outcome.STOPPED: 6,
              Outcome.TEMPLATE_MISMATCH: 7, Outcome.FORECAST_OVER_BUDGET: 8}

err = Console(stderr=True)


class ProgressBar:
    """done/total, $ spent vs budget, requests/s, retries and errors, live on the terminal."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._p = Progress(
            TextColumn("[bold]generating"), BarColumn(), MofNCompleteColumn(),
            TextColumn("${task.fields[spent]} / ${task.fields[budget]}"),
            TextColumn("forecast ${task.fields[forecast]}"),
            TextColumn("{task.fields[rps]:.1f} req/s"),
            TextColumn("retries {task.fields[retries]}"), TextColumn("errors {task.fields[errors]}"),
            TimeElapsedColumn(), console=err, transient=False, disable=not enabled)
        self._t0: float | None = None  # the first update: sending starts after preflight
        self._task = self._p.add_task("gen", total=None, spent="0", budget="?", forecast="?", rps=0.0, retries=0,
                                      errors=0)

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
                       budget=snap["maxUSD"], forecast=snap.get("forecastUSD", "?"), rps=rps,
                       retries=snap.get("retries", 0), errors=sum(snap.get("errors", {}).values()))


def run_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="eyrie run", description="Run a DatasetGeneration spec.")
    ap.add_argument("spec", help="YAML file with a DatasetGeneration (or just its spec)")
    ap.add_argument("--until", choices=UNTIL, default="all",
                    help="stop after this stage (the operator runs generation with --until samples)")
    ap.add_argument("--no-progress", action="store_true", help="no live progress bar")
    ap.add_argument("--inline", action="store_true",
                    help="run workers in this process instead of on Ray (debugging, benchmarks); "
                         "EYRIE_NO_RAY=1 does the same")
    args = ap.parse_args(argv)
    dg = load_spec(args.spec)
    ctx = RunContext.from_env()
    inline = args.inline or os.environ.get("EYRIE_NO_RAY") == "1"
    if dg.spec.generation.ray.mode == "Local" and not os.environ.get("RAY_ADDRESS"):
        # the private loopback cluster of a local run needs no auth token (DESIGN §9)
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    show = not args.no_progress and err.is_terminal
    with ProgressBar(show) as bar:
        outcome, message = run_stages(dg, ctx, args.until, inline=inline, on_progress=bar.update,
                                      notify=lambda msg: err.print(f"eyrie: {msg}", markup=False),
                                      on_audit=print_table if show else None)
    store = open_output(dg.spec)
    prog = read_progress(store) or {}
    s = prog.get("samples", {})
    print(f"outcome: {outcome}  samples done {s.get('done')}/{s.get('total')} "
          f"(dropped {s.get('dropped')}, failed {s.get('failed')})  spent ${prog.get('spentUSD')} "
          f"of ${prog.get('maxUSD')}  output {store.uri}", file=sys.stderr)
    variants = prog.get("templateVariants")
    if variants and variants.get("byProvider"):
        chosen = ", ".join(f"{p}: {c['variant']} ({c['how']}, {c['answers']} counted"
                           + (f"; thinking {'on' if c['thinking'] else 'off'} where the request did not say"
                              if isinstance(c.get("thinking"), bool) else "") + ")"
                           for p, c in variants["byProvider"].items())
        print(f"template variant of {variants['format']} per provider: {chosen}", file=sys.stderr)
    if message:
        print(f"why: {message}", file=sys.stderr)
    if prog:
        try:
            _report(store)
        except Exception as e:  # a by-product: its failure must not change the run's exit code
            print(f"report not written: {type(e).__name__}: {e} (retry with `eyrie report {store.uri} --html "
                  "FILE`)", file=sys.stderr)
    return EXIT_CODES.get(outcome, 1)


def _report(store: Store) -> None:
    """The one-screen summary, and the full report written beside the manifest."""
    from eyrie.jobs.report import collect, publish
    from eyrie.jobs.report.terminal import print_report

    data = collect(store)
    # a log file gets whole tables, not ones squeezed into 80 columns
    print_report(data, err if err.is_terminal else Console(stderr=True, width=160), full=False)
    # plain print: a wrapped URL cannot be clicked or copied
    print(f"report: {publish(store, data)}  (tables again: eyrie report {store.uri})", file=sys.stderr)


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


def print_table(doc: dict[str, Any]) -> None:
    from eyrie.jobs.report.terminal import audit_table

    Console().print(audit_table(doc))


def audit_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="eyrie audit", description="The same tool-declaring prompts sent with "
                                 "tools as text and as the API's `tools`, side by side.")
    ap.add_argument("spec")
    ap.add_argument("--samples", type=int, default=50, help="tool-declaring prompts to send both ways")
    args = ap.parse_args(argv)
    if args.samples < 1:
        print("eyrie audit: --samples must be at least 1", file=sys.stderr)
        return 2
    dg = load_spec(args.spec)
    from eyrie.jobs.generate.audit import AuditError, run_audit

    try:
        with provider(dg.spec) as base_url:
            doc = run_audit(dg, args.samples, RunContext.from_env(), base_url)
    except AuditError as e:
        print(f"eyrie audit: {e}", file=sys.stderr)
        return 2
    print_table(doc)
    print(f"spent ${doc['spentUSD']}; written to {open_output(dg.spec).url(layout.AUDIT)}", file=sys.stderr)
    if doc["outcome"] != Outcome.DONE:
        print(f"stopped early: {doc['message']}", file=sys.stderr)
        return 3
    return 0
