"""The samples stage: generation records in a store -> samples/shard-*.parquet + the manifest summary."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eyrie.jobs.contract import layout, records
from eyrie.jobs.reconstruct.formats import resolve_format
from eyrie.jobs.reconstruct.reconstructor import Reconstructor
from eyrie.jobs.reconstruct.samples import SCHEMA, build_samples
from eyrie.jobs.reconstruct.tokenizers import clear_cache, load_tokenizer
from eyrie.jobs.spec import DatasetGenerationSpec
from eyrie.jobs.store import FileStore

KIMI = Path(__file__).parent / "data" / "kimi_synthetic"


def read_samples(store: FileStore, shard: int) -> pa.Table:
    return pq.read_table(io.BytesIO(store.get(layout.samples_key(shard))))


def record(sid: str, content: str | None = "Hello", *, status: str = "ok", policy: str = "keep",
           messages: list[dict[str, Any]] | None = None, completion_tokens: int | None = None) -> dict[str, Any]:
    return {"sample_id": sid, "source": "chat", "row": int(sid[1:]), "status": status, "policy": policy,
            "request": {"model": "m", "messages": messages or [{"role": "user", "content": f"Hi {sid} ✓"}]},
            "response": {"reasoning": "Think.", "content": content, "tool_calls": [], "finish_reason": "stop"}
            if status == "ok" else None,
            "usage": {"prompt_tokens": 40, "completion_tokens": completion_tokens} if completion_tokens else None}


@pytest.fixture
def spec(tmp_path) -> DatasetGenerationSpec:
    clear_cache()
    return DatasetGenerationSpec.model_validate({
        "sources": [{"name": "chat", "uri": "prompts.jsonl"}],
        "target": {"model": "moonshotai/kimi-k2.5", "tokenizer": str(KIMI), "chatFormat": "kimi-k2.5"},
        "api": {"baseUrl": "simulated"}, "budget": {"maxUSD": "1"}, "output": {"uri": str(tmp_path / "out")}})


def test_build_samples_writes_one_parquet_per_shard_and_counts_exclusions(spec, tmp_path):
    store = FileStore(tmp_path / "out")
    a, d, e = record("r1", completion_tokens=13), record("r4", policy="flag"), record("r6", "Bye 👋")
    store.put(layout.part_key(0, 0), records.encode_part([a, record("r2", status="failed"),
                                                           record("r3", policy="drop")]))
    store.put(layout.part_key(0, 1), records.encode_part([d, record("r1")]))  # r1 again: a duplicate
    store.put(layout.part_key(2, 0), records.encode_part([
        e, record("r7", messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey"}])]))
    store.put(layout.samples_key(7), b"stale")  # a shard with no records any more

    summary = build_samples(spec, store)

    assert sorted(store.list(layout.SAMPLES)) == [layout.samples_key(0), layout.samples_key(2)]
    tok = load_tokenizer(spec.target)
    rebuild = Reconstructor(resolve_format("kimi-k2.5", tok), tok)
    expected = {sid: rebuild(r) for sid, r in (("r1", a), ("r4", d), ("r6", e))}
    shard0, shard2 = read_samples(store, 0), read_samples(store, 2)
    assert shard0.schema == SCHEMA and shard2.schema == SCHEMA
    assert shard0.schema.field("input_ids").type == pa.list_(pa.int32())
    assert shard0.schema.field("loss_mask").type == pa.list_(pa.int8())
    rows = shard0.to_pylist() + shard2.to_pylist()
    assert [r["sample_id"] for r in rows] == ["r1", "r4", "r6"]
    for row in rows:
        s = expected[row["sample_id"]]
        assert row == {"sample_id": s.sample_id, "turn": 0, "source": "chat", "input_ids": s.input_ids,
                       "loss_mask": s.loss_mask, "n_tokens": s.n_tokens, "flags": list(s.flags)}
    assert rows[1]["flags"] == ["tool_policy_flag"]
    assert rows[0]["loss_mask"].count(0) == expected["r1"].n_prompt and rows[0]["loss_mask"][-1] == 1

    m = summary.to_manifest()
    assert m["tokenizer"] == {"name": str(KIMI), "sha256": tok.sha256, "files": dict(tok.files)}
    assert m["chatTemplate"] == {"format": "kimi-k2.5", "sha256": resolve_format("kimi-k2.5", tok).sha256}
    got = m["samples"]
    assert got["records"] == 7 and got["kept"] == 3 and got["shards"] == 2
    assert got["excluded"] == {"duplicate": 1, "policy_drop": 1, "status_failed": 1, "template_error": 1}
    assert got["flags"] == {"tool_policy_flag": 1}
    assert got["tokens"] == sum(s.n_tokens for s in expected.values())
    assert got["responseTokens"] == sum(s.n_tokens - s.n_prompt for s in expected.values())
    # r1: "Think." </think> "Hello" <|im_end|> = 13 tokens, exactly what usage said
    assert got["completionTokenGap"] == {"count": 1, "exact": 1, "mean": 0.0, "min": 0, "p50": 0, "p90": 0,
                                         "p99": 0, "max": 0}
    assert got["largeCompletionGaps"] == 0
    assert got["promptTokenGap"]["count"] == 1 and got["promptTokenGap"]["min"] == expected["r1"].n_prompt - 40
    assert [(x["sampleId"], x["reason"]) for x in got["excludedExamples"]] == [
        ("r2", "status_failed"), ("r3", "policy_drop"), ("r1", "duplicate"), ("r7", "template_error")]
    assert got["files"] == [layout.samples_key(0), layout.samples_key(2)]


def test_build_samples_is_idempotent_and_writes_empty_shards(spec, tmp_path):
    store = FileStore(tmp_path / "out")
    store.put(layout.part_key(0, 0), records.encode_part([record("r1"), record("r2", "Yo")]))
    store.put(layout.part_key(1, 0), records.encode_part([record("r3", status="rejected")]))
    first = build_samples(spec, store)
    bytes0 = store.get(layout.samples_key(0))
    again = build_samples(spec, store)
    assert store.get(layout.samples_key(0)) == bytes0
    assert first.to_manifest() == again.to_manifest()
    empty = read_samples(store, 1)
    assert empty.num_rows == 0 and empty.schema == SCHEMA
    assert again.to_manifest()["samples"]["excluded"] == {"status_rejected": 1}


def test_build_samples_fails_before_writing_when_the_format_cannot_be_used(spec, tmp_path):
    from eyrie.jobs.reconstruct.tokenizers import TokenizerError

    store = FileStore(tmp_path / "out")
    store.put(layout.part_key(0, 0), records.encode_part([record("r1")]))
    bad = spec.model_copy(update={"target": spec.target.model_copy(update={"chat_format": "deepseek-v4"})})
    with pytest.raises(TokenizerError, match=r"chatFormat deepseek-v4: marker"):
        build_samples(bad, store)
    assert store.list(layout.SAMPLES) == []


def test_build_samples_streams_row_groups(spec, tmp_path, monkeypatch):
    from eyrie.jobs.reconstruct import samples

    monkeypatch.setattr(samples, "ROW_GROUP", 2)
    store = FileStore(tmp_path / "out")
    store.put(layout.part_key(0, 0), records.encode_part([record(f"r{i}", f"answer {i}") for i in range(1, 6)]))
    build_samples(spec, store)
    meta = pq.ParquetFile(io.BytesIO(store.get(layout.samples_key(0)))).metadata
    assert (meta.num_row_groups, meta.num_rows) == (3, 5)
    assert read_samples(store, 0).column("sample_id").to_pylist() == ["r1", "r2", "r3", "r4", "r5"]
