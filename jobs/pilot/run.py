"""The pilot stage (`spec.pilot`, `eyrie pilot`, the first stage of `eyrie run`): does the run's own data
train a drafter as good as the alternatives', measured before the money goes?

The steps, each done by the stage that owns it:
1. the prompts: a seeded random sample of the sources' tool-declaring prompts (`audit.pick_prompts`, the
   audit's sample: a larger pilot holds the smaller one); fewer than asked is refused before any spend;
2. the answers: every tools mode it needs (the run's own, the other with `otherMode`, and always the
   structured one: its answers are the held-out serving traffic), bought as the audit buys them
   (`audit.buy`: one session, each answer durable before its slot is freed, kept in the audit answer set by
   fingerprint: an answer an audit or an earlier pilot bought is never bought again); with `datasetAnswers`,
   the rows' own answers taken as `generation.answers: dataset` takes them (nothing sent);
3. the slices: each option's answers copied into an output-like folder (`pilot/<option>/`), reconstructed
   (`build_samples`) and extracted (`run_extraction`, one model load for all) in this process;
4. the drafters: `eyrie evaluate` of the structured slice (its held-out answers: the target's own, never
   trained on) against the others, on the pilot's budget (`jobs/evaluate`; stored and reused by key);
5. the verdict (`pilot/verdict.py`, pure) into `pilot.json`, progress.json at stage pilot with outcome
   PilotPassed or PilotFailed, the evaluation as `<output>/evaluation.json`.

The answers of the run's own mode are kept as the run's samples by the generation stage once the verdict
lets the run go on (`generate/adopt.pilot_answers`), never here: a run suspended by its pilot holds no answer
of the mode it may switch away from. A stored verdict for the same spec (`pilot_key`) is the answer.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson

from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import layout, records
from eyrie.jobs.contract.fingerprint import generated_mode, pilot_key
from eyrie.jobs.contract.pilot import Option, PilotVerdict, read_verdict, write_verdict
from eyrie.jobs.contract.progress import Outcome, PilotProgress, Progress, Stage, load_progress, now_iso, write_progress
from eyrie.jobs.contract.tally import cost_of
from eyrie.jobs.errors import InputError
from eyrie.jobs.generate.audit.run import AnswerSet, buy, pick_prompts
from eyrie.jobs.generate.budget.checkpoint import read_checkpoint
from eyrie.jobs.generate.sending.journal import Journal, compact_shard, scan_shard
from eyrie.jobs.generate.sending.session import Ask, Session
from eyrie.jobs.intervals import Estimate
from eyrie.jobs.pilot.verdict import Measured, decide
from eyrie.jobs.sources import Prompt
from eyrie.jobs.spec import MIN_TRAIN, DatasetGeneration, DatasetGenerationSpec
from eyrie.jobs.store import PrefixedStore, Store, open_output

SLICE = "slice.json"  # in a slice's folder: what it was built from; a slice is rebuilt when this differs


class PilotError(InputError):
    """The pilot cannot run as specified (e.g. fewer tool-declaring prompts than pilot.prompts); nothing was
    bought. The message names the field."""


@dataclass(frozen=True)
class PilotResult:
    outcome: Outcome  # PilotPassed | PilotFailed, or what stopped the buying (BudgetExhausted, ...)
    message: str
    verdict: PilotVerdict | None
    reused: bool = False  # a stored verdict for the same spec: nothing done


def own_option(spec: DatasetGenerationSpec) -> Option:
    return Option(generated_mode(spec))


def alternatives(spec: DatasetGenerationSpec) -> list[Option]:
    """What the run's own data is compared with, in the order the spec names them."""
    assert spec.pilot is not None
    own = own_option(spec)
    out = []
    for c in spec.pilot.compare:
        if c == "otherMode":
            out.append(Option.TEXT if own == Option.STRUCTURED else Option.STRUCTURED)
        else:
            out.append(Option.DATASET)
    return out


def slice_store(store: Store, option: Option) -> PrefixedStore:
    return PrefixedStore(store, layout.pilot_slice_prefix(option))


