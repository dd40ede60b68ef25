"""The generation job (DESIGN §3, §4): read prompts, shard them, run shard workers, keep progress.

Runs as the entrypoint of a Ray job in a cluster (RayJob or a submission: `ray.init()` joins the
cluster it runs in) and under a local `ray.init()` for `generation.ray.mode: Local`. The driver
owns progress.json; the run coordinator (a named Ray actor) owns the budget and stop decision;
workers own their shards' parts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import orjson

from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import records, timeseries
from eyrie.jobs.contract.fingerprint import Binding, bind_output, write_doc
from eyrie.jobs.contract.layout import BAD_ROWS, TIMESERIES
from eyrie.jobs.contract.money import dollars
from eyrie.jobs.contract.progress import (
    BadRows,
    BoundFingerprint,
    Outcome,
    Progress,
    ResumeFigures,
    RunFigures,
    Stage,
    load_progress,
    now_iso,
    write_progress,
)
from eyrie.jobs.contract.tally import bad_row
from eyrie.jobs.generate.adopt import into_shards, pilot_answers
from eyrie.jobs.generate.budget.checkpoint import Checkpoint, read_checkpoint, settle_stops
from eyrie.jobs.generate.budget.coordinator import CoordinatorArgs, RunCoordinator
from eyrie.jobs.generate.budget.forecast import forecaster
from eyrie.jobs.generate.budget.inflight import AbandonedTotals
from eyrie.jobs.generate.budget.reconcile import provider_key_usage
from eyrie.jobs.generate.plan import ShardPlan, plan_shards
from eyrie.jobs.generate.preflight import PreflightError, empty_source, preflight
from eyrie.jobs.generate.probe.run import ProbeOutcome, ProbeSettings, adopt, run_probe, seed_variants
from eyrie.jobs.generate.sending.actor import ShardWorkerActor, run_loop
from eyrie.jobs.generate.sending.conversation import AgenticSummary
from eyrie.jobs.generate.sending.session import Session
from eyrie.jobs.generate.sending.worker import ShardWorker
from eyrie.jobs.reconstruct.variants import detector_for
from eyrie.jobs.sources import SourceError
from eyrie.jobs.spec import DatasetGeneration, DatasetGenerationSpec
from eyrie.jobs.status import SampleCounts
from eyrie.jobs.store import Store
from eyrie.jobs.timeline import Timeline
from eyrie.jobs.tools.gate import ToolGate

PROGRESS_EVERY_S = 2.0
MAX_WORKER_RESTARTS = 3


# ------------------------------------------------------------------------------------ run


@dataclass
class GenerationResult:
    outcome: str
    message: str
    snapshot: Progress


class _Stopper:
    """SIGTERM/SIGINT (Ray's stop_job, Ctrl-C): stop dispatching, let in-flight requests finish. A
    second SIGINT during that graceful stop (a user who will not wait) stops at once: the requests in
    flight are abandoned (they may have been paid: each worker writes them down, the provider is asked
    what they cost, their worst case is booked until it says), and the run still ends with
    progress.json read from what is on disk, outcome Stopped, exit 6."""

    def __init__(self) -> None:
        self.requested = False
        self.hard = False
        self.signal: int | None = None  # the first one
        self.announced = False
        self._old: dict[int, Any] = {}
        self._wake: Callable[[], None] | None = None

    def wake_on_signal(self) -> asyncio.Event:
        """An event of the running loop, set when a signal arrives: the run's loop reacts at once, not at its
        next poll."""
        loop, event = asyncio.get_running_loop(), asyncio.Event()
        self._wake = lambda: loop.call_soon_threadsafe(event.set)
        return event

    def __enter__(self) -> _Stopper:
        self.install()
        return self

    def install(self) -> None:
        """(Re)install the handlers: `ray.init()` replaces SIGTERM's with an immediate exit, which
        would lose the answers in flight when Ray's stop_job signals the driver."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: no handlers then
                old = signal.signal(sig, self._handle)
                self._old.setdefault(sig, old)

    def _handle(self, signum: int, frame: Any) -> None:
        # never raise here: an exception thrown at an arbitrary bytecode (mid-write, mid-settle) is
        # what left progress.json disagreeing with the store; the run loops poll these flags
        if self.requested and signum == signal.SIGINT:
            self.hard = True
        if not self.requested:
            self.signal = signum
        self.requested = True
        if self._wake is not None:
            self._wake()

    def acknowledge(self, in_flight: int, notify: Callable[[str], None]) -> None:
        """The one line a first stop gets, once, from the run's loop (never from the handler)."""
        if self.requested and not self.hard and not self.announced:
            self.announced = True
            more = "; Ctrl-C again to abandon them" if self.signal == signal.SIGINT else ""
            notify(f"stopping: finishing {in_flight} requests in flight{more}")

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


@dataclass
class _Run:
    """Everything a way of running the workers (inline or on Ray) needs."""

    session: Session  # the coordinator's arguments, the limits the workers share
    plan: ShardPlan  # the shards' row ranges: each worker reads its own
    stopper: _Stopper
    monitor: _Monitor
    notify: Callable[[str], None] = lambda _m: None
    timeline: Timeline = field(default_factory=Timeline.off)
    read_bytes_per_token: Callable[[], int | None] | None = None  # what extraction stores per token (pipeline's)
    bytes_per_token: concurrent.futures.Future | None = None  # its reading, beside the requests
    delivered: bool = False  # to the coordinator

    def start_beside(self) -> None:
        """What extraction stores per token, for the canary's projection: read from the model's config, which
        can mean importing torch and building a builtin model (seconds), so on a thread beside the requests."""
        if self.bytes_per_token is None and self.read_bytes_per_token is not None:
            self.bytes_per_token = _beside(self.timeline, "the forecast's bytes per token (the model's config)",
                                           self.read_bytes_per_token)

    def bytes_per_token_at_end(self) -> int | None:
        """What extraction stores per token for the final figures of a run that was not stopped: waited for if
        still being read (it overlapped the run; a stop does not wait for it), None when delivered already."""
        fut = self.bytes_per_token
        if fut is None or self.delivered or self.stopper.requested:
            return None
        self.delivered = True
        try:
            return fut.result()
        except Exception:  # the projection is a by-product: no figure rather than a failed run
            return None

    def bytes_per_token_now(self) -> int | None:
        """Once (the first call after it is known): what extraction stores per token; None meanwhile."""
        fut = self.bytes_per_token
        if fut is None or not fut.done() or self.delivered:
            return None
        self.delivered = True
        return None if fut.exception() is not None else fut.result()  # no projection rather than a failed run

    @property
    def spec(self) -> DatasetGenerationSpec:
        return self.session.spec


def run_generation(dg: DatasetGeneration, store: Store, ctx: RunContext, base_url: str, *, inline: bool = False,
                   on_progress: Callable[[Progress], None] | None = None,
                   notify: Callable[[str], None] = lambda _m: None, accept_changed: Sequence[str] = (),
                   binding: Binding | None = None, bytes_per_token: Callable[[], int | None] | None = None,
                   timeline: Timeline | None = None) -> GenerationResult:
    """Generate until every prompt is persisted or the run stops; returns the final snapshot.
    `base_url` is the provider's (the caller starts the simulator for `api.baseUrl: simulated`).
    With `api.providerProbe` the probe runs first (generate/probe/run.py) and generation is routed to
    the endpoints that pass. Refuses (FingerprintChanged, before anything is sent) an output whose
    answers were bought under another fingerprint, unless `accept_changed` names every field that
    changed. `bytes_per_token` reads what extraction will store per token (`extract/projection.py`, handed in by
    `pipeline`: generation sits below extraction), for the forecast's hidden-state bytes: called on a thread beside
    the first requests (it may import torch); None leaves them out. `timeline` hears each start-up step and the
    first request and answer (`eyrie run --verbose`)."""
    spec = dg.spec
    timeline = timeline or Timeline.off()
    if binding is None:
        binding = bind_output(store, spec, ctx.attempt, accept=accept_changed, accept_id=ctx.accept_fingerprint,
                              now=now_iso())
    early = None  # off a local run's first-request path, what runs beside starts now, beside preflight too
    if bytes_per_token is not None and (inline or not local_ray(spec)):
        early = _beside(timeline, "the forecast's bytes per token (the model's config)", bytes_per_token)
    with _Stopper() as stopper:
        step = timeline.step
        with step("preflight (store, API, sources, tokenizer)"):
            asyncio.run(preflight(spec, base_url, store, ctx.api_key))
        with step("what earlier stops left in flight, booked"):
            news = settle_stops(store, base_url, ctx.api_key).news
        with step("the provider's key usage"):
            key_usage = provider_key_usage(base_url, ctx.api_key)  # its own figure, shown after a stop
        try:
            with step("shard plan (a scan of each source)"):
                plan = plan_shards(spec, store)  # the driver holds no prompt
        except SourceError as e:
            raise PreflightError(f"sources: {e}") from None
        for i, src in enumerate(spec.sources):
            if plan.indexes[src.name].rows == 0:
                raise empty_source(i, src)
        write_doc(store, binding)
        total = plan.total
        prev = load_progress(store)  # the attempt before, as the probe's progress writes do not say
        # the pilot's answers of the run's own mode, once its verdict lets the run go on: never bought again
        if adopted := into_shards(store, plan, pilot_answers(spec, store), binding.fingerprint.id):
            notify(f"pilot: {len(adopted)} of its answers kept as the run's samples (not bought again)")
        probe, kept, stop = _probe(spec, store, ctx, base_url, plan, notify, binding.fingerprint.id, prev,
                                   on_progress or (lambda s: None))
        gate = ToolGate(spec.tools.gate)  # a disabled gate still measures; it never stops
        with step("checkpoint (what earlier attempts persisted)"):
            ckpt = read_checkpoint(store, gate, resuming=True)
        coordinator = CoordinatorArgs(
            max_usd=spec.budget.max_usd, spent=ckpt.spent, counts=ckpt.counts, total=total, shards=sorted(plan.shards),
            gate=gate, audit_usd=ckpt.audit, workers=spec.generation.ray.workers, variants=detector_for(spec),
            forecast=forecaster(spec, ckpt.costs, ckpt.counts.input_tokens + ckpt.counts.output_tokens))
        if stop is None and (mismatch := seed_variants(spec, coordinator.variants, kept)):
            stop = (Outcome.TEMPLATE_MISMATCH, mismatch)
        # a fresh output only: on a resume a shard's first rows may be persisted already (never sent again)
        if stop is None and not ckpt.costs and (
                short := first_requests_unaffordable(spec, plan, spec.budget.max_usd - ckpt.spent)):
            stop = (Outcome.BUDGET_EXHAUSTED, short)
        start = Resume.at_start(prev, ctx.attempt, ctx.run_id, ckpt, binding)
        monitor = _Monitor(store, ctx, on_progress or (lambda s: None),
                           {**(probe.progress() if probe else {}), **start.progress(),
                            "workers_lost": start.workers_lost, **_pilot_carried(prev)})
        session = Session(probe.routed(spec) if probe else spec, store, ctx, base_url, coordinator,
                          senders=spec.generation.ray.workers, fingerprint=binding.fingerprint.id)
        run = _Run(session, plan, stopper, monitor, notify, timeline, bytes_per_token, early)
        if stop is not None:  # nothing to generate with: the run ends before its first request
            coord = session.start()
            asyncio.run(coord.stop(*stop))
            figures = coord.snapshot()
        elif inline:
            figures = _run_inline(run)
        elif local_ray(spec):
            figures = _run_local(run)
        else:
            figures = _run_ray(run)
        # still under the handlers: a signal now (a third Ctrl-C) cannot cut the accounting short
        news += settle_stops(store, base_url, ctx.api_key).news  # a stop's abandoned requests, a lost worker's slots
        progress = _account(spec, store, monitor.merged(figures), total, stopper.hard, start, news)
        a = progress.abandoned
        if key_usage is not None and a and a.this_attempt and (now := provider_key_usage(base_url, ctx.api_key)):
            progress.abandoned = a.model_copy(update={"key_usage_rose": now - key_usage})
        final = monitor.write(progress)
        monitor.on_progress(final)
    return GenerationResult(final.outcome, final.message, final)


FIRST_ROWS = 8  # rows of a shard read for its first request (rows before it may never be sent)


def first_requests_unaffordable(spec: DatasetGenerationSpec, plan: ShardPlan, left: Decimal) -> str | None:
    """Why no shard's first request fits the budget left (None: one does, or nothing tells), for an
    output nothing was persisted in yet (the caller's check: a resume skips rows already stored). Each is
    reserved as the sender reserves it (its prompt's tokens estimated the same way, plus every output
    token it may write), so when none fits, each worker's first reservation would be refused: the run
    is stopped before any worker starts (Ray, the provider's pacing) instead of after. Validation
    refuses the budget that cannot pay the output alone (`spec._check_one_answer_fits`)."""
    if spec.generation.turns != "last" or spec.generation.answers == "dataset" or spec.tools.mode == "audit":
        return None
    from eyrie.jobs.generate.budget.pricing import Pricing, worst_case
    from eyrie.jobs.generate.sending.requests import estimate_prompt_tokens, max_output_tokens, prepare_row
    from eyrie.jobs.sources import iter_source

    count = None
    if spec.target.tokenizer:  # the sender counts with it; loaded (and cached) by preflight
        from eyrie.jobs.reconstruct.tokenizers import load_tokenizer

        tok = load_tokenizer(spec.target, spec.output.endpoint)
        count = lambda text: len(tok.encode(text))  # noqa: E731
    prices = spec.effective_pricing()
    pricing = Pricing(prices.input_per_million, prices.output_per_million)
    out_tokens = max_output_tokens(spec)
    by_name = {s.name: s for s in spec.sources}
    cheapest: tuple[Decimal, int] | None = None
    for spans in plan.shards.values():
        span = spans[0]
        rows = iter_source(by_name[span.source], spec.output.endpoint, start=span.start,
                           stop=min(span.stop, span.start + FIRST_ROWS), index=plan.indexes.get(span.source))
        for prompt in rows:
            prepared = prepare_row(prompt, spec.tools.mode)
            if isinstance(prepared, tuple):
                continue
            est = estimate_prompt_tokens(prepared.messages, prepared.tools or prepared.declared_tools, count)
            cost = worst_case(pricing, est, out_tokens)
            if cost <= left:
                return None
            cheapest = min(cheapest or (cost, est), (cost, est))
            break
        else:
            return None  # no sendable row among the first: nothing certain
    if cheapest is None:
        return None
    cost, est = cheapest
    return (f"budget exhausted before the first request: {dollars(left)} left of budget.maxUSD "
            f"{dollars(spec.budget.max_usd)}, and the cheapest shard's first request reserves {dollars(cost)} ({est:,} "
            "prompt tokens and "
            f"{out_tokens:,} output tokens, api.sampling.maxTokens, at the spec's prices); lower "
            "api.sampling.maxTokens or raise budget.maxUSD")


def _account(spec: DatasetGenerationSpec, store: Store, progress: Progress, total: int, hard: bool,
             start: Resume, news: int = 0) -> Progress:
    """The final figures, read from the store: what is on disk is what progress.json says. Returns `progress`
    with them. `news`: abandoned requests this attempt booked or reconciled (what a kill before it left, what its
    own stop left)."""
    # The store is the truth: a worker lost before flushing reported answers that were never
    # persisted (and are redone), so counts come from what was persisted; spend stays the ledger's.
    final_gate = ToolGate(spec.tools.gate)
    bad: list[bytes] = []
    final = read_checkpoint(store, final_gate, on_bad_row=lambda rec: bad.append(orjson.dumps(bad_row(rec).dump())))
    if bad:
        store.put(BAD_ROWS, b"\n".join(bad) + b"\n")
    outcome, message = progress.outcome, progress.message
    if hard:
        said = stopped_at_once(final.abandoned)
        if outcome in (Outcome.RUNNING, Outcome.STOPPED):
            outcome, message = Outcome.STOPPED, said
        else:  # it was draining after another stop (budget, drift): that stays the outcome
            message = f"{message}; then {said}"
    samples, agentic = final.counts.samples(total), None
    if spec.generation.turns == "all":  # samples count conversations; their turns are in `agentic`
        summary = AgenticSummary()
        for rec in records.iter_records(store):
            summary.add(rec)
        samples, agentic = summary.samples(total), summary.figures()
    if outcome == Outcome.RUNNING:
        if samples.missing:
            outcome = Outcome.FAILED
            message = f"{samples.missing} prompts were not processed (workers lost); run again to resume"
        else:
            outcome = Outcome.DONE
    c = final.counts
    # booked: the records' exact costs plus what stops abandoned in flight (their real cost where
    # the provider said, else their worst case); the ledger's figure would also count leases.
    # The attempt has ended: what was in flight is stored or booked as abandoned, nothing is reserved.
    return progress.model_copy(update={
        "outcome": outcome, "message": message, "spent": final.spent, "reserved": Decimal(0), "in_flight": 0,
        "abandoned": final.abandoned.figures(news) if final.abandoned.requests else None,
        "discarded": c.discarded_usd, "failures": dict(c.failures), "resend_on_resume": c.resend,
        "tokens": c.tokens(), "tools": final_gate.metrics(),
        "samples": samples, "agentic": agentic, **start.final(final, final.spent)})


def _probe(spec: DatasetGenerationSpec, store: Store, ctx: RunContext, base_url: str, plan: ShardPlan,
           notify: Callable[[str], None], fingerprint: str, prev: Progress | None,
           on_progress: Callable[[Progress], None]) -> tuple[ProbeOutcome | None, list, tuple[Outcome, str] | None]:
    """`api.providerProbe`: probe (or reuse the stored probe), keep the passing answers as samples;
    the records kept, and the outcome that stops the run before generation (no endpoint passes,
    budget spent), if any. While it sends, progress.json is at stage probe, carrying the attempts
    and the counts the attempt before wrote (what the operator showed until then); `on_progress` (the
    progress bar) gets the same snapshots."""
    if spec.api.provider_probe is None:
        return None, [], None
    carried = {"attempts": Resume.attempts_of(prev, ctx.attempt),
               "samples": prev.samples if prev else SampleCounts(total=plan.total),
               **({"tokens": prev.tokens, "tools": prev.tools} if prev else {})}

    def show(section: dict) -> None:
        on_progress(write_progress(store, Progress.model_validate(
            {**carried, **section, "attempt": ctx.attempt, "stage": Stage.PROBE, "runId": ctx.run_id or None})))

    probe = run_probe(spec, store, ctx, base_url, ProbeSettings.from_spec(spec), notify=notify, on_progress=show,
                      progress_every=PROGRESS_EVERY_S)
    kept = []
    # kept only where a probe answer is what generation would record: tools structural, one turn
    if probe.stop is None and spec.tools.mode != "text" and spec.generation.turns == "last":
        kept = adopt(store, plan, probe, fingerprint=fingerprint)
        if kept:
            notify(f"provider probe: {len(kept)} answers of passing endpoints kept as samples")
    if probe.doc:
        notify(f"provider probe: passing {', '.join(probe.passing) or 'none'} "
               f"(of {len(probe.doc.get('candidates') or [])})")
    return probe, kept, probe.stop


def _pilot_carried(prev: Progress | None) -> dict[str, Any]:
    """The pilot's figures (its section and spend) from the progress.json it wrote: kept by every later write."""
    if prev is None or prev.pilot is None:
        return {}
    return {"pilot": prev.pilot, "pilot_usd": prev.pilot_usd}


@dataclass
class Resume:
    """What this attempt found and what it added: the attempts so far, the answers reused from earlier
    ones (and what they cost), what this attempt paid for how many requests, and spent vs paid."""

    attempts: list[str]
    reused_answers: int
    reused_usd: Decimal
    binding: Binding
    restarts: int = 0  # earlier starts of this same attempt (its job submitted again after its driver was lost)
    workers_lost: int = 0  # this attempt's shard workers lost before this start

    @classmethod
    def at_start(cls, prev: Progress | None, attempt: str, run_id: str | None, ckpt: Checkpoint,
                 binding: Binding) -> Resume:
        restarts, lost = cls.disruptions_of(prev, attempt, run_id)
        return cls(cls.attempts_of(prev, attempt), ckpt.tally.all.answers, ckpt.tally.all.answers_usd, binding,
                   restarts=restarts, workers_lost=lost)

    @staticmethod
    def disruptions_of(prev: Progress | None, attempt: str, run_id: str | None) -> tuple[int, int]:
        """(this start's restarts, the workers lost before it) from the progress.json it found. The operator gives
        every new attempt of a DatasetGeneration a new number (a local run makes a unique one), so progress of this
        same attempt and object (`runId`: a deleted and recreated object starts at attempt 1 again) means that its
        job ran before and ended without a word: its Ray head was lost and KubeRay submitted it again. Progress at
        stage pilot is the pilot's, which runs before the generation job under the same attempt (the operator's
        pilot Job, or the first stage of `eyrie run`): no start of this job."""
        if prev is None or prev.attempt != attempt or (prev.run_id or None) != (run_id or None) \
                or prev.stage == Stage.PILOT:
            return 0, 0
        return prev.restarts + 1, prev.workers_lost

    @staticmethod
    def attempts_of(prev: Progress | None, attempt: str) -> list[str]:
        """The attempts so far, this one last, from the progress.json before it."""
        attempts = list(prev.attempts) if prev else []
        if not attempts or attempts[-1] != attempt:
            attempts.append(attempt)
        return attempts

    @property
    def number(self) -> int:
        return len(self.attempts)

    def progress(self) -> dict[str, Any]:
        """What every progress.json write of this attempt carries (`Progress` fields by name)."""
        accepted = [c.field for c in self.binding.changes] if self.binding.kind == "accepted" else None
        bound = BoundFingerprint(id=self.binding.fingerprint.id, previous=self.binding.previous, accepted=accepted)
        resume = ResumeFigures(attempt=self.number, reused_answers=self.reused_answers, reused=self.reused_usd)
        return {"attempts": self.attempts, "fingerprint": bound, "restarts": self.restarts, "resume": resume}

    def final(self, ckpt: Checkpoint, spent: Decimal) -> dict[str, Any]:
        """From the store's final read: this attempt's share, per fingerprint, bad rows, spent vs paid."""
        mine = ckpt.tally.by_attempt.get(self.attempts[-1])
        out = self.progress()
        out["resume"] = out["resume"].model_copy(update={"paid": mine.paid if mine else Decimal(0),
                                                         "requests": mine.sent if mine else 0})
        paid = ckpt.paid + ckpt.audit
        out.update(paid=paid, unrecorded=max(Decimal(0), spent - paid), fingerprints=ckpt.tally.fingerprints(),
                   models=ckpt.tally.models())
        if ckpt.tally.bad_rows:
            out["bad_rows"] = BadRows(count=ckpt.tally.bad_rows, first=ckpt.tally.first_bad, file=BAD_ROWS)
        return out


class _Monitor:
    """Throttled progress.json writes plus the on_progress callback (the progress bar); each write
    also adds a point to timeseries.jsonl (earlier attempts' points kept: the report plots them all).
    `base` (the attempt, the provider probe's verdict, the attempt's fingerprint and resume figures, the
    workers it lost) is what every write has beside the coordinator's figures."""

    def __init__(self, store: Store, ctx: RunContext, on_progress: Callable[[Progress], None],
                 carried: dict[str, Any] | None = None):
        """`carried`: `Progress` fields by name."""
        self.store, self.ctx, self.on_progress = store, ctx, on_progress
        self.base = Progress(attempt=ctx.attempt, stage=Stage.GENERATE, run_id=ctx.run_id or None,
                             outcome=Outcome.RUNNING, **(carried or {}))
        self.last = 0.0
        self.series = timeseries.TimeSeries()
        for p in timeseries.read_timeseries(store):
            self.series.add(p)

    def merged(self, figures: RunFigures) -> Progress:
        """The coordinator's figures and this attempt's as progress.json."""
        return self.base.model_copy(update=dict(figures))

    def tick(self, figures: RunFigures) -> None:
        progress = self.merged(figures)
        self.on_progress(progress)
        if time.monotonic() - self.last >= PROGRESS_EVERY_S:
            self.write(progress)
            self.last = time.monotonic()

    def write(self, progress: Progress) -> Progress:
        progress = write_progress(self.store, progress)
        self.series.add(timeseries.point(progress))
        self.store.put(TIMESERIES, timeseries.encode(self.series.points()))
        return progress


STOPPED_BY_SIGNAL = "stopped by a signal; resume by running again"
STOPPED_AT_ONCE = ("stopped at once by a second signal: the requests in flight were abandoned (they may have been "
                   "paid: their worst case is booked until the provider says what they cost); resume by running again")
def stopped_at_once(abandoned: AbandonedTotals) -> str:
    """What a second signal's stop says, once the stop is accounted: the worst case stays booked only
    while the provider has not said what the abandoned requests cost."""
    if abandoned.requests and not abandoned.open_requests:
        return ("stopped at once by a second signal: the requests in flight were abandoned, and the provider said "
                f"what they cost ({dollars(abandoned.reconciled_usd)}, booked); resume by running again")
    return STOPPED_AT_ONCE


ABANDON_WAIT_S = 5.0  # under Ray, how long workers get to write down what they abandon before they are killed


def _run_inline(run: _Run) -> RunFigures:
    """Workers as tasks in this process (`--inline`, `EYRIE_NO_RAY=1`, benchmarks)."""

    async def main() -> RunFigures:
        session = run.session
        coord = session.start()
        run.start_beside()
        workers = [session.shard_worker(i, run.plan) for i in range(session.senders)]
        tasks = [asyncio.create_task(w.run()) for w in workers]
        signalled = run.stopper.wake_on_signal()
        while not all(t.done() for t in tasks):
            await _wait_or_signal(tasks, signalled)
            _mark_first(run.timeline, workers)
            if (known := run.bytes_per_token_now()) is not None:
                coord.know_bytes_per_token(known)
            if run.stopper.hard:
                await coord.stop(Outcome.STOPPED, STOPPED_AT_ONCE, abandon=True)
                for t in tasks:
                    t.cancel()  # each worker writes down the requests it abandons (ShardWorker.run)
                await asyncio.gather(*tasks, return_exceptions=True)
                return coord.snapshot()
            if run.stopper.requested:
                await coord.stop(Outcome.STOPPED, STOPPED_BY_SIGNAL)
                _stop_here(workers)
                run.stopper.acknowledge(sum(len(w.sender.inflight.book.flights) for w in workers), run.notify)
            # off the loop: a store that retries (S3 down) must not stall answers in flight
            await asyncio.to_thread(run.monitor.tick, coord.snapshot())
        for t in tasks:
            t.result()
        if (known := await asyncio.to_thread(run.bytes_per_token_at_end)) is not None:
            coord.know_bytes_per_token(known)
        return coord.snapshot()

    return run_loop(main())


async def _wait_or_signal(aws: Sequence[asyncio.Future], signalled: asyncio.Event, timeout: float = 0.5) -> None:
    """Until one of `aws` is done, a signal arrives, or `timeout`: the driver's poll."""
    waiter = asyncio.ensure_future(signalled.wait())
    try:
        await asyncio.wait([*aws, waiter], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    signalled.clear()


def _stop_here(workers: Sequence[ShardWorker]) -> None:
    """Workers in this process learn a stop at once (not at their next report): nothing waiting for the rate
    limits is sent after it."""
    for w in workers:
        w.sender.budget.stopped = True


def _mark_first(timeline: Timeline, workers: Sequence[ShardWorker]) -> None:
    """The first request sent and the first answer back, as the in-process workers' clients saw them."""
    for w in workers:
        stats = w.sender.client.stats if w.sender.client is not None else None
        if stats is not None and stats.first_sent is not None:
            timeline.mark(FIRST_REQUEST, stats.first_sent)
        if stats is not None and stats.first_answer is not None:
            timeline.mark(FIRST_ANSWER, stats.first_answer)


FIRST_REQUEST, FIRST_ANSWER = "first request sent", "first answer received"


def local_ray(spec: DatasetGenerationSpec) -> bool:
    """`generation.ray.mode: Local` with no cluster named (RAY_ADDRESS): a private Ray on this machine."""
    return spec.generation.ray.mode == "Local" and not os.environ.get("RAY_ADDRESS")


def _init_ray(spec: DatasetGenerationSpec) -> None:
    import ray

    if ray.is_initialized():
        return
    # Workers inherit this process's environment (a local cluster) or their pod's (RayJob), which is
    # how the API key reaches them: never through a runtime_env, which Ray records.
    if local_ray(spec):  # a private cluster bound to loopback for this run only (DESIGN §9)
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False, _node_ip_address="127.0.0.1")
    else:
        ray.init(log_to_driver=True)


class _Movable:
    """The run coordinator as a local run's driver and its in-process worker call it: the object in this
    process until Ray is up, then the Ray actor it moved into (`move`). A worker's `coordinator_call`
    awaits these methods whichever it is."""

    def __init__(self, local: RunCoordinator):
        self.local: RunCoordinator | None = local
        self.actor: Any = None
        self._busy = 0
        self._moved: asyncio.Event | None = None  # set while moving: calls wait for the new home

    async def move(self, actor: Any) -> None:
        """Carry the whole state into `actor` between two calls: none runs here meanwhile, none is lost."""
        self._moved = asyncio.Event()
        while self._busy:  # a local call never waits long: with one worker nothing else holds budget
            await asyncio.sleep(0.01)
        await actor.adopt.remote(self.local)
        self.actor, self.local = actor, None
        self._moved.set()

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        async def call(*args: Any) -> Any:
            if self._moved is not None:
                await self._moved.wait()
            if self.actor is not None:
                return await getattr(self.actor, method).remote(*args)
            self._busy += 1
            try:
                res = getattr(self.local, method)(*args)
                return await res if asyncio.iscoroutine(res) else res
            finally:
                self._busy -= 1

        return call


def _beside(timeline: Timeline, name: str, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
    """`fn(*args)` on a daemon thread, timed as a step: what the first request need not wait for."""
    done: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            with timeline.step(name):
                done.set_result(fn(*args))
        except BaseException as e:
            done.set_exception(e)

    threading.Thread(target=run, name="eyrie-beside", daemon=True).start()
    return done


def _start_ray_beside(spec: DatasetGenerationSpec, timeline: Timeline) -> concurrent.futures.Future:
    """Ray's start on a thread of its own, beside the first requests. The thread then stays until the process
    ends: Ray's processes die with the thread that started them (their parent-death signal is the thread's),
    so a thread that returned would take the cluster with it. A run that ends before Ray is up still waits,
    at its exit, for Ray's own exit hook (which waits for the start to finish)."""
    done: concurrent.futures.Future = concurrent.futures.Future()

    def start() -> None:
        quiet = logging.getLogger("ray._private.worker")  # "no SIGTERM handler off the main thread": ours stays
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            with timeline.step("Ray's start (beside the first requests)"):
                _init_ray(spec)
            done.set_result(None)
        except BaseException as e:
            done.set_exception(e)
            return
        finally:
            quiet.setLevel(level)
        threading.Event().wait()  # never set: see the docstring

    threading.Thread(target=start, name="eyrie-ray-start", daemon=True).start()
    return done


def _run_local(run: _Run) -> RunFigures:
    """A local run (`generation.ray.mode: Local`, the default): shard worker 0 runs in this process from
    the start, with the coordinator, so the first request leaves while Ray starts beside it. Ray is
    needed only for workers 1.. (their own processes, on the machine's other cores): once it is up, the
    coordinator moves into a named actor (`_Movable`, its state whole) and they start as actors, as on
    a cluster; a lost one is replaced (its shards requeued) as `_run_ray` does. With one worker Ray is
    never started: it would only add processes."""

    actor_coord: list[Any] = []

    async def main() -> RunFigures:
        session, timeline = run.session, run.timeline
        n = session.senders
        configs = [session.actor_config(i, f"w{i}.0") for i in range(n)]  # refused before any worker starts
        coord = _Movable(session.start())
        session.coordinator = coord  # the worker here calls it wherever it lives
        first = session.shard_worker(0, run.plan)
        here = asyncio.create_task(first.run())
        ray_up: concurrent.futures.Future | None = None
        beside = False  # what runs beside the requests has started
        remote: dict[asyncio.Future, tuple[int, str, Any]] = {}  # a Ray worker's run -> (slot, id, handle)
        actor_cls: Any = None
        restarts = 0

        def start(i: int, gen: int) -> None:
            wid = f"w{i}.{gen}"
            # no api_key argument: Ray records arguments; the worker reads its own environment
            w = actor_cls.remote(replace(configs[i], sender_id=wid), coord.actor, run.plan)
            remote[asyncio.wrap_future(w.run_blocking.remote().future())] = (i, wid, w)

        signalled = run.stopper.wake_on_signal()
        while not here.done() or remote:
            await _wait_or_signal([here, *remote], signalled)
            _mark_first(timeline, [first])
            if not beside and _first_answer_due(first):
                beside = True
                run.start_beside()
                if n > 1:
                    ray_up = _start_ray_beside(run.spec, timeline)
            if (known := run.bytes_per_token_now()) is not None:
                await coord.know_bytes_per_token(known)
            if ray_up is not None and ray_up.done():
                ray_up.result()  # Ray that cannot start fails the run (as _run_ray's ray.init would)
                ray_up = None
                if not here.done() and not run.stopper.requested:
                    import ray

                    run.stopper.install()
                    with timeline.step("the coordinator moved into a Ray actor"):
                        actor_coord.append(session.start_actor(f"eyrie-coordinator-{session.attempt}"))
                        await coord.move(actor_coord[0])
                    actor_cls = ray.remote(ShardWorkerActor).options(num_cpus=0, max_concurrency=1, max_restarts=0)
                    for i in range(1, n):
                        start(i, 0)
            for fut in [f for f in remote if f.done()]:
                i, wid, _w = remote.pop(fut)
                if _lost(fut):
                    await coord.worker_lost(wid)
                    run.monitor.base.workers_lost += 1  # the operator says so (a Warning event)
                    if restarts < MAX_WORKER_RESTARTS * n:
                        restarts += 1
                        start(i, restarts)
            if run.stopper.hard:
                await coord.stop(Outcome.STOPPED, STOPPED_AT_ONCE, True)
                here.cancel()  # the worker here writes down the requests it abandons (ShardWorker.run)
                # Ray workers hear it on their next report (REPORT_SECONDS) and do the same; one that does
                # not in time leaves its slots, the bound of the same requests
                await asyncio.wait([here, *remote], timeout=ABANDON_WAIT_S)
                _kill(w for _i, _wid, w in remote.values())
                return await coord.snapshot()
            snap = await coord.snapshot()
            if run.stopper.requested:
                await coord.stop(Outcome.STOPPED, STOPPED_BY_SIGNAL)
                _stop_here([first])
                run.stopper.acknowledge(len(first.sender.inflight.book.flights) if not remote else snap.in_flight,
                                         run.notify)
            await asyncio.to_thread(run.monitor.tick, snap)  # off the loop: the requests here go on meanwhile
        here.result()
        if (known := await asyncio.to_thread(run.bytes_per_token_at_end)) is not None:
            await coord.know_bytes_per_token(known)
        return await coord.snapshot()

    try:
        return run_loop(main())
    finally:
        _kill(actor_coord)


QUIET_START_S = 3.0


def _first_answer_due(worker: ShardWorker) -> bool:
    """Whether what runs beside the requests may start: once the first answer is in, or QUIET_START_S after the
    first request left. On a small machine it would take the cores the first answer needs (the simulator's
    model, on the quickstart), and the worker here already uses the run's first slots meanwhile."""
    stats = worker.sender.client.stats if worker.sender.client is not None else None
    if stats is None or stats.first_sent is None:
        return False
    return stats.first_answer is not None or time.time() - stats.first_sent >= QUIET_START_S


def _lost(fut: asyncio.Future) -> bool:
    """Whether a Ray worker's run ended with its process (the worker itself returns normally)."""
    from ray.exceptions import RayActorError

    exc = fut.exception()
    if isinstance(exc, RayActorError):
        return True
    if exc is not None:
        raise exc
    return False


def _kill(actors: Any) -> None:
    actors = list(actors)
    if actors:  # never an import of Ray for nothing: a run that never started it ends without
        import ray

        for a in actors:
            ray.kill(a, no_restart=True)


def _run_ray(run: _Run) -> RunFigures:
    """A run on a Ray cluster (RayJob, Submit, or Local with RAY_ADDRESS): the coordinator and every worker
    are actors; the driver watches them."""
    import ray
    from ray.exceptions import RayActorError

    spec = run.spec
    run.start_beside()
    with run.timeline.step("Ray's start"):
        _init_ray(spec)
    run.stopper.install()
    session = run.session
    n = session.senders
    configs = [session.actor_config(i, f"w{i}.0") for i in range(n)]  # refused before any worker starts
    coord = session.start_actor(f"eyrie-coordinator-{session.attempt}")
    actor_cls = ray.remote(ShardWorkerActor).options(
        num_cpus=spec.generation.ray.cpus_per_worker if spec.generation.ray.mode != "Local" else 0,
        max_concurrency=1, max_restarts=0)

    def start(i: int, gen: int) -> tuple[str, Any, Any]:
        wid = f"w{i}.{gen}"
        # no api_key argument: Ray records arguments; the worker reads its own environment
        w = actor_cls.remote(replace(configs[i], sender_id=wid), coord, run.plan)
        return wid, w, w.run_blocking.remote()

    running = {}
    for i in range(n):
        wid, w, ref = start(i, 0)
        running[ref] = (i, wid, w)
    restarts = 0
    try:
        while running:
            ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
            for ref in ready:
                i, wid, _w = running.pop(ref)
                try:
                    ray.get(ref)
                except RayActorError:
                    ray.get(coord.worker_lost.remote(wid))
                    run.monitor.base.workers_lost += 1  # the operator says so (a Warning event)
                    if restarts < MAX_WORKER_RESTARTS * n:
                        restarts += 1
                        nwid, nw, nref = start(i, restarts)
                        running[nref] = (i, nwid, nw)
            if run.stopper.hard:
                # workers hear it on their next report (REPORT_SECONDS), write down what they abandon
                # and end; one that does not in time leaves its slots, the bound of the same requests
                ray.get(coord.stop.remote(Outcome.STOPPED, STOPPED_AT_ONCE, True))
                ray.wait(list(running), num_returns=len(running), timeout=ABANDON_WAIT_S)
                for _i, _wid, w in running.values():
                    ray.kill(w, no_restart=True)
                return ray.get(coord.snapshot.remote())
            if (known := run.bytes_per_token_now()) is not None:
                ray.get(coord.know_bytes_per_token.remote(known))
            snap = ray.get(coord.snapshot.remote())
            if run.stopper.requested:
                ray.get(coord.stop.remote(Outcome.STOPPED, STOPPED_BY_SIGNAL))
                run.stopper.acknowledge(snap.in_flight, run.notify)
            run.monitor.tick(snap)
        if (known := run.bytes_per_token_at_end()) is not None:
            ray.get(coord.know_bytes_per_token.remote(known))
        return ray.get(coord.snapshot.remote())
    finally:
        ray.kill(coord)
