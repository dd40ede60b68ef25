"""`eyrie pilot SPEC`: the pilot alone (the operator's pilot Job runs it): arguments in, the verdict out, the
exit code saying whether the run may go on (the work is jobs/pilot/)."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from eyrie.jobs.contract.pilot import EXIT_FAILED
from eyrie.jobs.contract.progress import Outcome
from eyrie.jobs.errors import InputError


def pilot_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="eyrie pilot",
        description="The pilot of a spec with spec.pilot: buys its answers (paid from budget.maxUSD, never twice), "
        "extracts them, trains one small EAGLE-3 drafter per option with SpecForge's code and compares their "
        "accepted tokens per step on the target's own structured answers held out. Writes pilot.json and "
        "evaluation.json to the output. Exit 0: the run may go on; 10: policy require and the run's own data is "
        "worse (the run is to be suspended); 2: the spec cannot be piloted; 3/5/6/1 as `eyrie run`.")
    ap.add_argument("spec", help="YAML file with a DatasetGeneration (or just its spec) with spec.pilot")
    ap.add_argument("--device", help="where the drafters train: cpu, or cuda (default: extraction.device, else "
                    "cuda where there is one)")
    args = ap.parse_args(argv)
    from eyrie.jobs.cli.run import EXIT_CODES
    from eyrie.jobs.context import RunContext
    from eyrie.jobs.pilot.run import run_pilot
    from eyrie.jobs.pipeline import provider
    from eyrie.jobs.report.terminal import print_verdict
    from eyrie.jobs.spec import load_spec

    dg = load_spec(args.spec)
    if dg.spec.pilot is None:
        raise InputError(f"{args.spec}: spec.pilot is not set: nothing to pilot")
    err = Console(stderr=True)
    with provider(dg.spec) as base_url:
        result = run_pilot(dg, RunContext.from_env(), base_url, device=args.device,
                           notify=lambda m: err.print(f"eyrie: {m}", markup=False))
    if result.verdict is not None:
        if result.reused:
            print("eyrie: the pilot decided for this spec already (pilot.json): nothing bought or trained",
                  file=sys.stderr)
        print_verdict(result.verdict, err)
    else:
        print(f"eyrie pilot: stopped before a verdict: {result.outcome}: {result.message}", file=sys.stderr)
    if result.outcome == Outcome.PILOT_FAILED:
        return EXIT_FAILED
    return EXIT_CODES.get(result.outcome, 1)
