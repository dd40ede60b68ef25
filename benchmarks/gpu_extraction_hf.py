"""The transformers backend's extraction at the speed of the GPU (issue 42): old batching against new.

One script, no network, no Ray, no SGLang. On a GPU it needs only torch, transformers, triton and
eyrie, plus one small wheel: orjson (eyrie's store keys module imports it); numpy, pyarrow, safetensors,
pyyaml and typing-extensions are on the lent machine's image, and nothing here imports pydantic
(tests/extract/test_gpu_extraction_hf.py checks the import closure against what that image lacks).
It runs in phases, writes its JSON after each (a failed phase is recorded and the next one runs;
one that would not finish in the time left is skipped), and prints:

 1. matmul    the ceiling: a bf16 8192^3 matmul (fp32 512^3 on the CPU), FLOP/s;
 2. store     the output store's own write speed: parts of the size extraction writes, to a local
              folder (and to MinIO when its binary is here: tests/conftest.py's `start_minio`);
 3. model     an 8B Llama's shape (Llama-3.1-8B: hidden 4096, 32 layers, GQA 32/8; random bf16 weights
              built on the GPU, no download), aux layers 2/16/29; on the CPU a tiny Llama from a config;
 4. equal     NEW states against OLD ones, sample for sample, on the varied and the short batches: the
              lowest cosine per token of each layer block >= 0.999 (a batch's shape changes the kernels,
              so bf16 is not bit for bit), rows == T;
 5. table     issue 42's table for the OLD and NEW batching side by side, on its three batches
              (16 x 2048 uniform; 16 of lengths 600-3,500; 64 of 100-900):
              OLD: one right-padded forward of the whole batch, each sample's states copied to the host
                   synchronously as extraction did (`codec.encode(...).cpu()`);
              NEW: `batching.plan_batches` at the token budget (packed, per-sample SDPA), the states
                   staged off the device on a side stream into pinned memory and assembled on the worker
                   (`staging.StatePipeline`), parts serialized, no store; and the forward alone.
              Columns: batch, tokens, padded (tokens computed), tokens/s, fraction of the matmul
              (tokens/s x the forward's matmul FLOP per token / the matmul's FLOP/s);
 6. whole     the whole extraction (`run.extract_shard`: forward + copy + encode + write) of 64 samples
              of 600-3,500 tokens into the local folder (and MinIO when here), against the matmul and
              the store's own speed: which one binds;
 7. flex      the NEW path with flex attention (compiled on the GPU) instead of per-sample SDPA: its
              states against OLD (as `equal`) and its table.

Issue 42's bar on an H200: whole extraction of the varied samples >= 0.55 of the matmul, the uniform
batch >= 0.6; store writes keeping up or named as the limit.

CPU mode (`--cpu`, or no CUDA): the same phases on a tiny model and small batches, in ~20 s; the test
suite runs it (tests/extract/test_gpu_extraction_hf.py) so the script cannot rot.

The next session's device run (from the repository root; the tree travels, eyrie is put on the path as
`eyrie.jobs` by a link, the wheels travel in .whl/). Here, once:

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .whl orjson==3.13.0

(130 KB; the version this venv has), then the device tool's `run` with carry [".whl"], timeout_s 420,
and this command (one line):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site
    .whl/*.whl && mkdir -p /tmp/ey/eyrie && ln -sfn $PWD/jobs /tmp/ey/eyrie/jobs &&
    export PYTHONPATH=/tmp/site:/tmp/ey PYTHONUNBUFFERED=1 && nvidia-smi -L;
    python3 benchmarks/gpu_extraction_hf.py --out $OUT/gpu_extraction_hf.json 2>&1 | tee $OUT/log.txt

It should take ~3 minutes of the 15 (phases past --time-budget 270 s are skipped, flex last). The
results come back as $OUT/gpu_extraction_hf.json and log.txt.

Run here: python benchmarks/gpu_extraction_hf.py --cpu [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eyrie.jobs.contract.layers import resolve_layers
from eyrie.jobs.extract import codec
from eyrie.jobs.extract.batching import plan_batches
from eyrie.jobs.extract.fidelity import Forward
from eyrie.jobs.extract.hf_backend import HFBackend
from eyrie.jobs.extract.staging import HostStaging, StatePipeline, Stats
from eyrie.jobs.store import FileStore, Store

ROOT = Path(__file__).resolve().parents[1]
WHOLE_BAR_VARIED = 0.55  # issue 42: the whole extraction of varied lengths, fraction of the matmul
UNIFORM_BAR = 0.6


@dataclass(frozen=True)
class Scale:
    """What one mode runs: the model's shape, the batches, the budget, the repetitions."""

    device: str
    dtype: torch.dtype
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    matmul_n: int
    budget: int
    batches: tuple[tuple[str, int, int, int], ...]  # (label, count, min length, max length)
    whole: tuple[int, int, int]  # count, min, max
    shard_bytes: int
    reps: int
    storage: str = "bfloat16"

    def flop_per_token(self) -> float:
        """Matmul FLOP of one token's forward (the decoder's projections and MLP; no LM head, no
        attention scores): issue 42's ~14 GFLOP for an 8B Llama."""
        h, kv = self.hidden, self.hidden * self.kv_heads // self.heads
        return 2.0 * self.layers * (h * (h + 2 * kv) + h * h + 3 * h * self.intermediate)


