"""`eyrie run | validate | crd` and `eyrie audit`: arguments in, a progress bar and a summary out."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from eyrie.jobs.cli.screen import fitted, print_audit
from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import progress
from eyrie.jobs.contract.money import dollars
from eyrie.jobs.contract.pilot import EXIT_FAILED
from eyrie.jobs.contract.progress import Outcome, ProgressError, load_progress
from eyrie.jobs.contract.tally import describe_bad_row
from eyrie.jobs.pipeline import UNTIL, run_stages
from eyrie.jobs.spec import load_spec
from eyrie.jobs.store import Store, open_output
from eyrie.jobs.timeline import Timeline

EXIT_CODES = {Outcome.DONE: 0, Outcome.FAILED: 1, Outcome.BUDGET_EXHAUSTED: 3,
              Outcome.TOOL_SEMANTICS_DRIFT: 4, Outcome.INSUFFICIENT_CREDITS: 5, Outcome.STOPPED: 6,
              Outcome.TEMPLATE_MISMATCH: 7, Outcome.FORECAST_OVER_BUDGET: 8, Outcome.NO_PROVIDER_PASSES: 9,
              Outcome.PILOT_PASSED: 0, Outcome.PILOT_FAILED: EXIT_FAILED}

err = Console(stderr=True)


PROGRESS_LOG_EVERY_S = 5.0  # off a terminal: one progress line this often (a CI log's progress bar)


@dataclass(frozen=True)
class Shown:
    """What the live progress shows of a snapshot: one reading for the bar and the log alike."""

    stage: str  # generating | probing providers | pilot: STEP
    total: int | None
    finished: int
    requests: int  # sent by this stage of this attempt
    spent: str
    budget: str
    forecast: str | None
    retries: int
    errors: int

    @classmethod
    def of(cls, snap: progress.Progress) -> Shown:
        probe = snap.probe  # only in the probe stage's snapshots
        pilot = snap.pilot if snap.stage == progress.Stage.PILOT else None
        if probe:
            total, finished, requests = probe.planned, probe.answers, probe.requests
        elif pilot:
            total, finished, requests = pilot.planned, pilot.answers, 0
        else:  # this attempt's requests
            total, finished, requests = snap.samples.total, snap.samples.finished, snap.requests
        stage = "probing providers" if probe else f"pilot: {pilot.step}" if pilot else "generating"
        return cls(stage, total, finished, requests, dollars(snap.spent),
                   dollars(snap.max_usd) if snap.max_usd is not None else "?",
                   dollars(snap.forecast) if snap.forecast else None, snap.retries, sum(snap.errors.values()))


class LiveProgress:
    """done/total, $ spent vs budget, requests/s, retries and errors while a run sends: a live bar on
    a terminal (`bar`), one line every `PROGRESS_LOG_EVERY_S` off one (`log`: a file or a CI log gets
    no bar's control codes), or nothing. While the provider probe sends (progress.json at stage
    probe), its answers of those its verdict needs."""

    def __init__(self, mode: str, console: Console = err, every_s: float = PROGRESS_LOG_EVERY_S):
        self.mode, self.console, self.every_s = mode, console, every_s
        self._p = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[spent]} / {task.fields[budget]}"),
            TextColumn("forecast {task.fields[forecast]}"),
            TextColumn("{task.fields[rps]:.1f} req/s"),
            TextColumn("retries {task.fields[retries]}"), TextColumn("errors {task.fields[errors]}"),
            TimeElapsedColumn(), console=console, transient=False, disable=mode != "bar")
        self._start = time.monotonic()
        self._t0: float | None = None  # the stage's first update: sending starts after preflight
        self._logged = -every_s  # the first snapshot is logged at once
        self._stage = ""
        self._task = self._p.add_task("generating", total=None, spent="$0", budget="?", forecast="?", rps=0.0,
                                      retries=0, errors=0)

    def __enter__(self) -> LiveProgress:
        self._p.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._p.__exit__(*exc)

    def update(self, snap: progress.Progress) -> None:
        s = Shown.of(snap)
        now = time.monotonic()
        if s.stage != self._stage:  # each stage's bar and request rate from its own start
            self._stage, self._t0 = s.stage, now
            self._p.reset(self._task, description=s.stage)
        rps = s.requests / max(1e-3, now - (self._t0 or now))
        if self.mode == "bar":
            self._p.update(self._task, total=s.total, completed=s.finished, spent=s.spent, budget=s.budget,
                           forecast=s.forecast or "?", rps=rps, retries=s.retries, errors=s.errors)
        elif self.mode == "log" and now - self._logged >= self.every_s:
            self._logged = now
            print(log_line(s, rps, now - self._start), file=self.console.file, flush=True)


def log_line(s: Shown, rps: float, elapsed_s: float) -> str:
    """"eyrie: 0:00:05 generating 20/45 done, spent $0.004512 of $1.00, 3.2 req/s, forecast ...":
    what the bar shows, in at most `WIDTH` columns (the figures after the rate as they fit)."""
    from eyrie.jobs.report.text import WIDTH

    m, sec = divmod(int(elapsed_s), 60)
    line = (f"eyrie: {m // 60}:{m % 60:02d}:{sec:02d} {s.stage} {s.finished}/{s.total if s.total is not None else '?'}"
            f" done, spent {s.spent} of {s.budget}, {rps:.1f} req/s")
    for more in ([f"forecast {s.forecast}"] if s.forecast else []) + [f"retries {s.retries}", f"errors {s.errors}"]:
        if len(line) + 2 + len(more) > WIDTH:
            break
        line += f", {more}"
    return line


def run_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="eyrie run", description="Run a DatasetGeneration spec.")
    ap.add_argument("spec", help="YAML file with a DatasetGeneration (or just its spec)")
    ap.add_argument("--until", choices=UNTIL, default="all",
                    help="stop after this stage (the operator runs generation with --until samples)")
    ap.add_argument("--no-progress", action="store_true",
                    help="no live progress (a bar on a terminal, else a line every few seconds)")
    ap.add_argument("--verbose", action="store_true",
                    help="end with every table of the report (default: the summary and the verdict; the tables "
                         "are `eyrie report OUTPUT`'s), and say where the start-up's seconds went")
    ap.add_argument("--accept-changed", nargs="+", default=[], metavar="FIELD",
                    help="keep the answers the output holds although these fingerprint fields changed (a prefix "
                         "such as api.sampling names all under it); new answers are labelled with the new "
                         "fingerprint")
    ap.add_argument("--inline", action="store_true",
                    help="run workers in this process instead of on Ray (debugging, benchmarks); "
                         "EYRIE_NO_RAY=1 does the same")
    args = ap.parse_args(argv)
    timeline = Timeline()
    timeline.add("interpreter and the command's imports", timeline.origin, time.time() - timeline.origin)
    with timeline.step("the spec"):
        dg = load_spec(args.spec)
    ctx = RunContext.from_env()
    from eyrie.jobs.api.client import raise_open_files

    raise_open_files(dg.spec.api.max_concurrency)  # a socket per request in flight; Ray's workers inherit it
    inline = args.inline or os.environ.get("EYRIE_NO_RAY") == "1"
    if dg.spec.generation.ray.mode == "Local" and not os.environ.get("RAY_ADDRESS"):
        # the private loopback cluster of a local run needs no auth token (DESIGN §9)
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    store = open_output(dg.spec)
    print(f"eyrie: output {store.uri}", file=sys.stderr)
    mode = "off" if args.no_progress else "bar" if err.is_terminal else "log"
    try:
        with LiveProgress(mode) as live:
            outcome, message = run_stages(dg, ctx, args.until, inline=inline, on_progress=live.update,
                                          notify=lambda msg: err.print(f"eyrie: {msg}", markup=False),
                                          # before anything else is sent
                                          on_pilot=lambda v: _print_verdict(v),
                                          # the summary ends with the audit's verdict; its tables: --verbose
                                          on_audit=(lambda doc: print_audit(doc, err)) if args.verbose else None,
                                          accept_changed=args.accept_changed, timeline=timeline)
    except KeyboardInterrupt:  # outside generation's own handling (samples, extraction: rebuilt on resume)
        outcome, message = Outcome.STOPPED, "interrupted; run the same command again to resume"
    if args.verbose:
        print("start-up timeline (seconds since the process started; steps side by side overlap):", file=sys.stderr)
        for line in timeline.lines():
            print(line, file=sys.stderr)
    try:
        _finish(store, outcome, message, args.verbose)
    except KeyboardInterrupt:  # a Ctrl-C after the run: the summary is cut short, the outcome stands
        print(f"eyrie: interrupted; the summary and tables again: eyrie report {store.uri}", file=sys.stderr)
    return EXIT_CODES.get(outcome, 1)


def _print_verdict(verdict: Any) -> None:
    from eyrie.jobs.report.terminal import console_for, print_verdict

    print_verdict(verdict, console_for(stderr=True))


def _finish(store: Store, outcome: Outcome, message: str, verbose: bool) -> None:
    """What the run ends with: the summary's lines, then the verdict (or every table) and the page."""
    try:
        prog = load_progress(store)
    except ProgressError as e:  # the run's own document: a summary cannot be made of it, the outcome stands
        print(f"eyrie: no summary: {e}", file=sys.stderr)
        prog = None
    lines = summary_lines(prog, store.uri) if prog is not None else []
    variants = prog.template_variants if prog is not None else None
    if variants and variants.by_provider:
        chosen = ", ".join(f"{p}: {c.variant} ({c.how}, {c.answers} counted"
                           + (f"; thinking {'on' if c.thinking else 'off'} where the request did not say"
                              if c.thinking is not None else "") + ")"
                           for p, c in variants.by_provider.items())
        lines.append(f"template variant of {variants.format} per provider: {chosen}")
        lines += [f"warning: {c.message}" for c in variants.by_provider.values()
                  if c.how == "mismatch" and c.message and outcome != Outcome.TEMPLATE_MISMATCH]
    if message:
        lines.append(f"why: {message}")
    for line in lines:
        print(fitted(line, err.width if err.is_terminal else None), file=sys.stderr)
    if prog is not None and outcome == Outcome.STOPPED:
        # a user who stopped the run is waiting for the prompt: the verdict and the page (seconds of
        # reading every record and drawing plots) are one command away, not part of the stop
        print(f"the verdict and the report: eyrie report {store.uri} (--html FILE for the page)", file=sys.stderr)
    elif prog is not None:
        try:
            _report(store, verbose)
        except Exception as e:  # a by-product: its failure must not change the run's exit code
            print(f"report not written: {type(e).__name__}: {e} (retry with `eyrie report {store.uri} --html "
                  "FILE`)", file=sys.stderr)


