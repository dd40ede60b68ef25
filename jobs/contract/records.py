"""The generation record and its parts: what stage 1 writes and stage 2 reads.

Generation writes one record per prompt; tool checks annotate it; token reconstruction reads it
back. A shard's records live in two kinds of gzip JSONL objects: journal objects (one per group
commit, written while the shard runs, so an answer is durable before its request's slot is freed)
and parts (the final layout, written when the shard ends by compacting its journal). A run killed at
any moment can leave both, and a record in both (killed mid-compaction): readers here see each
sample once, parts first, so every reader works on a store in any state.

A sample that failed only on transient errors (its retries ran out on 429s, 5xx, the in-flight
402, timeouts: `error.transient`) is sent again by the next attempt, whose record follows the
failed one in the shard; readers see the later record in its place. Any other record is final:
never sent again, and a second copy of it (mid-compaction) is the same record.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from enum import StrEnum
from typing import Any, Literal, TypedDict

import orjson

from eyrie.jobs.contract.layout import (
    GENERATIONS,
    PROBE_ANSWERS,
    journal_prefix,
    parse_journal_key,
    parse_part_key,
    shard_prefix,
    turn_sample_key,
)
from eyrie.jobs.store import NotFound, Store


class ToolCall(TypedDict):
    id: str
    type: str
    function: dict[str, str]  # {"name": ..., "arguments": <the exact string returned>}


class ReasoningDetail(StrEnum):
    """The `type` of an item of OpenRouter's `reasoning_details` (reasoning-tokens guide)."""

    TEXT = "reasoning.text"  # the reasoning as the model wrote it: what reconstruction needs
    SUMMARY = "reasoning.summary"  # a summary of it: the tokens cannot be rebuilt from it
    ENCRYPTED = "reasoning.encrypted"  # opaque (redacted) data: neither


class Response(TypedDict, total=False):
    id: str | None
    provider: str | None
    model: str | None
    finish_reason: str | None
    native_finish_reason: str | None  # the upstream provider's own finish reason, when given
    reasoning: str | None  # `reasoning`, else the `reasoning.text` items of reasoning_details in order
    content: str | None
    tool_calls: list[ToolCall]
    logprobs: Any
    reasoning_details: list[dict[str, Any]]  # as returned (streamed pieces of one item merged)


class Record(TypedDict, total=False):
    sample_id: str
    source: str
    row: int
    attempt: str
    fingerprint: str  # the id of what shaped the answer (contract/fingerprint.py); absent in older records
    status: Literal["ok", "failed", "rejected"]  # rejected: never sent (bad row/declaration)
    toolsMode: Literal["structured", "text"]
    request: dict[str, Any]  # the body as sent; never any header, never a key
    response: Response | None
    usage: dict[str, Any] | None
    costUSD: str  # decimal string; "0" when nothing was paid
    attempts: int
    # {"type": ..., "message": ...[, "details": the provider's reason][, "transient": true: resent on resume]}
    error: dict[str, Any] | None
    checks: dict[str, Any]  # tool verdicts, leaks (filled by eyrie.jobs.tools)
    policy: Literal["keep", "drop", "flag"]  # what the tool policy decided for this sample
    createdAt: str
    turn: int  # generation.turns: all: the assistant turn of the conversation (absent otherwise)
    agentic: dict[str, Any]  # turns: all: spliced, diverged, divergedFrom, end, dropped (conversation.annotate)
    latencyS: float  # seconds from the first attempt to the whole answer (retries included)
    probe: dict[str, str]  # a provider-probe answer: {"endpoint": tag, "key": hash of the request as sent}


def record_key(rec: Record) -> str:
    """What a record is persisted once for: its sample, and its turn in an agentic conversation."""
    return turn_sample_key(rec["sample_id"], rec.get("turn") or 0)


def resend_on_resume(rec: Record) -> bool:
    """Did this sample (or turn) fail only on transient errors, so that a resume sends it again?"""
    return rec.get("status") == "failed" and bool((rec.get("error") or {}).get("transient"))


