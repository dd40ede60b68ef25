"""Hidden-state extraction with the transformers backend on CPU, against a direct forward pass."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).parents[1]))
from extract_helpers import assert_float32_rounding, make_spec, put_samples, random_rows, reference
from specforge_helpers import need_specforge

from eyrie.jobs.contract import layout
from eyrie.jobs.contract.layers import LayerError, model_facts, resolve_layers
from eyrie.jobs.extract import HiddenReader, SampleNotFound, ShardError, read_sample
from eyrie.jobs.extract.batching import plan_batches
from eyrie.jobs.extract.codec import E4M3_MAX, Layout
from eyrie.jobs.extract.hf_backend import HFBackend, build_tiny_model
from eyrie.jobs.extract.run import (
    ExtractionError,
    VocabMismatch,
    assign_shards,
    extract_shard,
    make_plan,
    run_extraction,
    summarize,
)
from eyrie.jobs.extract.shards import index_key, part_key, plan_parts
from eyrie.jobs.store import open_store

VOCAB = 512
HIDDEN = 64
CONTEXT = 64
LAYERS = (1, 2, 3)  # auto for a 4-layer model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", VOCAB, HIDDEN, layers=4, context=CONTEXT)


@pytest.fixture(scope="module")
def ref_model(tiny):
    return AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def backend(tiny) -> HFBackend:
    return HFBackend(str(tiny), device="cpu", storage_dtype="float32")


def _run(tmp_path: Path, tiny: Path, backend=None, rows_per_shard=(6, 5), **extraction):
    out = f"file://{tmp_path}/out"
    store = open_store(out)
    rows = {}
    for shard, n in enumerate(rows_per_shard):
        rows[shard] = random_rows(shard, n, VOCAB, seed=shard)
        put_samples(store, shard, rows[shard])
    spec = make_spec(out, tiny, **extraction)
    summary = run_extraction(spec, store, backend=backend)
    return out, store, rows, summary


# ------------------------------------------------------------------------------------- layers


def test_auto_layers_follow_the_eagle3_convention():
    assert resolve_layers("auto", 32).ids == (2, 16, 29)
    assert resolve_layers("auto", 61).ids == (2, 30, 58)  # Kimi-K2 / DeepSeek-V3 depth
    assert resolve_layers("auto", 7).ids == (2, 3, 4)
    assert resolve_layers("auto", 4).ids == (1, 2, 3)  # shallow fallback
    assert "2, 16, 29" in resolve_layers("auto", 32).convention
    assert resolve_layers([3, 5, 9], 12).ids == (3, 5, 9)


@pytest.mark.parametrize("layers,needle", [([1, 2, 9], "layer id 9 is out of range"),
                                          ([0, 2], "layer id 0 is out of range"),
                                          ([3, 2], "layer id 2 follows 3"), ([], "at least one")])
def test_bad_layer_ids_are_named(layers, needle):
    with pytest.raises(LayerError, match=needle):
        resolve_layers(layers, 4)


def test_a_missing_model_is_named():
    from eyrie.jobs.extract.hf_backend import ModelLoadError

    with pytest.raises(ModelLoadError, match=r"extraction\.model '/nonexistent/model' cannot be loaded"):
        HFBackend("/nonexistent/model", device="cpu")


@pytest.mark.integration
def test_model_facts_read_the_config(tiny, backend):
    f = backend.facts
    assert (f.num_layers, f.hidden_size, f.vocab_size, f.max_context) == (4, HIDDEN, VOCAB, CONTEXT)
    assert len(f.config_sha256) == 64
    assert f.config_sha256 == model_facts(backend.model.config).config_sha256


# --------------------------------------------------------------------------------- pure logic


def test_padded_batches_respect_the_token_budget():
    lengths = [5, 30, 7, 30, 12, 100]
    batches = [list(b.positions) for b in plan_batches(lengths, 64, packed=False)]
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert batches[0] == [5]  # longer than the budget: alone
    for b in batches[1:]:
        assert len(b) * max(lengths[i] for i in b) <= 64
    assert batches == [[5], [1, 3], [4, 2, 0]]


def test_plan_parts_fill_up_to_shard_bytes_in_order():
    assert plan_parts([10, 10, 10, 50, 1], 95, 2000) == [[0, 1], [2], [3], [4]]
    assert plan_parts([], 95, 2000) == []


def test_assign_shards_cover_each_shard_exactly_once():
    shards = [0, 1, 2, 3, 5, 8, 13]
    for count in (1, 2, 3, 7, 9):
        got = [assign_shards(shards, i, count) for i in range(count)]
        flat = sorted(s for g in got for s in g)
        assert flat == shards
    assert assign_shards(shards, 1, 3) == [1, 13]
    with pytest.raises(ExtractionError, match="--index 3 --count 3"):
        assign_shards(shards, 3, 3)


# ------------------------------------------------------------------------------ whole stage


@pytest.mark.integration
def test_float32_equals_a_direct_forward_exactly(tmp_path, tiny, ref_model, backend):
    # a budget of 1 token runs every sample alone: the same matmul shapes as the direct forward
    out, _store, rows, summary = _run(tmp_path, tiny, backend=backend, dtype="float32", maxTokensPerBatch=1)
    assert summary.aux_layers == list(LAYERS) and summary.hidden_size == HIDDEN
    assert summary.bytes_per_token == 4 * HIDDEN * 4
    assert summary.samples == 11 and summary.skipped == {}
    for shard_rows in rows.values():
        for sid, ids, mask in shard_rows:
            s = read_sample(out, sid)
            aux, last = reference(ref_model, ids, LAYERS)
            assert s["input_ids"].tolist() == ids and s["loss_mask"].tolist() == mask
            assert s["aux_hidden"].shape == (len(ids), 3 * HIDDEN) and s["last_hidden"].shape == (len(ids), HIDDEN)
            assert torch.equal(s["aux_hidden"], aux)
            assert torch.equal(s["last_hidden"], last)


@pytest.mark.integration
def test_length_batches_match_single_forwards_to_float32_rounding(tmp_path, tiny, ref_model, backend):
    # padded batches change only the summation order of float32 matmuls (a few ulp)
    out, _store, rows, _summary = _run(tmp_path, tiny, backend=backend, dtype="float32", maxTokensPerBatch=80)
    for sid, ids, _mask in rows[0] + rows[1]:
        s = read_sample(out, sid)
        aux, last = reference(ref_model, ids, LAYERS)
        torch.testing.assert_close(s["aux_hidden"], aux, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(s["last_hidden"], last, rtol=1e-5, atol=1e-6)


@pytest.mark.integration
def test_bfloat16_is_the_reference_rounded(tmp_path, tiny, ref_model):
    out, _store, rows, summary = _run(tmp_path, tiny, dtype="bfloat16", maxTokensPerBatch=1)
    assert summary.bytes_per_token == 4 * HIDDEN * 2
    for sid, ids, _mask in rows[0] + rows[1]:
        s = read_sample(out, sid)
        aux, last = reference(ref_model, ids, LAYERS)
        assert s["aux_hidden"].dtype == torch.bfloat16
        assert torch.equal(s["aux_hidden"], aux.to(torch.bfloat16))
        assert torch.equal(s["last_hidden"], last.to(torch.bfloat16))


@pytest.mark.integration
def test_float8_is_within_e4m3_precision_and_halves_bf16(tmp_path, tiny, ref_model):
    out, _store, rows, summary = _run(tmp_path, tiny, dtype="float8", maxTokensPerBatch=1)
    assert summary.bytes_per_token == 4 * HIDDEN + 4 * 4  # 1 byte per value + one scale per layer
    for sid, ids, _mask in rows[0] + rows[1]:
        s = read_sample(out, sid)
        aux, last = reference(ref_model, ids, LAYERS)
        assert s["aux_hidden"].dtype == torch.float32
        for got, want in ((s["aux_hidden"].reshape(len(ids), 3, HIDDEN), aux.reshape(len(ids), 3, HIDDEN)),
                          (s["last_hidden"].reshape(len(ids), 1, HIDDEN), last.reshape(len(ids), 1, HIDDEN))):
            scale = want.abs().amax(-1, keepdim=True) / E4M3_MAX
            err = (got - want).abs()
            # e4m3: 3 mantissa bits -> half-ulp 2^-4 relative; subnormal steps of scale * 2^-9
            assert bool((err <= want.abs() * 2**-4 + scale * 2**-9 + 1e-12).all())
            assert float(err.max()) > 0  # really quantized


@pytest.mark.integration
def test_bytes_on_disk_match_bytes_per_token(tmp_path, tiny):
    _out, store, _rows, summary = _run(tmp_path, tiny, dtype="bfloat16")
    layout = Layout(3, HIDDEN, "bfloat16")
    data = 0
    for shard in summary.shards:
        for key in shard.files:
            blob = store.get(key)
            data += len(blob) - 8 - int.from_bytes(blob[:8], "little")
    assert data == summary.tokens * (layout.bytes_per_token + 5)  # + int32 id + int8 mask
    assert summary.bytes == sum(store.size(k) for s in summary.shards for k in s.files)


@pytest.mark.integration
def test_many_parts_and_a_ranged_read_of_one_sample(tmp_path, tiny, ref_model):
    _out, store, rows, summary = _run(tmp_path, tiny, rows_per_shard=(40,), dtype="float32", shardBytes=1 << 16,
                                      maxTokensPerBatch=1)
    files = summary.shards[0].files
    assert len(files) >= 4
    assert files[:2] == [part_key(0, 0), part_key(0, 1)]

    calls: list[tuple[str, str, int]] = []

    class Counting:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            fn = getattr(self.inner, name)

            def wrapped(*a, **k):
                res = fn(*a, **k)
                calls.append((name, a[0] if a else "", len(res) if isinstance(res, bytes) else 0))
                return res
            return wrapped

    reader = HiddenReader(Counting(store))
    sid, ids, _ = rows[0][17]
    s = reader.read(sid)
    assert torch.equal(s["aux_hidden"], reference(ref_model, ids, LAYERS)[0])
    on_parts = [c for c in calls if c[1].endswith(".safetensors")]
    assert {c[0] for c in on_parts} == {"get_range"}  # never a whole shard
    assert sum(c[2] for c in on_parts) == len(ids) * (4 * HIDDEN * 4 + 5)


@pytest.mark.integration
def test_turns_of_one_conversation_are_read_back_by_id_and_turn(tmp_path, tiny, ref_model, backend):
    out = f"file://{tmp_path}/out"
    store = open_store(out)
    (sid, ids0, mask0), (_other, ids1, mask1) = random_rows(0, 2, VOCAB, seed=7)
    put_samples(store, 0, [(sid, ids0, mask0), (sid, ids1, mask1)], turns=[0, 1])
    run_extraction(make_spec(out, tiny, dtype="float32"), store, backend=backend)
    for key, ids in ((sid, ids0), (layout.turn_sample_key(sid, 1), ids1)):
        got = read_sample(out, key)
        assert got["input_ids"].tolist() == ids
        assert torch.equal(got["aux_hidden"], reference(ref_model, ids, LAYERS)[0])


@pytest.mark.integration
def test_skipped_samples_are_counted_with_reasons(tmp_path, tiny, backend):
    out = f"file://{tmp_path}/out"
    store = open_store(out)
    good = random_rows(0, 4, VOCAB, seed=3)
    bad = [("toolong", list(range(CONTEXT + 1)), [1] * (CONTEXT + 1)),
           ("oov", [1, 2, VOCAB + 7], [0, 1, 1]),
           ("empty", [], []),
           ("badmask", [1, 2, 3], [1, 1]),
           (good[0][0], good[0][1], good[0][2])]  # duplicate id
    put_samples(store, 0, good + bad)
    summary = run_extraction(make_spec(out, tiny, dtype="float32"), store, backend=backend)
    assert summary.samples == 4
    assert summary.skipped == {"duplicate": 1, "empty": 1, "mask_length_mismatch": 1,
                               "token_out_of_vocab": 1, "too_long": 1}
    idx = json.loads(store.get(index_key(0)))
    reasons = {s["sampleId"]: s["reason"] for s in idx["skipped"]}
    assert reasons["toolong"] == "too_long" and reasons["oov"] == "token_out_of_vocab"
    assert f"token id {VOCAB + 7} outside" in next(s["detail"] for s in idx["skipped"] if s["sampleId"] == "oov")
    with pytest.raises(SampleNotFound, match="'oov' has no hidden states"):
        HiddenReader(store).read("oov")
    manifest = summary.to_manifest()
    assert manifest["skipped"]["too_long"] == 1 and manifest["samples"] == 4
    assert manifest["layerConvention"].startswith("eagle3-shallow")


@pytest.mark.integration
def test_a_model_whose_vocabulary_is_too_small_is_an_error(tmp_path, tiny, backend):
    out = f"file://{tmp_path}/out"
    store = open_store(out)
    put_samples(store, 0, random_rows(0, 3, VOCAB, seed=1))
    put_samples(store, 1, random_rows(1, 5, 10 * VOCAB, seed=2, min_len=30))  # a bigger tokenizer's ids
    spec = make_spec(out, tiny, dtype="float32")
    with pytest.raises(VocabMismatch, match=f"vocabulary of {VOCAB}.*does not match target.tokenizer"):
        run_extraction(spec, store, backend=backend)
    assert store.exists(index_key(0)) and not store.exists(index_key(1))  # shard 0 kept


@pytest.mark.integration
def test_explicit_out_of_range_layer_fails_before_writing(tmp_path, tiny, backend):
    with pytest.raises(LayerError, match="layer id 7 is out of range for a model with 4"):
        _run(tmp_path, tiny, backend=backend, layers=[1, 2, 7])
    assert open_store(f"file://{tmp_path}/out").list(layout.HIDDEN) == []


@pytest.mark.integration
def test_missing_or_corrupt_shards_and_unknown_ids_are_named(tmp_path, tiny, backend):
    out, store, _rows, summary = _run(tmp_path, tiny, backend=backend, rows_per_shard=(8,), dtype="float32",
                                     shardBytes=1 << 16)
    reader = HiddenReader(store)
    with pytest.raises(SampleNotFound, match="'nope' has no hidden states"):
        reader.read("nope")
    files = summary.shards[0].files
    idx = json.loads(store.get(index_key(0)))
    victim = next(sid for sid, row in idx["samples"].items() if row[0] == len(files) - 1)
    blob = store.get(files[-1])
    store.put(files[-1], blob[: len(blob) // 2])
    with pytest.raises(ShardError, match=f"{files[-1]}: truncated: sample {victim}"):
        reader.read(victim)
    store.delete(files[-1])
    with pytest.raises(ShardError, match=f"{files[-1]}: hidden shard is missing"):
        reader.read(victim)
    plan = make_plan(make_spec(out, tiny, dtype="float32"), backend)
    with pytest.raises(ShardError, match=r"samples/shard-00009\.parquet: samples shard is missing"):
        extract_shard(store, 9, backend, plan, 1 << 30, 1024)
    store.put(layout.samples_key(7), b"not parquet")
    with pytest.raises(ShardError, match=r"samples/shard-00007\.parquet: not a samples parquet"):
        extract_shard(store, 7, backend, plan, 1 << 30, 1024)


@pytest.mark.integration
def test_index_count_split_covers_every_shard_once(tmp_path, tiny, backend):
    out = f"file://{tmp_path}/out"
    store = open_store(out)
    rows = {shard: random_rows(shard, 2, VOCAB, seed=shard) for shard in range(5)}
    for shard, r in rows.items():
        put_samples(store, shard, r)
    spec = make_spec(out, tiny, dtype="float32")
    done = [[r.shard for r in run_extraction(spec, store, 0, 3, backend=backend).shards]]
    reader = HiddenReader(store)  # made while pods 1 and 2 have not finished
    assert reader.read(rows[3][0][0])["input_ids"].tolist() == rows[3][0][1]
    with pytest.raises(SampleNotFound):
        reader.read(rows[1][0][0])
    done += [[r.shard for r in run_extraction(spec, store, i, 3, backend=backend).shards] for i in (1, 2)]
    assert done == [[0, 3], [1, 4], [2]]
    assert reader.read(rows[1][0][0])["input_ids"].tolist() == rows[1][0][1]  # seen after a re-list
    merged = summarize(store)
    assert merged is not None and [s.shard for s in merged.shards] == [0, 1, 2, 3, 4]
    assert merged.samples == 10
    assert sorted(store.list(layout.HIDDEN))[-3:] == [
        "hidden/summary-00000-of-00003.json", "hidden/summary-00001-of-00003.json",
        "hidden/summary-00002-of-00003.json"]


@pytest.mark.integration
def test_rerun_with_other_settings_is_refused(tmp_path, tiny, backend):
    out, store, _rows, _summary = _run(tmp_path, tiny, backend=backend, dtype="float32")
    with pytest.raises(ExtractionError, match="dtype='float32', this run has 'bfloat16'"):
        run_extraction(make_spec(out, tiny, dtype="bfloat16"), store)


CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from extract_helpers import make_spec
    from eyrie.jobs.extract.run import run_extraction
    from eyrie.jobs.store import open_store

    def on_part(key):
        print(key, flush=True)
        time.sleep(0.4)

    spec = make_spec({out!r}, {model!r}, dtype="float32", shardBytes=1 << 16, maxTokensPerBatch=1)
    run_extraction(spec, open_store({out!r}), on_part=on_part)
    print("finished", flush=True)
""")


