"""Token-budget batches, packed attention and the overlapped host side of extraction (issue 42).

What must hold whatever the batching: every sample's states are its own (equal to a forward of that
sample alone, within float32 rounding), in the order the samples came, none dropped; and the host
side never holds more than its stated bound of batches.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).parents[1]))
from extract_helpers import assert_float32_rounding, make_spec, put_samples, random_rows, reference

from eyrie.jobs.extract import read_sample, varlen
from eyrie.jobs.extract.batching import (
    CPU_BUDGET,
    MAX_BUDGET,
    MIN_BUDGET,
    Shape,
    activation_bytes_per_token,
    default_budget,
    plan_batches,
)
from eyrie.jobs.extract.codec import Layout
from eyrie.jobs.extract.fidelity import Forward
from eyrie.jobs.extract.hf_backend import HFBackend, build_tiny_model
from eyrie.jobs.extract.run import run_extraction
from eyrie.jobs.extract.shards import index_key, load_index, part_key, read_header
from eyrie.jobs.extract.staging import StatePipeline, Stats
from eyrie.jobs.store import FileStore, open_store

VOCAB, HIDDEN, LAYERS = 512, 64, (1, 2, 3)


# --------------------------------------------------------------------------------- the plan (pure)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 300), max_size=60), st.integers(1, 1000), st.booleans())
def test_every_sample_is_planned_once_within_the_budget(lengths, budget, packed):
    batches = plan_batches(lengths, budget, packed)
    flat = [i for b in batches for i in b.positions]
    assert sorted(flat) == list(range(len(lengths)))  # none dropped, none twice
    for b in batches:
        assert b.lengths == tuple(lengths[i] for i in b.positions)
        assert len(b.positions) == 1 or b.computed <= budget  # a longer sample runs alone
        if len(set(b.lengths)) == 1:
            assert b.shape is Shape.UNIFORM
        else:
            assert b.shape is (Shape.PACKED if packed else Shape.PADDED)
    # bucketed: longest first, so each batch's samples are no longer than the previous batch's
    widths = [(max(b.lengths), min(b.lengths)) for b in batches]
    assert all(lo >= hi for (_, lo), (hi, _) in itertools.pairwise(widths))


def test_packed_batches_carry_no_padding_and_fewer_forwards():
    lengths = [600, 3500, 1200, 2900, 800, 2048, 3100, 700]
    padded = plan_batches(lengths, 16384, packed=False)
    packed = plan_batches(lengths, 16384, packed=True)
    assert sum(b.computed for b in packed) == sum(lengths)
    assert sum(b.computed for b in padded) > sum(lengths)
    assert len(packed) == 1 < len(padded)
    assert [b.positions for b in plan_batches([7, 7, 7, 7], 14, packed=True)] == [(0, 1), (2, 3)]
    assert {b.shape for b in plan_batches([7, 7, 7, 7], 14, packed=True)} == {Shape.UNIFORM}


def test_default_budget_follows_the_device_memory():
    assert default_budget("cpu", None, 1000) == CPU_BUDGET
    per = activation_bytes_per_token(4096, 14336, 3, 2, 2)  # an 8B model in bf16
    assert per == 2 * (4 * 4096 + 3 * 14336 + 4 * 4096 * 3)
    assert default_budget("cuda", 120 << 30, per) == MAX_BUDGET  # an H200 after the weights
    assert default_budget("cuda", 4 << 30, per) == (4 << 30) // 4 // per // 1024 * 1024
    assert default_budget("cuda", 1 << 20, per) == MIN_BUDGET


# ------------------------------------------------------------------------------ states (CPU model)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", VOCAB, HIDDEN, layers=4, context=4096)


@pytest.fixture(scope="module")
def ref_model(tiny):
    return AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()


def _seqs(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.integration
@pytest.mark.parametrize("attention", ["sdpa", "flex", "padded", "packable-but-padded"])
def test_each_shape_gives_each_sample_its_own_states(tiny, ref_model, attention):
    asked = "sdpa" if attention == "packable-but-padded" else attention
    be = HFBackend(str(tiny), device="cpu", storage_dtype="float32", attention=asked)
    if attention == "packable-but-padded":  # loaded to pack, told to pad: the padding mask must still be built
        assert be.model.config._attn_implementation == varlen.IMPLEMENTATION
        be.kernel = None
        attention = "padded"
    assert be.packs == (attention != "padded")
    seqs = _seqs([5, 37, 100, 1, 64, 64])
    starts = [1, 2, None, None, 10, None]
    alone = [be.forward([s], LAYERS, [st])[0] for s, st in zip(seqs, starts, strict=True)]
    for batch in ([0, 1, 2, 3, 4, 5], [4, 5], [2, 0]):
        got = be.forward([seqs[i] for i in batch], LAYERS, [starts[i] for i in batch])
        assert be.shape_of([len(seqs[i]) for i in batch]) is (
            Shape.UNIFORM if batch == [4, 5] else Shape.PADDED if attention == "padded" else Shape.PACKED)
        for i, f in zip(batch, got, strict=True):
            aux, last = reference(ref_model, seqs[i], LAYERS)
            assert_float32_rounding(f.aux, aux)
            assert_float32_rounding(f.last, last)
            if starts[i] is None:
                assert f.scores is None
            else:
                np.testing.assert_allclose(f.scores.logprob, alone[i].scores.logprob, atol=1e-5)
                assert (f.scores.top1 == alone[i].scores.top1).all()


@pytest.mark.integration
def test_a_model_that_cannot_be_packed_runs_padded(tmp_path):
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=16)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        MistralForCausalLM(config).save_pretrained(tmp_path / "m")
    be = HFBackend(str(tmp_path / "m"), device="cpu", storage_dtype="float32")
    assert not be.packs and be.packing_refused == "sliding window 16"
    seqs = _seqs([40, 9])
    got = be.forward(seqs, LAYERS)
    alone = [be.forward([s], LAYERS)[0] for s in seqs]
    for f, a in zip(got, alone, strict=True):
        assert_float32_rounding(f.aux, a.aux)


def test_a_flash_request_without_flash_attn_is_refused():
    with pytest.raises(varlen.VarlenError, match="needs CUDA and the flash_attn package"):
        varlen.choose_kernel("flash", "cpu")
    assert varlen.choose_kernel("auto", "cpu") is varlen.Kernel.SDPA
    assert varlen.choose_kernel("padded", "cuda") is None


def _varied_run(tmp_path: Path, model: Path, **extraction):
    out = f"file://{tmp_path}/out"
    store = open_store(out)
    rows = random_rows(0, 23, VOCAB, seed=7, min_len=2, max_len=90)
    rows[5] = (rows[5][0], rows[3][1], rows[3][2])  # equal lengths meet in a uniform batch
    rows[6] = (rows[6][0], rows[3][1][:], rows[3][2][:])
    put_samples(store, 0, rows)
    summary = run_extraction(make_spec(out, model, dtype="float32", **extraction), store)
    return out, store, rows, summary


@pytest.mark.integration
@pytest.mark.parametrize("attention", ["sdpa", "padded"])
def test_bucketing_keeps_every_sample_in_its_place(tmp_path, tiny, ref_model, attention):
    # budgets that cut the shard into many mixed batches and three parts; each sample read back must
    # be that sample's own forward, and each part must list its samples in the shard's order
    out, store, rows, summary = _varied_run(tmp_path, tiny, maxTokensPerBatch=150, attention=attention,
                                            shardBytes=1 << 16)
    assert summary.samples == len(rows)
    index = load_index(store, index_key(0))
    assert list(index["samples"]) == [sid for sid, _ids, _m in rows]
    order = []
    for n in range(len(index["files"])):
        header, _ = read_header(store, part_key(0, n))
        order += json.loads(header["__metadata__"]["sample_ids"])
    assert order == [sid for sid, _ids, _m in rows]
    assert len(index["files"]) >= 2
    for sid, ids, mask in rows:
        s = read_sample(out, sid)
        assert s["input_ids"].tolist() == ids and s["loss_mask"].tolist() == mask
        aux, last = reference(ref_model, ids, LAYERS)
        assert_float32_rounding(s["aux_hidden"], aux)
        assert_float32_rounding(s["last_hidden"], last)


# ------------------------------------------------------------------------- the host side's bound


class SlowStore(FileStore):
    """A local folder whose writes take a while, so the forward runs ahead as far as the bound lets it."""

    def __init__(self, root: Path, delay: float):
        super().__init__(str(root))
        self.delay = delay
        self.puts: list[str] = []
        self.lock = threading.Lock()

    def put(self, key: str, data: bytes) -> None:
        time.sleep(self.delay)
        with self.lock:
            self.puts.append(key)
        super().put(key, data)


def _forwards(n: int, tokens: int, layout: Layout) -> list[Forward]:
    return [Forward(torch.randn(tokens, layout.aux_layers * layout.hidden), torch.randn(tokens, layout.hidden))
            for _ in range(n)]


@pytest.mark.integration
def test_the_pipeline_holds_at_most_depth_batches_and_writes_parts_in_order(tmp_path):
    layout = Layout(3, 16, "bfloat16")
    store = SlowStore(tmp_path, delay=0.05)
    stats = Stats()
    pipe = StatePipeline(store, layout, depth=2, stats=stats)
    written = []
    sent: dict[str, list[torch.Tensor]] = {}
    try:
        for part in range(4):
            pipe.start_part(f"hidden/p{part}.safetensors", part, 6)
            for batch in ((0, 3), (5, 1), (2, 4)):  # a batch's positions in any order
                fw = _forwards(2, 8, layout)
                rows = [(f"p{part}-{p}", np.arange(8), np.ones(8, dtype=np.int8)) for p in batch]
                for (sid, _i, _m), f in zip(rows, fw, strict=True):
                    sent[sid] = [f.aux, f.last]
                pipe.add(batch, rows, fw)
                assert stats.max_in_flight <= 2
            pipe.finish_part({"format": "x"})
            written += pipe.finished()
        written += pipe.close()
    finally:
        pipe.shutdown()
    assert [w[1] for w in written] == [0, 1, 2, 3]
    assert store.puts == [f"hidden/p{n}.safetensors" for n in range(4)]
    assert stats.max_in_flight == 2  # the forward ran ahead, but never past the bound
    assert stats.forward_waited_s > 0.05  # and the slow store held it back
    for _key, n, _size, entries in written:
        assert list(entries) == [f"p{n}-{p}" for p in range(6)]  # slots in part order
    from safetensors.torch import load

    blob = load((tmp_path / "hidden/p2.safetensors").read_bytes())
    torch.testing.assert_close(blob["s000003.aux_hidden"], sent["p2-3"][0].to(torch.bfloat16))


@pytest.mark.integration
def test_a_failed_write_surfaces_on_the_forward_side(tmp_path):
    class Broken(FileStore):
        def put(self, key: str, data: bytes) -> None:
            raise OSError("disk full")

    layout = Layout(3, 16, "float32")
    pipe = StatePipeline(Broken(str(tmp_path)), layout, depth=2)
    try:
        with pytest.raises(OSError, match="disk full"):
            for part in range(5):
                pipe.start_part(f"hidden/p{part}", part, 1)
                pipe.add((0,), [("s", np.arange(4), np.ones(4, dtype=np.int8))], _forwards(1, 4, layout))
                pipe.finish_part({})
                pipe.finished()
            pipe.close()
    finally:
        pipe.shutdown()


ELEMENT_BYTES = {"I32": 4, "I8": 1, "BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1}  # safetensors' dtype names


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16", "float8"])
def test_a_part_is_a_safetensors_file_that_safetensors_reads(dtype):
    from safetensors.torch import load

    from eyrie.jobs.extract import codec
    from eyrie.jobs.extract.shards import PartSample, encode_part, parse_header, part_entries

    layout = Layout(3, 8, dtype)
    g = torch.Generator().manual_seed(0)
    samples = [PartSample(f"id{n}", torch.arange(t, dtype=torch.int32), torch.ones(t, dtype=torch.int8),
                          codec.encode(torch.randn(t, 24, generator=g), torch.randn(t, 8, generator=g), layout))
               for n, t in enumerate((5, 1, 17, 2))]
    blob = encode_part(samples, {"k": "v"})
    back = load(bytes(blob))
    for n, s in enumerate(samples):
        assert torch.equal(back[f"s{n:06d}.input_ids"], s.input_ids)
        for name, t in s.hidden.items():
            assert back[f"s{n:06d}.{name}"].dtype == t.dtype
            assert torch.equal(back[f"s{n:06d}.{name}"].view(torch.uint8), t.view(torch.uint8))
    header, start = parse_header(bytes(blob[:4096]), "part")
    assert start % 8 == 0 and header["__metadata__"]["k"] == "v"
    for info in (v for k, v in header.items() if k != "__metadata__"):  # each tensor aligned to its element size
        assert (start + info["data_offsets"][0]) % ELEMENT_BYTES[info["dtype"]] == 0
    assert list(part_entries(header, start, 0, layout, len(blob), "part")) == ["id0", "id1", "id2", "id3"]

