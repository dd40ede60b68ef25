"""The store layout of DESIGN §3 and the generation record: the contract between the stages.

Generation writes one record per prompt into gzip JSONL parts; tool checks annotate it; token
reconstruction reads it back. Everything that names a key in the store goes through here.
"""

from __future__ import annotations

import gzip
import hashlib
import re
from collections.abc import Iterator
from typing import Any, Literal, TypedDict

import orjson

from eyrie.jobs.store import Store

MANIFEST = "manifest.json"
PROGRESS = "progress.json"
AUDIT = "audit.json"
BUDGET = "budget.json"  # the persisted upper bound of what may have been paid (see coordinator)
GENERATIONS = "generations"
SAMPLES = "samples"
HIDDEN = "hidden"

_PART_RE = re.compile(r"^generations/shard-(\d{5})/part-(\d{5})\.jsonl\.gz$")


def shard_prefix(shard: int) -> str:
    return f"{GENERATIONS}/shard-{shard:05d}"


def part_key(shard: int, part: int) -> str:
    return f"{shard_prefix(shard)}/part-{part:05d}.jsonl.gz"


def samples_key(shard: int) -> str:
    return f"{SAMPLES}/shard-{shard:05d}.parquet"


def summary_key(index: int, count: int) -> str:
    """One extraction pod's summary (pod `index` of `count`)."""
    return f"{HIDDEN}/summary-{index:05d}-of-{count:05d}.json"


def parse_part_key(key: str) -> tuple[int, int] | None:
    m = _PART_RE.match(key)
    return (int(m.group(1)), int(m.group(2))) if m else None


def sample_id(source: str, row: int, prompt: Any) -> str:
    """Stable id of one prompt: a hash of (source name, row index, prompt content)."""
    h = hashlib.sha256()
    h.update(source.encode())
    h.update(b"\0")
    h.update(str(row).encode())
    h.update(b"\0")
    h.update(orjson.dumps(prompt, option=orjson.OPT_SORT_KEYS))
    return h.hexdigest()[:32]


def shard_of(sid: str, shards: int) -> int:
    """Shard assignment by id: stable across reruns whatever the order rows are read in."""
    return int(sid[:8], 16) % shards


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
