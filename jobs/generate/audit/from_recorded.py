"""`eyrie audit --from FILE`: answers a user already has, checked as a run checks its own answers
and counted with the audit's figures. Nothing is sent, unless `--rerun N` buys the other tools mode
for N of the file's prompts (a seeded sample, kept in the audit's answer set like any audit answer).

Each row is read by `recorded.py`, its declarations prepared for the mode it was sent in
(`declarations.prepare_prompt`), its answer checked by `checks.check_response` (text calls read in
every format, validated like structured ones), and turned into the figures' `AnswerFact`. A row
whose functions do not parse is counted as unparsable; a row without declared functions apart.

Speed: checking an answer costs several times what reading its row does, so a file of more than
`PARALLEL_BYTES` is checked by one process per core. This process reads the lines and hands them out
in batches of `BATCH_LINES`, in file order, with at most two batches per worker in flight (memory
stays bounded whatever the file's size); each batch's tally comes back and is merged in row order,
so the result is the same as a pass in one process.
"""

from __future__ import annotations

import gc
import multiprocessing
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from eyrie.jobs import sources
from eyrie.jobs.api import reported_cost
from eyrie.jobs.context import RunContext, usable_cores
from eyrie.jobs.contract import audit as stored
from eyrie.jobs.contract import records
from eyrie.jobs.contract.progress import Outcome, now_iso
from eyrie.jobs.generate.audit import stats
from eyrie.jobs.generate.audit.recorded import RecordedRow, RowProblem, iter_lines, parse_line, recorded_path
from eyrie.jobs.generate.audit.run import (
    DEFAULT_SEED,
    MAX_PROBLEMS,
    MODES,
    AnswerSet,
    AuditError,
    Lowest,
    buy,
    declarations_of,
    examples,
    finish,
    priority,
)
from eyrie.jobs.generate.budget.pricing import Pricing, actual_cost, usd
from eyrie.jobs.spec import DatasetGeneration
from eyrie.jobs.store import open_output
from eyrie.jobs.tools import checks, declarations

BATCH_LINES = 2000
PARALLEL_BYTES = 8 << 20  # smaller files are checked in this process: starting workers would cost more


@dataclass
class Candidate:
    """A judged answer that may be bought again in the other mode (`--rerun`)."""

    sample_id: str
    prompt: sources.Prompt
    mode: str
    declared: frozenset[str]
    record: dict[str, Any]  # the recorded answer as a record (for the side-by-side examples)