GPU = Scale("cuda", torch.bfloat16, 4096, 32, 14336, 32, 8, 128256, 8192, 32768,
            (("16 x 2048 (uniform)", 16, 2048, 2048), ("16, lengths 600-3,500", 16, 600, 3500),
             ("64, lengths 100-900", 64, 100, 900)),
            (64, 600, 3500), 1 << 30, 3)
CPU = Scale("cpu", torch.float32, 64, 4, 128, 4, 2, 1024, 512, 512,
            (("4 x 64 (uniform)", 4, 64, 64), ("6, lengths 20-120", 6, 20, 120), ("16, lengths 4-40", 16, 4, 40)),
            (24, 20, 120), 1 << 18, 1)


class Null:
    """A store that keeps nothing: the NEW table's rows measure up to the serialized part."""

    uri = "null://"

    def put(self, key: str, data: bytes) -> None:
        pass

    def url(self, key: str) -> str:
        return f"null://{key}"


def lengths_of(count: int, lo: int, hi: int, seed: int) -> list[int]:
    g = np.random.default_rng(seed)
    return [int(x) for x in g.integers(lo, hi + 1, count)]


def token_ids(lengths: list[int], vocab: int, seed: int) -> list[np.ndarray]:
    g = np.random.default_rng(seed)
    return [g.integers(0, vocab, n, dtype=np.int64) for n in lengths]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------- phases


