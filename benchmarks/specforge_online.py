"""`eyrie export specforge-online` with verification against reading the samples alone, on 50,000 samples.

The export's whole path (`export_specforge_online`: read the samples shards, decode each sample into its
text, run every row through SpecForge 0.2.0's own parser (`preprocess_conversations`, what its
`build_eagle3_dataset` maps), compare ids and masks, write data.jsonl, tokens.jsonl and the rest) is
timed against reading the same samples alone (`read_samples` over every shard: the floor of any
export), and beside them the export without verification and SpecForge's parser alone on the same
texts, so the cost is seen where it is. Qwen3 samples (Qwen's BPE, `qwen3-thinking`: every row is
rebuilt exactly, so every row takes the whole path), thinking answers with a tool call in every third
and an earlier exchange in every fourth; `--distinct` different conversations, each written under
`--samples / --distinct` sample ids (SpecForge's parser does the same work for each). One process, one
tokenizer thread (RAYON_NUM_THREADS=1), wall and CPU seconds (the ratios are of CPU seconds in this
process: on a shared machine wall time counts the neighbours); `--workers N` adds the export with N
parser processes (wall time only: their CPU is in the workers). Target (issue 27): the verified export
>= 0.5 x the rate of reading the samples alone; beside it the export against SpecForge's parser alone,
the floor of any export SpecForge checks (the share of the cost that is eyrie's).

Also printed: the hidden-state bytes per token the docs quote (`extract.layers.hidden_bytes_per_token`).

    python benchmarks/specforge_online.py [--samples 50000] [--distinct 500] [--workers 2]
"""

from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported: one core, like for like
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse
import io
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.5
SHARD = 5000  # samples per shard, as a run's samples stage writes them


def timed(fn):
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t, time.process_time() - c