@pytest.mark.integration
def test_resume_after_the_extractor_is_killed_mid_shard(tmp_path, tiny, ref_model):
    """What resume promises: the parts finished before the kill are kept byte for byte (not written
    again), the rest is computed anew, and every sample is the model's forward within float32 rounding.
    Not bit for bit across the two: the killed child and this process may run torch on other thread
    counts, and a float32 forward summed in another order differs in its last bits."""
    out = f"file://{tmp_path}/out"
    store = open_store(out)
    rows = random_rows(0, 40, VOCAB, seed=11)
    put_samples(store, 0, rows)
    script = CHILD.format(tests=str(Path(__file__).parents[1]), out=out, model=str(tiny))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        seen = [proc.stdout.readline().strip() for _ in range(2)]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert seen == [part_key(0, 0), part_key(0, 1)]
    assert not store.exists(index_key(0))
    kept = {k: (os.stat(tmp_path / "out" / k).st_ino, (tmp_path / "out" / k).read_bytes())
            for k in store.list(layout.HIDDEN)}
    assert part_key(0, 0) in kept

    summary = run_extraction(make_spec(out, tiny, dtype="float32", shardBytes=1 << 16, maxTokensPerBatch=1), store)
    files = summary.shards[0].files
    assert len(files) > len(kept)
    assert files[:len(kept)] == sorted(kept)
    for k, (ino, data) in kept.items():  # parts finished before the kill were kept, not rewritten
        assert os.stat(tmp_path / "out" / k).st_ino == ino and (tmp_path / "out" / k).read_bytes() == data
    assert summary.samples == 40
    reader = HiddenReader(store)
    for sid, ids, mask in rows:
        s = reader.read(sid)
        aux, last = reference(ref_model, ids, LAYERS)
        assert_float32_rounding(s["aux_hidden"], aux, sid)
        assert_float32_rounding(s["last_hidden"], last, sid)
        assert s["input_ids"].tolist() == ids and s["loss_mask"].tolist() == mask
    again = run_extraction(make_spec(out, tiny, dtype="float32", shardBytes=1 << 16, maxTokensPerBatch=1), store)
    assert [r.resumed for r in again.shards] == [True] and again.samples == 40


