"""The request sender: the one path every request takes, whoever asks (a shard, a conversation's turn, the
audit, the provider probe).

prepare (the prompt's tools declared for the mode) -> reserve (its worst case against the budget lease, its
slot's cap in the store before it is sent) -> send (the API client, within the provider's limits) -> check
(the tool checks, the template canary's prompt lengths) -> settle (the actual cost) -> persist (the record
durable in the journal; only then is the request no longer in flight).

A `Sender` knows nothing of shards or sessions: it is given its coordinator (in-process or a Ray actor), its
journal and its `Pacer` (`session.py` builds every sender and shares the provider's limits among them).
`answer` is the whole path under one of the sender's slots, the one step every loop runs (the shard loop,
`Session.answer_all`); `record`, `prepare`, `reject`, `send` and
`persist` are its steps, for a caller that runs several requests under one slot (a conversation's turns:
`agentic.TurnSender`).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from eyrie.jobs.api import AuthError, ChatClient, InsufficientCredits, RequestFailed, reported_cost
from eyrie.jobs.api.client import Completion
from eyrie.jobs.api.errors import NotSent
from eyrie.jobs.api.limits import Limits, Pacer
from eyrie.jobs.api.sse import parse_completion
from eyrie.jobs.context import api_key_from_env
from eyrie.jobs.contract import layout, records
from eyrie.jobs.contract.fingerprint import fingerprint, generated_mode
from eyrie.jobs.contract.progress import Outcome, now_iso
from eyrie.jobs.generate.budget.coordinator import RequestResult
from eyrie.jobs.generate.budget.holder import InflightLog, LeaseHolder
from eyrie.jobs.generate.budget.pricing import Pricing, UnpriceableRequest, actual_cost, usd, worst_case
from eyrie.jobs.generate.sending.journal import Journal, company_for
from eyrie.jobs.generate.sending.requests import build_body, estimate_prompt_tokens, max_output_tokens, prepare_row
from eyrie.jobs.sources import BadRow, Prompt
from eyrie.jobs.spec import DatasetGenerationSpec, GenerationSpec
from eyrie.jobs.store import Store
from eyrie.jobs.tools import checks, declarations

# The coordinator seen from a sender: `await call("lease", ...)`, whether it is the object or a Ray actor.
Call = Callable[..., Awaitable[Any]]


DATASET_PROVIDER = "dataset"  # the provider of an answer taken from the row itself (generation.answers: dataset)

def coordinator_call(coordinator: Any) -> Call:
    """How a sender calls the run coordinator in this process (a Ray actor's: `actor.actor_call`)."""

    async def call(method: str, *args: Any) -> Any:
        res = getattr(coordinator, method)(*args)
        return await res if asyncio.iscoroutine(res) else res

    return call


@dataclass(frozen=True)
class SenderConfig:
    """What a sender is told; plain data (it crosses into a Ray actor), never the API key."""

    spec_json: str
    sender_id: str
    attempt: str
    base_url: str
    limits: Limits  # this sender's share of the provider's limits (session.py)
    fingerprint: str | None = None  # the run's (contract/fingerprint.py); None: the sender's own spec's


class Sender:
    """One sender's per-request path (see the module docstring). `journal` and the pacer's rates may be shared
    with other senders; without them the sender makes its own (a journal on its store, a pacer of its limits)."""

    def __init__(self, config: SenderConfig, call: Call, store: Store | None = None, *, api_key: str | None = None,
                 journal: Journal | None = None, pacer: Pacer | None = None):
        self.spec = DatasetGenerationSpec.model_validate_json(config.spec_json)
        self.sender_id = config.sender_id
        self.attempt = config.attempt
        self.base_url = config.base_url
        # under Ray the key is not an argument (Ray records those): workers read their environment
        self.api_key = api_key if api_key is not None else api_key_from_env()
        self.limits = config.limits
        self.concurrency = config.limits.concurrency
        self.pacer = pacer or Pacer.of(config.limits)
        self.store = store
        self._journal = journal
        prices = self.spec.effective_pricing()
        self.pricing = Pricing(prices.input_per_million, prices.output_per_million)
        self.max_out = max_output_tokens(self.spec)
        self.mode = generated_mode(self.spec)  # audit runs structured
        # on every record: what shaped its answer (the run's binding: routing a probe derived is part of it)
        self.fingerprint = config.fingerprint or fingerprint(self.spec).id
        self.agentic = self.spec.generation.turns == "all"
        self.dataset_answers = self.spec.generation.answers == "dataset"
        key = layout.inflight_key(self.sender_id, secrets.token_hex(4))
        meta = {"attempt": self.attempt, "worker": self.sender_id, "maxUSD": str(self.spec.budget.max_usd)}
        self.inflight = InflightLog(lambda doc: self.open_store().put(key, doc),
                                    lambda: self.open_store().delete(key), meta)
        self.call = call  # the run coordinator (a shard loop asks it for shards)
        self.budget = LeaseHolder(call, self.sender_id, self.concurrency, self.inflight)
        self._unrecorded: dict[int, int] = {}  # id(record) -> its request's reservation, until durable
        self._tok: Any = False  # the target tokenizer; False: not loaded yet, None: none set
        self._counter: Callable[[str], int] | None = None
        self.client: ChatClient | None = None
        from eyrie.jobs.reconstruct.variants import TemplateCanary

        self.canary = TemplateCanary(self.spec, self.tokenizer)

    @property
    def stopping(self) -> bool:
        """The run stopped (any reason): dispatch nothing more; requests in flight finish."""
        return self.budget.stopped

    @property
    def generation(self) -> GenerationSpec:
        return self.spec.generation

    @property
    def slots(self) -> asyncio.Semaphore:
        """Requests in flight, each from before its reservation until its record is durable (journal.py)."""
        return self.pacer.slots

    @property
    def journal(self) -> Journal:
        if self._journal is None:
            self._journal = Journal(self.open_store(), company=company_for(self.concurrency))
        return self._journal

    def open_store(self) -> Store:
        if self.store is None:
            from eyrie.jobs.store import open_output

            self.store = open_output(self.spec)
        return self.store

    def open_client(self) -> ChatClient:
        """The API client the requests go through; use as `async with sender.open_client():`."""
        self.client = ChatClient(
            self.base_url, self.api_key, timeout=self.spec.api.request_timeout_seconds,
            max_retries=self.spec.api.max_retries, max_concurrency=self.concurrency, stream=self.spec.api.stream,
            headers=self.spec.api.headers, rates=self.pacer.rates)
        return self.client

    def tokenizer(self) -> Any:
        """The target tokenizer, loaded once per sender (None without target.tokenizer)."""
        if self._tok is False:
            self._tok = None
            if self.spec.target.tokenizer:
                from eyrie.jobs.reconstruct.tokenizers import load_tokenizer

                self._tok = load_tokenizer(self.spec.target, self.spec.output.endpoint)
        return self._tok

    def _count_tokens(self) -> Callable[[str], int] | None:
        """The target tokenizer's counter (None without target.tokenizer)."""
        tok = self.tokenizer()
        if tok is not None and self._counter is None:
            self._counter = lambda text: len(tok.encode(text))
        return self._counter

    # -- the steps -------------------------------------------------------------------------------
    def record(self, sid: str, prompt: Prompt | BadRow, turn: int | None = None) -> records.Record:
        """A new record of `prompt` (of one turn of its conversation), nothing sent yet."""
        rec: records.Record = {
            "sample_id": sid, "source": prompt.source, "row": prompt.row, "attempt": self.attempt,
            "fingerprint": self.fingerprint, "toolsMode": self.mode, "createdAt": now_iso(), "costUSD": "0",
            "attempts": 0, "response": None, "usage": None, "error": None, "checks": {}, "policy": "keep"}
        if turn is not None:
            rec["turn"] = turn
        return rec

    def prepare(self, prompt: Prompt | BadRow) -> declarations.Prepared | tuple[str, str]:
        """The prompt's tools declared for this sender's mode, or (error type, reason) of a rejected one."""
        return prepare_row(prompt, self.mode, whole=self.agentic)

    def reject(self, rec: records.Record, kind: str, reason: str) -> records.Record:
        """`rec` as a prompt never sent (nothing paid), counted."""
        rec.update(status="rejected", request=None, error={"type": kind, "message": reason})
        self.budget.observe(RequestResult("rejected"))
        return rec

    async def persist(self, shard: int, rec: records.Record) -> None:
        """Make `rec` durable in the journal; only then is its request no longer in flight (its cost is
        in the store). Every record this sender fills is persisted through here."""
        await self.journal.commit(shard, rec)
        rid = self._unrecorded.pop(id(rec), None)
        if rid is not None:
            self.budget.durable(rid)

    async def process(self, sid: str, prompt: Prompt | BadRow) -> records.Record | None:
        """One prompt -> one record (not yet persisted), or None when the run stopped before it was sent."""
        rec = self.record(sid, prompt)
        prepared = self.prepare(prompt)
        if not isinstance(prepared, declarations.Prepared):
            return self.reject(rec, *prepared)
        if self.dataset_answers:
            return self.take_answer(rec, prepared, prompt)
        return await self.send(rec, prepared)

    def take_answer(self, rec: records.Record, prepared: declarations.Prepared,
                    prompt: Prompt | BadRow) -> records.Record:
        """`generation.answers: dataset`: the row's own answer as the response of the request that would
        have been sent (provider `dataset`, read by the same parser as a provider's body): nothing sent,
        nothing paid, checked and kept or dropped as a bought answer is."""
        answer = prompt.answer if isinstance(prompt, Prompt) else None
        if answer is None:
            return self.reject(rec, "no_answer", "the row has no assistant turn right after its prompt's user "
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

    async def answer(self, shard: int, sid: str, prompt: Prompt | BadRow,
                     label: Callable[[records.Record], None] | None = None, *, held: bool = False
                     ) -> records.Record | None:
        """The one slot step, whoever asks (the run's shard loop, the audit, the probe): take a slot, process,
        `label` the record (the caller's own fields), persist, and free the slot only once the record is durable
        (journal.py's invariant). None when the run stopped before it was sent. `held`: the caller took the slot
        already (`slots.acquire()`; the shard loop does, before it reads the next prompt); it is freed here."""
        if not held:
            await self.slots.acquire()
        try:
            if self.stopping:
                return None
            rec = await self.process(sid, prompt)
            if rec is None:
                return None
            if label is not None:
                label(rec)
            await self.persist(shard, rec)
            return rec
        finally:
            self.slots.release()

    async def send(self, rec: records.Record, prepared: declarations.Prepared) -> records.Record | None:
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
        self._unrecorded[id(rec)] = rid  # paid: in flight until `persist` makes the record durable
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
        if self.client is None:
            raise RuntimeError(f"sender {self.sender_id}: send inside `async with sender.open_client()`")
        self.budget.sending(rid)
        try:
            return await self.client.complete(body, est_tokens=est, on_id=lambda gen: self.budget.identify(rid, gen),
                                              stop=self.budget.stop_event)
        except NotSent:  # the run stopped while it waited for the rate limits: never sent, nothing paid
            self.budget.unsent(rid)
            return None
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
        if e.transient:  # retries ran out on errors a later attempt may not meet: a resume sends it again
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