def build(folder: Path, tok, n: int, distinct: int, seed: int = 7):
    """A run's output with `n` Qwen3 samples (`distinct` conversations, rebuilt by eyrie) and its summary."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from reconstruction import TOOLS, text

    from eyrie.jobs.contract import layout
    from eyrie.jobs.reconstruct.formats import resolve_format
    from eyrie.jobs.reconstruct.reconstructor import Reconstructor, Sample
    from eyrie.jobs.reconstruct.samples import SamplesSummary, samples_table
    from eyrie.jobs.store import FileStore

    rng = random.Random(seed)
    fmt = resolve_format("qwen3", tok)
    rebuild = Reconstructor(fmt, tok)
    kept = []
    for i in range(distinct):
        messages = [{"role": "system", "content": text(rng, 30)}]
        if i % 4 == 0:
            messages += [{"role": "user", "content": text(rng, 20)}, {"role": "assistant", "content": text(rng, 40)}]
        messages.append({"role": "user", "content": text(rng, rng.randint(10, 60))})
        calls = ([{"id": f"call_{i}", "type": "function",
                   "function": {"name": "get_weather", "arguments": f'{{"city": "Paris", "days": {i % 7 + 1}}}'}}]
                 if i % 3 == 0 else [])
        r = {"sample_id": f"s{i}", "source": "bench", "row": i, "status": "ok", "policy": "keep",
             "request": {"model": "m", "messages": messages, "tools": TOOLS if calls else None,
                         "reasoning": {"effort": "high"}},
             "response": {"reasoning": text(rng, rng.randint(40, 160)), "content": text(rng, rng.randint(20, 80)),
                          "tool_calls": calls, "finish_reason": "tool_calls" if calls else "stop"},
             "usage": {}}
        s = rebuild(r)
        assert isinstance(s, Sample), s
        kept.append(s)
    store = FileStore(folder)
    from dataclasses import replace

    for shard, start in enumerate(range(0, n, SHARD)):
        rows = [replace(kept[i % distinct], sample_id=f"b{i:07d}") for i in range(start, min(n, start + SHARD))]
        buf = io.BytesIO()
        pq.write_table(samples_table(rows), buf, compression="zstd")
        store.put(layout.samples_key(shard), buf.getvalue())
    summary = SamplesSummary(tokenizer=tok.name, tokenizer_sha256=tok.sha256, tokenizer_files=dict(tok.files),
                             chat_format=fmt.name, template_sha256=fmt.sha256, variant=fmt.variant, samples=n)
    store.put(layout.SAMPLES_SUMMARY, json.dumps(summary.to_manifest()).encode())
    return store, sum(len(kept[i % distinct].input_ids) for i in range(n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=50_000)
    ap.add_argument("--distinct", type=int, default=500)
    ap.add_argument("--workers", type=int, default=2, help="also time the export with N parser processes (0: no)")
    args = ap.parse_args()

    from eyrie.jobs.extract.layers import hidden_bytes_per_token
    from eyrie.jobs.extract.specforge_online import (
        Checker,
        OnlineOptions,
        ParserConfig,
        export_specforge_online,
        specforge_importable,
    )

    for name, hidden in (("Kimi K2.5 / DeepSeek-V3 (H 7168)", 7168), ("an 8B Llama (H 4096)", 4096),
                         ("builtin:tiny-llama (H 64)", 64)):
        bf16, fp8 = hidden_bytes_per_token(3, hidden, "bfloat16"), hidden_bytes_per_token(3, hidden, "float8")
        print(f"hidden-state bytes per token, {name}: bfloat16 {bf16:,}, float8 {fp8:,}")
    kimi = hidden_bytes_per_token(3, 7168, "bfloat16")
    run_tokens = 83_000 * 3_000
    print(f"83,000 samples x 3,000 tokens (the run behind this project): {run_tokens * kimi / 1e12:.1f} TB "
          "in bfloat16, "
          f"{run_tokens * hidden_bytes_per_token(3, 7168, 'float8') / 1e12:.1f} TB in float8")

    why = specforge_importable()
    if why is not None:
        print(f"RESULT specforge_online SKIPPED: SpecForge's data code does not import ({why}); "
              "pip install --no-deps specforge==0.2.0")
        sys.exit(1)
    sys.path.insert(0, str(ROOT / "tests"))
    from tokenizer_helpers import qwen3_folder

    from eyrie.jobs.extract.run import list_sample_shards, read_samples
    from eyrie.jobs.reconstruct.tokenizers import load_tokenizer
    from eyrie.jobs.spec import TargetSpec

    work = Path(tempfile.mkdtemp(prefix="sfo-bench-"))
    try:
        tok = load_tokenizer(TargetSpec(model="m", tokenizer=str(qwen3_folder(work))))
        (store, tokens), build_s, _ = timed(lambda: build(work / "run", tok, args.samples, args.distinct))
        n = args.samples
        print(f"{n:,} Qwen3 samples ({args.distinct} distinct conversations), {tokens:,} tokens "
              f"({tokens / n:.0f} per sample), built in {build_s:.1f} s; one process, one tokenizer thread")

        def read_all() -> int:
            return sum(len(r.input_ids) for s in list_sample_shards(store) for r in read_samples(store, s))

        results: dict[str, tuple[float, float]] = {}

        def show(name: str, s: float, c: float) -> None:  # as each is measured: a cut-off run keeps its figures
            results[name] = (s, c)
            print(f"{name:28s} {s:8.1f} s wall {c:8.1f} s CPU here  {n / s:9.0f} samples/s  {tokens / s:11.0f} "
                  "tokens/s", flush=True)

        got, read_s, read_cpu = timed(read_all)
        assert got == tokens
        show("read", read_s, read_cpu)

        def export(name: str, **kw):
            out = work / name
            r, s, c = timed(lambda: export_specforge_online(store, out, OnlineOptions(overwrite=True, **kw)))
            show(name, s, c)
            return r

        plain = export("unverified", verify=False)
        assert plain.written == n
        r = export("verified", workers=1)
        assert (r.exact, r.written) == (n, n), (r.exact, dict(r.mismatched))
        # SpecForge's parser alone, on the same texts in the same batches, in this process
        rows = [(row.input_ids, row.loss_mask) for s in list_sample_shards(store) for row in read_samples(store, s)]
        checker = Checker(ParserConfig(str(tok.folder), False, r.chat_template, r.max_length, True), tok)
        texts = checker.texts(rows)
        from specforge.data.preprocessing import preprocess_conversations

        def parse_all() -> None:
            for i in range(0, len(texts), 128):
                batch = texts[i:i + 128]
                preprocess_conversations(checker.hf, batch, checker.template, r.max_length, is_preformatted=True,
                                         train_only_last_turn=True, tools=[[] for _ in batch])

        _, parse_s, parse_cpu = timed(parse_all)
        show("parser alone", parse_s, parse_cpu)
        if args.workers > 1:
            export(f"verified, {args.workers} processes", workers=args.workers)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    # CPU seconds of this process (the verified export and the parser alone both run here, one process):
    # on a shared machine wall time counts the neighbours too
    cpu = {k: c for k, (_s, c) in results.items()}
    ratio = cpu["read"] / cpu["verified"]
    peer = cpu["parser alone"] / cpu["verified"]
    rest = cpu["verified"] - cpu["parser alone"]
    print(f"verified export vs reading the samples alone (CPU): ratio {ratio:.4f} (target >= {TARGET}) -> "
          f"{'OK' if ratio >= TARGET else 'BELOW TARGET'}: SpecForge's parser costs "
          f"{1e3 * cpu['parser alone'] / n:.2f} ms per sample, reading {1e3 * cpu['read'] / n:.3f} ms")
    print(f"verified export vs SpecForge's parser alone on the same texts (CPU): ratio {peer:.3f}; the rest "
          f"(reading, decoding, comparing, writing) {rest:.1f} s CPU, {rest / cpu['verified']:.1%} of the export")
    print(f"RESULT specforge_online ratio={ratio:.4f} target>={TARGET} {'PASS' if ratio >= TARGET else 'MISS'} "
          f"vs_parser_alone={peer:.3f}")


if __name__ == "__main__":
    main()
