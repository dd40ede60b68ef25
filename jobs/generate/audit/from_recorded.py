"""`eyrie audit --from FILE`: answers a user already has, checked as a run checks its own answers
and counted with the audit's figures. Nothing is sent, unless `--rerun N` buys the other tools mode
for N of the file's prompts (a seeded sample, kept in the audit's answer set like any audit answer).

Such an audit has its own output (`--output`, default `<file name>-audit/` next to the file): it is
not the dataset's audit, so the dataset's output never shows it, and what `--rerun` pays is booked
there, under the spec's `budget.maxUSD`, never in the budget of the dataset's run. A file that yields
nothing to judge (empty, a JSON array, rows without a prompt, an answer or declared functions) is
refused (`UnusableFile`) with the reason and its first offending rows. `--rerun` buys from the spec's
model; when the file's rows say another model answered, the comparison would be between models, not
tools modes, and is refused unless the model is named (`rerun_model`) or the mismatch accepted.

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
import re
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from eyrie.jobs import sources
from eyrie.jobs.api import reported_cost
from eyrie.jobs.context import RunContext, usable_cores
from eyrie.jobs.contract import audit as stored
from eyrie.jobs.contract import records
from eyrie.jobs.contract.progress import Outcome, now_iso
from eyrie.jobs.generate.audit import stats
from eyrie.jobs.generate.audit.recorded import (
    RecordedRow,
    RowProblem,
    first_byte,
    iter_lines,
    parse_line,
    recorded_path,
    structured_history,
)
from eyrie.jobs.generate.audit.run import (
    DEFAULT_SEED,
    MAX_PROBLEMS,
    MODES,
    AnswerSet,
    AuditError,
    Lowest,
    answer_row,
    buy,
    declarations_of,
    examples,
    finish,
    priority,
)
from eyrie.jobs.generate.budget.pricing import Pricing, actual_cost, usd
from eyrie.jobs.spec import DatasetGeneration
from eyrie.jobs.store import Store, open_store
from eyrie.jobs.tools import checks, declarations

BATCH_LINES = 2000
PARALLEL_BYTES = 8 << 20  # smaller files are checked in this process: starting workers would cost more
SHOWN_ROWS = 5  # offending rows named when a file yields nothing usable
OUTPUT_SUFFIX = "-audit"  # the default output: `<file name without .jsonl(.gz)>-audit/` next to the file


class UnusableFile(AuditError):
    """The file yields no answer to judge: the message says why and names its first offending rows."""


@dataclass(frozen=True)
class FromOptions:
    """What `eyrie audit --from` does beyond reading the file."""

    rerun: int = 0  # prompts to buy in the other tools mode
    seed: int = DEFAULT_SEED
    output: str | None = None  # the audit's own output; None: `default_output(file)`
    rerun_model: str | None = None  # the model --rerun buys from (None: the spec's target.model)
    accept_other_model: bool = False  # --rerun with the spec's model although the rows name another one


@dataclass
class Candidate:
    """A judged answer that may be bought again in the other mode (`--rerun`)."""

    sample_id: str
    prompt: sources.Prompt
    mode: str
    declared: frozenset[str]
    record: dict[str, Any]  # the recorded answer as a record (for the side-by-side examples)
    line: int  # its row in the file (1-based)


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
    shapes: dict[str, dict[str, int]] = field(default_factory=dict)  # source -> declaration shape -> rows
    no_tools_rows: list[int] = field(default_factory=list)  # the first rows declaring nothing eyrie reads
    failed: list[dict[str, Any]] = field(default_factory=list)  # the first rows holding the provider's error
    models: Counter[str] = field(default_factory=Counter)  # the model each row says answered it
    tokens: Counter[str] = field(default_factory=Counter)  # judged rows: rows, usage (rows with it), prompt, completion
    lines: list[bytes] = field(default_factory=list)  # audit/rows.jsonl, a line per row, in file order

    def __post_init__(self) -> None:
        self.candidates = self.candidates or {m: Lowest(self.rerun) for m in MODES}

    def merge(self, other: RecordedPass) -> None:
        self.facts += other.facts
        self.problems = (self.problems + other.problems)[:MAX_PROBLEMS]
        self.unparsable = (self.unparsable + other.unparsable)[:MAX_PROBLEMS]
        self.no_tools_rows = (self.no_tools_rows + other.no_tools_rows)[:MAX_PROBLEMS]
        self.failed = (self.failed + other.failed)[:MAX_PROBLEMS]
        self.lines += other.lines
        self.models.update(other.models)
        self.tokens.update(other.tokens)
        stats.merge_shapes(self.shapes, other.shapes)
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


def _line(entry: dict[str, Any]) -> bytes:
    return orjson.dumps(entry) + b"\n"


def _add(tally: RecordedPass, item: RecordedRow | RowProblem, job: _Job) -> None:
    if isinstance(item, RowProblem):
        tally.bad_rows += 1
        if len(tally.problems) < MAX_PROBLEMS:
            tally.problems.append({"row": item.line, "error": item.error})
        tally.lines.append(_line(stored.row_entry({"row": item.line}, stored.RowStatus.BAD_ROW, error=item.error)))
        return
    tally.rows += 1
    tally.modes[item.mode] = tally.modes.get(item.mode, 0) + 1
    if item.model:
        tally.models[item.model] += 1
    cost = _cost(item, job.pricing, tally)
    sid = item.prompt.sample_id()
    base = {"row": item.line, "sampleId": sid, "source": item.prompt.source, "mode": item.mode, "model": item.model,
            "costUSD": usd(cost) if cost is not None else None}
    got = declarations_of(item.prompt, item.mode)
    shapes = tally.shapes.setdefault(item.prompt.source, {})
    if isinstance(got, declarations.Rejected):
        stats.count_shapes(shapes, None)
        tally.unparsable_rows += 1
        if len(tally.unparsable) < MAX_PROBLEMS:
            tally.unparsable.append({"row": item.line, "error": got.reason})
        tally.facts.append(stats.AnswerFact(sid, item.prompt.source, item.mode, "unparsable"))
        tally.lines.append(_line(stored.row_entry(base, stored.RowStatus.UNPARSABLE, error=got.reason)))
        return
    stats.count_shapes(shapes, got.shapes)
    if not got.names:
        tally.no_tools += 1
        if len(tally.no_tools_rows) < MAX_PROBLEMS:
            tally.no_tools_rows.append(item.line)
        tally.lines.append(_line(stored.row_entry(base, stored.RowStatus.NO_DECLARATIONS)))
        return
    check = None if item.response is None else checks.check_response(got.prepared, item.response, got.validator)
    _count_tokens(tally.tokens, item.usage)
    tally.facts.append(stats.fact_from_check(sid, item.prompt.source, item.mode, check, got.names, item.usage,
                                                   float(cost) if cost is not None else None))
    if check is None:
        if len(tally.failed) < MAX_PROBLEMS:
            tally.failed.append({"row": item.line, "error": item.error})
        tally.lines.append(_line(stored.row_entry(base, stored.RowStatus.FAILED, error=item.error)))
        return
    tally.lines.append(_line(stored.row_entry(base, stored.RowStatus.OK, check.to_record())))
    if job.rerun:
        rec: dict[str, Any] = {"sample_id": sid, "source": item.prompt.source, "toolsMode": item.mode,
                               "usage": item.usage, "response": item.response,
                               "costUSD": usd(cost) if cost is not None else None, "status": "ok",
                               "checks": check.to_record()}
        tally.candidates[item.mode].offer(priority(job.seed, sid), Candidate(sid, item.prompt, item.mode, got.names,
                                                                             rec, item.line))


def _count_tokens(tokens: Counter[str], usage: dict[str, Any] | None) -> None:
    """A judged row's own token counts: what regenerating it would cost at a spec's prices."""
    tokens["rows"] += 1
    p, c = (usage or {}).get("prompt_tokens"), (usage or {}).get("completion_tokens")
    if isinstance(p, int) and isinstance(c, int) and not isinstance(p, bool) and not isinstance(c, bool):
        tokens["usage"] += 1
        tokens["prompt"] += p
        tokens["completion"] += c


def regeneration(tokens: Counter[str], pricing: Pricing | None) -> dict[str, Any]:
    """What buying the judged rows again would cost: their own token counts at the spec's prices, the
    rows without usage at the mean of those with it (`usd` None: no prices, or no row says its tokens)."""
    out: dict[str, Any] = {"rows": tokens["rows"], "rowsWithUsage": tokens["usage"],
                           "promptTokens": tokens["prompt"], "completionTokens": tokens["completion"], "usd": None}
    if pricing is not None and tokens["usage"]:
        cost = pricing.cost(tokens["prompt"], tokens["completion"]) * tokens["rows"] / tokens["usage"]
        out["usd"] = usd(cost)
    return out


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


def _as_structured(picked: list[Candidate]) -> tuple[list[Candidate], list[tuple[int, str]]]:
    """The picked text prompts as structured requests carry them (earlier calls as `tool_calls`, their
    results as `tool` messages: `recorded.structured_history`), and the rows that cannot be, with why:
    those are not bought, so the comparison is never with a hybrid of both modes."""
    ok: list[Candidate] = []
    refused: list[tuple[int, str]] = []
    for c in picked:
        got = structured_history(c.prompt, c.declared)
        if isinstance(got, str):
            refused.append((c.line, got))
        else:
            c.prompt = got
            ok.append(c)
    return ok, refused


def _most(models: Counter[str]) -> str | None:
    """The model most rows say answered them (the audit's header without a spec)."""
    return models.most_common(1)[0][0] if models else None


def default_output(path: str | Path) -> str:
    """`answers.jsonl(.gz)` -> `file://.../answers-audit`: the audit of a file is written next to it."""
    p = recorded_path(path).expanduser().resolve()
    stem = re.sub(r"(\.jsonl|\.json)?(\.gz)?$", "", p.name) or p.name
    return f"file://{p.parent / (stem + OUTPUT_SUFFIX)}"


def _open(uri: str, dg: DatasetGeneration | None) -> Store:
    out = dg.spec.output if dg is not None else None
    return open_store(uri, out.endpoint if out else None, None, out.region if out else None)


def same_model(a: str, b: str) -> bool:
    """Whether two model names are one model: case aside, a vendor prefix aside (`kimi-k2.5` is
    `moonshotai/kimi-k2.5`), an OpenRouter variant aside (`:free`), and a dated snapshot of it
    (`-20250905`, `-0905`) is it."""
    def norm(name: str) -> str:
        return name.strip().lower().rsplit("/", 1)[-1].split(":", 1)[0]

    x, y = sorted((norm(a), norm(b)), key=len)
    return x == y or re.fullmatch(re.escape(x) + r"-\d{4,8}", y) is not None


def other_models(models: Counter[str], asked: str) -> dict[str, int]:
    """The rows' models that are not `asked`, with their row counts."""
    return {m: n for m, n in models.most_common() if not same_model(m, asked)}


def unusable(path: Path, tally: RecordedPass) -> str | None:
    """Why the file yields nothing to judge (None: it does), with its first offending rows (1-based)."""
    if any(f.status == "ok" for f in tally.facts):
        return None
    name = path.name
    if not tally.rows and not tally.bad_rows:
        return f"--from {name}: the file is empty: nothing to audit (one JSON object a line is expected)"
    if first_byte(path) == b"[":
        reason = ("it is one JSON array, not JSON lines (one object a line): convert it with "
                  f"`jq -c '.[]' {name} > {name.removesuffix('.json')}.jsonl`")
    elif not tally.rows:
        reason = f"none of its {tally.bad_rows:,} rows can be read"
    else:
        parts = [(tally.no_tools, "declare no function in a shape eyrie reads (docs/operating.md, Tool "
                                  "declarations eyrie reads)"),
                 (tally.unparsable_rows, "declare functions that do not parse"),
                 (sum(f.status == "failed" for f in tally.facts), "hold the provider's error, not an answer"),
                 (tally.bad_rows, "cannot be read")]
        reason = "no row holds an answer to judge: " + ", ".join(f"{n:,} rows {what}" for n, what in parts if n)
    rows = sorted([(p["row"], p["error"]) for p in tally.problems]
                  + [(u["row"], f"declarations do not parse: {u['error']}") for u in tally.unparsable]
                  + [(r, "no declared function found") for r in tally.no_tools_rows]
                  + [(f["row"], f"the provider's error: {f['error']}") for f in tally.failed])[:SHOWN_ROWS]
    shown = "; ".join(f"row {r}: {why[:160]}" for r, why in rows)
    return f"--from {name}: nothing usable: {reason}. First offending rows: {shown}"


def run_audit_from(path: str | Path, dg: DatasetGeneration | None, ctx: RunContext, base_url: str | None,
                   opts: FromOptions = FromOptions()) -> dict[str, Any]:
    """Figures of answers a user already has; with `opts.rerun`, the other mode bought for that many
    of their prompts (under the spec's budget, booked in the audit's own output). Nothing is sent
    without `rerun`. The document is written to the audit's own output (`opts.output`, default
    `default_output(path)`), with `audit/rows.jsonl`; never to the dataset's output."""
    rerun, seed = opts.rerun, opts.seed
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
    why = unusable(p, tally)
    if why:
        raise UnusableFile(why)
    store = _open(opts.output or default_output(p), dg)
    picked = tally.picked()
    facts = list(tally.facts)
    sent, reused, spent, outcome, message = 0, 0, Decimal(0), Outcome.DONE, ""
    fp: dict[str, Any] | None = None
    not_rerun: list[tuple[int, str]] = []  # (row, why) of picked prompts the other mode cannot be bought for
    entry_not_rerun: dict[str, Any] | None = None
    changed: list[str] = []
    examples_doc: list[dict[str, Any]] = []
    lines = tally.lines
    asked = None
    bought_mode = None
    if dg is not None and picked:
        asked = opts.rerun_model or dg.spec.target.model
        others = other_models(tally.models, asked)
        if others and not opts.rerun_model and not opts.accept_other_model:
            named = ", ".join(f"{m} ({n:,} rows)" for m, n in list(others.items())[:3])
            raise AuditError(f"--rerun: the file's rows say {named} answered, but the spec's model is {asked!r}: the "
                             "comparison would be between two models, not two tools modes. Name the model to buy "
                             f"the other mode from with --rerun-model MODEL (e.g. --rerun-model {next(iter(others))}), "
                             "or pass --accept-other-model to compare with the spec's model knowingly")
        spec_dg = dg
        if opts.rerun_model:
            spec_dg = dg.model_copy(deep=True)
            spec_dg.spec.target.model = opts.rerun_model
        recorded_mode = picked[0].mode
        bought_mode = {"text": "structured", "structured": "text"}[recorded_mode]
        if bought_mode == "structured":
            picked, not_rerun = _as_structured(picked)
        answers = AnswerSet(store, spec_dg.spec)
        fp, changed = answers.fingerprint.to_json(), answers.changed_since(stored.read_audit(store))
        todo: dict[str, list[tuple[str, sources.Prompt]]] = {m: [] for m in MODES}
        for c in picked:
            if c.sample_id not in answers.have(bought_mode):
                todo[bought_mode].append((c.sample_id, c.prompt))
        reused = len(picked) - len(todo[bought_mode])
        sent, spent, outcome, message = buy(spec_dg, ctx, base_url, answers, todo)
        by_id = {c.sample_id: c for c in picked}
        pairs = answers.load(set(by_id))
        bought = {sid: rec for sid, rec in pairs[bought_mode].items()}
        bought_facts = [stats.fact_from_record(rec, by_id[sid].declared) for sid, rec in bought.items()]
        # the figures compare the file's answers in one mode with the answers bought in the other: the
        # file's own answers in the bought mode (another model's, perhaps) are counted in `from` only
        facts = [f for f in tally.facts if f.mode == recorded_mode] + bought_facts
        sides: dict[str, dict[str, records.Record]] = {recorded_mode: {}, bought_mode: dict(bought)}
        side_facts: dict[str, dict[str, stats.AnswerFact]] = {m: {} for m in MODES}
        for f in bought_facts:
            side_facts[bought_mode][f.sample_id] = f
        for c in picked:
            sides[c.mode][c.sample_id] = c.record  # type: ignore[assignment]
            side_facts[c.mode][c.sample_id] = stats.fact_from_record(c.record, c.declared)
        examples_doc = examples({c.sample_id: c.prompt for c in picked}, sides, side_facts)
        lines = [*lines, *(answer_row(rec, {"row": by_id[sid].line, "sampleId": sid, "source": by_id[sid].prompt.source,
                                            "mode": bought_mode, "model": asked, "bought": True})
                           for sid, rec in bought.items())]
    if not_rerun:
        entry_not_rerun = {"count": len(not_rerun), "rows": [{"row": r, "why": why} for r, why in not_rerun[:5]]}
    judged = sum(1 for f in tally.facts if f.status != "unparsable")
    population = {"prompts": tally.rows, "declaredPrompts": judged}
    figures = stats.summarize(facts, population)
    entry = {
        "kind": "from", "at": now_iso(), "samples": len(picked), "seed": seed,
        "model": asked or (dg.spec.target.model if dg is not None else _most(tally.models)), "fingerprint": fp,
        "changedSince": changed, "outcome": outcome, "message": message, "spentUSD": usd(spent), "sent": sent,
        "reused": reused, "population": population,
        "from": {"file": str(path), "output": store.uri, "rows": tally.rows, "badRows": tally.bad_rows,
                 "problems": tally.problems, "modes": tally.modes, "models": dict(tally.models.most_common(20)),
                 "noTools": tally.no_tools, "unparsableRows": tally.unparsable_rows, "unparsable": tally.unparsable,
                 "declarationShapes": tally.shapes, "costUSD": usd(tally.cost), "priced": tally.priced,
                 "regenerate": regeneration(tally.tokens, pricing), "notRerun": entry_not_rerun},
        "figures": figures,
        "verdict": stats.verdict(figures, recorded=p.name, shapes=tally.shapes,
                                 bought=(bought_mode, sent, reused) if bought_mode else None,
                                 regenerate=regeneration(tally.tokens, pricing)),
        "examples": examples_doc, "sampleIds": [c.sample_id for c in picked],
    }
    stored.write_rows(store, lines)
    return finish(store, entry)
