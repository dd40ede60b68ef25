"""`eyrie evaluate`'s speed targets and the acceptance experiment's table (issue 34).

1. One drafter's evaluation at the quickstart's scale: `eyrie evaluate OUTPUT` (training, held-out
   evaluation, figures) on the quickstart's output, its CPU seconds (this process, user + system:
   the machine is shared, so wall time counts the neighbours) against the ceiling of 180 s.
2. With --against A B C: the experiment's drafters on the same budget (OUTPUT = dataset (a), tools
   structured, regenerated; then (b) tools as text, (c) the dataset's original answers, (d) the
   impostor), held out: OUTPUT's own answers; the table and the CPU seconds against 1,800 s.
3. --experiment N: the four datasets made first, by `eyrie run` (each a process; their CPU seconds
   printed apart from the evaluation's), from the same N distinct prompts (tests/acceptance_fixture.py:
   the tool-declaring conversations of builtin:tiny-chat's training distribution, each row the prompt,
   its tools and the recipe's own answer): (a) `structured`, (b) `text`, (c) `dataset` (the rows'
   own answers), (d) `impostor`; then evaluated as in 2 with (a) as OUTPUT. The held-out serving
   traffic is (a)'s own answers, left out of every drafter's training.

Run: python benchmarks/acceptance.py [OUTPUT] [--against OTHER ...] [--heldout N] [--steps S]
(OUTPUT default: examples/eyrie-out/quickstart, made by `eyrie run examples/quickstart.yaml`), or
python benchmarks/acceptance.py --experiment N [--heldout H] [--work DIR] [--steps S] [--repeats].
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

ONE_CEILING_S = 180.0
FOUR_CEILING_S = 1800.0
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # acceptance_fixture: the datasets


def _cpu(who: int = resource.RUSAGE_SELF) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def make_datasets(work: Path, n: int, unique: bool) -> dict[str, float]:
    """The four outputs under `work` (tests/acceptance_fixture.py); returns each run's CPU seconds (the
    `eyrie run` process and the children it reaped, as the kernel counts them)."""
    import acceptance_fixture as data

    data.write_prompts(work, n, unique)
    cpu: dict[str, float] = {}
    for name in data.DATASETS:
        before, t0 = _cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
        out = data.make(work, name)
        cpu[name] = _cpu(resource.RUSAGE_CHILDREN) - before
        done = json.loads((out / "progress.json").read_text())["samples"]
        print(f"  {name}: {done.get('done')} samples of {n} prompts, CPU {cpu[name]:.0f} s, wall "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    return cpu


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("output", nargs="?",
                    default=str(Path(__file__).resolve().parents[1] / "examples/eyrie-out/quickstart"))
    ap.add_argument("--against", nargs="*", default=[])
    ap.add_argument("--heldout", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--experiment", type=int, metavar="N", help="make the four datasets from N prompts first")
    ap.add_argument("--work", type=Path, default=Path("acceptance-experiment"),
                    help="with --experiment: where the datasets are made (default: ./acceptance-experiment)")
    ap.add_argument("--repeats", action="store_true", help="with --experiment: let a prompt come twice, as the "
                    "distribution draws it (default: every prompt once)")
    args = ap.parse_args()
    if args.experiment:
        made = make_datasets(args.work.resolve(), args.experiment, unique=not args.repeats)
        print(f"datasets: CPU {sum(made.values()):.0f} s ({', '.join(f'{k} {v:.0f}' for k, v in made.items())})")
        args.output = str(args.work.resolve() / "structured")
        args.against = [str(args.work.resolve() / d) for d in ("text", "dataset", "impostor")]

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
