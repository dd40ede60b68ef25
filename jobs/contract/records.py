"""The generation record and its parts: what stage 1 writes and stage 2 reads.

Generation writes one record per prompt into gzip JSONL parts; tool checks annotate it; token
reconstruction reads it back. Everything that names a key in the store goes through here.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import Any, Literal, TypedDict

import orjson

from eyrie.jobs.contract.layout import GENERATIONS, parse_part_key, shard_prefix
from eyrie.jobs.store import Store


class ToolCall(TypedDict):
    id: str
    type: str
    function: dict[str, str]  # {"name": ..., "arguments": <the exact string returned>}


class Response(TypedDict, total=False):
    id: str | None
    provider: str | None
    model: str | None
    finish_reason: str | None
    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall]
    logprobs: Any


class Record(TypedDict, total=False):
    sample_id: str
    source: str
    row: int
    attempt: str
    status: Literal["ok", "failed", "rejected"]  # rejected: never sent (bad row/declaration)
    toolsMode: Literal["structured", "text"]
    request: dict[str, Any]  # the body as sent; never any header, never a key
    response: Response | None
    usage: dict[str, Any] | None
    costUSD: str  # decimal string; "0" when nothing was paid
    attempts: int
    error: dict[str, str] | None  # {"type": ..., "message": ...}
    checks: dict[str, Any]  # tool verdicts, leaks (filled by eyrie.jobs.tools)
    policy: Literal["keep", "drop", "flag"]  # what the tool policy decided for this sample
    createdAt: str


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


def iter_records(store: Store, shard: int | None = None) -> Iterator[Record]:
    for _s, _p, key in list_parts(store, shard):
        yield from decode_part(store.get(key))