@pytest.mark.integration
def test_read_sample_from_s3(s3_bucket, tiny, ref_model, backend):
    out = f"{s3_bucket}/runs/one"
    store = open_store(out)
    rows = random_rows(0, 5, VOCAB, seed=5)
    put_samples(store, 2, rows)
    spec = make_spec(out, tiny, dtype="float32", maxTokensPerBatch=1)
    summary = run_extraction(spec, store, backend=backend)
    assert summary.shards[0].files == [part_key(2, 0)]
    for sid, ids, _mask in rows:
        s = read_sample(out, sid)
        assert torch.equal(s["last_hidden"], reference(ref_model, ids, LAYERS)[1])
    with pytest.raises(SampleNotFound):
        read_sample(out, "missing-id")


def specforge_dataset(folder: Path, max_len: int = 2048):
    """SpecForge's own offline dataset over the export (specforge==0.2.0, installed --no-deps):
    `build_offline_eagle3_dataset` lists every `.ckpt` under the folder and `OfflineEagle3Dataset`
    loads each as its trainer does; skipped (and named) only where specforge cannot be imported."""
    need_specforge()
    from specforge.data.preprocessing import OfflineEagle3Dataset, build_offline_eagle3_dataset

    ds = build_offline_eagle3_dataset(str(folder), max_len=max_len)
    assert isinstance(ds, OfflineEagle3Dataset)
    return ds