def phase_env(ctx: dict[str, Any]) -> dict[str, Any]:
    import transformers

    s: Scale = ctx["scale"]
    out = {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0],
           "device": s.device, "threads": torch.get_num_threads()}
    if s.device == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
        out["gpuMemoryGiB"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    return out


def phase_matmul(ctx: dict[str, Any]) -> dict[str, Any]:
    s: Scale = ctx["scale"]
    n = s.matmul_n
    a = torch.randn(n, n, device=s.device, dtype=s.dtype)
    b = torch.randn(n, n, device=s.device, dtype=s.dtype)
    for _ in range(3):
        a @ b
    sync(s.device)
    reps = 20 if s.device == "cuda" else 5
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        sync(s.device)
        best = min(best, (time.perf_counter() - t0) / reps)
    ctx["matmul"] = 2 * n**3 / best
    return {"n": n, "dtype": str(s.dtype), "flopPerS": ctx["matmul"], "tflopPerS": ctx["matmul"] / 1e12}


def store_speed(store: Store, size: int, count: int) -> dict[str, Any]:
    blob = os.urandom(min(size, 64 << 20)) * max(1, size // (64 << 20))
    t0 = time.perf_counter()
    for i in range(count):
        store.put(f"speed/blob-{i}", blob)
    took = time.perf_counter() - t0
    for i in range(count):
        store.delete(f"speed/blob-{i}")
    return {"bytes": len(blob) * count, "seconds": took, "bytesPerS": len(blob) * count / took}


def open_stores(ctx: dict[str, Any]) -> dict[str, Store]:
    """The local folder, and MinIO when its binary is here (the tests' server; never on the GPU machine)."""
    stores: dict[str, Store] = {"local": FileStore(ctx["base"] / "store")}
    if ctx["scale"].device == "cuda":
        ctx["minioNotRun"] = "the GPU machine has no MinIO (its binary does not travel)"
        return stores
    try:
        sys.path.insert(0, str(ROOT / "tests"))
        from conftest import minio_binary, start_minio  # type: ignore[import-not-found]

        minio_binary()
        server = start_minio(ctx["base"] / "minio")
        ctx["minio"] = server
        from eyrie.jobs.store import S3Credentials, open_store

        stores["minio"] = open_store("s3://bench/extract", server.endpoint,
                                     S3Credentials(server.access_key, server.secret_key))
        stores["minio"].check_writable()
    except Exception as e:  # no testbed here (the GPU machine): the local folder alone
        ctx["minioNotRun"] = f"{type(e).__name__}: {str(e)[:200]}"
    return stores


def phase_store(ctx: dict[str, Any]) -> dict[str, Any]:
    s: Scale = ctx["scale"]
    ctx["stores"] = open_stores(ctx)
    out: dict[str, Any] = {name: store_speed(st, s.shard_bytes, 3) for name, st in ctx["stores"].items()}
    if "minioNotRun" in ctx:
        out["minioNotRun"] = ctx["minioNotRun"]
    ctx["storeSpeed"] = {k: v["bytesPerS"] for k, v in out.items() if isinstance(v, dict)}
    return out


def phase_model(ctx: dict[str, Any]) -> dict[str, Any]:
    from transformers import LlamaConfig

    s: Scale = ctx["scale"]
    config = LlamaConfig(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.intermediate,
                         num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                         max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False)
    t0 = time.perf_counter()
    be = HFBackend.random(config, device=s.device, dtype=s.dtype, attention="sdpa")
    ctx["backend"] = be
    ctx["layers"] = list(resolve_layers("auto", s.layers).ids)
    ctx["layout"] = codec.Layout(len(ctx["layers"]), s.hidden, s.storage)
    return {"seconds": time.perf_counter() - t0, "packs": be.packs, "attention": be.model.config._attn_implementation,
            "auxLayers": ctx["layers"], "flopPerToken": s.flop_per_token(),
            "bytesPerToken": ctx["layout"].bytes_per_token, "defaultBudget": be.default_max_tokens()}


COSINE_MIN = 0.999  # bf16 on the GPU; float32 on the CPU is far closer


def states(be: HFBackend, seqs: list[np.ndarray], layers: list[int], budget: int, kernel: Any) -> list[Forward]:
    """Each sample's states on the host, in input order, run as the plan batches them (`kernel` None:
    the whole list as one padded batch, as before)."""
    saved, be.kernel = be.kernel, kernel
    try:
        if kernel is None:
            return [Forward(f.aux.float().cpu(), f.last.float().cpu()) for f in be.forward(seqs, layers)]
        out: list[Forward | None] = [None] * len(seqs)
        for batch in plan_batches([len(x) for x in seqs], budget, be.packs):
            for i, f in zip(batch.positions, be.forward([seqs[i] for i in batch.positions], layers), strict=True):
                out[i] = Forward(f.aux.float().cpu(), f.last.float().cpu())
        return [f for f in out if f is not None]
    finally:
        be.kernel = saved


def phase_equal(ctx: dict[str, Any], kernel_name: str = "sdpa") -> dict[str, Any]:
    """NEW states equal OLD ones sample for sample (the varied and the short batches): per sample and
    per layer block, the lowest cosine over tokens, and rows == T."""
    from eyrie.jobs.extract import varlen

    s: Scale = ctx["scale"]
    be: HFBackend = ctx["backend"]
    worst, samples = 1.0, 0
    hidden = s.hidden
    for n, (_label, count, lo, hi) in enumerate(s.batches[1:], start=1):
        seqs = token_ids(lengths_of(count, lo, hi, seed=n), s.vocab, seed=100 + n)
        old = states(be, seqs, ctx["layers"], s.budget, None)
        new = states(be, seqs, ctx["layers"], s.budget, varlen.Kernel(kernel_name))
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            if a.aux.shape != b.aux.shape or b.aux.shape[0] != len(seqs[i]):
                raise AssertionError(f"sample {i}: {tuple(b.aux.shape)} new, {tuple(a.aux.shape)} old")
            blocks = [(a.aux[:, k * hidden:(k + 1) * hidden], b.aux[:, k * hidden:(k + 1) * hidden])
                      for k in range(len(ctx["layers"]))] + [(a.last, b.last)]
            for x, y in blocks:
                c = float(torch.nn.functional.cosine_similarity(x, y, dim=-1).min())
                worst = min(worst, c)
                if c < COSINE_MIN:
                    raise AssertionError(f"sample {i} of batch {n}: lowest cosine per token {c:.6f} < {COSINE_MIN}")
            samples += 1
    return {"kernel": kernel_name, "samples": samples, "lowestCosinePerToken": worst, "floor": COSINE_MIN}


def old_way(be: HFBackend, seqs: list[np.ndarray], layers: list[int], layout: codec.Layout) -> None:
    """What extraction did before issue 42: the batch as given, right-padded, each sample's states
    encoded and copied to pageable host memory synchronously."""
    kernel, be.kernel = be.kernel, None
    try:
        for f in be.forward(seqs, layers):
            {k: v.cpu() for k, v in codec.encode(f.aux, f.last, layout).items()}
    finally:
        be.kernel = kernel


def new_way(be: HFBackend, seqs: list[np.ndarray], layers: list[int], layout: codec.Layout, budget: int,
            store: Any, stats: Stats, copy: bool = True) -> None:
    """The new path: token-budget batches in their shape, states through the pipeline (or, `copy` off,
    the forward alone)."""
    pipe = StatePipeline(store, layout, stats=stats, staging=staging_of(layout)) if copy else None
    try:
        if pipe:
            pipe.start_part("hidden/bench-00000.safetensors", 0, len(seqs))
        for batch in plan_batches([len(x) for x in seqs], budget, be.packs):
            res = be.forward([seqs[i] for i in batch.positions], layers)
            if pipe:
                rows = [(str(i), seqs[i], np.ones(len(seqs[i]), dtype=np.int8)) for i in batch.positions]
                pipe.add(batch.positions, rows, res)
        if pipe:
            pipe.finish_part({"format": "bench"})
            pipe.close()
        else:
            sync(be.device)
    finally:
        if pipe:
            pipe.shutdown()


_STAGING: dict[codec.Layout, HostStaging] = {}


def staging_of(layout: codec.Layout) -> HostStaging:
    """One set of pinned buffers for the whole run, as run_extraction keeps one: allocating pinned memory
    (~1 GiB a buffer for an 8B model) is not part of what a batch costs."""
    return _STAGING.setdefault(layout, HostStaging(layout))


def timed(fn: Callable[[], None], device: str, reps: int) -> float:
    """Seconds of one call: a warm-up, then the mean of `reps` calls back to back (a stream of batches,
    as extraction runs them: each call's copies overlap the next one's forward)."""
    fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / reps


def table_rows(ctx: dict[str, Any], kernel_name: str) -> list[dict[str, Any]]:
    s: Scale = ctx["scale"]
    be: HFBackend = ctx["backend"]
    from eyrie.jobs.extract import varlen

    be.kernel = varlen.Kernel(kernel_name)
    rows = []
    for n, (label, count, lo, hi) in enumerate(s.batches):
        lengths = lengths_of(count, lo, hi, seed=n)
        seqs = token_ids(lengths, s.vocab, seed=100 + n)
        tokens = sum(lengths)
        row: dict[str, Any] = {"batch": label, "tokens": tokens}
        if kernel_name == "sdpa":
            t = timed(lambda seqs=seqs: old_way(be, seqs, ctx["layers"], ctx["layout"]), s.device, s.reps)
            row["old"] = {"padded": count * max(lengths), "forwards": 1, "seconds": t,
                          "tokensPerS": tokens / t, "fractionOfMatmul": tokens / t * s.flop_per_token() / ctx["matmul"]}
        plan = plan_batches(lengths, s.budget, be.packs)
        stats = Stats()
        t = timed(lambda seqs=seqs, stats=stats: new_way(be, seqs, ctx["layers"], ctx["layout"], s.budget, Null(),
                                                        stats), s.device, s.reps)
        row["new"] = {"padded": sum(b.computed for b in plan), "forwards": len(plan), "seconds": t,
                      "tokensPerS": tokens / t, "fractionOfMatmul": tokens / t * s.flop_per_token() / ctx["matmul"],
                      "forwardWaitedS": stats.forward_waited_s / (s.reps + 1),
                      "pinnedBytes": stats.pinned_bytes, "maxInFlight": stats.max_in_flight}
        f = timed(lambda seqs=seqs: new_way(be, seqs, ctx["layers"], ctx["layout"], s.budget, None, Stats(),
                                           copy=False), s.device, s.reps)
        row["new"]["forwardOnlyTokensPerS"] = tokens / f
        row["new"]["forwardOnlyFraction"] = tokens / f * s.flop_per_token() / ctx["matmul"]
        rows.append(row)
        ctx.setdefault("forwardOnly", {})[label] = tokens / f
    return rows


def phase_table(ctx: dict[str, Any]) -> dict[str, Any]:
    rows = table_rows(ctx, "sdpa")
    print_table(rows)
    return {"rows": rows}


def phase_whole(ctx: dict[str, Any]) -> dict[str, Any]:
    from eyrie.jobs.contract.layers import LayerChoice
    from eyrie.jobs.extract.run import Plan, SampleRow, extract_shard

    s: Scale = ctx["scale"]
    be: HFBackend = ctx["backend"]
    from eyrie.jobs.extract import varlen

    be.kernel = varlen.Kernel.SDPA
    count, lo, hi = s.whole
    lengths = lengths_of(count, lo, hi, seed=7)
    seqs = token_ids(lengths, s.vocab, seed=8)
    tokens = sum(lengths)
    rows = [SampleRow(f"{i:08x}", x, np.ones(len(x), dtype=np.int8)) for i, x in enumerate(seqs)]
    layout: codec.Layout = ctx["layout"]
    meta = {"engine": be.name, "model": "bench", "auxLayers": ctx["layers"], "layerConvention": "auto",
            "numLayers": s.layers, "dtype": s.storage, "modelConfigSha256": be.facts.config_sha256,
            "generationShards": 1}
    plan = Plan(LayerChoice(tuple(ctx["layers"]), "auto"), layout, meta)
    out: dict[str, Any] = {"samples": count, "tokens": tokens, "bytesPerToken": layout.bytes_per_token,
                           "budget": s.budget, "stores": {}}
    varied = ctx.get("forwardOnly", {}).get(s.batches[1][0])
    for name, store in ctx["stores"].items():
        _put_rows(store, rows)
        extract_shard(store, 0, be, plan, s.shard_bytes, s.budget,  # warm-up: kernels, allocator, pinned buffers
                      staging=staging_of(layout))
        _clear_hidden(store)
        stats = Stats()
        sync(s.device)
        t0 = time.perf_counter()
        extract_shard(store, 0, be, plan, s.shard_bytes, s.budget, stats=stats, staging=staging_of(layout))
        sync(s.device)
        took = time.perf_counter() - t0
        tps = tokens / took
        need = tps * layout.bytes_per_token
        speed = ctx["storeSpeed"].get(name)
        res = {"seconds": took, "tokensPerS": tps, "fractionOfMatmul": tps * s.flop_per_token() / ctx["matmul"],
               "bytesPerS": need, "storeBytesPerS": speed, "storeShare": need / speed if speed else None,
               "forwardOnlyTokensPerS": varied, "stats": stats.dump()}
        res["binds"] = binds(res, stats, took)
        out["stores"][name] = res
        _clear_hidden(store)
    return out


def binds(res: dict[str, Any], stats: Stats, took: float) -> str:
    """Which side limits the whole extraction: the store (its writes took most of the time and its
    measured speed is nearly reached), the host side (the forward waited on the worker), or compute."""
    waited = stats.forward_waited_s / took
    if res["storeShare"] is not None and res["storeShare"] >= 0.8 and stats.write_s >= 0.8 * took:
        return "store"
    if waited >= 0.1:
        return "host (copy, assembly, serialization)"
    return "compute (the forward)"


def _put_rows(store: Store, rows: list[Any]) -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from eyrie.jobs.contract.layout import samples_key

    table = pa.table({"sample_id": [r.sample_id for r in rows],
                      "input_ids": [r.input_ids.tolist() for r in rows],
                      "loss_mask": [r.loss_mask.tolist() for r in rows]})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    store.put(samples_key(0), buf.getvalue())


def _clear_hidden(store: Store) -> None:
    from eyrie.jobs.contract.layout import HIDDEN

    for key in store.list(HIDDEN):
        store.delete(key)


def phase_flex(ctx: dict[str, Any]) -> dict[str, Any]:
    equal = phase_equal(ctx, "flex")  # compiles it too (its seconds are in this phase)
    rows = table_rows(ctx, "flex")
    print_table(rows, "NEW with flex attention")
    return {"equal": equal, "rows": rows}


PHASES: list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]], float]] = [
    # (name, phase, seconds it needs on the GPU: skipped when less is left)
    ("env", phase_env, 1), ("matmul", phase_matmul, 5), ("store", phase_store, 20), ("model", phase_model, 40),
    ("equal", phase_equal, 15), ("table", phase_table, 60), ("whole", phase_whole, 60), ("flex", phase_flex, 90)]