@dataclass
class RecordedPass:
    """What a pass over (part of) a recorded file found; `merge` adds a later part to it."""

    rerun: int = 0
    facts: list[stats.AnswerFact] = field(default_factory=list)
    problems: list[dict[str, Any]] = field(default_factory=list)
    bad_rows: int = 0
    rows: int = 0
    no_tools: int = 0
    unparsable: list[dict[str, Any]] = field(default_factory=list)
    unparsable_rows: int = 0
    cost: Decimal = Decimal(0)
    priced: dict[str, int] = field(default_factory=lambda: {"usage": 0, "pricing": 0, "unpriced": 0})
    modes: dict[str, int] = field(default_factory=dict)
    candidates: dict[str, Lowest] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.candidates = self.candidates or {m: Lowest(self.rerun) for m in MODES}

    def merge(self, other: RecordedPass) -> None:
        self.facts += other.facts
        self.problems = (self.problems + other.problems)[:MAX_PROBLEMS]
        self.unparsable = (self.unparsable + other.unparsable)[:MAX_PROBLEMS]
        for name in ("bad_rows", "rows", "no_tools", "unparsable_rows", "cost"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for k, v in other.priced.items():
            self.priced[k] += v
        for k, v in other.modes.items():
            self.modes[k] = self.modes.get(k, 0) + v
        for m, lowest in other.candidates.items():
            for pri, item in lowest.entries():
                self.candidates[m].offer(pri, item)

    def picked(self) -> list[Candidate]:
        """The --rerun sample: text-mode answers (structured ones in a file of only those)."""
        return self.candidates["text"].items() or self.candidates["structured"].items()


@dataclass(frozen=True)
class _Job:
    """What a worker needs to check a batch (plain data: it crosses into the pool's processes)."""

    name: str
    pricing: Pricing | None
    rerun: int
    seed: int


def _cost(row: RecordedRow, pricing: Pricing | None, tally: RecordedPass) -> Decimal | None:
    reported = reported_cost(row.usage)
    cost = actual_cost(pricing, row.usage, reported)
    tally.priced["usage" if reported is not None else "pricing" if cost is not None else "unpriced"] += 1
    if cost is not None:
        tally.cost += cost
    return cost


def _add(tally: RecordedPass, item: RecordedRow | RowProblem, job: _Job) -> None:
    if isinstance(item, RowProblem):
        tally.bad_rows += 1
        if len(tally.problems) < MAX_PROBLEMS:
            tally.problems.append({"row": item.line, "error": item.error})
        return
    tally.rows += 1
    tally.modes[item.mode] = tally.modes.get(item.mode, 0) + 1
    cost = _cost(item, job.pricing, tally)
    sid = item.prompt.sample_id()
    got = declarations_of(item.prompt, item.mode)
    if isinstance(got, declarations.Rejected):
        tally.unparsable_rows += 1
        if len(tally.unparsable) < MAX_PROBLEMS:
            tally.unparsable.append({"row": item.line, "error": got.reason})
        tally.facts.append(stats.AnswerFact(sid, item.prompt.source, item.mode, "unparsable"))
        return
    if not got.names:
        tally.no_tools += 1
        return
    check = None if item.response is None else checks.check_response(got.prepared, item.response, got.validator)
    tally.facts.append(stats.fact_from_check(sid, item.prompt.source, item.mode, check, got.names, item.usage,
                                                   float(cost) if cost is not None else None))
    if job.rerun and check is not None:
        rec: dict[str, Any] = {"sample_id": sid, "source": item.prompt.source, "toolsMode": item.mode,
                               "usage": item.usage, "response": item.response,
                               "costUSD": usd(cost) if cost is not None else None, "status": "ok",
                               "checks": check.to_record()}
        tally.candidates[item.mode].offer(priority(job.seed, sid), Candidate(sid, item.prompt, item.mode, got.names,
                                                                             rec))


def _check_batch(job: _Job, batch: list[tuple[int, bytes] | RowProblem]) -> RecordedPass:
    tally = RecordedPass(job.rerun)
    for item in batch:
        _add(tally, item if isinstance(item, RowProblem) else parse_line(item[1], job.name, item[0]), job)
    return tally


def _batches(path: Path) -> Iterator[list[tuple[int, bytes] | RowProblem]]:
    batch: list[tuple[int, bytes] | RowProblem] = []
    for item in iter_lines(path):
        batch.append(item)
        if len(batch) == BATCH_LINES:
            yield batch
            batch = []
    if batch:
        yield batch


def workers_for(path: Path) -> int:
    if path.stat().st_size < PARALLEL_BYTES:
        return 1
    return usable_cores()


def analyse_recorded(path: str | Path, pricing: Pricing | None = None, *, rerun: int = 0,
                     seed: int = DEFAULT_SEED, workers: int | None = None) -> RecordedPass:
    """Check every recorded answer (in `workers` processes; default: one per core for a large file)."""
    p = recorded_path(path)
    job = _Job(p.name, pricing, rerun, seed)
    workers = workers or workers_for(p)
    total = RecordedPass(rerun)
    if workers == 1:
        for batch in _batches(p):
            total.merge(_check_batch(job, batch))
        return total
    # fork: a worker starts with eyrie imported and never re-runs the command's main module (spawn and
    # forkserver do); nothing else runs in this process while it reads the file. gc.freeze: what the
    # worker inherits lives as long as it does, so its collections need not walk it (-10% CPU a row)
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"),
                             initializer=gc.freeze) as pool:
        pending: deque[Any] = deque()
        for batch in _batches(p):
            pending.append(pool.submit(_check_batch, job, batch))
            if len(pending) >= 2 * workers:
                total.merge(pending.popleft().result())
        while pending:
            total.merge(pending.popleft().result())
    return total