def specforge_load(folder: Path) -> list[dict[str, torch.Tensor]]:
    """The raw files of the export as SpecForge's dataset opens them (`OfflineEagle3Dataset._open_file`)."""
    ds = specforge_dataset(folder)
    return [ds._open_file(i) for i in range(len(ds))]


@pytest.mark.integration
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float8"])
def test_specforge_export_loads_in_specforges_own_dataset_for_every_stored_dtype(tmp_path, tiny, backend, dtype):
    import torch.nn.functional as F

    from eyrie.jobs.extract.specforge import METADATA, export_specforge

    out, store, _rows, _summary = _run(tmp_path, tiny, backend=backend, dtype=dtype, shardBytes=1 << 16)
    r = export_specforge(store, tmp_path / "sf")
    assert (r.samples, r.stored_dtype, r.over_max_length) == (11, dtype, 0)
    ids = [json.loads(line) for line in (tmp_path / "sf" / "sample_ids.jsonl").read_text().splitlines()]
    assert [i["index"] for i in ids] == list(range(11))
    by_file = {str((tmp_path / "sf" / i["file"]).resolve()): i["sampleId"] for i in ids}
    ds = specforge_dataset(tmp_path / "sf")
    assert len(ds) == 11 and set(map(str, map(Path, ds.datapaths))) == set(by_file)
    for i, path in enumerate(ds.datapaths):  # item by item, as SpecForge's trainer receives them
        s = read_sample(out, by_file[str(Path(path).resolve())])
        t = len(s["input_ids"])
        raw = ds._open_file(i)
        assert set(raw) == {"input_ids", "loss_mask", "hidden_state", "aux_hidden_state"}
        assert raw["input_ids"].dtype == torch.int64 and raw["loss_mask"].dtype == torch.int64
        item = ds[i]
        assert item["input_ids"].tolist() == [s["input_ids"].tolist()]
        want_mask = s["loss_mask"].tolist()
        want_mask[-1] = 0  # SpecForge never trains on the last position (no next token)
        assert item["loss_mask"].tolist() == [want_mask] and raw["loss_mask"].tolist() == s["loss_mask"].tolist()
        # hidden_state is what the draft takes (the 3 aux layers), target what it is trained towards
        assert item["hidden_state"].dtype == torch.bfloat16 and item["target"].dtype == torch.bfloat16
        assert item["hidden_state"].shape == (1, t, 3 * HIDDEN) and item["target"].shape == (1, t, HIDDEN)
        assert torch.equal(item["hidden_state"][0], s["aux_hidden"].to(torch.bfloat16))
        assert torch.equal(item["target"][0], s["last_hidden"].to(torch.bfloat16))
        assert item["attention_mask"].shape == (1, t)
        # what SpecForge's bfloat16 draft does first: project 3H -> H; a float32 input raised
        # "expected m1 and m2 to have the same dtype" before
        proj = torch.zeros(HIDDEN, 3 * HIDDEN, dtype=torch.bfloat16)
        assert F.linear(item["hidden_state"], proj).shape == (1, t, HIDDEN)
        # each file holds its own tensors only (no view of a larger storage)
        assert Path(path).stat().st_size < 2 * (t * 4 * HIDDEN * 2 + t * 16) + 4096
    meta = json.loads((tmp_path / "sf" / METADATA).read_text())
    assert meta["auxLayers"] == list(LAYERS) and meta["specforgeAuxLayerIds"] == [i - 1 for i in LAYERS]
    assert meta["storedDtype"] == dtype and meta["dtype"] == "bfloat16" and meta["samples"] == 11


