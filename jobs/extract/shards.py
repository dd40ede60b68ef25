"""Hidden-state shards: large safetensors files of many samples, an index, and a ranged reader.

Layout under the run's output (DESIGN §3):

    hidden/shard-00003-00000.safetensors   samples of input shard 3, part 0 (~extraction.shardBytes)
    hidden/shard-00003.index.json          written last: sample id -> part, tokens, byte offsets;
                                           its presence means input shard 3 is complete
    hidden/summary-00000-of-00002.json     one pod's summary (ExtractionSummary.to_manifest)

A part holds, per sample n, tensors `s{n:06d}.input_ids` [T] int32, `.loss_mask` [T] int8,
`.aux_hidden` [T, kH], `.last_hidden` [T, H] (and float8's `.aux_scale` [T, k], `.last_scale` [T, 1]);
the header's `__metadata__.sample_ids` maps n to the sample id. Because a safetensors header
carries every tensor's offsets, the index is derived from the parts' headers, and a part that
already exists is verified and reused on resume instead of being recomputed.
"""

from __future__ import annotations

import functools
import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from eyrie.jobs.contract.layout import HIDDEN
from eyrie.jobs.errors import EyrieError
from eyrie.jobs.extract.codec import Layout, decode
from eyrie.jobs.store import NotFound, Store, open_store

PART_FORMAT = "eyrie-hidden/1"
INDEX_FORMAT = "eyrie-hidden-index/1"
_INDEX_RE = re.compile(r"^hidden/shard-(\d{5})\.index\.json$")
_MAX_HEADER = 100 << 20  # safetensors' own limit on a header

_ST_DTYPES: dict[str, torch.dtype] = {
    "I32": torch.int32, "I8": torch.int8, "BF16": torch.bfloat16, "F16": torch.float16,
    "F32": torch.float32, "F8_E4M3": torch.float8_e4m3fn,
}
_ST_NAMES = {dtype: name for name, dtype in _ST_DTYPES.items()}


class ShardError(EyrieError, RuntimeError):
    """A hidden shard or its index is missing, truncated or inconsistent; the message names the key."""