def run_audit_from(path: str | Path, dg: DatasetGeneration | None, ctx: RunContext, base_url: str | None,
                   rerun: int = 0, seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """Figures of answers a user already has; with `rerun`, the other mode bought for that many
    of their prompts (under the spec's budget). Nothing is sent without `rerun`. With a spec the
    document is written to its output's audit.json; without one it is only returned."""
    if rerun and dg is None:
        raise AuditError("--rerun needs a SPEC: its model, provider and budget pay for the comparison")
    p = recorded_path(path)
    if not p.is_file():
        raise AuditError(f"--from {path}: no such file")
    pricing = None
    if dg is not None:
        prices = dg.spec.effective_pricing()
        pricing = Pricing(prices.input_per_million, prices.output_per_million)
    tally = analyse_recorded(p, pricing, rerun=rerun, seed=seed)
    picked = tally.picked()
    facts = list(tally.facts)
    sent, spent, outcome, message = 0, Decimal(0), Outcome.DONE, ""
    fp: dict[str, Any] | None = None
    changed: list[str] = []
    examples_doc: list[dict[str, Any]] = []
    store = open_output(dg.spec) if dg is not None else None
    if dg is not None and store is not None and picked:
        other = {"text": "structured", "structured": "text"}
        answers = AnswerSet(store, dg.spec)
        fp, changed = answers.fingerprint.to_json(), answers.changed_since(stored.read_audit(store))
        todo: dict[str, list[tuple[str, sources.Prompt]]] = {m: [] for m in MODES}
        for c in picked:
            if c.sample_id not in answers.have(other[c.mode]):
                todo[other[c.mode]].append((c.sample_id, c.prompt))
        sent, spent, outcome, message = buy(dg, ctx, base_url, answers, todo)
        by_id = {c.sample_id: c for c in picked}
        pairs = answers.load(set(by_id))
        bought = [stats.fact_from_record(rec, by_id[sid].declared)
                  for m in MODES for sid, rec in pairs[m].items()]
        facts += bought
        sides: dict[str, dict[str, records.Record]] = {m: dict(pairs[m]) for m in MODES}
        side_facts: dict[str, dict[str, stats.AnswerFact]] = {m: {} for m in MODES}
        for f in bought:
            side_facts[f.mode][f.sample_id] = f
        for c in picked:
            sides[c.mode][c.sample_id] = c.record  # type: ignore[assignment]
            side_facts[c.mode][c.sample_id] = stats.fact_from_record(c.record, c.declared)
        examples_doc = examples({c.sample_id: c.prompt for c in picked}, sides, side_facts)
    judged = sum(1 for f in tally.facts if f.status != "unparsable")
    population = {"prompts": tally.rows, "declaredPrompts": judged}
    figures = stats.summarize(facts, population)
    entry = {
        "kind": "from", "at": now_iso(), "samples": len(picked), "seed": seed,
        "model": dg.spec.target.model if dg is not None else None, "fingerprint": fp, "changedSince": changed,
        "outcome": outcome, "message": message, "spentUSD": usd(spent), "sent": sent,
        "reused": len(picked) - sent if picked else 0, "population": population,
        "from": {"file": str(path), "rows": tally.rows, "badRows": tally.bad_rows, "problems": tally.problems,
                 "modes": tally.modes, "noTools": tally.no_tools, "unparsableRows": tally.unparsable_rows,
                 "unparsable": tally.unparsable, "costUSD": usd(tally.cost), "priced": tally.priced},
        "figures": figures, "verdict": stats.verdict(figures, recorded=p.name),
        "examples": examples_doc, "sampleIds": [c.sample_id for c in picked],
    }
    return finish(store, entry)