@pytest.mark.integration
def test_the_offline_export_is_what_specforge_train_takes_draft_run_config_and_vocab_mapping(tmp_path, tiny,
                                                                                             backend, monkeypatch):
    """Beside the features: a draft config of the target's shape, read through SpecForge's own
    resolver (and equal to the one it would derive from the target), a run config its schema accepts,
    and the vocab mapping its code builds from what the export holds."""
    need_specforge()
    import yaml
    from datasets import Dataset
    from specforge.algorithms.eagle3.providers import algorithm_providers
    from specforge.config.schema import Config
    from specforge.data.preprocessing import generate_vocab_mapping_file, process_token_dict_to_mappings
    from specforge.training.model_loading import resolve_draft_config
    from specforge.training.vocab_mapping import count_effective_feature_tokens

    from eyrie.jobs.extract.specforge import DRAFT_CONFIG, RUN_CONFIG, export_specforge

    out, store, _rows, _summary = _run(tmp_path, tiny, backend=backend)
    sf = tmp_path / "sf"
    r = export_specforge(store, sf)
    assert r.draft_config == str((sf / DRAFT_CONFIG).resolve()) and r.draft_error is None
    cfg = Config.model_validate(yaml.safe_load((sf / RUN_CONFIG).read_text()))
    # portable: every path relative to the export folder, where `specforge train` is run from
    assert (cfg.mode, cfg.data.hidden_states_path, cfg.model.draft_model_config) == ("offline", ".", DRAFT_CONFIG)
    assert cfg.model.target_model_path == os.path.relpath(tiny.resolve(), sf.resolve()) == r.target_model_path
    assert str(tmp_path.parent) not in (sf / RUN_CONFIG).read_text()  # no absolute path of this machine
    monkeypatch.chdir(sf)
    assert Path(cfg.model.target_model_path).resolve() == tiny.resolve()
    provider = algorithm_providers().model.draft_config
    ours = resolve_draft_config(cfg, provider=provider).to_dict()
    theirs = resolve_draft_config(Config.model_validate({**cfg.model_dump(), "model": {
        "target_model_path": str(tiny)}}), provider=provider).to_dict()
    drop = {"draft_vocab_size", "eagle_config", "_name_or_path", "transformers_version"}
    assert {k: v for k, v in ours.items() if k not in drop} == {k: v for k, v in theirs.items() if k not in drop}
    assert ours["architectures"] == ["LlamaForCausalLMEagle3"] and ours["num_hidden_layers"] == 1
    assert ours["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in LAYERS]}
    assert ours["draft_vocab_size"] == VOCAB  # a draft vocabulary no larger than the target's
    # the tokens the loss covers, as SpecForge 0.2.0's offline trainer counts them from the features...
    ids = [json.loads(x) for x in (sf / "sample_ids.jsonl").read_text().splitlines()]
    samples = [read_sample(out, i["sampleId"]) for i in ids]
    counts = count_effective_feature_tokens(str(sf), max_length=cfg.data.max_length, target_vocab_size=VOCAB)
    want: dict[int, int] = {}
    for s in samples:
        for t, m in zip(s["input_ids"].tolist(), s["loss_mask"].tolist(), strict=True):
            if m:
                want[t] = want.get(t, 0) + 1
    assert dict(counts) == want
    # ...and SpecForge's generate_vocab_mapping_file over the export's ids and masks: a 16-token draft
    # vocabulary holds the 16 most frequent loss tokens
    data = Dataset.from_dict({"input_ids": [s["input_ids"].tolist() for s in samples],
                              "loss_mask": [s["loss_mask"].tolist() for s in samples]}).with_format("torch")
    path = generate_vocab_mapping_file(data, VOCAB, 16, cache_dir=str(tmp_path / "vm"), cache_key="vm")
    mapping = torch.load(path)
    d2t, t2d = mapping["d2t"], mapping["t2d"]
    assert t2d.shape == (VOCAB,) and int(t2d.sum()) == 16 and d2t.shape == (16,)
    chosen = sorted((torch.arange(16) + d2t).tolist())
    assert chosen == sorted(torch.nonzero(t2d).flatten().tolist())
    top = sorted(want.values(), reverse=True)[15]
    assert all(want.get(t, 0) >= top for t in chosen) and all(n <= top for t, n in want.items() if t not in chosen)
    d2t2, t2d2 = process_token_dict_to_mappings(counts, 16, VOCAB)  # what the trainer installs from the counts
    assert torch.equal(t2d2, t2d) and torch.equal(d2t2, d2t)


@pytest.mark.integration
def test_specforge_export_refuses_other_than_three_aux_layers_before_writing(tmp_path, tiny, backend):
    from eyrie.jobs.extract.specforge import ExportError, export_specforge

    _out, store, _rows, _summary = _run(tmp_path, tiny, backend=backend, layers=[1, 3])
    with pytest.raises(ExportError, match=r"captured 2 aux layers \[1, 3\].*exactly 3"):
        export_specforge(store, tmp_path / "sf")
    assert not (tmp_path / "sf").exists() or not any((tmp_path / "sf").iterdir())


@pytest.mark.integration
def test_specforge_export_into_a_non_empty_folder_needs_overwrite(tmp_path, tiny, backend):
    from eyrie.jobs.extract.specforge import ExportError, ExportOptions, export_specforge

    _out, store, _rows, _summary = _run(tmp_path, tiny, backend=backend, rows_per_shard=(6, 5))
    sf = tmp_path / "sf"
    assert export_specforge(store, sf).samples == 11
    with pytest.raises(ExportError, match=r"not empty.*--overwrite"):
        export_specforge(store, sf)
    _out2, small, _rows2, _s2 = _run(tmp_path / "second", tiny, backend=backend, rows_per_shard=(2, 1))
    assert export_specforge(small, sf, ExportOptions(overwrite=True)).samples == 3
    assert len(specforge_load(sf)) == 3  # no stale data_*.ckpt of the first export left for SpecForge
    (sf / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match=r"notes\.txt"):
        export_specforge(small, sf, ExportOptions(overwrite=True))
    assert (sf / "notes.txt").exists() and len(specforge_load(sf)) == 3  # nothing removed


@pytest.mark.integration
def test_specforge_export_counts_and_truncates_long_samples(tmp_path, tiny, backend):
    from eyrie.jobs.extract.specforge import METADATA, ExportError, ExportOptions, export_specforge

    out, store, rows, _summary = _run(tmp_path, tiny, backend=backend)
    lengths = {sid: len(ids) for shard in rows.values() for sid, ids, _m in shard}
    n = 20
    longer = sum(v > n for v in lengths.values())
    assert 0 < longer < len(lengths)
    r = export_specforge(store, tmp_path / "count", ExportOptions(max_length=n))
    assert r.over_max_length == longer
    assert max(d["input_ids"].shape[0] for d in specforge_load(tmp_path / "count")) == max(lengths.values())
    r = export_specforge(store, tmp_path / "cut", ExportOptions(max_length=n, truncate=True))
    assert r.over_max_length == longer
    ids = [json.loads(line) for line in (tmp_path / "cut" / "sample_ids.jsonl").read_text().splitlines()]
    for entry in ids:
        d = torch.load(next((tmp_path / "cut").rglob(f"data_{entry['index']}.ckpt")), weights_only=False, mmap=True)
        s = read_sample(out, entry["sampleId"])
        t = min(n, len(s["input_ids"]))
        assert d["input_ids"].tolist() == s["input_ids"][:t].tolist()
        assert d["loss_mask"].tolist() == s["loss_mask"][:t].tolist()
        assert d["aux_hidden_state"].shape == (1, t, 3 * HIDDEN) and d["hidden_state"].shape == (1, t, HIDDEN)
        assert torch.equal(d["aux_hidden_state"][0], s["aux_hidden"][:t].to(torch.bfloat16))
    meta = json.loads((tmp_path / "cut" / METADATA).read_text())
    assert (meta["maxLength"], meta["overMaxLength"], meta["truncated"]) == (n, longer, longer)
    with pytest.raises(ExportError, match="--truncate needs --max-length"):
        export_specforge(store, tmp_path / "x", ExportOptions(truncate=True))


def test_specforge_draft_config_layers_are_converted_to_hf_indices():
    from eyrie.jobs.contract.layers import specforge_layer_ids

    # SpecForge's shipped GPT-OSS-20B draft config (24 layers) pins [1, 11, 21]: HF [2, 12, 22];
    # `auto` would capture 21 for the high layer, a layer SpecForge does not serve
    gpt_oss = {"architectures": ["LlamaForCausalLMEagle3"],
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 11, 21]}}
    choice = resolve_layers("specforge:s3://cfg/gpt-oss-20B-eagle3.json", 24, gpt_oss)
    assert choice.ids == (2, 12, 22) and resolve_layers("auto", 24).ids == (2, 12, 21)
    assert "[1, 11, 21]" in choice.convention and "gpt-oss-20B-eagle3.json" in choice.convention
    assert specforge_layer_ids({"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}, "x") == [1, 2, 3]  # top level too
    for bad, match in (({"eagle_config": {}}, "no eagle_config"),
                       ({"eagle_aux_hidden_state_layer_ids": [1, 2]}, "3 non-neg"),
                       ({"eagle_aux_hidden_state_layer_ids": [1, -1, 3]}, "3 non-neg"),
                       ([1, 2, 3], "not a JSON object")):
        with pytest.raises(LayerError, match=match):
            specforge_layer_ids(bad, "cfg.json")
    with pytest.raises(LayerError, match="out of range"):
        resolve_layers("specforge:c.json", 12, {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 5, 11]}})


