"""The host side of extraction, overlapped with the device: states leave it without stalling it.

On an H200 the synchronous copy of ~1 GB of states per batch to pageable memory halved the forward's
speed (issue 42). Here each batch's states are encoded on the device (cast or float8), copied with
non-blocking copies on a side stream into pinned host buffers (`HostStaging`), and handed to a worker
thread that waits for the copy, keeps the states in ordinary memory and frees the pinned buffer
(`StatePipeline`); a second thread serializes each finished part and writes it to the store. The
device meanwhile runs the next forwards.

The memory the overlap needs is bounded:
- pinned host memory: `depth` buffers, each the largest batch's states seen so far (at the token
  budget: budget x bytes per token; an 8B model at 32k tokens, 3 aux layers, bf16: 1 GiB each);
- device memory: the encoded states of at most `depth` batches whose copy is pending;
- host memory: the part being assembled, plus the part being written (its states and its serialized
  blob): about 3 x `extraction.shardBytes` at most;
- the forward waits (a submit blocks) when `depth` batches are queued for the worker, and the worker
  waits when a part is still being written: neither side runs ahead without bound.
On the CPU the copy is nothing (states are already on the host): the same worker and writer run,
and the states are encoded on the worker instead.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from eyrie.jobs.extract import codec
from eyrie.jobs.extract.fidelity import Forward
from eyrie.jobs.extract.shards import PartSample, encode_part, parse_header, part_entries
from eyrie.jobs.store import Store

log = logging.getLogger("eyrie.extract")

DEPTH = 2
"""Batches in flight between the forward and the worker: one being copied or assembled while the
next forward runs is all the overlap needs; a second absorbs a slow moment of the store."""
_ALIGN = 64  # every tensor's offset in a pinned buffer: any dtype's alignment


@dataclass
class Stats:
    """Where an extraction's time went, for the benchmarks: seconds the forward thread waited on the
    worker (back-pressure: the host side binds), seconds the worker and the writer were busy."""

    batches: int = 0
    parts: int = 0
    bytes_written: int = 0
    forward_waited_s: float = 0.0
    worker_busy_s: float = 0.0
    encode_s: float = 0.0
    write_s: float = 0.0
    pinned_bytes: int = 0  # pinned host memory held at the end (the bound's figure)
    max_in_flight: int = 0  # most batches queued or being assembled at once (never above depth)

    def dump(self) -> dict[str, Any]:
        return dict(self.__dict__)


class _PinnedSlots:
    """`count` reusable pinned buffers (allocating pinned memory costs far more than a copy into it)."""

    def __init__(self, count: int):
        self.free: queue.Queue[torch.Tensor | None] = queue.Queue()
        for _ in range(count):
            self.free.put(None)  # allocated on first use, at the size the first batch needs
        self.sizes: dict[int, int] = {}

    def acquire(self, nbytes: int) -> torch.Tensor:
        buf = self.free.get()
        if buf is None or buf.numel() < nbytes:
            if buf is not None:
                self.sizes.pop(buf.data_ptr(), None)
            buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            self.sizes[buf.data_ptr()] = nbytes
        return buf

    def release(self, buf: torch.Tensor) -> None:
        self.free.put(buf)

    @property
    def held(self) -> int:
        return sum(self.sizes.values())


@dataclass
class Staged:
    """One batch's encoded states on their way to the host; `host()` (on the worker) waits for them."""

    encoded: list[dict[str, torch.Tensor]]  # per sample: on the host, or views of a pinned buffer
    layout: codec.Layout
    event: Any = None  # torch.cuda.Event of the copy; None: already on the host
    buffer: torch.Tensor | None = None
    release: Callable[[torch.Tensor], None] | None = None
    raw: list[Forward] = field(default_factory=list)  # CPU: encoded on the worker

    def host(self) -> list[dict[str, torch.Tensor]]:
        """Per sample, its stored tensors in ordinary host memory; frees the pinned buffer."""
        if self.raw:
            return [codec.encode(f.aux, f.last, self.layout) for f in self.raw]
        if self.event is None:
            return self.encoded
        self.event.synchronize()
        try:
            return [{k: v.clone() for k, v in e.items()} for e in self.encoded]
        finally:
            assert self.buffer is not None and self.release is not None
            self.release(self.buffer)