class SampleNotFound(ShardError, KeyError):
    """No hidden states were extracted for this sample id."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


def part_key(shard: int, part: int) -> str:
    return f"{HIDDEN}/shard-{shard:05d}-{part:05d}.safetensors"


def index_key(shard: int) -> str:
    return f"{HIDDEN}/shard-{shard:05d}.index.json"


def parse_index_key(key: str) -> int | None:
    m = _INDEX_RE.match(key)
    return int(m.group(1)) if m else None


def list_indexes(store: Store) -> list[tuple[int, str]]:
    """(input shard, index key) of every completed shard, sorted."""
    return sorted((s, k) for k in store.list(HIDDEN) if (s := parse_index_key(k)) is not None)


# ------------------------------------------------------------------------------------ writing


@dataclass
class PartSample:
    sample_id: str
    input_ids: torch.Tensor  # [T] int32
    loss_mask: torch.Tensor  # [T] int8
    hidden: dict[str, torch.Tensor]  # codec.encode output, on CPU


def plan_parts(lengths: Sequence[int], bytes_per_token: int, shard_bytes: int) -> list[list[int]]:
    """Split samples (in order) into parts of at most ~shard_bytes; a bigger sample gets its own part.

    Deterministic in its inputs, so a rerun plans the same parts and can reuse finished ones.
    """
    parts: list[list[int]] = []
    cur: list[int] = []
    size = 0
    for i, n in enumerate(lengths):
        b = n * (bytes_per_token + 5)  # + int32 id + int8 mask
        if cur and size + b > shard_bytes:
            parts.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += b
    if cur:
        parts.append(cur)
    return parts


def encode_part(samples: Sequence[PartSample], metadata: dict[str, str]) -> bytearray:
    """One safetensors blob holding every sample's tensors; metadata maps slot n -> sample id.

    Written here rather than by `safetensors.torch.save`, which copies every tensor twice (to bytes,
    then into its buffer): a part is ~`extraction.shardBytes` (1 GiB), serialized on the writer thread
    while the device runs on, so each copy counts. The file is the same format (a JSON header padded to
    8 bytes, the data with no holes; tensors ordered by element size, largest first, as safetensors
    orders them, so each one is aligned to its element size); `safetensors.torch.load` reads it."""
    tensors: list[tuple[str, torch.Tensor]] = []
    for n, s in enumerate(samples):
        p = f"s{n:06d}."
        tensors.append((p + "input_ids", s.input_ids.to(torch.int32).contiguous()))
        tensors.append((p + "loss_mask", s.loss_mask.to(torch.int8).contiguous()))
        tensors += [(p + name, t.contiguous()) for name, t in s.hidden.items()]
    tensors.sort(key=lambda nt: -nt[1].element_size())  # stable: slot order within a size
    meta = {**metadata, "format": PART_FORMAT, "sample_ids": json.dumps([s.sample_id for s in samples])}
    header: dict[str, Any] = {"__metadata__": meta}
    end = 0
    for name, t in tensors:
        header[name] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [end, end + t.nbytes]}
        end += t.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    blob = bytearray(8 + len(head) + end)
    blob[:8] = struct.pack("<Q", len(head))
    blob[8:8 + len(head)] = head
    at = 8 + len(head)
    for _name, t in tensors:
        if t.nbytes:
            blob[at:at + t.nbytes] = memoryview(t.reshape(-1).view(torch.uint8).numpy())
        at += t.nbytes
    return blob


def parse_header(prefix: bytes, key: str) -> tuple[dict[str, Any], int]:
    """(header, data start) from the first bytes of a safetensors file."""
    if len(prefix) < 8:
        raise ShardError(f"{key}: truncated (no safetensors header)")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > _MAX_HEADER or len(prefix) < 8 + n:
        raise ShardError(f"{key}: truncated or not a safetensors file (header length {n})")
    try:
        header = json.loads(prefix[8 : 8 + n])
    except ValueError as e:
        raise ShardError(f"{key}: corrupt safetensors header: {e}") from None
    if not isinstance(header, dict) or header.get("__metadata__", {}).get("format") != PART_FORMAT:
        raise ShardError(f"{key}: not an eyrie hidden-state part (format {PART_FORMAT} expected)")
    return header, 8 + n


def read_header(store: Store, key: str) -> tuple[dict[str, Any], int]:
    """Read only a part's header (two ranged reads), never its data."""
    try:
        head = store.get_range(key, 0, 8)
        if len(head) < 8:
            raise ShardError(f"{store.url(key)}: truncated (no safetensors header)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER:
            raise ShardError(f"{store.url(key)}: not a safetensors file (header length {n})")
        return parse_header(head + store.get_range(key, 8, n), store.url(key))
    except NotFound:
        raise ShardError(f"{store.url(key)}: hidden shard is missing") from None


def part_entries(header: dict[str, Any], data_start: int, file_no: int, layout: Layout,
                 file_size: int, key: str) -> dict[str, list[int]]:
    """Index rows [file, tokens, offset of each column...] for every sample of one part."""
    sids = json.loads(header["__metadata__"]["sample_ids"])
    cols = layout.columns()
    out: dict[str, list[int]] = {}
    for n, sid in enumerate(sids):
        row = [file_no, 0]
        for name, (dtype, width) in cols.items():
            info = header.get(f"s{n:06d}.{name}")
            if info is None:
                raise ShardError(f"{key}: sample {sid} has no {name} tensor (written with another dtype "
                                 "or layer set?)")
            if _ST_DTYPES.get(info["dtype"]) != dtype or info["shape"][1:] not in ([], [width]):
                raise ShardError(f"{key}: sample {sid} {name} is {info['dtype']}{info['shape']}, "
                                 f"expected {dtype} width {width}")
            begin, end = info["data_offsets"]
            if data_start + end > file_size:
                raise ShardError(f"{key}: truncated: sample {sid} {name} ends at byte "
                                 f"{data_start + end}, the file has {file_size}")
            if name == "input_ids":
                row[1] = int(info["shape"][0])
            row.append(data_start + begin)
        out[sid] = row
    return out


def encode_index(shard: int, files: list[tuple[str, int]], entries: dict[str, list[int]],
                 skipped: list[dict[str, str]], layout: Layout, meta: dict[str, Any]) -> bytes:
    cols = layout.columns()
    doc = {
        "format": INDEX_FORMAT,
        "shard": shard,
        **meta,
        "dtype": layout.dtype,
        "hiddenSize": layout.hidden,
        "auxLayerCount": layout.aux_layers,
        "bytesPerToken": layout.bytes_per_token,
        "files": [k for k, _ in files],
        "fileBytes": [b for _, b in files],
        "columns": ["file", "tokens", *cols],
        "samples": entries,
        "skipped": skipped,
        "tokens": sum(e[1] for e in entries.values()),
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_index(data: bytes, key: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise ShardError(f"{key}: corrupt index: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != INDEX_FORMAT:
        raise ShardError(f"{key}: not an eyrie hidden-state index ({INDEX_FORMAT} expected)")
    return doc


def load_index(store: Store, key: str) -> dict[str, Any]:
    try:
        return decode_index(store.get(key), store.url(key))
    except NotFound:
        raise ShardError(f"{store.url(key)}: index is missing") from None


def layout_of(index: dict[str, Any]) -> Layout:
    return Layout(int(index["auxLayerCount"]), int(index["hiddenSize"]), index["dtype"])


# ------------------------------------------------------------------------------------ reading


def _coalesce(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge byte ranges that touch, so adjacent tensors of a sample come in one request."""
    out: list[tuple[int, int]] = []
    for b, e in sorted(spans):
        if out and b <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((b, e))
    return out


class HiddenReader:
    """Reads single samples back with ranged reads; indexes are cached (a finished dataset is immutable)."""

    def __init__(self, store: Store, cache_indexes: int = 16):
        self.store = store
        self._load = functools.lru_cache(maxsize=cache_indexes)(self._load_uncached)
        self._keys: list[tuple[int, str]] | None = None

    def _load_uncached(self, key: str) -> dict[str, Any]:
        return load_index(self.store, key)

    def index_keys(self, refresh: bool = False) -> list[tuple[int, str]]:
        if self._keys is None or refresh:
            self._keys = list_indexes(self.store)
        return self._keys

    def locate(self, sample_id: str) -> tuple[dict[str, Any], list[int]]:
        """The index and row of a sample; tries the shard its id hashes to first, then all.

        A miss lists the indexes again once, so shards finished after the first read are seen.
        """
        known = self.index_keys()
        try:
            return self._search(sample_id, known)
        except SampleNotFound:
            fresh = [k for k in self.index_keys(refresh=True) if k not in known]
            if not fresh:
                raise
            return self._search(sample_id, fresh)

    def _search(self, sample_id: str, keys: list[tuple[int, str]]) -> tuple[dict[str, Any], list[int]]:
        if not keys:
            raise SampleNotFound(f"{self.store.url(HIDDEN)}: no hidden states here (no index files)")
        order = list(keys)
        first = self._load(keys[0][1])
        n = first.get("generationShards")
        if isinstance(n, int) and n > 0 and len(sample_id) >= 8:
            try:
                guess = int(sample_id[:8], 16) % n
                order.sort(key=lambda sk: sk[0] != guess)
            except ValueError:
                pass
        for _shard, key in order:
            idx = self._load(key)
            row = idx["samples"].get(sample_id)
            if row is not None:
                return idx, row
        raise SampleNotFound(f"sample {sample_id!r} has no hidden states in {self.store.url(HIDDEN)} "
                             f"({len(self.index_keys())} shard indexes searched)")

    def read(self, sample_id: str) -> dict[str, torch.Tensor]:
        idx, row = self.locate(sample_id)
        layout = layout_of(idx)
        names = idx["columns"][2:]
        cols = layout.columns()
        key = idx["files"][row[0]]
        t = row[1]
        spans = {}
        for name, off in zip(names, row[2:], strict=True):
            dtype, width = cols[name]
            spans[name] = (off, off + t * width * dtype.itemsize)
        blobs: list[tuple[int, bytes]] = []
        for b, e in _coalesce(list(spans.values())):
            try:
                data = self.store.get_range(key, b, e - b)
            except NotFound:
                raise ShardError(
                    f"{self.store.url(key)}: hidden shard is missing (sample {sample_id})") from None
            if len(data) != e - b:
                raise ShardError(f"{self.store.url(key)}: truncated: sample {sample_id} needs bytes "
                                 f"[{b}, {e}), got {len(data)}")
            blobs.append((b, data))
        tensors: dict[str, torch.Tensor] = {}
        for name, (b, e) in spans.items():
            start, blob = next((s, d) for s, d in blobs if s <= b and e <= s + len(d))
            dtype, width = cols[name]
            raw = bytearray(blob[b - start : e - start])
            x = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
            tensors[name] = x.reshape(t, width) if name not in ("input_ids", "loss_mask") else x
        aux, last = decode(tensors, layout)
        return {"input_ids": tensors["input_ids"], "loss_mask": tensors["loss_mask"],
                "aux_hidden": aux, "last_hidden": last}


@functools.lru_cache(maxsize=8)
def _reader(uri: str, endpoint: str | None) -> HiddenReader:
    return HiddenReader(open_store(uri, endpoint))


def read_sample(uri: str, sample_id: str, endpoint: str | None = None) -> dict[str, torch.Tensor]:
    """One sample's `input_ids` [T], `loss_mask` [T], `aux_hidden` [T, kH], `last_hidden` [T, H].

    `uri` is the run's output (file://, a path, or s3:// with EYRIE_S3_* credentials in the
    environment). Only that sample's byte ranges are read; float8 storage comes back as float32.
    """
    return _reader(uri, endpoint).read(sample_id)

