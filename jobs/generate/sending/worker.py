"""A shard worker: takes shards from the coordinator, sends their prompts, checks each answer and
makes it durable before its slot is freed (`journal.py`: the invariant and the group commit).

Persistence is the exactly-once boundary: a shard's ids already in the store are skipped. The
worker is one `asyncio.TaskGroup`: the journal's writer, one task per request in flight (at most
`concurrency`, each holding a slot) and one per shard finishing. Any task that raises (a store that
stays down, a lost coordinator, a bug) cancels the others and the worker ends with outcome Failed
naming the error; nothing can wait forever on a sibling that died.

`process` is the per-request path (prepare, reserve, send, check, settle -> one record): a plain
coroutine with no knowledge of shards or persistence, so a caller can run it per prompt or per turn.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from eyrie.jobs.api import AuthError, ChatClient, InsufficientCredits, RequestFailed, reported_cost
from eyrie.jobs.api.client import Completion
from eyrie.jobs.api.sse import parse_completion
from eyrie.jobs.context import api_key_from_env
from eyrie.jobs.contract import layout, records
from eyrie.jobs.contract.fingerprint import fingerprint, generated_mode
from eyrie.jobs.contract.progress import Outcome, now_iso
from eyrie.jobs.errors import EyrieError
from eyrie.jobs.generate.budget.coordinator import RequestResult
from eyrie.jobs.generate.budget.holder import Abandoned, InflightLog, LeaseHolder
from eyrie.jobs.generate.budget.pricing import Pricing, UnpriceableRequest, actual_cost, usd, worst_case
from eyrie.jobs.generate.plan import ShardPlan
from eyrie.jobs.generate.sending import agentic
from eyrie.jobs.generate.sending.journal import Journal, ShardState, compact_shard, scan_shard
from eyrie.jobs.generate.sending.requests import build_body, estimate_prompt_tokens, max_output_tokens, prepare_row
from eyrie.jobs.sources import BadRow, Prompt, iter_source
from eyrie.jobs.spec import DatasetGenerationSpec
from eyrie.jobs.store import Store
from eyrie.jobs.tools import checks, declarations

log = logging.getLogger(__name__)

DATASET_PROVIDER = "dataset"  # the provider of an answer taken from the row itself (generation.answers: dataset)


def run_loop(coro: Any) -> Any:
    """Run a coroutine on uvloop where available: ~20% less CPU per request than asyncio's loop."""
    try:
        import uvloop
    except ImportError:  # e.g. Windows
        return asyncio.run(coro)
    return uvloop.run(coro)


# The coordinator seen from a worker: in-process it is the object, under Ray an actor handle.
Call = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class WorkerConfig:
    """What a shard worker is told; plain data (it crosses into a Ray actor), never the API key."""

    spec_json: str
    worker_id: str
    attempt: str
    base_url: str
    concurrency: int
    rpm: int | None = None
    tpm: int | None = None
    fingerprint: str | None = None  # the run's (contract/fingerprint.py); None: the worker's own spec's


class WorkerFailed(EyrieError, RuntimeError):
    """A worker could not go on (store down after retries, coordinator lost, a bug); the run's
    outcome is Failed with this message."""


@dataclass
class _ShardRun:
    """One shard while a worker holds it: requests still open, and whether all were fed."""

    shard: int
    state: ShardState
    todo: int
    open: int = 0
    fed: bool = False
    answered: int = 0
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    earlier: dict[str, list[records.Record]] = field(default_factory=dict)  # turns: all, by conversation

    def settle_one(self, answered: bool) -> None:
        self.open -= 1
        self.answered += answered
        if self.fed and self.open == 0:
            self.drained.set()


