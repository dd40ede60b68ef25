"""The run's single point of truth while it generates: the lease book, tool gate, counters, stop.

One instance per run: in the driver's event loop when running inline, or as a named Ray actor that
every shard worker calls. Workers do not call it per request: they hold budget leases
(`lease.py`) and report spend and tool observations in batches, when a lease runs out and every
`REPORT_SECONDS`. The first stop reason (budget, drift, credits, a fatal error) wins and every
worker sees it on its next call.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from eyrie.jobs.contract.money import dollars
from eyrie.jobs.contract.progress import Outcome, RunFigures, ToolFigures
from eyrie.jobs.generate.budget.forecast import Forecaster
from eyrie.jobs.generate.budget.lease import Grant, LeaseBook, Renewal, Report
from eyrie.jobs.status import SampleCounts, TokenCounts


@dataclass
class RequestResult:
    """What a worker learned from one prompt; plain data so it crosses Ray cheaply."""

    status: str  # ok | failed | rejected
    policy: str = "keep"  # keep | drop | flag
    input_tokens: int = 0
    output_tokens: int = 0
    retries: int = 0
    error_kind: str | None = None
    check: Any = None  # eyrie.jobs.tools.ResponseCheck of an answer (per-tool counts, gate)
    provider: str | None = None  # who answered (OpenRouter's `provider`)
    prompt_tokens: int | None = None  # the provider's usage.prompt_tokens, when reported
    # canary answers: our prompt length per template variant and thinking reading (variants.prompt_lengths)
    prompt_lengths: dict[str, dict[bool, int]] | None = None
    cost: Decimal | None = None  # what the prompt cost (None: nothing billed), for the forecast
    transient: bool = False  # failed only on transient errors: a resume sends it again


@dataclass
class Counts:
    """What the records say so far: the prompts by outcome (`prompts`, the run's `SampleCounts`: `rejected`
    were never sent, a bad row or declaration: unpaid; `discarded` were answered, paid (`discarded_usd`) and
    then excluded by the tool policy), tokens, and failures by error type."""

    prompts: SampleCounts = field(default_factory=SampleCounts)  # its `total` is the run's, set in `samples`
    discarded_usd: Decimal = Decimal(0)
    input_tokens: int = 0
    output_tokens: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # failed samples by error type
    resend: int = 0  # failed samples a resume sends again (only transient errors), part of `failed`

    def add(self, obs: RequestResult) -> None:
        p = self.prompts
        if obs.status == "ok":
            if obs.policy == "drop":
                p.discarded += 1
                self.discarded_usd += obs.cost or Decimal(0)
            else:
                p.done += 1
        elif obs.status == "rejected":
            p.rejected += 1
        else:
            p.failed += 1
            self.failures[obs.error_kind or "unknown"] += 1
            self.resend += obs.transient
        self.input_tokens += obs.input_tokens
        self.output_tokens += obs.output_tokens

    def samples(self, total: int) -> SampleCounts:
        """progress.json's `samples`: the prompts of `total` by outcome."""
        return self.prompts.model_copy(update={"total": total})

    def tokens(self) -> TokenCounts:
        """progress.json's `tokens`."""
        return TokenCounts(input=self.input_tokens, output=self.output_tokens)


@dataclass(frozen=True)
class CoordinatorArgs:
    """What a run's coordinator starts from: the run's cap and what earlier attempts spent and counted, the prompts
    and shards to hand out, and the run's judges. Plain data, so it crosses into the coordinator's Ray actor as it
    is (`Session.start_actor`)."""

    max_usd: Decimal
    spent: Decimal  # what earlier attempts paid (checkpoint.py)
    counts: Counts  # and what their records say
    total: int  # prompts of the run
    shards: list[int]  # to hand out, in order
    gate: Any = None  # eyrie.jobs.tools.gate.ToolGate (the canary's judge), or None
    audit_usd: Decimal = Decimal(0)  # part of `spent`, paid by `eyrie audit`
    workers: int = 1  # senders sharing the cap (each holds a lease)
    variants: Any = None  # eyrie.jobs.reconstruct.variants.VariantDetector, or None
    forecast: Forecaster | None = None  # seeded with earlier attempts' costs


