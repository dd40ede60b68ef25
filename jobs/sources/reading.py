"""A source's rows: its bytes through the store (`store.open_uri`: from disk, or from S3 range by range),
JSONL lines (gunzipped when the file is gzip) or Parquet rows, the index a shard seeks with
(`scan_source`), and each row read by its format into a `Prompt` or a `BadRow` (`iter_source`)."""

from __future__ import annotations

import bisect
import gzip
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import orjson

from eyrie.jobs.contract.prompt import BadRow, Prompt
from eyrie.jobs.sources.errors import RowError, SourceError
from eyrie.jobs.sources.formats import prompt_from_row
from eyrie.jobs.spec import SourceSpec
from eyrie.jobs.store import NotFound, StoreError, open_uri

PARQUET_BATCH_ROWS = 1024


def _is_parquet(uri: str) -> bool:
    return uri.rstrip("/").lower().endswith(".parquet")


def check_source(source: SourceSpec, endpoint: str | None = None) -> None:
    """Raise SourceError if the source's file is missing or unreadable; cheap (an open, no download).

    Call it for every source before the first paid request so a typo in a URI costs nothing.
    """
    _open_binary(source, endpoint).close()


def _open_binary(source: SourceSpec, endpoint: str | None) -> IO[bytes]:
    """A seekable binary stream over the file (`store.open_uri`: from disk, or from S3 range by range)."""
    uri = source.uri
    try:
        return open_uri(uri, endpoint)
    except NotFound:
        raise SourceError(f"source {source.name!r}: {uri} does not exist or is not a file") from None
    except StoreError as e:
        raise SourceError(f"source {source.name!r}: cannot read {uri}: {e}") from None


MARK_ROWS = 4096  # a scan notes where every MARK_ROWS-th row starts; a shard's reader seeks there


@dataclass(frozen=True)
class Mark:
    """Where a source's row number `taken` (0-based among the rows that count: not blank lines)
    starts: its row number, and its byte offset in a plain JSONL file or its row group in a Parquet
    file; `pos` None in a .gz file, which is read from its start."""

    taken: int
    row: int
    pos: int | None


START = Mark(0, 0, 0)


@dataclass(frozen=True)
class SourceIndex:
    """A source's rows (its `limit` applied) and marks to start reading at; small: one mark per
    MARK_ROWS rows (per row group for Parquet), whatever the file's size."""

    name: str
    rows: int
    marks: tuple[Mark, ...] = (START,)

    def mark_for(self, taken: int) -> Mark:
        """The last mark at or before row `taken`."""
        i = bisect.bisect_right([m.taken for m in self.marks], taken) - 1
        return self.marks[max(0, i)]


def scan_source(source: SourceSpec, endpoint: str | None = None) -> SourceIndex:
    """Count a source's rows and mark where to seek, streaming (memory flat in the file's size;
    Parquet reads only the footer). Raises SourceError when the file cannot be read at all."""
    limit = source.limit
    f = _open_binary(source, endpoint)
    with f:
        if _is_parquet(source.uri):
            pf = _parquet_file(source, f)
            marks, first = [], 0
            for g in range(pf.metadata.num_row_groups):
                if limit is not None and first >= limit:
                    break
                marks.append(Mark(first, first, g))
                first += pf.metadata.row_group(g).num_rows
            rows = first if limit is None else min(first, limit)
            return SourceIndex(source.name, rows, tuple(marks) or (START,))
        stream, seekable = _text_stream(f)
        marks, taken, offset, after = [START], 0, 0, 0  # after: the row number after the last line
        for i, _line in _lines(stream):
            if limit is not None and taken >= limit:
                break
            if seekable and taken and taken % MARK_ROWS == 0:
                marks.append(Mark(taken, after, offset))  # blank lines before row i keep their numbers
            taken += 1
            after = i + 1
            if seekable:
                offset = stream.tell()
        return SourceIndex(source.name, taken, tuple(marks))