class ShardWorker:
    def __init__(self, config: WorkerConfig, coordinator: Any, plan: ShardPlan | None,
                 store: Store | None = None, *, api_key: str | None = None, is_actor: bool = False):
        self.spec = DatasetGenerationSpec.model_validate_json(config.spec_json)
        self.worker_id = config.worker_id
        self.attempt = config.attempt
        self.base_url = config.base_url
        # under Ray the key is not an argument (Ray records those): workers read their environment
        self.api_key = api_key if api_key is not None else api_key_from_env()
        self.concurrency = config.concurrency
        self.rpm, self.tpm = config.rpm, config.tpm
        self._coord = coordinator
        self._is_actor = is_actor
        self.plan = plan  # the shards' row ranges (None: `process` calls only, as the audit makes)
        self.store = store
        prices = self.spec.effective_pricing()
        self.pricing = Pricing(prices.input_per_million, prices.output_per_million)
        self.max_out = max_output_tokens(self.spec)
        self.mode = generated_mode(self.spec)  # audit runs structured
        # on every record: what shaped its answer (the run's binding: routing a probe derived is part of it)
        self.fingerprint = config.fingerprint or fingerprint(self.spec).id
        self.agentic = self.spec.generation.turns == "all"
        self.dataset_answers = self.spec.generation.answers == "dataset"
        key = layout.inflight_key(self.worker_id, secrets.token_hex(4))
        meta = {"attempt": self.attempt, "worker": self.worker_id, "maxUSD": str(self.spec.budget.max_usd)}
        self.inflight = InflightLog(lambda doc: self._store().put(key, doc), lambda: self._store().delete(key), meta)
        self.budget = LeaseHolder(self._call, self.worker_id, self.concurrency, self.inflight)
        self._unrecorded: dict[int, int] = {}  # id(record) -> its request's reservation, until durable
        self.persisted = 0
        self._tok: Any = False  # the target tokenizer; False: not loaded yet, None: none set
        self._counter: Callable[[str], int] | None = None
        from eyrie.jobs.reconstruct.variants import TemplateCanary

        self.canary = TemplateCanary(self.spec, self._tokenizer)

    @property
    def stopping(self) -> bool:
        """The run stopped (any reason): dispatch nothing more; requests in flight finish."""
        return self.budget.stopped

    def open_client(self) -> ChatClient:
        """The API client for `process` calls; use as `async with worker.open_client():`."""
        self.client = ChatClient(
            self.base_url, self.api_key, timeout=self.spec.api.request_timeout_seconds,
            max_retries=self.spec.api.max_retries, max_concurrency=self.concurrency,
            requests_per_minute=self.rpm, tokens_per_minute=self.tpm, stream=self.spec.api.stream,
            headers=self.spec.api.headers)
        return self.client

    async def _call(self, method: str, *args: Any) -> Any:
        fn = getattr(self._coord, method)
        if self._is_actor:
            return await fn.remote(*args)
        res = fn(*args)
        return await res if asyncio.iscoroutine(res) else res

    def _tokenizer(self) -> Any:
        """The target tokenizer, loaded once per worker (None without target.tokenizer)."""
        if self._tok is False:
            self._tok = None
            if self.spec.target.tokenizer:
                from eyrie.jobs.reconstruct.tokenizers import load_tokenizer

                self._tok = load_tokenizer(self.spec.target, self.spec.output.endpoint)
        return self._tok

    def _count_tokens(self) -> Callable[[str], int] | None:
        """The target tokenizer's counter (None without target.tokenizer)."""
        tok = self._tokenizer()
        if tok is not None and self._counter is None:
            self._counter = lambda text: len(tok.encode(text))
        return self._counter

    def _store(self) -> Store:
        if self.store is None:
            from eyrie.jobs.store import open_output

            self.store = open_output(self.spec)
        return self.store

    def run_blocking(self) -> int:
        """The Ray actor's entry: the worker's own (uv)loop, on a thread of its own because Ray
        already runs an asyncio loop in an actor that has async methods."""
        with ThreadPoolExecutor(1, thread_name_prefix="eyrie-worker") as pool:
            return pool.submit(run_loop, self.run()).result()

    # -- the worker: shards in, durable records out --------------------------------------------
    async def run(self) -> int:
        """Process shards until none are left or the run stops; returns records persisted. Any
        failure of any task ends the worker and the run with outcome Failed and its message."""
        try:
            async with self.open_client():
                await self._run_shards()
            await self.budget.give_back()
        except asyncio.CancelledError:  # the run stopped at once: what was in flight is written down
            await self.budget.abandon()
            raise
        except Exception as e:  # an ExceptionGroup from the TaskGroup, or the client's own
            err = _first_cause(e)
            if isinstance(err, Abandoned):  # the run stopped at once (under Ray: no cancel reaches here)
                await self.budget.abandon()
                return self.journal.durable
            message = f"worker {self.worker_id} stopped: {type(err).__name__}: {err}"
            if not isinstance(err, EyrieError):
                log.error("%s", message, exc_info=err)  # a bug: keep its traceback
            try:
                await self.budget.give_back(failed=True)
                await self.budget.stop(Outcome.FAILED, message)
            except Exception:
                raise WorkerFailed(message) from err
        return self.persisted

    async def _run_shards(self) -> None:
        self.journal = Journal(self._store())
        self._slots = asyncio.Semaphore(self.concurrency)
        async with asyncio.TaskGroup() as tg:
            writer = tg.create_task(self.journal.run())
            reporter = tg.create_task(self.budget.report_forever())
            finishing = []
            while not self.stopping:
                shard = await self._call("next_shard", self.worker_id)
                if shard is None:
                    break
                run = await self._start_shard(shard)
                finishing.append(tg.create_task(self._finish_shard(run)))
                await self._feed(tg, run)
            await asyncio.gather(*finishing)  # every record durable, every shard compacted
            writer.cancel()
            self.budget.close()
            await reporter
        self.persisted = self.journal.durable

    async def _start_shard(self, shard: int) -> _ShardRun:
        state = await asyncio.to_thread(scan_shard, self._store(), shard)
        run = _ShardRun(shard, state, todo=0)
        if self.agentic:
            run.earlier = await asyncio.to_thread(agentic.earlier_turns, self._store(), shard)
        return run

    async def _feed(self, tg: asyncio.TaskGroup, run: _ShardRun) -> None:
        """Start one task per prompt not yet persisted, each once a slot is free."""
        done = run.state.done
        async for sid, prompt in self._prompts(run.shard):
            if self.stopping:
                break
            if agentic.finished(run.earlier.get(sid, [])) if self.agentic else sid in done:
                continue
            run.todo += 1
            await self._slots.acquire()
            run.open += 1
            tg.create_task(self._conversation(run, sid, prompt) if self.agentic else self._request(run, sid, prompt))
        run.fed = True
        if run.open == 0:
            run.drained.set()

    async def _prompts(self, shard: int) -> AsyncIterator[tuple[str, Prompt | BadRow]]:
        """The shard's rows streamed from their sources, `concurrency` at a time and read off the
        event loop: a worker holds O(concurrency) prompts, however large its shard."""
        if self.plan is None:
            raise ValueError("a worker without a plan only answers `process` calls")
        by_name = {s.name: s for s in self.spec.sources}
        whole = self.spec.generation.turns == "all"
        for span in self.plan.shards[shard]:
            rows = iter_source(by_name[span.source], self.spec.output.endpoint, whole=whole, start=span.start,
                               stop=span.stop, index=self.plan.indexes[span.source], answers=self.dataset_answers)

            def take(rows: Iterator[Prompt | BadRow] = rows) -> list[tuple[str, Prompt | BadRow]]:
                return [(item.sample_id(), item) for item in itertools.islice(rows, self.concurrency)]

            while batch := await asyncio.to_thread(take):
                for item in batch:
                    yield item

    async def _request(self, run: _ShardRun, sid: str, prompt: Prompt | BadRow) -> None:
        """One prompt under its slot: the slot is freed only once the record is durable."""
        answered = False
        try:
            rec = await self.process(sid, prompt)
            if rec is not None:
                await self.commit(self.journal, run.shard, rec)
                answered = True
        finally:
            run.settle_one(answered)
            self._slots.release()

    async def _conversation(self, run: _ShardRun, sid: str, prompt: Prompt | BadRow) -> None:
        """A conversation's turns under one slot (`agentic.converse`: each turn durable before the next)."""
        ended = False
        try:
            ended = await agentic.converse(self, run.shard, sid, prompt, run.earlier.get(sid, []))
        finally:
            run.settle_one(ended)
            self._slots.release()

    async def _finish_shard(self, run: _ShardRun) -> None:
        """Once the shard's requests are durable: compact its journal into parts; report it done
        when every prompt got a record (a stopped run leaves it for the resume)."""
        await run.drained.wait()
        await asyncio.to_thread(compact_shard, self._store(), run.shard, run.state,
                                self.spec.generation.part_records)
        if run.answered == run.todo:
            await self._call("shard_done", run.shard)

    # -- the per-request path ------------------------------------------------------------------
    def _base_record(self, sid: str, prompt: Prompt | BadRow) -> records.Record:
        return {"sample_id": sid, "source": prompt.source, "row": prompt.row, "attempt": self.attempt,
                "fingerprint": self.fingerprint, "toolsMode": self.mode, "createdAt": now_iso(), "costUSD": "0",
                "attempts": 0, "response": None, "usage": None, "error": None, "checks": {}, "policy": "keep"}

    def prepare(self, prompt: Prompt | BadRow) -> declarations.Prepared | tuple[str, str]:
        """The prompt's tools declared for this run's mode, or (error type, reason) of a rejected one."""
        return prepare_row(prompt, self.mode, whole=self.agentic)

    def _rejected(self, rec: records.Record, kind: str, reason: str) -> records.Record:
        rec.update(status="rejected", request=None, error={"type": kind, "message": reason})
        self.budget.observe(RequestResult("rejected"))
        return rec

    async def reject(self, shard: int, rec: records.Record, kind: str, reason: str) -> None:
        """Persist a prompt that is never sent (nothing paid)."""
        await self.journal.commit(shard, self._rejected(rec, kind, reason))

    async def commit(self, journal: Journal, shard: int, rec: records.Record) -> None:
        """Make `rec` durable in `journal`; only then is its request no longer in flight (its cost is
        in the store). Every caller of `process`/`send_prepared` persists through here."""
        await journal.commit(shard, rec)
        rid = self._unrecorded.pop(id(rec), None)
        if rid is not None:
            self.budget.durable(rid)

    async def process(self, sid: str, prompt: Prompt | BadRow) -> records.Record | None:
        """One prompt -> one record, or None when the run stopped before it was sent."""
        rec = self._base_record(sid, prompt)
        prepared = self.prepare(prompt)
        if not isinstance(prepared, declarations.Prepared):
            return self._rejected(rec, *prepared)
        if self.dataset_answers:
            return self.take_answer(rec, prepared, prompt)
        return await self.send_prepared(rec, prepared)

    def take_answer(self, rec: records.Record, prepared: declarations.Prepared,
                    prompt: Prompt | BadRow) -> records.Record:
        """`generation.answers: dataset`: the row's own answer as the response of the request that would
        have been sent (provider `dataset`, read by the same parser as a provider's body): nothing sent,
        nothing paid, checked and kept or dropped as a bought answer is."""
        answer = prompt.answer if isinstance(prompt, Prompt) else None
        if answer is None:
            return self._rejected(rec, "no_answer", "the row has no assistant turn right after its prompt's user "
                                  "turn to take as the answer (generation.answers: dataset)")
        rec["request"] = build_body(self.spec, prepared.messages, prepared.tools)
        response, _ = parse_completion({"provider": DATASET_PROVIDER, "model": self.spec.target.model, "choices": [
            {"message": answer, "finish_reason": "tool_calls" if answer.get("tool_calls") else "stop"}]})
        check = checks.check_response(prepared, response)
        verdict = checks.policy(check, self.spec.tools.on_invalid_call)
        rec.update(status="ok", response=response, checks=check.to_record(), policy=verdict)
        self.budget.observe(RequestResult("ok", policy=verdict, check=check, provider=DATASET_PROVIDER,
                                          cost=Decimal(0)))
        return rec

    async def send_prepared(self, rec: records.Record, prepared: declarations.Prepared) -> records.Record | None:
        """Reserve, send, check and settle one request; fills `rec`, or None when the run stopped
        before it was sent (one prompt, or one turn of a conversation)."""
        body = build_body(self.spec, prepared.messages, prepared.tools)
        rec["request"] = body
        est = estimate_prompt_tokens(prepared.messages, prepared.tools or prepared.declared_tools,
                                     self._count_tokens())
        rid, amount = await self._reserve(est)
        if rid is None:
            return None
        sent = await self._send(body, est, rid)
        if sent is None:
            return None
        if isinstance(sent, RequestFailed):
            cost, obs = self._record_failure(rec, sent)
            if cost is None:
                self.budget.release(rid, obs)
            else:
                self._unrecorded[id(rec)] = rid
                self.budget.settle(rid, cost, obs)
            return rec
        cost, obs = self._record_answer(rec, prepared, sent, amount)
        self._unrecorded[id(rec)] = rid  # paid: in flight until `commit` makes the record durable
        if self.canary.wants(sent.response):  # each provider's canary: our prompt length per template variant
            obs.prompt_lengths = await asyncio.to_thread(self.canary.lengths, body, sent.response, sent.usage or {})
        self.budget.settle(rid, cost, obs)
        return rec

    async def _reserve(self, est: int) -> tuple[int | None, Decimal]:
        """Reserve the request's worst case; (None, 0) when the run stops instead."""
        try:
            amount = worst_case(self.pricing, est, self.max_out)
        except UnpriceableRequest as e:
            await self.budget.stop(Outcome.FAILED, str(e))
            return None, Decimal(0)
        return await self.budget.reserve(amount), amount

    async def _send(self, body: dict, est: int, rid: int) -> Completion | RequestFailed | None:
        """The answer, a per-sample failure, or None when the provider's error stops the run."""
        self.budget.sending(rid)
        try:
            return await self.client.complete(body, est_tokens=est,
                                              on_id=lambda gen: self.budget.identify(rid, gen))
        except RequestFailed as e:  # this sample fails (retries spent, a refusal, a 4xx); the run goes on
            return e
        except InsufficientCredits as e:  # out of credits, a spent key or budget: the run stops
            kind, outcome, message = "insufficient-credits", Outcome.INSUFFICIENT_CREDITS, str(e)
        except AuthError as e:
            kind, outcome, message = "auth", Outcome.FAILED, str(e)
        self.budget.release(rid, RequestResult("failed", error_kind=kind))
        await self.budget.stop(outcome, message)
        return None

    def _record_failure(self, rec: records.Record, e: RequestFailed) -> tuple[Decimal | None, RequestResult]:
        """Fill the record of a failed sample; what it cost (None: nothing billed) and what the
        coordinator learns from it. Usage reported with the failure (a refusal mid-stream) means it
        may have been billed."""
        cost = actual_cost(self.pricing, e.usage, reported_cost(e.usage)) if e.usage else None
        error: dict[str, Any] = {"type": e.kind, "message": str(e)}
        if e.details:
            error["details"] = e.details
        if e.transient:  # retries ran out on errors a later attempt may not meet: a resume resends it
            error["transient"] = True
        rec.update(status="failed", attempts=e.attempts, error=error, usage=e.usage,
                   costUSD=usd(cost) if cost is not None else "0")
        used = e.usage or {}
        return cost, RequestResult("failed", retries=max(0, e.attempts - 1), error_kind=e.kind, transient=e.transient,
                                 input_tokens=int(used.get("prompt_tokens") or 0),
                                 output_tokens=int(used.get("completion_tokens") or 0), cost=cost)

    def _record_answer(self, rec: records.Record, prepared: declarations.Prepared, done: Completion,
                       amount: Decimal) -> tuple[Decimal | None, RequestResult]:
        """Fill the record of an answer; its actual cost (None: settled at the reservation) and
        what the coordinator learns from it."""
        cost = actual_cost(self.pricing, done.usage, done.cost)
        check = checks.check_response(prepared, done.response)
        verdict = checks.policy(check, self.spec.tools.on_invalid_call)
        usage = done.usage or {}
        rec.update(status="ok", response=done.response, usage=done.usage, attempts=done.attempts,
                   costUSD=usd(cost if cost is not None else amount), checks=check.to_record(),
                   policy=verdict, latencyS=round(done.latency_s, 3))
        reported = usage.get("prompt_tokens")
        obs = RequestResult("ok", policy=verdict, input_tokens=int(reported or 0),
                          output_tokens=int(usage.get("completion_tokens") or 0),
                          retries=done.attempts - 1, check=check, provider=done.response.get("provider"),
                          prompt_tokens=reported if isinstance(reported, int) else None,
                          cost=cost if cost is not None else amount)
        return cost, obs


def _first_cause(e: BaseException) -> BaseException:
    """The first leaf of an ExceptionGroup (the TaskGroup's), else the exception itself."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e