@pytest.mark.integration
def test_extraction_captures_the_layers_a_specforge_draft_config_serves(tmp_path):
    from eyrie.jobs.contract.layers import read_specforge_config
    from eyrie.jobs.spec import SpecError, load_spec

    deeper = build_tiny_model(tmp_path / "tiny8", VOCAB, HIDDEN, layers=8, context=CONTEXT)
    ref_model = AutoModelForCausalLM.from_pretrained(deeper, dtype=torch.float32).eval()
    backend = HFBackend(str(deeper), device="cpu", storage_dtype="float32")
    cfg = tmp_path / "configs" / "draft.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 3, 6]}}))
    spec_file = tmp_path / "spec.yaml"
    doc = make_spec(f"file://{tmp_path}/out", deeper, dtype="float32", maxTokensPerBatch=1,
                    layers="specforge:configs/draft.json").dump()
    spec_file.write_text(json.dumps(doc))
    spec = load_spec(spec_file).spec  # a relative draft config path is next to the spec file
    assert spec.extraction.layers == f"specforge:{cfg}"
    store = open_store(spec.output.uri)
    rows = random_rows(0, 3, VOCAB, seed=4)
    put_samples(store, 0, rows)
    summary = run_extraction(spec, store, backend=backend)
    assert summary.aux_layers == [1, 4, 7] and summary.layer_convention.startswith("specforge:")
    assert resolve_layers("auto", 8).ids == (2, 4, 5)  # what would have been captured without the config
    for sid, ids, _m in rows:
        assert torch.equal(read_sample(spec.output.uri, sid)["aux_hidden"], reference(ref_model, ids, (1, 4, 7))[0])
    with pytest.raises(LayerError, match="cannot read the SpecForge draft config"):
        read_specforge_config(f"specforge:{tmp_path}/missing.json")
    for bad in ("specforge:", "every-layer"):
        doc["extraction"]["layers"] = bad
        spec_file.write_text(json.dumps(doc))
        with pytest.raises(SpecError, match=r"extraction\.layers"):
            load_spec(spec_file)


