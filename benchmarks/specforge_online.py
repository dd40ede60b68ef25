"""`eyrie export specforge-online` with verification against reading the samples alone, on 50,000 samples.

Timed on the same samples, one after the other:
- reading them alone (`read_samples` over every shard: the floor of any export);
- the export without verification, and with it in this process (`export_specforge_online`, one parser
  process: read the shards, decode each sample into its text, run every row through SpecForge 0.2.0's
  own parser (`preprocess_conversations`, what its `build_eagle3_dataset` maps), compare ids and masks,
  write data.jsonl, tokens.jsonl and the rest);
- SpecForge's parser alone on the same texts in the same batches: the floor of any export SpecForge
  checks; the export against it is the share of the cost that is eyrie's;
- where SpecForge's parser spends its time, on the first `--breakdown` texts (interleaved): the
  tokenizer's own encode (Rust, `tokenizers`) of the three strings it tokenizes per row (the whole
  text, then for the answer span the text before it and the text up to its end, to find token
  positions), transformers' wrappers around those calls (BatchEncoding, tensors), and SpecForge's
  own Python (regex, masks, tensors);
- the path users run: `eyrie export specforge-online OUTPUT DIR` as a subprocess with its defaults
  (parser processes: one per core for 5,000 rows each), wall and CPU seconds of the whole process tree;
- eyrie's share within one pass: each export's summary gives its processes' CPU seconds and, of them,
  those inside SpecForge's parser (`cpuSeconds`, `parserCpuSeconds`), free of the load changing
  between passes (on a shared machine two passes' CPU seconds differ by tens of percent).

Qwen3 samples (Qwen's BPE, `qwen3-thinking`: every row is rebuilt exactly, so every row takes the
whole path), thinking answers with a tool call in every third and an earlier exchange in every fourth;
`--distinct` different conversations, each written under `--samples / --distinct` sample ids
(SpecForge's parser does the same work for each). In this process one tokenizer thread
(RAYON_NUM_THREADS=1) and the ratios are of CPU seconds (on a shared machine wall time counts the
neighbours); the CLI runs in the user's environment. Target (issue 27): the verified export >= 0.5 x
the rate of reading the samples alone. `--workers N` adds the export with N parser processes in this
process (wall time only: their CPU is in the workers).

Also printed: the hidden-state bytes per token the docs quote (`contract.layers.hidden_bytes_per_token`).

    python benchmarks/specforge_online.py [--samples 50000] [--distinct 500] [--breakdown 1000] [--workers 0]
"""

from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported: one core, like for like
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse
import io
import json
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.5
SHARD = 5000  # samples per shard, as a run's samples stage writes them
PARSER = "SpecForge's parser alone"


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


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def breakdown(hf, template, texts: list[str], max_length: int) -> dict[str, float]:
    """ms of CPU per row inside SpecForge's parser: the tokenizer's own encode of the three strings it
    tokenizes (found with its own assistant pattern), transformers' wrappers around those calls, and
    the rest, SpecForge's Python. The three are timed in turn on each slice of 50 rows, twice over, so
    that a load changing on a shared machine falls on all three alike."""
    import re

    from specforge.data.parse import GeneralParser
    from specforge.data.preprocessing import preprocess_conversations

    pattern = GeneralParser(hf, template).assistant_pattern
    parts = []
    for t in texts:
        m = list(re.finditer(pattern, t, re.DOTALL))[-1]  # train_only_last_turn: the last span
        parts.append((t, t[:m.start(1)], t[:m.end(1)]))
    rust = hf._tokenizer  # the `tokenizers` object transformers wraps

    def own(rows) -> None:
        for whole, before, to_end in rows:
            for x in (whole, before, to_end):
                rust.encode(x, add_special_tokens=False)

    def wrapped(rows) -> None:  # the calls the parser makes, as it makes them
        for whole, before, to_end in rows:
            hf(whole, max_length=max_length, truncation=True, return_tensors="pt", add_special_tokens=False)
            for x in (before, to_end):
                hf.encode(x, add_special_tokens=False, truncation=True, max_length=max_length)

    def parser(rows) -> None:
        batch = [whole for whole, _, _ in rows]
        preprocess_conversations(hf, batch, template, max_length, is_preformatted=True, train_only_last_turn=True,
                                 tools=[[] for _ in batch])

    spent = {"tokenizer": 0.0, "calls": 0.0, "parser": 0.0}
    for _ in range(2):
        for i in range(0, len(parts), 50):
            rows = parts[i:i + 50]
            for name, fn in (("tokenizer", own), ("calls", wrapped), ("parser", parser)):
                c = time.process_time()
                fn(rows)
                spent[name] += time.process_time() - c
    ms = {k: 1e3 * v / (2 * len(texts)) for k, v in spent.items()}
    return {"parser": ms["parser"], "tokenizer": ms["tokenizer"], "transformers": ms["calls"] - ms["tokenizer"],
            "specforge": ms["parser"] - ms["calls"]}