def encode_part(records: list[Record]) -> bytes:
    body = b"".join(orjson.dumps(r) + b"\n" for r in records)
    return gzip.compress(body, compresslevel=5, mtime=0)


def decode_part(data: bytes) -> list[Record]:
    return [orjson.loads(line) for line in gzip.decompress(data).splitlines() if line.strip()]


def list_parts(store: Store, shard: int | None = None) -> list[tuple[int, int, str]]:
    """(shard, part, key) of every complete part, sorted."""
    prefix = shard_prefix(shard) if shard is not None else GENERATIONS
    out = []
    for key in store.list(prefix):
        parsed = parse_part_key(key)
        if parsed:
            out.append((*parsed, key))
    return sorted(out)


def list_journal(store: Store, shard: int) -> list[str]:
    """A shard's journal objects not yet compacted, in commit order per writer."""
    return sorted(k for k in store.list(journal_prefix(shard)) if parse_journal_key(k))


def list_shards(store: Store) -> list[int]:
    """Every shard with a part or a journal object."""
    shards = set()
    for key in store.list(GENERATIONS):
        parsed = parse_part_key(key) or parse_journal_key(key)
        if parsed:
            shards.add(parsed[0])
    return sorted(shards)


def iter_shard(store: Store, shard: int) -> Iterator[Record]:
    """A shard's records, each sample once: parts, then journal records no part holds yet; a record
    to be resent (`resend_on_resume`) is held back and replaced by any later record of its sample.
    Safe beside a running compaction: a journal object gone meanwhile was rewritten into parts
    first (compaction deletes only after writing), so the parts are listed again and read instead."""
    journal = list_journal(store, shard)
    seen: set[str] | None = set() if journal else None  # ids matter only when a journal is left
    held: dict[str, Record] = {}  # to be resent: yielded at the end unless a later record replaces them
    read: set[str] = set()

    def take(rec: Record) -> bool:
        key = record_key(rec)
        if key in held:  # a later attempt at a sample that failed on transient errors
            if resend_on_resume(rec):
                held[key] = rec
                return False
            del held[key]
        elif seen is not None and key in seen:
            return False
        elif resend_on_resume(rec):
            held[key] = rec
            return False
        if seen is not None:
            seen.add(key)
        return True

    def parts() -> Iterator[Record]:
        for _s, _p, key in list_parts(store, shard):
            if key in read:
                continue
            read.add(key)
            yield from filter(take, decode_part(store.get(key)))

    yield from parts()
    for key in journal:
        try:
            data = store.get(key)
        except NotFound:
            yield from parts()  # compacted while we read
            continue
        yield from filter(take, decode_part(data))
    yield from held.values()


ADOPTED_FROM_AUDIT = "pilot"  # an adopted pilot answer's mark: its cost is counted in its audit answer set


def paid_elsewhere(rec: Record) -> bool:
    """Whether a run's record is a copy of an answer paid and counted where it was bought: the provider
    probe's (`probe`), the pilot's (in an audit answer set): its cost is counted there, once."""
    return "probe" in rec or ADOPTED_FROM_AUDIT in rec


def iter_records(store: Store, shard: int | None = None) -> Iterator[Record]:
    """Every persisted record (of one shard, or of all), each sample once, whatever state a killed
    run left the store in."""
    for s in [shard] if shard is not None else list_shards(store):
        yield from iter_shard(store, s)


def iter_probe_records(store: Store) -> Iterator[Record]:
    """The provider probe's records, each (endpoint, request) once, in commit order."""
    seen: set[tuple[str, str]] = set()
    for key in sorted(store.list(PROBE_ANSWERS)):
        if not key.endswith(".jsonl.gz"):
            continue
        for rec in decode_part(store.get(key)):
            probe = rec.get("probe") or {}
            ident = (str(probe.get("endpoint")), str(probe.get("key")))
            if ident not in seen:
                seen.add(ident)
                yield rec
