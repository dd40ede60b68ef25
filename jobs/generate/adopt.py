"""Answers bought outside the run's shards, kept as the run's own: the provider probe's (passing endpoints)
and the pilot's (the run's own tools mode, once its verdict lets the run go on).

Each is written into the shard holding its row, as a journal object, unless that row already has a record
there, so the workers skip it: an answer is never bought twice. Idempotent: a second call (a resume) finds
them in the shards and writes nothing. The checkpoint counts what they cost once, where they were bought (the
probe's records, the audit answer sets the pilot buys into): an adopted record carries the mark of where
(`probe`, or `records.ADOPTED_FROM_AUDIT`).
"""

from __future__ import annotations

from collections.abc import Iterable

from eyrie.jobs.contract import layout, records
from eyrie.jobs.contract.fingerprint import audit_fingerprint, pilot_key
from eyrie.jobs.contract.pilot import read_verdict
from eyrie.jobs.generate.plan import ShardPlan
from eyrie.jobs.generate.sending.journal import Journal
from eyrie.jobs.spec import DatasetGenerationSpec
from eyrie.jobs.store import PrefixedStore, Store


def shard_of(plan: ShardPlan, source: str, row: int) -> int | None:
    """The shard whose spans hold (source, row); None for a row no shard covers (a lowered limit)."""
    for shard, spans in plan.shards.items():
        if any(sp.source == source and sp.start <= row < sp.stop for sp in spans):
            return shard
    return None


def into_shards(store: Store, plan: ShardPlan, recs: Iterable[records.Record],
                fingerprint: str | None = None) -> list[records.Record]:
    """Write each record into the shard holding its row unless the row has a record there; the records
    written. `fingerprint`: the run's (contract/fingerprint.py), which they then carry as generation's do."""
    by_shard: dict[int, list[records.Record]] = {}
    for rec in recs:
        shard = shard_of(plan, rec["source"], rec["row"])
        if shard is not None:
            by_shard.setdefault(shard, []).append(rec)
    written: list[records.Record] = []
    journal = Journal(store)
    for shard, got in sorted(by_shard.items()):
        held = {records.record_key(r) for r in records.iter_shard(store, shard)}
        fresh = [{**r, "fingerprint": fingerprint} if fingerprint else r
                 for r in got if records.record_key(r) not in held]
        if fresh:
            journal.write(shard, fresh)
            written += fresh
    return written


def pilot_answers(spec: DatasetGenerationSpec, store: Store) -> list[records.Record]:
    """The pilot's answers of the run's own tools mode, marked as bought in the audit answer set, when the
    pilot decided for this spec (its key) and its verdict lets the run go on; else none (a run suspended by
    its pilot keeps no answer of the mode it may switch away from)."""
    if spec.pilot is None:
        return []
    verdict = read_verdict(store)
    if verdict is None or verdict.key != pilot_key(spec) or not verdict.proceed:
        return []
    mark = {"answerSet": audit_fingerprint(spec).id}
    own = PrefixedStore(store, layout.pilot_slice_prefix(verdict.own))
    return [{**r, records.ADOPTED_FROM_AUDIT: mark} for r in records.iter_records(own) if r.get("status") == "ok"]
