"""How far the cost forecast is from what the run then spends: `eyrie run` (local Ray, the default
path) against the simulator, prompts of 5 to 400 words whose answers vary in length, run to the end.
The forecast judged once the canary (`tools.gate.canarySamples`, 200 by default) is measured
(progress.json `forecast.atCanary`: spent + prompts left x mean cost per answer, and with the
90th-percentile cost) against the final `spentUSD`.

Two orders of the same prompts: shuffled (what the canary assumes: its answers are like the rest)
and sorted by length, short first (the canary sees only the cheapest prompts: how wrong a forecast
is when that assumption fails). Target, shuffled: the mean forecast within 5% of the spend, and the
p90 forecast not below it.

    python benchmarks/forecast.py [--prompts 3000] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from decimal import Decimal
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cli_spec, run_eyrie

from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess

TARGET = 0.05
WORDS = ["budget", "forecast", "weather", "river", "model", "token", "answer", "question", "city", "price"]


def prompt_rows(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 400))) + f" (question {i})"
            for i in range(n)]


def write(path: Path, texts: list[str]) -> Path:
    path.write_bytes(b"".join(orjson.dumps({"messages": [{"role": "user", "content": t}]}) + b"\n" for t in texts))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()
    texts = prompt_rows(args.prompts, args.seed)
    orders = {"shuffled": texts, "sorted short first": sorted(texts, key=len)}
    results = {}
    with SimulatorProcess(SimulatorConfig(latency_ms=0)) as sim, tempfile.TemporaryDirectory() as tmp:
        for k, (name, rows) in enumerate(orders.items()):
            out = Path(tmp) / f"out-{k}"
            spec = cli_spec(Path(tmp) / f"spec-{k}.yaml", write(Path(tmp) / f"p-{k}.jsonl", rows), out, sim.base_url,
                            args.concurrency, max_tokens=512)
            _wall, prog = run_eyrie(spec)
            assert prog["outcome"] == "Done" and prog["samples"]["done"] == args.prompts, prog
            at = prog["forecast"]["atCanary"]
            spent = Decimal(prog["spentUSD"])
            results[name] = (Decimal(at["meanUSD"]), Decimal(at["p90USD"]), spent, at["answers"])
    print(f"forecast: {args.prompts} prompts (5-400 words) through `eyrie run` (local Ray), concurrency "
          f"{args.concurrency}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    for name, (mean, p90, spent, answers) in results.items():
        print(f"  {name:>18}: forecast at the canary ({answers} answers) ${mean} (p90 ${p90}); spent ${spent}: "
              f"mean {100 * float(mean / spent - 1):+.2f}%, p90 {100 * float(p90 / spent - 1):+.2f}%")
    mean, p90, spent, _ = results["shuffled"]
    err = float(mean / spent - 1)
    ok = abs(err) <= TARGET and p90 >= spent
    sorted_err = float(results["sorted short first"][0] / results["sorted short first"][2] - 1)
    print(f"RESULT forecast mean_error={err:+.4f} p90_covers={p90 >= spent} sorted_mean_error={sorted_err:+.4f} "
          f"target=|mean_error|<={TARGET},p90>=spent {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