def _text_stream(f: IO[bytes]) -> tuple[IO[bytes], bool]:
    """The lines' stream (gunzipped when the file is gzip) and whether it can seek to a mark."""
    magic = f.read(2)
    f.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=f), False  # type: ignore[return-value]
    return f, True


def _lines(stream: IO[bytes], first_row: int = 0) -> Iterator[tuple[int, bytes | RowError]]:
    """(row number, line) of every non-blank line; a corrupt .gz ends with one RowError."""
    i = first_row - 1
    try:
        while line := stream.readline():
            i += 1
            if line.strip():
                yield i, line.rstrip(b"\r\n")
    except (OSError, EOFError) as e:  # a truncated .gz: report it like a bad row, keep the rest
        yield i + 1, RowError(f"the file is corrupt from here on ({type(e).__name__}: {e})")


def _raw_rows(source: SourceSpec, endpoint: str | None, mark: Mark = START) -> Iterator[tuple[int, Any]]:
    """(row number, undecoded line, Parquet row or RowError) in file order, from `mark`."""
    f = _open_binary(source, endpoint)
    with f:
        if _is_parquet(source.uri):
            yield from _parquet_rows(source, f, mark)
            return
        stream, seekable = _text_stream(f)
        if seekable and mark.pos:
            stream.seek(mark.pos)
        yield from _lines(stream, mark.row if seekable else 0)


def decode_line(line: bytes) -> Any:
    """One JSONL line decoded, or a ValueError (not raised) naming what is wrong with it."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as e:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as u:
            return RowError(f"invalid UTF-8 at byte {u.start}")
        return RowError(f"invalid JSON: {e}")


def _parquet_file(source: SourceSpec, f: IO[bytes]) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(f)
    except (pa.ArrowException, OSError) as e:
        raise SourceError(f"source {source.name!r}: {source.uri} is not a readable Parquet file: {e}"
                          ) from None


def _parquet_rows(source: SourceSpec, f: IO[bytes], mark: Mark = START) -> Iterator[tuple[int, Any]]:
    pf = _parquet_file(source, f)
    groups = list(range(mark.pos or 0, pf.metadata.num_row_groups))
    i = mark.row
    for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=groups):
        for row in batch.to_pylist():
            yield i, row
            i += 1


def iter_source(source: SourceSpec, endpoint: str | None = None, *, whole: bool = False, start: int = 0,
                stop: int | None = None, index: SourceIndex | None = None,
                answers: bool = False) -> Iterator[Prompt | BadRow]:
    """Stream a source's prompts in file order; bad rows come out as BadRow, never as an exception.

    `whole`: each Prompt holds the whole normalized conversation (`generation.turns: all`), not the
    conversation up to its last user turn.

    `limit` counts rows taken, bad rows included (a row is taken once it yields a Prompt or a
    BadRow; blank lines are not rows), so a limit of N always means the first N rows of the file.
    `start`/`stop` select rows by that count (a shard's slice); with the source's `index`
    (`scan_source`) the reader seeks to the slice instead of reading up to it. `answers`: each Prompt
    also carries the row's own answer (`generation.answers: dataset`).
    The S3 endpoint defaults to EYRIE_S3_ENDPOINT (see `store.open_store`). Raises SourceError when
    the file cannot be opened or is corrupt as a whole.
    """
    if source.limit is not None:
        stop = source.limit if stop is None else min(stop, source.limit)
    mark = index.mark_for(start) if index is not None else START
    taken = mark.taken
    for i, raw in _raw_rows(source, endpoint, mark):
        if stop is not None and taken >= stop:
            return
        taken += 1
        if taken <= start:
            continue
        if isinstance(raw, bytes):
            raw = decode_line(raw)  # error positions within the line
        yield prompt_from_row(source.name, source.format, i, raw, whole=whole, answer=answers)