class RunCoordinator:
    """The ledger, gate and stop of one run. What a stop may leave paid and unrecorded is not its
    business: each worker keeps its requests in flight bounded in the store (inflight.py), and the
    final accounting reads the store (checkpoint.py)."""

    def __init__(self, max_usd: Decimal, spent: Decimal, counts: Counts, total: int,
                 shards: list[int], gate: Any = None, audit_usd: Decimal = Decimal(0), workers: int = 1,
                 variants: Any = None, forecast: Forecaster | None = None):
        self.book = LeaseBook(max_usd=max_usd, workers=workers, spent=spent)
        self.abandoning = False  # stopped at once: workers abandon what is in flight
        self._changed = asyncio.Condition()
        self.counts = counts
        self.total = total
        self.gate = gate  # eyrie.jobs.tools.gate.ToolGate or None
        self.variants = variants  # eyrie.jobs.reconstruct.variants.VariantDetector or None
        self.audit_usd = audit_usd  # part of the spend, paid by `eyrie audit`
        self.outcome = Outcome.RUNNING
        self.message = ""
        self.retries = 0
        self.errors: Counter[str] = Counter()
        self.requests = 0
        self.calls = 0  # calls from workers (the benchmarks count them per request)
        self._pending_shards = list(shards)
        self._active: dict[int, str] = {}  # shard -> worker id
        self.forecast = forecast  # seeded with earlier attempts' costs: may judge before any spend
        self._judge_forecast()

    @classmethod
    def start(cls, args: CoordinatorArgs) -> RunCoordinator:
        return cls(**vars(args))

    # -- moving: the driver's coordinator into a Ray actor (generate/driver.py, a local run) ---------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_changed"]  # bound to this process's event loop: the new home makes its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._changed = asyncio.Condition()

    def adopt(self, other: RunCoordinator) -> None:
        """Become `other` (its ledger, gate, counters, shards and stop, whole): a local run's coordinator
        starts in the driver's process, so that the first request need not wait for Ray, and moves
        into a Ray actor once Ray is up and other workers need to reach it."""
        self.__setstate__(other.__getstate__())

    def know_bytes_per_token(self, n: int) -> None:
        """What extraction stores per token (the forecast's projection of the hidden states), once the driver
        has read it from the model's config beside the first requests."""
        if self.forecast is not None:
            self.forecast.know_bytes_per_token(n)

    # -- shards ------------------------------------------------------------------------------
    def next_shard(self, worker: str) -> int | None:
        self.calls += 1
        if self.outcome != Outcome.RUNNING or not self._pending_shards:
            return None
        shard = self._pending_shards.pop(0)
        self._active[shard] = worker
        return shard

    def shard_done(self, shard: int) -> None:
        self.calls += 1
        self._active.pop(shard, None)

    async def worker_lost(self, worker: str) -> list[int]:
        """A worker died: requeue its shards and count its whole lease as spent (its requests may
        have been paid; counting them is the safe side)."""
        lost = [s for s, w in self._active.items() if w == worker]
        for s in lost:
            del self._active[s]
        self._pending_shards[:0] = lost
        self.book.lost(worker)
        await self._notify()
        return lost

    # -- budget ------------------------------------------------------------------------------
    async def lease(self, report: Report, want: Decimal, hint: Decimal) -> Grant:
        """Account `report`, then renew the worker's lease by at least `want` (aiming at `hint`).
        Waits here while nothing of the worker's own is open and the budget is leased to others;
        answers WAIT when the worker's own reservations may free what it needs."""
        self.calls += 1
        w = report.worker
        if not self._account(report):  # a late report (its worker failed meanwhile): no new slice
            return self._grant(w, Renewal.EXHAUSTED)
        async with self._changed:
            self._changed.notify_all()  # what this report returned may be what another waits for
            while True:
                if self.outcome != Outcome.RUNNING:
                    return self._grant(w, Renewal.EXHAUSTED)
                renewal = self.book.renew(w, want, hint, self._canary_left())
                if renewal is Renewal.EXHAUSTED:
                    self._stop(Outcome.BUDGET_EXHAUSTED,
                               f"budget exhausted: spent {dollars(self.book.spent)} of {dollars(self.book.max_usd)}; "
                               f"the next request could cost up to {dollars(want)}")
                    self._changed.notify_all()
                    return self._grant(w, renewal)
                if renewal is Renewal.GRANTED:
                    break
                if report.in_flight > 0:
                    return self._grant(w, renewal)
                await self._changed.wait()
        return self._grant(w, Renewal.GRANTED)

    def _grant(self, worker: str, renewal: Renewal) -> Grant:
        return Grant(renewal, self.book.grants.get(worker, Decimal(0)), self.book.quota(worker),
                     self.book.price_factor, stop=self.outcome != Outcome.RUNNING, abandon=self.abandoning)

    def _canary_left(self) -> int | None:
        """Answers still needed before the first judgment (the gate's, or the forecast's when it may
        suspend): leases carry a request quota until then, so nothing is spent past the canary."""
        lefts = []
        if self.gate is not None and self.gate.spec.enabled:
            lefts.append(self.gate.canary_left())
        f = self.forecast
        if f is not None and f.suspend and not f.judged:
            lefts.append(f.canary - f.costs.count)
        lefts = [n for n in lefts if n > 0]
        return min(lefts) if lefts else None

    def _prompts_left(self) -> int:
        return self.total - self.counts.prompts.finished

    def _judge_forecast(self) -> None:
        if self.forecast is not None and (
                why := self.forecast.judge(self.book.spent, self._prompts_left(), self.book.max_usd)):
            self._stop(Outcome.FORECAST_OVER_BUDGET, why)

    async def give_back(self, report: Report) -> None:
        """A worker ended: its final spend and observations; nothing stays leased to it."""
        self.calls += 1
        self._account(report)
        self.book.give_back(report)
        await self._notify()

    def _account(self, report: Report) -> bool:
        if not self.book.report(report):
            return False
        for obs in report.observations:
            self.observe(obs)
        self._judge_forecast()  # after the whole report: its spend and its answers both counted
        return True

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def observe(self, obs: RequestResult) -> bool:
        self.counts.add(obs)
        self.retries += obs.retries
        if obs.status != "rejected":
            self.requests += 1 + obs.retries
        if obs.error_kind:
            self.errors[obs.error_kind] += 1
        if self.gate is not None and obs.check is not None:
            drift = self.gate.observe_check(obs.check)
            if drift is not None:
                self._stop(Outcome.TOOL_SEMANTICS_DRIFT, drift.message)
        if self.variants is not None and obs.prompt_lengths is not None:
            mismatch = self.variants.observe(obs.provider, obs.prompt_tokens, obs.prompt_lengths)
            if mismatch is not None:
                self._stop(Outcome.TEMPLATE_MISMATCH, mismatch.message)
        if self.forecast is not None:
            self.forecast.add(obs.cost or Decimal(0), obs.input_tokens + obs.output_tokens)
        return self.outcome != Outcome.RUNNING

    async def stop(self, outcome: str, message: str, abandon: bool = False) -> None:
        """Stop the run (the first reason wins); `abandon`: at once, the requests in flight are not
        waited for (workers learn it on their next call)."""
        self.calls += 1
        self._stop(outcome, message)
        self.abandoning = self.abandoning or abandon
        await self._notify()

    def _stop(self, outcome: str, message: str) -> None:
        if self.outcome == Outcome.RUNNING:
            self.outcome, self.message = outcome, message
            self.book.exhausted = True

    # -- reporting ---------------------------------------------------------------------------
    def snapshot(self) -> RunFigures:
        c = self.counts
        forecast = self.forecast.to_progress(self.book.spent, self._prompts_left()) if self.forecast else None
        return RunFigures(
            outcome=self.outcome, message=self.message, spent=self.book.spent, reserved=self.book.leased,
            max_usd=self.book.max_usd, audit=self.audit_usd, price_factor=self.book.price_factor,
            forecast=forecast.mean if forecast else None, forecast_figures=forecast,
            discarded=c.discarded_usd, samples=c.samples(self.total),
            tokens=c.tokens(),
            tools=self.gate.metrics() if self.gate is not None else ToolFigures(),
            failures=dict(c.failures), resend_on_resume=c.resend, requests=self.requests, retries=self.retries,
            errors=dict(self.errors), in_flight=sum(self.book.in_flight.values()), coordinator_calls=self.calls,
            template_variants=self.variants.summary() if self.variants is not None else None)