def print_table(rows: list[dict[str, Any]], title: str = "OLD (padded batch, synchronous copies) | NEW") -> None:
    print(f"\n{title}")
    print("| batch | tokens | padded old | padded new | tokens/s old | tokens/s new | matmul old | matmul new "
          "| forward alone |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        o, n = r.get("old", {}), r["new"]
        print(f"| {r['batch']} | {r['tokens']:,} | {o.get('padded', 0):,} | {n['padded']:,} "
              f"| {o.get('tokensPerS', 0):,.0f} | {n['tokensPerS']:,.0f} | {o.get('fractionOfMatmul', 0):.2f} "
              f"| {n['fractionOfMatmul']:.2f} | {n['forwardOnlyFraction']:.2f} |")


def verdict(doc: dict[str, Any]) -> list[str]:
    """issue 42's bars, where the phases ran."""
    lines = []
    checks = {c["name"]: c for c in doc["phases"] if c.get("ok")}
    if "table" in checks:
        uniform = checks["table"]["rows"][0]["new"]["fractionOfMatmul"]
        lines.append(f"uniform batch, new path: {uniform:.2f} of the matmul (bar {UNIFORM_BAR})")
    if "whole" in checks:
        for name, r in checks["whole"]["stores"].items():
            lines.append(f"whole extraction to {name}: {r['tokensPerS']:,.0f} tokens/s = {r['fractionOfMatmul']:.2f} "
                         f"of the matmul (bar {WHOLE_BAR_VARIED}); the store took {r['storeShare'] or 0:.2f} of its "
                         f"own speed; binds: {r['binds']}")
    return lines


def default_out() -> Path:
    return Path(os.environ["OUT"]) / "gpu_extraction_hf.json" if os.environ.get("OUT") else Path(
        "gpu_extraction_hf.json")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--cpu", action="store_true", help="the tiny model's mode (what the test suite runs)")
    p.add_argument("--time-budget", type=float, default=270.0, help="seconds; phases that would not fit are skipped")
    args = p.parse_args(argv)
    out = args.out or default_out()
    scale = CPU if args.cpu or not torch.cuda.is_available() else GPU
    started = time.perf_counter()
    doc: dict[str, Any] = {"mode": scale.device, "phases": [], "skipped": []}
    ctx: dict[str, Any] = {"scale": scale, "base": Path(tempfile.mkdtemp(prefix="eyrie-gpu-hf-"))}
    threads = torch.get_num_threads()
    try:
        for name, phase, need in PHASES:
            left = args.time_budget - (time.perf_counter() - started)
            if scale.device == "cuda" and left < need:
                doc["skipped"].append({"name": name, "secondsLeft": left, "needs": need})
                continue
            t0 = time.perf_counter()
            try:
                facts = phase(ctx)
                doc["phases"].append({"name": name, "ok": True, "seconds": time.perf_counter() - t0, **facts})
            except Exception as e:
                doc["phases"].append({"name": name, "ok": False, "seconds": time.perf_counter() - t0,
                                      "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]})
                print(f"phase {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
            out.write_text(json.dumps(doc, indent=1, default=str))
    finally:
        torch.set_num_threads(threads)
        if "minio" in ctx:
            from conftest import stop_pid  # type: ignore[import-not-found]

            stop_pid(ctx["minio"].proc)
        shutil.rmtree(ctx["base"], ignore_errors=True)
        doc["seconds"] = time.perf_counter() - started
        doc["verdict"] = verdict(doc)
        out.write_text(json.dumps(doc, indent=1, default=str))
    for line in doc["verdict"]:
        print(line)
    failed = [c["name"] for c in doc["phases"] if not c["ok"]]
    print(f"RESULT gpu_extraction_hf mode={scale.device} seconds={doc['seconds']:.0f} "
          f"{'FAILED ' + ','.join(failed) if failed else 'all phases ran'}"
          f"{' skipped ' + ','.join(s['name'] for s in doc['skipped']) if doc['skipped'] else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