class _Reporter:
    """progress.json at stage pilot: what the attempt before wrote, with the pilot's figures on top."""

    def __init__(self, store: Store, spec: DatasetGenerationSpec, ctx: RunContext,
                 on_progress: Callable[[Progress], None]):
        self.store, self.spec, self.ctx, self.on_progress = store, spec, ctx, on_progress
        prev = load_progress(store)
        self.base: dict[str, Any] = {k: v for k, v in (prev.to_json() if prev else {}).items()
                                     if k not in ("probe", "message", "updatedAt")}
        attempts = list(prev.attempts) if prev else []
        if not attempts or attempts[-1] != ctx.attempt:
            attempts.append(ctx.attempt)
        self.base["attempts"] = attempts

    def write(self, outcome: Outcome, section: PilotProgress, pilot_usd: Decimal, message: str = "") -> Progress:
        spent = read_checkpoint(self.store).spent
        doc = {**self.base, "attempt": self.ctx.attempt, "runId": self.ctx.run_id or None, "stage": Stage.PILOT,
               "outcome": outcome, "message": message, "spentUSD": str(spent),
               "maxUSD": str(self.spec.budget.max_usd), "pilotUSD": str(pilot_usd), "pilot": section.dump()}
        progress = write_progress(self.store, Progress.model_validate(doc))
        self.on_progress(progress)
        return progress


def _spend(recs: list[records.Record]) -> Decimal:
    return sum((cost_of(r) for r in recs), Decimal(0))


def _dataset_answers(dg: DatasetGeneration, store: Store, ctx: RunContext, base_url: str,
                     prompts: list[tuple[str, Prompt]]) -> None:
    """The rows' own answers as the dataset option's records (`generation.answers: dataset`: checked as a bought
    answer, nothing sent or paid), durable in its slice's generations."""
    target = slice_store(store, Option.DATASET)
    state = scan_shard(target, 0)
    todo = [(sid, p) for sid, p in prompts if sid not in state.done]
    if not todo:
        return
    spec = dg.spec.model_copy(deep=True)
    spec.generation.answers = "dataset"
    spec.tools.mode = "structured"
    spec.pilot = None  # a spec taking the rows' answers has nothing to pilot (and refuses a pilot)
    session = Session.for_requests(spec, store, ctx, base_url, requests=len(todo), senders=1, attempt="pilot")
    sender = session.sender("pilot-dataset", spec, Journal(target))
    asyncio.run(session.answer_all([Ask(sender, 0, sid, p) for sid, p in todo]))
    compact_shard(target, 0, scan_shard(target, 0), spec.generation.part_records)


def _slice_doc(spec: DatasetGenerationSpec, option: Option, sids: list[str]) -> dict[str, Any]:
    ex = spec.extraction
    return {"option": option.value, "samples": len(sids),
            "ids": hashlib.sha256("\n".join(sorted(sids)).encode()).hexdigest(),
            "target": [spec.target.tokenizer, spec.target.chat_format, spec.target.template_variant],
            "extraction": [ex.engine, ex.model or spec.target.tokenizer, ex.layers, ex.dtype]}


def _build_slices(spec: DatasetGenerationSpec, store: Store, wanted: dict[Option, list[records.Record]],
                  step: Callable[[str], None]) -> None:
    """Each option's answers as an output of its own (generations, samples, hidden states), unless its folder
    already holds exactly these (slice.json)."""
    todo = {}
    for option, recs in wanted.items():
        target = slice_store(store, option)
        doc = _slice_doc(spec, option, [r["sample_id"] for r in recs])
        try:
            same = orjson.loads(target.get(SLICE)) == doc
        except Exception:  # absent or unreadable: built again
            same = False
        if not same:
            todo[option] = (target, recs, doc)
    if not todo:
        return
    from eyrie.jobs.extract.run import open_backend, run_extraction
    from eyrie.jobs.reconstruct.samples import build_samples

    step("samples")
    for target, recs, _doc in todo.values():
        for key in target.list():
            target.delete(key)
        if recs:  # through the journal, the one writer of a shard's records, then compacted into parts
            Journal(target).write(0, recs)
            compact_shard(target, 0, scan_shard(target, 0), spec.generation.part_records)
        target.put(layout.SAMPLES_SUMMARY, orjson.dumps(build_samples(spec, target).to_manifest()))
    step("extract")
    backend = open_backend(spec)
    try:
        for target, _recs, doc in todo.values():
            run_extraction(spec, target, backend=backend)
            target.put(SLICE, orjson.dumps(doc))
    finally:
        backend.close()