def summary_lines(prog: progress.Progress, uri: str) -> list[str]:
    """The run's first lines: what happened to the samples, what the money went to, what a resume
    reused and what this attempt paid, and the rows that were never sent."""
    s = prog.samples
    discarded = (f"discarded {s.discarded} paid {dollars(prog.discarded or 0)} then excluded, "
                 if s.discarded else "")
    out = [f"outcome: {prog.outcome}  samples done {s.done}/{s.total} (rejected {s.rejected} never sent, "
           f"{discarded}failed {s.failed})  spent {dollars(prog.spent)} of {dollars(prog.max_usd or 0)}"]
    r = prog.resume
    if r is not None and r.attempt > 1:
        out.append(f"resumed attempt {r.attempt}: reused {r.reused_answers} answers "
                   f"({dollars(r.reused)}) from earlier attempts; this attempt paid "
                   f"{dollars(r.paid or 0)} for {r.requests or 0} requests")
    out += abandoned_lines(prog)
    fp = prog.fingerprint
    if fp is not None and fp.accepted:
        out.append(f"fingerprint {fp.id}: new answers are labelled with it; earlier ones keep {fp.previous} "
                   f"(changed and accepted: {', '.join(fp.accepted)})")
    bad = prog.bad_rows
    if bad is not None and bad.count:
        out.append(f"{bad.count} rows never sent (bad data, not paid); the first:")
        out += [f"  {describe_bad_row(b)}" for b in bad.first]
        out.append(f"  all of them: {uri.rstrip('/')}/{bad.file}")
    return out


def abandoned_lines(prog: progress.Progress) -> list[str]:
    """After a stop that abandoned requests in flight: `report.text.abandoned_spend`'s line. Shown while
    some are only bounded, and by the attempt that booked or reconciled them."""
    a = prog.abandoned
    if a is None or not (a.unreconciled or a.this_attempt):
        return []
    from eyrie.jobs.report.text import abandoned_spend

    line = abandoned_spend(prog.paid, a.dump())  # the report's line, from the document as written
    return [line] if line else []


def _report(store: Store, verbose: bool = False) -> None:
    """The verdict (every table with `verbose`), and the full report written beside the manifest."""
    from eyrie.jobs.report import collect, publish
    from eyrie.jobs.report.terminal import console_for, print_report, summary

    data = collect(store)
    console = console_for(stderr=True)
    if verbose:
        print_report(data, console)
    else:
        console.print(Group(*summary(data)))
    # plain print: a wrapped URL cannot be clicked or copied
    print(f"report: {publish(store, data)}", file=sys.stderr)
    again, hint = f"tables: eyrie report {store.uri}", " (or eyrie run --verbose)"
    print(again + hint if not verbose and len(again + hint) <= console.width else again, file=sys.stderr)
