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
from eyrie.jobs.reconstruct.samples import GAP_CLIP, SCHEMA, _distribution, build_samples
from eyrie.jobs.reconstruct.tokenizers import clear_cache, load_tokenizer
from eyrie.jobs.spec import DatasetGenerationSpec
from eyrie.jobs.store import FileStore

KIMI = Path(__file__).parents[1] / "data" / "kimi_synthetic"


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
                       "loss_mask": s.loss_mask, "n_tokens": s.n_tokens, "flags": list(s.flags),
                       "provider": None, "segments": list(s.segments), "fingerprint": None}
    assert rows[1]["flags"] == ["tool_policy_flag"]
    assert rows[0]["loss_mask"].count(0) == expected["r1"].n_prompt and rows[0]["loss_mask"][-1] == 1

    m = summary.to_manifest()
    assert m["tokenizer"] == {"name": str(KIMI), "sha256": tok.sha256, "files": dict(tok.files)}
    assert m["chatTemplate"] == {"format": "kimi-k2.5", "sha256": resolve_format("kimi-k2.5", tok).sha256,
                                 "variant": "current", "byProvider": {}, "mismatched": [],
                                 "onMismatch": "stop"}
    got = m["samples"]
    assert got["records"] == 7 and got["kept"] == 3 and got["shards"] == 2
    assert got["excluded"] == {"duplicate": 1, "policy_drop": 1, "status_failed": 1, "template_error": 1}
    assert got["flags"] == {"tool_policy_flag": 1}
    assert got["tokens"] == sum(s.n_tokens for s in expected.values())
    assert got["responseTokens"] == sum(s.n_tokens - s.n_prompt for s in expected.values())
    # r1: "Think." </think> "Hello" <|im_end|> = 13 tokens, exactly what usage said
    assert got["completionTokenGap"] == {"count": 1, "exact": 1, "mean": 0.0, "min": 0, "p50": 0, "p90": 0,
                                         "p99": 0, "max": 0, "histogram": {"0": 1}}
    assert got["largeCompletionGaps"] == 0
    assert got["promptTokenGap"]["count"] == 1 and got["promptTokenGap"]["min"] == expected["r1"].n_prompt - 40
    assert got["promptTokenGap"]["histogram"] == {str(max(-GAP_CLIP, min(GAP_CLIP, expected["r1"].n_prompt - 40))): 1}
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