def _minus_own(doc: dict[str, Any], own: Option, alt: Option) -> Estimate:
    """alt's accepted length minus own's, from the evaluation's pairs (paired bootstrap)."""
    for p in doc.get("pairs") or ():
        e = p["bMinusA"]
        if (p["a"], p["b"]) == (own.value, alt.value):
            return Estimate(e["value"], e["low"], e["high"], e["n"])
        if (p["a"], p["b"]) == (alt.value, own.value):
            return Estimate(-e["value"], -e["high"], -e["low"], e["n"])
    raise ValueError(f"the evaluation holds no difference between {own} and {alt}")


def pilot_device(spec: DatasetGenerationSpec) -> str:
    """Where the pilot's drafters train: extraction.device when set, else CUDA where there is one (SpecForge's
    Triton loss and torch.compile), else the CPU (its torch formula)."""
    if spec.extraction.device:
        return spec.extraction.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def decided(spec: DatasetGenerationSpec, store: Store) -> PilotVerdict | None:
    """The stored verdict when the pilot decided for this spec (`pilot_key`), else None."""
    stored = read_verdict(store)
    return stored if stored is not None and stored.key == pilot_key(spec) else None


def run_pilot(dg: DatasetGeneration, ctx: RunContext, base_url: str, *, device: str | None = None,
              notify: Callable[[str], None] = lambda _m: None,
              on_progress: Callable[[Progress], None] = lambda _p: None) -> PilotResult:
    """The pilot of `dg` (spec.pilot set): its verdict, decided now or read back when one for this spec is stored."""
    spec = dg.spec
    pilot = spec.pilot
    if pilot is None:
        raise PilotError("pilot: the spec has no pilot section")
    store = open_output(spec)
    key = pilot_key(spec)
    if (stored := decided(spec, store)) is not None:
        return PilotResult(Outcome.PILOT_PASSED if stored.proceed else Outcome.PILOT_FAILED, "" if stored.proceed
                           else stored.sentence, stored, reused=True)
    own, alts = own_option(spec), alternatives(spec)
    n, held = spec.pilot_prompts(), spec.pilot_heldout()
    picked = pick_prompts(dg, n, pilot.seed, answers=Option.DATASET in alts)
    if len(picked.prompts) < n:
        raise PilotError(
            f"spec.pilot.prompts: the sources hold {len(picked.prompts):,} prompts that declare tools, fewer than "
            f"the pilot's {n:,} (unset: tools.gate.canarySamples); lower pilot.prompts (at least "
            f"{held + MIN_TRAIN:,} with {held:,} held out) or add prompts; nothing was bought")
    modes = [m for m in (Option.STRUCTURED, Option.TEXT) if m == Option.STRUCTURED or m == own or m in alts]
    answers = AnswerSet(store, spec)
    todo = {m.value: [(sid, p) for sid, p in picked.prompts if sid not in answers.have(m.value)] for m in modes}
    sids = {sid for sid, _ in picked.prompts}
    planned = len(picked.prompts) * len(modes)
    report = _Reporter(store, spec, ctx, on_progress)

    def section(step: str, got: int, spent: Decimal, **more: Any) -> PilotProgress:
        return PilotProgress(step=step, prompts=n, answers=got, planned=planned, spent=spent, **more)

    before = _spend([r for m in modes for r in answers.load(sids)[m.value].values()])
    report.write(Outcome.RUNNING, section("buy", planned - sum(len(v) for v in todo.values()), before), before)
    notify(f"pilot: {n:,} tool-declaring prompts, {', '.join(m.value for m in modes)} answers "
           f"({sum(len(v) for v in todo.values()):,} to buy), compared: {own} (the run's own) with "
           f"{', '.join(a.value for a in alts)}")
    _sent, _spent, outcome, message = buy(dg, ctx, base_url, answers, todo)
    got = answers.load(sids)
    spent = _spend([r for m in modes for r in got[m.value].values()])
    if outcome != Outcome.DONE:
        report.write(Outcome(outcome), section("buy", sum(len(got[m.value]) for m in modes), spent), spent,
                     f"pilot: {message}")
        return PilotResult(Outcome(outcome), message, None)
    if Option.DATASET in alts:
        _dataset_answers(dg, store, ctx, base_url, picked.prompts)
    wanted: dict[Option, list[records.Record]] = {m: [got[m.value][sid] for sid, _ in picked.prompts
                                                      if sid in got[m.value]] for m in modes}
    if Option.DATASET in alts:
        wanted[Option.DATASET] = [r for r in records.iter_records(slice_store(store, Option.DATASET))
                                  if r["sample_id"] in sids]

    def step(name: str) -> None:
        report.write(Outcome.RUNNING, section(name, planned, spent), spent)

    _build_slices(spec, store, wanted, step)
    step("train")
    doc = _evaluate(spec, store, own, alts, held, device or pilot_device(spec), notify)
    store.put(layout.EVALUATION, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    measured = []
    for option in [own, *alts]:
        row = next(r for r in doc["drafters"] if r["name"] == option.value)
        a = row["acceptance"]["acceptedLength"]
        measured.append(Measured(option, Estimate(a["value"], a["low"], a["high"], a["n"]),
                                 int(row["training"]["samples"]), _projected(option, wanted, picked.population)))
    verdict = decide(key=key, own=own, measured=measured, minus_own={a: _minus_own(doc, own, a) for a in alts},
                     policy=pilot.policy, margin=pilot.margin, prompts=n, heldout=held, spent_usd=spent,
                     adopted=sum(r.get("status") == "ok" for r in wanted[own]),
                     evaluation=f"{layout.pilot_slice_prefix(Option.STRUCTURED)}/{layout.EVALUATION}",
                     name=dg.metadata.name or "NAME", namespace=dg.metadata.namespace, created_at=now_iso())
    write_verdict(store, verdict)
    result = Outcome.PILOT_PASSED if verdict.proceed else Outcome.PILOT_FAILED
    report.write(result, section("decided", planned, spent, passed=verdict.passed, proceed=verdict.proceed,
                                 verdict=verdict.sentence), spent, "" if verdict.proceed else verdict.sentence)
    return PilotResult(result, "" if verdict.proceed else verdict.sentence, verdict)


def _projected(option: Option, wanted: dict[Option, list[records.Record]], population: dict[str, Any]) -> Decimal:
    """The whole dataset with this option: the pilot's mean cost per answer times the sources' prompts
    (the sources' own answers cost nothing)."""
    paid = [cost_of(r) for r in wanted.get(option, []) if r.get("status") == "ok"]
    if option == Option.DATASET or not paid:
        return Decimal(0)
    return (sum(paid, Decimal(0)) / len(paid) * int(population.get("prompts") or 0)).quantize(Decimal("0.000001"))


def _evaluate(spec: DatasetGenerationSpec, store: Store, own: Option, alts: list[Option], held: int, device: str,
              notify: Callable[[str], None]) -> dict[str, Any]:
    """`eyrie evaluate` of the structured slice (held-out: its answers, the target's own) against the others."""
    from eyrie.jobs.evaluate.drafter import TrainSettings
    from eyrie.jobs.evaluate.plan import EvaluationError, Leakage
    from eyrie.jobs.evaluate.run import Request, run_evaluation

    assert spec.pilot is not None
    t = spec.pilot.training
    settings = TrainSettings(steps=t.steps, tokens_per_step=t.tokens_per_step, seed=spec.pilot.seed,
                             dtype="bfloat16" if device.startswith("cuda") else "float32")
    others = [o for o in dict.fromkeys([own, *alts]) if o != Option.STRUCTURED]
    req = Request(slice_store(store, Option.STRUCTURED).uri, tuple(slice_store(store, o).uri for o in others),
                  held, settings, False, spec.output.endpoint, device)
    try:
        return run_evaluation(req, notify=lambda m: notify(f"pilot: {m}")).doc
    except Leakage:
        raise  # a plan that would train on held-out answers: refused as it is, never reworded into a spec error
    except EvaluationError as e:
        raise PilotError(f"spec.pilot: its drafters cannot be evaluated: {e}") from None
