"""`eyrie evaluate`'s speed targets and the acceptance experiment's table (issue 34).

1. One drafter's evaluation at the quickstart's scale: `eyrie evaluate OUTPUT` (training, held-out
   evaluation, figures) on the quickstart's output, its CPU seconds (this process, user + system:
   the machine is shared, so wall time counts the neighbours) against the ceiling of 180 s.
2. With --against A B C: the experiment's drafters on the same budget (OUTPUT = dataset (a), tools
   structured, regenerated; then (b) tools as text, (c) the dataset's original answers, (d) the
   impostor), held out: OUTPUT's own answers; the table and the CPU seconds against 1,800 s.

Run: python benchmarks/acceptance.py [OUTPUT] [--against OTHER ...] [--heldout N] [--steps S]
(OUTPUT default: examples/eyrie-out/quickstart, made by `eyrie run examples/quickstart.yaml`).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ONE_CEILING_S = 180.0
FOUR_CEILING_S = 1800.0


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("output", nargs="?",
                    default=str(Path(__file__).resolve().parents[1] / "examples/eyrie-out/quickstart"))
    ap.add_argument("--against", nargs="*", default=[])
    ap.add_argument("--heldout", type=int)
    ap.add_argument("--steps", type=int)
    args = ap.parse_args()

    from eyrie.jobs.cli.evaluate import table
    from eyrie.jobs.evaluate.drafter import TrainSettings
    from eyrie.jobs.evaluate.run import Request, run_evaluation

    settings = TrainSettings(**({"steps": args.steps} if args.steps else {}), seed=0)
    cpu0, wall0 = _cpu(), time.perf_counter()
    # a stored evaluation of the same inputs is read back (reused: True, seconds): remove
    # OUTPUT/evaluation.json to measure the training
    result = run_evaluation(Request(args.output, tuple(args.against), args.heldout, settings),
                            notify=lambda m: print(f"  {m}", flush=True))
    cpu, wall = _cpu() - cpu0, time.perf_counter() - wall0
    from rich.console import Console

    Console(width=180).print(table(result.doc))
    print(f"verdict: {result.doc['verdict']}")
    n = len(result.doc["drafters"])
    ceiling = ONE_CEILING_S if n == 1 else FOUR_CEILING_S
    print(f"drafters {n}, reused {result.reused}: CPU {cpu:.1f} s (wall {wall:.1f} s), ceiling {ceiling:.0f} s, "
          f"ratio {cpu / ceiling:.2f} ({'pass' if cpu <= ceiling else 'miss'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