class HostStaging:
    """Encodes a batch's states on its device and starts their copy to pinned host memory."""

    def __init__(self, layout: codec.Layout, depth: int = DEPTH):
        self.layout = layout
        self.slots = _PinnedSlots(depth)
        self._stream: Any = None

    def stage(self, forwards: Sequence[Forward]) -> Staged:
        if not forwards or not forwards[0].aux.is_cuda:
            return Staged([], self.layout, raw=list(forwards))
        device = forwards[0].aux.device
        encoded = [codec.encode(f.aux, f.last, self.layout) for f in forwards]  # on the device, async
        spans: list[list[tuple[str, int, torch.Tensor]]] = []
        total = 0
        for e in encoded:
            row = []
            for name, t in e.items():
                row.append((name, total, t))
                total += -(-t.nbytes // _ALIGN) * _ALIGN
            spans.append(row)
        buf = self.slots.acquire(total)  # blocks while `depth` earlier batches still hold theirs
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        self._stream.wait_stream(torch.cuda.current_stream(device))
        views: list[dict[str, torch.Tensor]] = []
        with torch.cuda.stream(self._stream):
            for row in spans:
                out = {}
                for name, off, t in row:
                    dst = buf[off:off + t.nbytes].view(t.dtype).view(t.shape)
                    dst.copy_(t, non_blocking=True)
                    t.record_stream(self._stream)  # its memory is not reused before the copy is done
                    out[name] = dst
                views.append(out)
            event = torch.cuda.Event()
            event.record(self._stream)
        return Staged(views, self.layout, event, buf, self.slots.release)


@dataclass
class _Part:
    key: str
    file_no: int
    samples: list[PartSample | None]


class StatePipeline:
    """Batches' states -> parts in the store, on a worker and a writer thread (see the module's bounds).

    `add` a batch (its positions in the current part and their rows), `finish_part` once its last
    batch is added; `finished()` returns the parts written so far, in order, and `close()` waits for
    the rest. An error on either thread is raised by the next call on the forward's side.
    """

    def __init__(self, store: Store, layout: codec.Layout, depth: int = DEPTH, stats: Stats | None = None,
                 staging: HostStaging | None = None):
        """`staging`: pinned buffers to reuse (one per run: allocating pinned memory costs more than the
        copies into it), else its own."""
        self.store = store
        self.layout = layout
        self.depth = depth
        self.staging = staging or HostStaging(layout, depth)
        self.stats = stats or Stats()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eyrie-hidden-assembler")
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eyrie-hidden-writer")
        self._tasks: deque[Future[None]] = deque()
        self._writes: deque[Future[tuple[str, int, int, dict[str, list[int]]]]] = deque()
        self._lock = threading.Lock()
        self._in_flight = 0
        self._part: _Part | None = None
        self._last_write: Future[tuple[str, int, int, dict[str, list[int]]]] | None = None  # the worker's

    def start_part(self, key: str, file_no: int, size: int) -> None:
        self._part = _Part(key, file_no, [None] * size)

    def add(self, positions: Sequence[int], rows: Sequence[tuple[str, np.ndarray, np.ndarray]],
            forwards: Sequence[Forward]) -> None:
        """One batch: `rows[j]` = (sample id, input ids, loss mask) of part position `positions[j]`."""
        part = self._part
        assert part is not None, "start_part first"
        staged = self.staging.stage(forwards)
        self.stats.batches += 1

        def assemble() -> None:
            t0 = time.perf_counter()
            try:
                for p, (sid, ids, mask), hidden in zip(positions, rows, staged.host(), strict=True):
                    part.samples[p] = PartSample(sid, torch.from_numpy(ids.astype(np.int32)),
                                                 torch.from_numpy(mask.astype(np.int8)), hidden)
            finally:
                with self._lock:
                    self._in_flight -= 1
                self.stats.worker_busy_s += time.perf_counter() - t0

        self._submit(assemble, batch=True)

    def finish_part(self, meta: dict[str, str]) -> None:
        part, self._part = self._part, None
        assert part is not None

        def hand_over() -> None:
            if self._last_write is not None:  # at most one part being written while the next is assembled
                self._last_write.result()
            samples = [s for s in part.samples if s is not None]
            if len(samples) != len(part.samples):
                raise RuntimeError(f"{part.key}: {len(part.samples) - len(samples)} samples never arrived")
            self._last_write = self._writer.submit(self._write, part.key, part.file_no, samples, meta)
            self._writes.append(self._last_write)

        self._submit(hand_over)

    def _write(self, key: str, file_no: int, samples: list[PartSample], meta: dict[str, str]
               ) -> tuple[str, int, int, dict[str, list[int]]]:
        t0 = time.perf_counter()
        blob = encode_part(samples, meta)
        t1 = time.perf_counter()
        header, start = parse_header(blob[: 8 + int.from_bytes(blob[:8], "little")], key)
        entries = part_entries(header, start, file_no, self.layout, len(blob), key)
        self.store.put(key, blob)
        self.stats.encode_s += t1 - t0
        self.stats.write_s += time.perf_counter() - t1
        self.stats.parts += 1
        self.stats.bytes_written += len(blob)
        log.info("wrote %s (%d samples, %d bytes)", self.store.url(key), len(samples), len(blob))
        return key, file_no, len(blob), entries

    def _submit(self, fn: Callable[[], None], batch: bool = False) -> None:
        t0 = time.perf_counter()
        while self._tasks and (len(self._tasks) >= self.depth or self._tasks[0].done()):
            self._tasks.popleft().result()
        self.stats.forward_waited_s += time.perf_counter() - t0
        if batch:
            with self._lock:
                self._in_flight += 1
                self.stats.max_in_flight = max(self.stats.max_in_flight, self._in_flight)
        self._tasks.append(self._worker.submit(fn))

    def finished(self) -> list[tuple[str, int, int, dict[str, list[int]]]]:
        """Parts written since the last call: (key, file number, bytes, index entries), in order."""
        out = []
        while self._tasks and self._tasks[0].done():
            self._tasks.popleft().result()
        while self._writes and self._writes[0].done():
            out.append(self._writes.popleft().result())
        return out

    def close(self) -> list[tuple[str, int, int, dict[str, list[int]]]]:
        """Waits for every batch and part; returns the parts not yet returned by `finished`."""
        while self._tasks:
            self._tasks.popleft().result()
        out = []
        while self._writes:
            out.append(self._writes.popleft().result())
        self.stats.pinned_bytes = self.staging.slots.held
        return out

    def shutdown(self) -> None:
        """Stops both threads (after an error: pending work is dropped, running work finishes)."""
        self._worker.shutdown(wait=True, cancel_futures=True)
        self._writer.shutdown(wait=True, cancel_futures=True)
