"""A sending session: the senders of one provider and what they share, built once for every caller.

The run (its shard workers, in this process or as Ray actors), the audit (one sender per tools mode) and the
provider probe (one per endpoint) each start one. The session builds the run coordinator (the budget ledger,
the tool gate, the first stop reason; in this process or as a named Ray actor) and divides the provider's
limits (`api.maxConcurrency`, `requestsPerMinute`, `tokensPerMinute`: one key's, whoever sends) among its
`senders`, so that together they never exceed them:
- the run's shard workers each get an exact share (`Limits.split`: the shares add up to the limits; a share of
  zero is refused), in this process as on Ray, where nothing can be shared;
- the senders of an audit or a probe (one process) share the request and token rates (one `Rates`: exactly the
  limits, whichever sender is busier) and split the slots exactly (each its own: `limits.Pacer` says why), at
  least one each.
`answer_all` is the audit's and the probe's loop: every ask through its sender, senders taking turns, each
sender's budget given back as soon as its last ask is done (an idle lease would hold up the others).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from eyrie.jobs.api.limits import Limits, LimitsTooLow, Pacer, Rates
from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import records
from eyrie.jobs.errors import InputError
from eyrie.jobs.generate.budget.checkpoint import Checkpoint, read_checkpoint, settle_stops
from eyrie.jobs.generate.budget.coordinator import CoordinatorArgs, Counts, RunCoordinator
from eyrie.jobs.generate.plan import ShardPlan
from eyrie.jobs.generate.sending.journal import Journal
from eyrie.jobs.generate.sending.sender import Call, Sender, SenderConfig, coordinator_call
from eyrie.jobs.generate.sending.worker import ShardWorker
from eyrie.jobs.sources import BadRow, Prompt
from eyrie.jobs.spec import DatasetGenerationSpec
from eyrie.jobs.store import Store


class LimitsNotShared(InputError, ValueError):
    """The provider's limits cannot be divided among the run's workers (a share would be zero)."""


@dataclass(frozen=True)
class Ask:
    """One request for `Session.answer_all`: the prompt, its sender, the shard its record goes to, and the
    caller's own fields for the record (`label`, called before it is persisted)."""

    sender: Sender
    shard: int
    sample_id: str
    prompt: Prompt | BadRow
    label: Callable[[records.Record], None] | None = None