def cli(store, out: Path, n: int) -> tuple[float, float, dict]:
    """`eyrie export specforge-online` as a user runs it: (wall s, CPU s of its process tree, its summary)."""
    from _common import eyrie_python

    env = {k: v for k, v in os.environ.items() if k not in ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")}
    t0, c0 = time.perf_counter(), children_cpu()
    p = subprocess.run([eyrie_python(), "-m", "eyrie.jobs.cli", "export", "specforge-online", store.uri, str(out)],
                       capture_output=True, text=True, env=env)
    wall, cpu = time.perf_counter() - t0, children_cpu() - c0
    if p.returncode != 0:
        raise SystemExit(f"eyrie export specforge-online failed ({p.returncode}): {p.stderr[-3000:]}")
    summary = json.loads((out / "eyrie_export.json").read_text())
    assert (summary["exact"], summary["written"]) == (n, n), summary["mismatched"]
    return wall, cpu, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=50_000)
    ap.add_argument("--distinct", type=int, default=500)
    ap.add_argument("--breakdown", type=int, default=1000, help="texts the parser's cost is broken down on (0: no)")
    ap.add_argument("--workers", type=int, default=0, help="also time the export with N parser processes here")
    args = ap.parse_args()

    from eyrie.jobs.context import usable_cores
    from eyrie.jobs.contract.layers import hidden_bytes_per_token
    from eyrie.jobs.extract.specforge_online import (
        Checker,
        OnlineOptions,
        ParserConfig,
        auto_workers,
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
    n = args.samples
    results: dict[str, tuple[float, float]] = {}
    accounts: dict[str, dict] = {}  # export summaries: their cpuSeconds and parserCpuSeconds

    def show(name: str, s: float, c: float, where: str = "here") -> None:  # as measured: a cut-off run keeps them
        results[name] = (s, c)
        print(f"{name:34s} {s:8.1f} s wall {c:8.1f} s CPU {where:5s} {n / s:9.0f} samples/s  {tokens / s:11.0f} "
              f"tokens/s  (load {os.getloadavg()[0]:.1f})", flush=True)

    try:
        tok = load_tokenizer(TargetSpec(model="m", tokenizer=str(qwen3_folder(work))))
        (store, tokens), build_s, _ = timed(lambda: build(work / "run", tok, n, args.distinct))
        cores = usable_cores()
        print(f"{n:,} Qwen3 samples ({args.distinct} distinct conversations), {tokens:,} tokens "
              f"({tokens / n:.0f} per sample), built in {build_s:.1f} s; here one process, one tokenizer thread; "
              f"{cores} usable cores (the CLI's default: {auto_workers(n, cores)} parser processes)")

        def read_all() -> int:
            return sum(len(r.input_ids) for s in list_sample_shards(store) for r in read_samples(store, s))

        got, read_s, read_cpu = timed(read_all)
        assert got == tokens
        show("read", read_s, read_cpu)

        def export(name: str, **kw):
            out = work / "out"
            r, s, c = timed(lambda: export_specforge_online(store, out, OnlineOptions(overwrite=True, **kw)))
            show(name, s, c)
            return r

        plain = export("unverified", verify=False)
        assert plain.written == n
        r = export("verified, 1 process", workers=1)
        assert (r.exact, r.written) == (n, n), (r.exact, dict(r.mismatched))
        accounts["the export in 1 process"] = r.summary
        # SpecForge's parser alone, on the same texts in the same batches, in this process
        rows = [(row.input_ids, row.loss_mask) for s in list_sample_shards(store) for row in read_samples(store, s)]
        checker = Checker(ParserConfig(str(tok.folder), False, r.chat_template, r.max_length, True), tok)
        texts = checker.texts(rows)
        del rows
        from specforge.data.preprocessing import preprocess_conversations

        def parse_all() -> None:
            for i in range(0, len(texts), 128):
                batch = texts[i:i + 128]
                preprocess_conversations(checker.hf, batch, checker.template, r.max_length, is_preformatted=True,
                                         train_only_last_turn=True, tools=[[] for _ in batch])

        _, parse_s, parse_cpu = timed(parse_all)
        show(PARSER, parse_s, parse_cpu)
        parts = breakdown(checker.hf, checker.template, texts[:args.breakdown], r.max_length) \
            if args.breakdown else None
        wall, cpu, summary = cli(store, work / "cli", n)
        show("eyrie export specforge-online", wall, cpu, "tree")
        accounts[f"the CLI ({summary['workers']} parser processes)"] = summary
        print(f"  (the CLI: {summary['workers']} parser processes, {summary['exact']:,} rows exact, its own clock "
              f"{summary['seconds']:.1f} s after start-up)")
        if args.workers > 1:
            export(f"verified, {args.workers} processes here", workers=args.workers)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    cpu = {k: c for k, (_s, c) in results.items()}
    wall = {k: s for k, (s, _c) in results.items()}
    one = "verified, 1 process"
    ratio = cpu["read"] / cpu[one]
    parser = cpu["read"] / cpu[PARSER]
    peer = cpu[PARSER] / cpu[one]
    rest = cpu[one] - cpu[PARSER]
    cli_name = "eyrie export specforge-online"
    ms = {k: 1e3 * v / n for k, v in cpu.items()}
    print(f"per sample (CPU): reading {ms['read']:.3f} ms, SpecForge's parser {ms[PARSER]:.2f} ms, "
          f"the verified export {ms[one]:.2f} ms, the CLI's process tree {ms[cli_name]:.2f} ms")
    if parts:
        print(f"inside SpecForge's parser, per sample ({args.breakdown:,} texts, interleaved): "
              f"{parts['parser']:.2f} ms = "
              f"the tokenizer's own encode of the 3 strings it tokenizes per row {parts['tokenizer']:.2f} ms "
              f"({parts['tokenizer'] / parts['parser']:.0%}) + transformers' wrappers {parts['transformers']:.2f} ms "
              f"+ SpecForge's Python {parts['specforge']:.2f} ms")
    print(f"verified export (1 process) vs reading the samples alone (CPU): ratio {ratio:.4f} (target >= {TARGET}) -> "
          f"{'OK' if ratio >= TARGET else 'BELOW TARGET'}; SpecForge's parser alone vs reading: {parser:.4f}")
    print(f"verified export vs SpecForge's parser alone on the same texts, passes one after the other (CPU): ratio "
          f"{peer:.3f}; the difference {rest:.1f} s CPU, {rest / cpu[one]:.1%} of the export (at a changing load the "
          "two passes' CPU seconds are not alike: the split within one pass below is the measure)")
    for name, doc in accounts.items():  # the export's own account of its processes' CPU (one pass: one load)
        total, parsed = doc["cpuSeconds"], doc["parserCpuSeconds"]
        print(f"eyrie's share of {name} (its own account, one pass): {total - parsed:.1f} s of {total:.1f} s CPU "
              f"({(total - parsed) / total:.1%}: reading, decoding, comparing, writing, start-up, loading the "
              f"tokenizers); inside SpecForge's parser {parsed:.1f} s ({1e3 * parsed / n:.2f} ms per sample)")
    print(f"the CLI (whole process, its default processes) vs reading alone: wall {wall['read'] / wall[cli_name]:.4f}, "
          f"CPU {cpu['read'] / cpu[cli_name]:.4f}; vs the export in one process here: wall "
          f"{wall[one] / wall[cli_name]:.2f}x as fast")
    share = {k: (d["cpuSeconds"] - d["parserCpuSeconds"]) / d["cpuSeconds"] for k, d in accounts.items()}
    print(f"RESULT specforge_online ratio={ratio:.4f} target>={TARGET} {'PASS' if ratio >= TARGET else 'MISS'} "
          f"parser_vs_read={parser:.4f} eyrie_share={max(share.values()):.3f} vs_parser_alone={peer:.3f} "
          f"cli_wall_vs_read={wall['read'] / wall[cli_name]:.4f}")


if __name__ == "__main__":
    main()