@pytest.mark.integration
def test_cli_extract_and_export(tmp_path, tiny, capsys):
    from eyrie.jobs.cli.export import export_main
    from eyrie.jobs.cli.extract import extract_main
    from eyrie.jobs.extract.specforge import ExportError

    out = f"file://{tmp_path}/out"
    put_samples(open_store(out), 0, random_rows(0, 3, VOCAB, seed=9))
    spec_file = tmp_path / "spec.yaml"
    doc = make_spec(out, tiny, dtype="bfloat16").dump()
    spec_file.write_text(json.dumps(doc))
    assert extract_main([str(spec_file), "--index", "0", "--count", "1"]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["samples"] == 3 and manifest["dtype"] == "bfloat16" and manifest["auxLayers"] == [1, 2, 3]
    assert export_main(["specforge", out, str(tmp_path / "sf"), "--max-length", "4"]) == 0
    said = capsys.readouterr().out
    assert "wrote 3 samples" in said and "bfloat16 from stored bfloat16" in said and "layer_ids [0, 1, 2]" in said
    assert re.search(r"\d of 3 samples longer than 4 tokens \(SpecForge will cut them", said)
    with pytest.raises(ExportError, match="--overwrite"):
        export_main(["specforge", out, str(tmp_path / "sf")])
    assert export_main(["specforge", out, str(tmp_path / "sf"), "--overwrite"]) == 0
    with pytest.raises(ShardError, match="no hidden states to export"):
        export_main(["specforge", f"file://{tmp_path}/empty", str(tmp_path / "sf2")])
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: {}\n")
    assert extract_main([str(bad)]) == 2


@pytest.mark.integration
async def test_an_unusable_specforge_draft_config_fails_the_preflight_before_anything_is_paid(
        tmp_path, tiny, start_sim):
    from eyrie.jobs.generate.preflight import PreflightError, preflight

    sim = await start_sim()
    store = open_store(f"file://{tmp_path}/out")
    two = tmp_path / "two.json"
    two.write_text(json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]}}))
    prompts = tmp_path / "prompts.jsonl"  # a readable source: preflight checks the sources first
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")

    def with_source(spec):
        spec.sources[0].uri = f"file://{prompts}"
        return spec

    for layers, match in ((f"specforge:{tmp_path}/missing.json", "cannot read the SpecForge draft config"),
                          (f"specforge:{two}", "must be 3 non-negative integers")):
        spec = with_source(make_spec(store.uri, tiny, layers=layers))
        with pytest.raises(PreflightError, match=match):
            await preflight(spec, sim.base_url, store, "key")
    spec = with_source(make_spec(store.uri, tiny, layers="auto"))
    spec.target.tokenizer, spec.target.chat_format = "bundled:deepseek-v4", "deepseek-v4"  # tiny has none
    await preflight(spec, sim.base_url, store, "key")  # the same spec with auto passes


