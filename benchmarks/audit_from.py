"""`eyrie audit --from FILE` throughput on recorded rows against the reader's own rate.

The file holds N rows in the shape the team behind eyrie's question had: a glaive prompt (functions
as text in the system prompt: one of 2,000 sets of 1-3 of 200 functions) with the provider's `content`, `reasoning` and
`usage`, the content calling in every text format eyrie reads (glaive, Hermes, Kimi, DeepSeek, bare
and fenced JSON, two calls, invalid and undeclared calls, prose, no call).

- peer (the ceiling): eyrie's own source reader, `sources.iter_source`, reading the same rows as a
  glaive source in one process: decode each line and parse the prompt, nothing else.
- eyrie: `eyrie audit --from FILE` as a user runs it, a process of its own (start-up and imports
  included): every row read, its declarations parsed, its text calls found and validated, the
  figures with their intervals computed and printed. Also printed: the analysis in this process.

Checking an answer costs several times what reading its row does, so `--from` checks a large file
in one process per core (generate/audit/from_recorded.py); the ratio therefore depends on the cores, and on
what else runs on them (a shared machine's load takes the cores the checking processes would use).
Also printed: the CPU time a row costs each, which the load changes far less, and where a row's
CPU goes: each step `--from` takes with a row, timed alone in this process on rows already in
memory, the figures computed over all the rows, the start-up's imports, and what is left of the
command's CPU (reading the file, handing rows to the checking processes and their tallies back,
and the steps' cost together beyond their costs alone: caches a lone step keeps warm).
Target: ratio >= 0.8.

Run: python benchmarks/audit_from.py [--rows N]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

import orjson
from _common import eyrie_python

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fake_openrouter import TEXT_ANSWERS
from tool_validation import best_of

from eyrie.jobs import sources
from eyrie.jobs.api import reported_cost
from eyrie.jobs.generate.audit import stats
from eyrie.jobs.generate.audit.from_recorded import analyse_recorded, workers_for
from eyrie.jobs.generate.audit.recorded import iter_lines, parse_line
from eyrie.jobs.generate.audit.run import declarations_of
from eyrie.jobs.generate.budget.pricing import Pricing, actual_cost
from eyrie.jobs.sources import iter_source
from eyrie.jobs.spec import SourceSpec
from eyrie.jobs.tools import checks

TARGET = 0.8
STAGE_ROWS = 10_000  # rows the step-by-step breakdown times (in memory, this process)
STEPS = ("decode + prompt (the reader's own work)", "the answer read (parse_line's rest)", "sample id",
         "declarations looked up (cached per set)", "priced", "checked (text calls found, validated)", "its fact made")
SETS = 2000  # distinct function sets the rows' system prompts declare (a dataset reuses its functions)
PREAMBLE = "SYSTEM: You are a helpful assistant with access to the following functions. Use them if required -\n"


def write_rows(path: Path, n: int, seed: int = 0) -> None:
    r = random.Random(seed)
    fns = []
    for i in range(200):
        props = {f"p{j}": {"type": r.choice(["string", "number", "integer"]), "description": f"parameter {j}"}
                 for j in range(r.randint(1, 5))}
        fns.append({"name": f"func_{i}", "description": f"Function {i}: does one thing well",
                    "parameters": {"type": "object", "properties": props, "required": list(props)[:1]}})
    cases = list(TEXT_ANSWERS)
    toolsets = [r.sample(fns, r.randint(1, 3)) for _ in range(SETS)]
    with path.open("wb") as out:
        for k in range(n):
            fs = r.choice(toolsets)
            f = fs[0]
            args = {p: ("x" if v["type"] == "string" else 3) for p, v in f["parameters"]["properties"].items()}
            content = (TEXT_ANSWERS[r.choice(cases)].replace("get_weather", f["name"])
                       .replace('{"city": "Paris"}', orjson.dumps(args).decode())
                       .replace('{\\"city\\": \\"Paris\\"}', orjson.dumps(orjson.dumps(args).decode()).decode()[1:-1]))
            usage = {"prompt_tokens": 600 + k % 300, "completion_tokens": 40 + k % 200}
            if k % 10:
                usage["cost"] = round(usage["prompt_tokens"] * 6e-7 + usage["completion_tokens"] * 2.5e-6, 9)
            row = {"system": PREAMBLE + "\n".join(orjson.dumps(x, option=orjson.OPT_INDENT_2).decode() for x in fs),
                   "chat": f"USER: question {k}: please use {f['name']}\n\n\nASSISTANT: ok <|endoftext|>",
                   "content": content, "reasoning": f"The user wants {f['name']}. " * 5, "usage": usage}
            out.write(orjson.dumps(row) + b"\n")


def reader_rate(path: Path, repeats: int = 2) -> tuple[float, float]:
    """(rows/s, CPU seconds a row): the better of `repeats` passes."""
    src = SourceSpec(name="recorded", uri=str(path), format="glaive")
    best, cpu = 0.0, float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        n = sum(1 for _ in iter_source(src))
        best = max(best, n / (time.perf_counter() - t0))
        cpu = min(cpu, (time.process_time() - c0) / n)
    return best, cpu


def step_costs(path: Path, rows: int = STAGE_ROWS, repeats: int = 3) -> list[float]:
    """CPU us a row of each of STEPS (the calls `generate/audit_from._add` makes), each timed alone
    over `rows` rows held in memory, on the inputs the step before it made: best of `repeats`."""
    lines = [item[1] for item, _ in zip(iter_lines(path), range(rows), strict=False)]
    pricing = Pricing(Decimal("0.60"), Decimal("2.50"))
    name = path.name
    read = [parse_line(line, name, i) for i, line in enumerate(lines, 1)]
    got = [declarations_of(r.prompt, r.mode) for r in read]
    costs = [actual_cost(pricing, r.usage, reported_cost(r.usage)) for r in read]
    found = [checks.check_response(g.prepared, r.response, g.validator) for g, r in zip(got, read, strict=True)]
    sids = [r.prompt.sample_id() for r in read]
    steps = [
        lambda: [sources.prompt_from_row(name, "glaive", i, sources.decode_line(line)) for i, line in enumerate(lines)],
        lambda: [parse_line(line, name, i) for i, line in enumerate(lines, 1)],
        lambda: [r.prompt.sample_id() for r in read],
        lambda: [declarations_of(r.prompt, r.mode) for r in read],
        lambda: [actual_cost(pricing, r.usage, reported_cost(r.usage)) for r in read],
        lambda: [checks.check_response(g.prepared, r.response, g.validator) for g, r in zip(got, read, strict=True)],
        lambda: [stats.fact_from_check(sid, r.prompt.source, r.mode, c, g.names, r.usage,
                                             float(cost) if cost is not None else None)
                 for sid, r, c, g, cost in zip(sids, read, found, got, costs, strict=True)],
    ]
    best = [1e6 * t / len(lines) for t, _ in best_of(steps, repeats, time.process_time)]
    best[1] -= best[0]  # parse_line reads the prompt as the reader does, then the answer
    return best


def import_cpu() -> float:
    """CPU seconds of the command's imports (a process that only imports what `eyrie audit` does)."""
    before = children_cpu()
    subprocess.run([eyrie_python(), "-c", "import eyrie.jobs.cli.run, eyrie.jobs.generate.audit.from_recorded"],
                   check=True)
    return children_cpu() - before


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "recorded.jsonl"
        write_rows(path, args.rows)
        size = path.stat().st_size
        workers = workers_for(path)
        peer, peer_cpu = reader_rate(path)
        t0, c0 = time.perf_counter(), children_cpu()
        p = subprocess.run([eyrie_python(), "-m", "eyrie.jobs.cli", "audit", "--from", str(path)], cwd=d,
                           capture_output=True, text=True, env={**os.environ, "COLUMNS": "160"})
        wall, cpu = time.perf_counter() - t0, (children_cpu() - c0) / args.rows
        if p.returncode != 0:
            raise SystemExit(f"eyrie audit --from failed ({p.returncode}): {p.stderr[-2000:]}")
        assert "recorded in recorded.jsonl" in " ".join(p.stdout.split()), p.stdout[-2000:]
        t0 = time.perf_counter()
        tally = analyse_recorded(path, Pricing(Decimal("0.60"), Decimal("2.50")))
        inproc = tally.rows / (time.perf_counter() - t0)
        assert tally.rows == args.rows and tally.bad_rows == 0, (tally.rows, tally.bad_rows)
        c0 = time.process_time()
        judged = sum(1 for f in tally.facts if f.status != "unparsable")
        stats.summarize(tally.facts, {"prompts": tally.rows, "declaredPrompts": judged})
        figures = 1e6 * (time.process_time() - c0) / tally.rows
        steps = step_costs(path, min(STAGE_ROWS, args.rows))
        imports = import_cpu()
    ours = args.rows / wall
    ratio = ours / peer
    print(f"rows: {args.rows:,} ({size / 2**20:.0f} MiB), checked by {workers} processes")
    print(f"peer: sources.iter_source reading them as a glaive source: {peer:,.0f} rows/s")
    print(f"eyrie audit --from (whole process, start-up included): {wall:.1f} s, {ours:,.0f} rows/s")
    print(f"analyse_recorded in this process (no start-up): {inproc:,.0f} rows/s")
    print(f"CPU a row (all its processes, start-up included): eyrie audit --from {1e6 * cpu:.0f} us, "
          f"the reader {1e6 * peer_cpu:.0f} us ({cpu / peer_cpu:.1f}x); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    per_row = 1e6 * cpu
    startup = 1e6 * imports / args.rows
    left = per_row - sum(steps) - figures - startup
    print(f"where a row's CPU goes (each step timed alone in this process on {min(STAGE_ROWS, args.rows):,} rows "
          f"in memory, best of 3; the figures over all {args.rows:,}):")
    for name, us in zip(STEPS, steps, strict=True):
        print(f"  {name:44s} {us:6.1f} us")
    print(f"  {'the figures and intervals (summarize)':44s} {figures:6.1f} us")
    print(f"  {'start-up imports':44s} {startup:6.1f} us ({imports:.2f} s at {args.rows:,} rows)")
    print(f"  {'the rest (file, hand-off, merging, the steps together)':44s} {left:6.1f} us")
    reader_us = 1e6 * peer_cpu
    print(f"  checking alone is {steps[5]:.1f} us, {steps[5] / reader_us:.1f}x the reader's whole {reader_us:.0f} us; "
          f"on {os.cpu_count()} cores {TARGET} needs everything within {os.cpu_count() / TARGET:.1f}x it")
    ok = ratio >= TARGET
    print(f"ratio eyrie/peer: {ratio:.2f}  (target >= {TARGET})  {'OK' if ok else 'MISSED'}")
    print(f"RESULT audit_from ratio={ratio:.2f} target>={TARGET} processes={workers} {'PASS' if ok else 'MISS'}")


if __name__ == "__main__":
    main()