class Session:
    """One provider's senders (see the module docstring): `coordinator` is what the run's coordinator starts from;
    `senders` is how many share the limits."""

    def __init__(self, spec: DatasetGenerationSpec, store: Store, ctx: RunContext, base_url: str,
                 coordinator: CoordinatorArgs, *, senders: int, fingerprint: str | None = None,
                 attempt: str | None = None):
        self.spec, self.store, self.ctx, self.base_url = spec, store, ctx, base_url
        self.attempt = attempt or ctx.attempt  # every record's and in-flight object's (the audit's: "audit")
        self.coordinator_args = coordinator
        self.senders = senders
        self.fingerprint = fingerprint  # every record's label (a run's binding), else each sender's own
        api = spec.api
        self.limits = Limits(api.max_concurrency, api.requests_per_minute, api.tokens_per_minute)
        self.coordinator: Any = None  # the RunCoordinator, or its Ray actor's handle
        self.checkpoint: Checkpoint | None = None
        self._rates: Rates | None = None
        self._made = 0  # senders made in this process

    @classmethod
    def for_requests(cls, spec: DatasetGenerationSpec, store: Store, ctx: RunContext, base_url: str, *,
                     requests: int, senders: int, attempt: str | None = None) -> Session:
        """A session for `requests` requests outside a run's shards (the audit, the probe), its coordinator
        started: what a kill left in flight is booked first, then the spend so far is read from the store
        (`checkpoint`), so no kill at any moment lets the next attempt spend past maxUSD."""
        settle_stops(store, base_url, ctx.api_key)
        ckpt = read_checkpoint(store)
        args = CoordinatorArgs(max_usd=spec.budget.max_usd, spent=ckpt.spent, counts=Counts(), total=requests,
                               shards=[], workers=senders)
        session = cls(spec, store, ctx, base_url, args, senders=senders, attempt=attempt)
        session.checkpoint = ckpt
        session.start()
        return session

    # -- the coordinator -------------------------------------------------------------------------------
    def start(self) -> RunCoordinator:
        """The coordinator, in this process."""
        self.coordinator = RunCoordinator.start(self.coordinator_args)
        return self.coordinator

    def start_actor(self, name: str) -> Any:
        """The coordinator as a named Ray actor (its handle); every worker calls it. It runs on the caller's node (the
        driver's: a RayJob's head), so it lives and dies with the run: Ray places an actor that asks for no
        resources on a random node, and on a worker's pod it would go with that pod: the driver's next call fails,
        and the RayJob with it, where the pod should cost one shard worker (the likely cause of a deleted worker pod
        failing a RayJob on the test node once)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.coordinator = ray.remote(RunCoordinator).options(
            name=name, num_cpus=0, max_concurrency=100_000, scheduling_strategy=here).remote(
            **vars(self.coordinator_args))
        return self.coordinator

    # -- senders ---------------------------------------------------------------------------------------
    def config(self, sender_id: str, limits: Limits, spec: DatasetGenerationSpec | None = None) -> SenderConfig:
        return SenderConfig((spec or self.spec).model_dump_json(by_alias=True), sender_id, self.attempt,
                            self.base_url, limits, self.fingerprint)

    def share(self, i: int) -> Limits:
        """Sender i's share of the limits, for senders that cannot share a pacer (each in its own process)."""
        try:
            return self.limits.split(self.senders)[i]
        except LimitsTooLow as e:
            raise LimitsNotShared(f"api: {e} (generation.ray.workers {self.senders}); raise the limit or lower "
                                  "the workers") from None

    def sender(self, sender_id: str, spec: DatasetGenerationSpec | None = None,
               journal: Journal | None = None) -> Sender:
        """The next of the session's `senders` in this process: the session's coordinator, the shared rates and
        its own share of the slots; `spec` its own (a mode, an endpoint), `journal` where its records go
        (default: a journal of its own on the session's store)."""
        if self._rates is None:
            self._rates = Rates(self.limits)
        i, self._made = self._made, self._made + 1
        c = self.limits.concurrency
        slots = max(1, c // self.senders + (i < c % self.senders))  # a sender needs a slot, however few there are
        limits = Limits(slots, self.limits.requests_per_minute, self.limits.tokens_per_minute, self.limits.window_s)
        return self._sender(self.config(sender_id, limits, spec), journal, Pacer(slots, self._rates))

    def _sender(self, config: SenderConfig, journal: Journal | None = None, pacer: Pacer | None = None) -> Sender:
        return Sender(config, coordinator_call(self.coordinator), self.store, api_key=self.ctx.api_key,
                      journal=journal, pacer=pacer)

    @staticmethod
    def actor_sender(config: SenderConfig, call: Call) -> Sender:
        """A Ray shard worker's sender, in its own process (`actor.ShardWorkerActor`): the coordinator is the run's
        actor (`call`), the store the spec's output, the API key the process's environment."""
        return Sender(config, call)

    def shard_worker(self, i: int, plan: ShardPlan) -> ShardWorker:
        """Shard worker i in this process (`--inline`): its share of the limits, as a Ray worker would get."""
        return ShardWorker(self._sender(self.config(f"w{i}", self.share(i))), plan)

    def actor_config(self, i: int, worker_id: str) -> SenderConfig:
        """What Ray worker `worker_id` (in slot i) is told; it reads the API key from its own environment."""
        return self.config(worker_id, self.share(i))

    async def answer_all(self, asks: Sequence[Ask], out: list[records.Record] | None = None) -> list[records.Record]:
        """Send every ask through its sender, the senders taking turns; each record is durable before its slot
        is freed, and each sender's budget is given back once its last ask is done. Returns the records in the
        order they became durable (appended to `out` as they do: a caller may read it meanwhile)."""
        by_sender: dict[int, list[Ask]] = {}
        for ask in asks:
            by_sender.setdefault(id(ask.sender), []).append(ask)
        senders = [group[0].sender for group in by_sender.values()]
        left = {id(s): len(by_sender[id(s)]) for s in senders}
        turns = [a for rnd in _round_robin(list(by_sender.values())) for a in rnd]
        journals = list({id(s.journal): s.journal for s in senders}.values())
        out = [] if out is None else out

        async def one(ask: Ask) -> None:
            rec = await ask.sender.answer(ask.shard, ask.sample_id, ask.prompt, ask.label)
            if rec is not None:
                out.append(rec)
            left[id(ask.sender)] -= 1
            if not left[id(ask.sender)]:
                await ask.sender.budget.give_back()

        async with contextlib.AsyncExitStack() as clients:
            for s in senders:
                await clients.enter_async_context(s.open_client())
            async with asyncio.TaskGroup() as tg:  # a journal's writer fails the whole if the store does
                writers = [tg.create_task(j.run()) for j in journals]
                try:
                    async with asyncio.TaskGroup() as sending:
                        for ask in turns:
                            sending.create_task(one(ask))
                finally:
                    for w in writers:
                        w.cancel()
        return out


def _round_robin(groups: list[list[Ask]]) -> list[list[Ask]]:
    """[[a1, a2], [b1]] -> [[a1, b1], [a2]]: each sender's first ask, then each one's second, ..."""
    longest = max((len(g) for g in groups), default=0)
    return [[g[i] for g in groups if i < len(g)] for i in range(longest)]