def test_samples_carry_the_provider_and_where_reasoning_content_and_tool_calls_start(spec, tmp_path):
    """The segments fidelity is split by: token positions decode back to each part of the answer."""
    store = FileStore(tmp_path / "out")
    calls = [{"id": "functions.get_time:0", "type": "function",
              "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}]
    tool = record("r1", "Let me check.")
    tool["response"] = {**tool["response"], "tool_calls": calls, "provider": "moonshotai"}
    tool["checks"] = {"declared": True, "called": True, "invalidCalls": 1, "leaked": False,
                      "calls": [{"index": 0, "name": "get_time", "valid": False, "errors": ["x"]}], "leaks": {}}
    plain = record("r2", "Hi there")
    plain["response"]["provider"] = "other"
    plain["checks"] = {"declared": True, "called": False, "invalidCalls": 0, "leaked": True, "calls": [],
                       "leaks": {"content": ["<|tool_calls_section_begin|>"]}}
    store.put(layout.part_key(0, 0), records.encode_part([tool, plain]))
    summary = build_samples(spec, store)
    tok = load_tokenizer(spec.target)
    rows = {r["sample_id"]: r for r in read_samples(store, 0).to_pylist()}

    r = rows["r1"]
    n_prompt = r["loss_mask"].count(0)
    reasoning, content, calls_at = r["segments"]
    assert r["provider"] == "moonshotai" and reasoning == n_prompt < content < calls_at < r["n_tokens"]
    ids = r["input_ids"]
    assert tok.decode(ids[reasoning:content]) == "Think.</think>"
    assert tok.decode(ids[content:calls_at]) == "Let me check."
    tail = tok.decode(ids[calls_at:])
    assert tail.startswith("<|tool_calls_section_begin|>") and tail.endswith("<|im_end|>")
    assert "functions.get_time:0" in tail and '{"tz": "UTC"}' in tail

    r = rows["r2"]
    reasoning, content, calls_at = r["segments"]
    assert r["provider"] == "other" and calls_at == r["n_tokens"]  # no calls: content runs to the end
    assert tok.decode(r["input_ids"][content:]) == "Hi there<|im_end|>"

    got = summary.to_manifest()["samples"]
    assert got["byProvider"]["moonshotai"]["toolCallRate"] == 1.0
    assert got["byProvider"]["moonshotai"]["invalidCallRate"] == 1.0
    assert got["byProvider"]["other"]["toolCallRate"] == 0.0 and got["byProvider"]["other"]["leakRate"] == 1.0
    assert got["answers"]["answers"] == 2 and got["answers"]["toolCallRate"] == 0.5
    assert got["bySource"]["chat"]["leakRate"] == 0.5


def test_segments_of_a_vocabulary_whose_tokens_do_not_add_up_to_the_text():
    """The decode fallback (binary search over prefixes) finds the same boundaries."""
    from eyrie.jobs.reconstruct.segments import segment_chars, token_starts

    text = "abc</think>hello<call>x</call>"
    pieces = (("reasoning", "abc"), ("content", "hello"), ("tool_calls[0].arguments", "x"))
    assert segment_chars(text, pieces, True) == (11, 16)
    assert segment_chars(text, pieces, False) == (11, len(text))
    toks = ["a", "bc", "</think>", "hel", "lo", "<call>", "x", "</call>"]
    ids = list(range(len(toks)))

    def decode(xs):
        return "".join(toks[i] for i in xs)

    by_bytes = token_starts(text, [t.encode() for t in toks], decode, ids, (11, 16))
    by_decode = token_starts(text, [b"?"] * len(toks), decode, ids, (11, 16))
    assert by_bytes == by_decode == [3, 5]


def test_gap_histogram_is_bounded_and_counts_every_sample() -> None:
    values = [0, 0, 3, -2, 10_000, -10_000, 5]
    hist = _distribution(values)["histogram"]
    assert sum(hist.values()) == len(values)
    assert hist == {str(-GAP_CLIP): 1, "-2": 1, "0": 2, "3": 1, "5": 1, str(GAP_CLIP): 1}


def test_each_providers_records_are_rebuilt_with_the_variant_found_for_it(spec, tmp_path):
    import orjson

    from eyrie.jobs.contract.progress import Progress, write_progress

    store = FileStore(tmp_path / "out")
    old, new = record("r1"), record("r2")
    old["response"]["provider"], new["response"]["provider"] = "OldHost", "NewHost"
    store.put(layout.part_key(0, 0), records.encode_part([old, new, record("r3")]))
    write_progress(store, Progress.model_validate({"attempt": "a1", "stage": "generate", "outcome": "Done",
                                                   "templateVariants": {"byProvider": {
        "OldHost": {"variant": "release", "how": "detected"}, "NewHost": {"variant": "current", "how": "detected"}}}}))
    summary = build_samples(spec, store)
    tok = load_tokenizer(spec.target)
    texts = {r["sample_id"]: tok.decode(r["input_ids"]) for r in read_samples(store, 0).to_pylist()}
    default_system = "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI."
    assert [default_system in texts[s] for s in ("r1", "r2", "r3")] == [True, False, False]
    by = summary.to_manifest()["chatTemplate"]["byProvider"]
    assert {p: v["variant"] for p, v in by.items()} == {"NewHost": "current", "OldHost": "release"}
    assert by["OldHost"]["sha256"] == resolve_format("kimi-k2.5", tok, "release").sha256 != by["NewHost"]["sha256"]
    assert orjson.loads(store.get(layout.PROGRESS))["templateVariants"]  # read, never rewritten here


@pytest.mark.parametrize("on", ["stop", "flag", "exclude"])
def test_a_mismatched_provider_s_samples_are_flagged_or_excluded_and_no_other(on):
    """Providers past the detector's cap share its `(other)` entry: a mismatch there must not reach a
    provider the detector judged on its own."""
    from eyrie.jobs.reconstruct.samples import ProviderRebuild
    from eyrie.jobs.reconstruct.variants import OTHER_PROVIDERS, Choice
    from eyrie.jobs.spec import TargetSpec

    tok = load_tokenizer(TargetSpec(model="m", tokenizer="bundled:deepseek-v4"))
    v4 = "deepseek-v4"  # no variants: a detected provider gets no rebuilder of its own
    chosen = {"good": Choice(v4, "detected", 8, (v4,)), "bad": Choice(v4, "mismatch", 8, ()),
              OTHER_PROVIDERS: Choice(v4, "mismatch", 8, ())}
    rebuild = ProviderRebuild(resolve_format(v4, tok), tok, chosen, on)
    for provider, mismatched in (("good", False), ("bad", True), ("never-judged", True)):
        r = record("r1")
        r["response"]["provider"] = provider
        got = rebuild(r)
        if not mismatched:
            assert "template_mismatch" not in got.flags, provider
        elif on == "exclude":
            assert got.reason == "template_mismatch" and "target.onTemplateMismatch: exclude" in got.message
        else:
            assert "template_mismatch" in got.flags, provider
