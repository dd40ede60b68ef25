"""Generation with `generation.turns: all`: a conversation's turns, in order, one request each.

A conversation runs under one of its worker's slots. Each turn is a request like any other (reserved,
sent, checked, settled: the budget, the tool checks and the drift gate count every turn) and its
record is durable (`Journal.commit`) before the next turn is asked, so a kill loses at most the turn
in flight. What the next request carries is recomputed from the persisted answers
(`conversation.next_turn`), so a resumed run starts at the first turn without a record and pays
for no earlier one. The record of a conversation's last turn says why it ended (`agentic.end`),
which is how a resume knows it is finished without preparing it again.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from eyrie.jobs.contract import records
from eyrie.jobs.generate.sending.conversation import Finished, annotate, next_turn
from eyrie.jobs.sources import BadRow, Prompt
from eyrie.jobs.spec import GenerationSpec
from eyrie.jobs.store import Store
from eyrie.jobs.tools import declarations


class TurnSender(Protocol):
    """What a conversation needs of the request sender (`sender.Sender` implements it): a turn's record, the
    prompt prepared, each turn sent and persisted, and whether the run stopped."""

    @property
    def generation(self) -> GenerationSpec: ...

    @property
    def stopping(self) -> bool: ...

    def record(self, sid: str, prompt: Prompt | BadRow, turn: int | None = None) -> records.Record: ...

    def prepare(self, prompt: Prompt | BadRow) -> declarations.Prepared | tuple[str, str]: ...

    def reject(self, rec: records.Record, kind: str, reason: str) -> records.Record: ...

    async def send(self, rec: records.Record, prepared: declarations.Prepared) -> records.Record | None: ...

    async def persist(self, shard: int, rec: records.Record) -> None: ...


def earlier_turns(store: Store, shard: int) -> dict[str, list[records.Record]]:
    """A shard's persisted turn records by conversation, in turn order."""
    out: dict[str, list[records.Record]] = {}
    for rec in records.iter_records(store, shard):
        out.setdefault(rec["sample_id"], []).append(rec)
    for recs in out.values():
        recs.sort(key=lambda r: r.get("turn") or 0)
    return out


def finished(recs: list[records.Record]) -> bool:
    """Did this conversation end (its last record says why, or its row was rejected)? One whose
    last turn failed only on transient errors goes on from that turn."""
    if not recs or records.resend_on_resume(recs[-1]):
        return False
    return recs[-1].get("status") == "rejected" or bool((recs[-1].get("agentic") or {}).get("end"))


def _answers(recs: list[records.Record]) -> list[dict[str, Any] | None]:
    """The model's answers of the turns already persisted (None: that turn failed), up to a gap or
    a turn to send again (it failed only on transient errors)."""
    out: list[dict[str, Any] | None] = []
    for rec in recs:
        if (rec.get("turn") or 0) != len(out) or records.resend_on_resume(rec):
            break
        out.append(rec.get("response") if rec.get("status") == "ok" else None)
    return out


async def converse(sender: TurnSender, shard: int, sid: str, prompt: Prompt | BadRow,
                   earlier: list[records.Record]) -> bool:
    """Regenerate a conversation's turns from the first one without a record; True once it has
    ended, False when the run stopped first (a resume goes on from there)."""
    spec = sender.generation
    prepared = sender.prepare(prompt)
    if not isinstance(prepared, declarations.Prepared):
        await sender.persist(shard, sender.reject(sender.record(sid, prompt, turn=0), *prepared))
        return True
    answers = _answers(earlier)
    # text mode: the model's calls are in its content, and the history carries none structurally
    declared = ([t["function"]["name"] for t in prepared.declared_tools]
                if prepared.mode == "text" and prepared.declared_tools else None)
    while True:
        nt = next_turn(prepared.messages, answers, spec.on_divergence, spec.max_turns, declared)
        if isinstance(nt, Finished):
            return True
        if sender.stopping:
            return False
        rec = sender.record(sid, prompt, turn=nt.turn)
        sent = await sender.send(rec, dataclasses.replace(prepared, messages=nt.messages))
        if sent is None:
            return False
        response = sent.get("response") if sent.get("status") == "ok" else None
        sent["agentic"] = annotate(prepared.messages, answers, nt, response, spec.on_divergence, spec.max_turns,
                                   declared)
        await sender.persist(shard, sent)
        answers.append(response)
