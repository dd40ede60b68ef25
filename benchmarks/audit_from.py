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
in one process per core (generate/audit_from.py); the ratio therefore depends on the cores, and on
what else runs on them (a shared machine's load takes the cores the checking processes would use).
Also printed: the CPU time a row costs each, which the load changes far less.
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
from fake_provider import TEXT_ANSWERS

from eyrie.jobs.generate.audit_from import analyse_recorded, workers_for
from eyrie.jobs.generate.budget import Pricing
from eyrie.jobs.sources import iter_source
from eyrie.jobs.spec import SourceSpec

TARGET = 0.8
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
    ours = args.rows / wall
    ratio = ours / peer
    print(f"rows: {args.rows:,} ({size / 2**20:.0f} MiB), checked by {workers} processes")
    print(f"peer: sources.iter_source reading them as a glaive source: {peer:,.0f} rows/s")
    print(f"eyrie audit --from (whole process, start-up included): {wall:.1f} s, {ours:,.0f} rows/s")
    print(f"analyse_recorded in this process (no start-up): {inproc:,.0f} rows/s")
    print(f"CPU a row (all its processes, start-up included): eyrie audit --from {1e6 * cpu:.0f} us, "
          f"the reader {1e6 * peer_cpu:.0f} us ({cpu / peer_cpu:.1f}x); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    ok = ratio >= TARGET
    print(f"ratio eyrie/peer: {ratio:.2f}  (target >= {TARGET})  {'OK' if ok else 'MISSED'}")
    print(f"RESULT audit_from ratio={ratio:.2f} target>={TARGET} processes={workers} {'PASS' if ok else 'MISS'}")


if __name__ == "__main__":
    main()
