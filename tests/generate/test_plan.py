"""Shards as row ranges (jobs/generate/plan.py): planned from cheap scans, read back slice by slice
exactly as a whole read would give them, kept across attempts so resume skips exactly what was
persisted."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eyrie.jobs import sources
from eyrie.jobs.contract import layout
from eyrie.jobs.generate.plan import Span, cut, plan_shards, read_plan
from eyrie.jobs.sources import iter_source, scan_source
from eyrie.jobs.spec import SourceSpec, parse_spec
from eyrie.jobs.store import FileStore


def row(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"prompt {i}"}]}


def jsonl_lines(n: int) -> list[bytes]:
    """Rows with blank lines and bad rows among them: row numbers are line numbers."""
    lines = []
    for i in range(n):
        if i % 7 == 3:
            lines.append(b"")  # blank: not a row, but it keeps its line number
        elif i % 11 == 5:
            lines.append(b"{not json")
        else:
            lines.append(json.dumps(row(i)).encode())
    return lines


def ident(items) -> list[tuple]:
    return [(type(x).__name__, x.row, x.sample_id()) for x in items]


@pytest.fixture(params=["jsonl", "gz", "parquet"])
def source(request, tmp_path, monkeypatch) -> SourceSpec:
    monkeypatch.setattr(sources, "MARK_ROWS", 5)  # many marks on a small file
    n = 97
    if request.param == "parquet":
        path = tmp_path / "p.parquet"
        table = pa.table({"messages": [json.dumps(row(i)["messages"]) for i in range(n)]})
        pq.write_table(table, path, row_group_size=8)
    else:
        body = b"\n".join(jsonl_lines(n)) + b"\n"
        path = tmp_path / ("p.jsonl.gz" if request.param == "gz" else "p.jsonl")
        path.write_bytes(gzip.compress(body) if request.param == "gz" else body)
    return SourceSpec(name="p", uri=str(path), format="openai")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(0, 120), max_size=6), limit=st.one_of(st.none(), st.integers(1, 120)))
def test_slices_read_back_exactly_what_a_whole_read_gives(source, cuts, limit):
    src = source.model_copy(update={"limit": limit})
    whole = list(iter_source(src))
    index = scan_source(src)
    assert index.rows == len(whole)
    bounds = sorted({0, index.rows, *(min(c, index.rows) for c in cuts)})
    pieces = [x for a, b in itertools.pairwise(bounds)
              for x in iter_source(src, start=a, stop=b, index=index)]
    assert ident(pieces) == ident(whole)


def test_a_scan_holds_marks_not_rows(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"\n".join(json.dumps(row(i)).encode() for i in range(20_000)) + b"\n")
    index = scan_source(SourceSpec(name="p", uri=str(path)))
    assert index.rows == 20_000 and len(index.marks) == 20_000 // sources.MARK_ROWS + 1
    # the reader seeks: rows 19,990.. come from the last mark, not from reading 19,990 rows
    last = list(iter_source(SourceSpec(name="p", uri=str(path)), start=19_990, stop=20_000, index=index))
    assert [p.row for p in last] == list(range(19_990, 20_000))


def test_cut_is_contiguous_near_equal_and_crosses_sources():
    shards = cut([Span("a", 0, 5), Span("b", 0, 6)], 3)
    assert shards == [[Span("a", 0, 3)], [Span("a", 3, 5), Span("b", 0, 2)], [Span("b", 2, 6)]]
    assert cut([Span("a", 0, 2)], 8) == [[Span("a", 0, 1)], [Span("a", 1, 2)]]
    assert cut([], 4) == []


def spec_for(tmp_path: Path, uri: Path, shards: int, limit: int | None = None):
    src = {"name": "p", "uri": str(uri), **({"limit": limit} if limit else {})}
    return parse_spec({"sources": [src], "target": {"model": "m"}, "api": {"baseUrl": "simulated"},
                       "budget": {"maxUSD": "1"}, "generation": {"shards": shards},
                       "output": {"uri": f"file://{tmp_path}/out"}}).spec


def test_the_stored_plan_is_kept_and_extended_never_reshuffled(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\n".join(json.dumps(row(i)).encode() for i in range(100)) + b"\n")
    store = FileStore(tmp_path / "out")
    first = plan_shards(spec_for(tmp_path, path, 4, limit=60), store)
    assert first.total == 60 and sorted(first.shards) == [0, 1, 2, 3]
    assert first.shards[1] == [Span("p", 15, 30)]
    assert read_plan(store) == first.shards and store.exists(layout.PLAN)
    # more shards asked and the limit raised: the old shards stay, the new rows get new shards
    second = plan_shards(spec_for(tmp_path, path, 8, limit=100), store)
    assert {k: second.shards[k] for k in range(4)} == first.shards
    assert sorted(second.shards) == list(range(12)) and second.total == 100
    assert second.shards[4][0] == Span("p", 60, 65)
    # the limit lowered: rows past it leave the old shards
    third = plan_shards(spec_for(tmp_path, path, 8, limit=20), store)
    assert third.total == 20 and third.shards == {0: [Span("p", 0, 15)], 1: [Span("p", 15, 20)]}
    assert read_plan(store) == second.shards  # ...and come back to them when it is raised again
    assert plan_shards(spec_for(tmp_path, path, 2, limit=100), store).shards == second.shards
