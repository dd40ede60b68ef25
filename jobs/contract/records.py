"""The generation record and its parts: what stage 1 writes and stage 2 reads.

Generation writes one record per prompt into gzip JSONL parts; tool checks annotate it; token
reconstruction reads it back. Everything that names a key in the store goes through here.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from enum import StrEnum
from typing import Any, Literal, TypedDict

import orjson

from eyrie.jobs.contract.layout import GENERATIONS, parse_part_key, shard_prefix
from eyrie.jobs.store import Store


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
    status: Literal["ok", "failed", "rejected"]  # rejected: never sent (bad row/declaration)
    toolsMode: Literal["structured", "text"]
    request: dict[str, Any]  # the body as sent; never any header, never a key
    response: Response | None
    usage: dict[str, Any] | None
    costUSD: str  # decimal string; "0" when nothing was paid
    attempts: int
    error: dict[str, Any] | None  # {"type": ..., "message": ...[, "details": the provider's reason]}
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