@pytest.mark.integration
def test_the_last_extraction_pod_writes_the_manifest_and_rewrites_the_report(tmp_path, tiny, capsys):
    """In a cluster the generation job's report.html predates extraction: each `eyrie extract` pod,
    once its summary is written, checks for the others', and the one that finds them all moves
    progress to stage done, merges the manifest and rewrites the page with the extraction and
    fidelity sections (the operator links that page from status.outputReport)."""
    from eyrie.jobs.cli.extract import extract_main
    from eyrie.jobs.contract.progress import Outcome, Progress, Stage, write_progress
    from eyrie.jobs.report import publish
    from eyrie.jobs.status import SampleCounts

    out = f"file://{tmp_path}/out"
    store = open_store(out)
    for shard in range(2):
        put_samples(store, shard, random_rows(shard, 3, VOCAB, seed=shard))
    write_progress(store, Progress(attempt="1", stage=Stage.SAMPLES, outcome=Outcome.DONE,
                                   samples=SampleCounts(total=6, done=6)))
    publish(store)  # as the generation job (`eyrie run --until samples`) ends
    stale = store.get(layout.REPORT).decode()
    assert "engine / dtype" not in stale and "the answers scored by" not in stale
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(json.dumps(make_spec(out, tiny, pods=2).dump()))
    assert extract_main([str(spec_file), "--index", "0", "--count", "2"]) == 0
    assert not store.exists(layout.MANIFEST) and store.get(layout.REPORT).decode() == stale  # pod 1 not done
    assert extract_main([str(spec_file), "--index", "1", "--count", "2"]) == 0
    assert "wrote " + store.url(layout.MANIFEST) in capsys.readouterr().err
    manifest = json.loads(store.get(layout.MANIFEST))
    assert manifest["extraction"]["pods"] == 2 and manifest["extraction"]["samples"] == 6
    assert manifest["fidelity"]["overall"]["samples"] == 6
    assert json.loads(store.get(layout.PROGRESS))["stage"] == "done"
    page = store.get(layout.REPORT).decode()
    assert "engine / dtype" in page and "fidelity: the answers scored by " in page
    assert "stage done" in page


@pytest.mark.integration
def test_the_offline_export_trains_into_a_folder_outside_itself(tmp_path, tiny, backend, capsys):
    """The run config and the printed training command name an `output_dir` outside the export
    folder: SpecForge's checkpoints never land in it, so `export --overwrite` can replace it later."""
    import yaml

    from eyrie.jobs.cli.export import export_main
    from eyrie.jobs.extract.specforge import RUN_CONFIG

    out, _store, _rows, _summary = _run(tmp_path, tiny, backend=backend)
    sf = tmp_path / "sf"
    assert export_main(["specforge", out, str(sf)]) == 0
    printed = capsys.readouterr().out
    cfg = yaml.safe_load((sf / RUN_CONFIG).read_text())
    train_dir = (sf / cfg["output_dir"]).resolve()  # relative to the folder, where specforge train runs
    assert sf.resolve() not in train_dir.parents and train_dir != sf.resolve()
    assert f"output_dir={cfg['output_dir']}" in printed or cfg["output_dir"] in printed, printed
    train_dir.mkdir()
    (train_dir / "checkpoint").write_text("x")  # what a training run leaves
    assert export_main(["specforge", out, str(sf), "--overwrite"]) == 0  # the export folder is still only ours
