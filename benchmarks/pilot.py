"""The pilot's speed and cost targets (issue 41), on the built-in target (examples/pilot.yaml: builtin:tiny-chat
behind the simulated provider, the run's own data in text mode, compared with structured):

1. `eyrie pilot SPEC` as a process (the pilot alone, as the operator's pilot Job runs it: buy both modes of the
   pilot's prompts, reconstruct and extract two slices, train and evaluate two drafters at the spec's budget):
   its CPU seconds (the process and what it reaped, user + system: the machine is shared, so wall time counts
   the neighbours) against the ceiling of 360 s (6 minutes of CPU);
2. the money: `eyrie run SPEC` after it (the pilot read back, its run's own answers kept) against `eyrie run`
   of the same spec without the pilot: what the pilot added to the run's spend, against what its answers cost
   (the ceiling: at most its own answers' cost; it should be the other mode's share of them).

Both runs with `policy: report` (the run goes on whatever the verdict), `eyrie run`'s defaults (local Ray).

Run: python benchmarks/pilot.py [--steps S] [--prompts N] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CEILING_CPU_S = 360.0


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def eyrie(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, float, float]:
    """An eyrie command as a process: the result, its CPU seconds (with its children), its wall seconds."""
    cpu0, t0 = _children_cpu(), time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", *args], cwd=cwd, capture_output=True, text=True,
                       timeout=3600, env={**os.environ})
    return r, _children_cpu() - cpu0, time.perf_counter() - t0


def write(work: Path, name: str, *, pilot: bool, steps: int | None, prompts: int | None) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "pilot.yaml").read_text())
    spec = doc["spec"]
    spec["sources"][0]["uri"] = str(ROOT / "examples" / spec["sources"][0]["uri"])
    spec["output"]["uri"] = str(work / name)
    if pilot:
        spec["pilot"]["policy"] = "report"
        if steps:
            spec["pilot"]["training"]["steps"] = steps
        if prompts:
            spec["pilot"].update(prompts=prompts, heldout=max(1, prompts // 5))
    else:
        del spec["pilot"]
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def progress(out: Path) -> dict:
    return json.loads((out / "progress.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, help="training steps per drafter (default: the example's)")
    ap.add_argument("--prompts", type=int, help="pilot prompts (default: the example's)")
    ap.add_argument("--work", type=Path, help="where the outputs go (default: a temporary folder, removed)")
    args = ap.parse_args()
    work = (args.work or Path(tempfile.mkdtemp(prefix="eyrie-pilot-bench-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        with_pilot = write(work, "with-pilot", pilot=True, steps=args.steps, prompts=args.prompts)
        without = write(work, "without-pilot", pilot=False, steps=None, prompts=None)
        r, cpu, wall = eyrie(["pilot", str(with_pilot)], work)
        if r.returncode != 0:
            print(r.stderr[-4000:])
            print("RESULT pilot error=eyrie-pilot-failed")
            return 1
        verdict = json.loads((work / "with-pilot" / "pilot.json").read_text())
        evaluation = json.loads((work / "with-pilot" / "evaluation.json").read_text())
        trained = ", ".join(f"{d['name']} {d['training']['seconds']:.0f} s" for d in evaluation["drafters"])
        print(f"eyrie pilot: CPU {cpu:.1f} s, wall {wall:.1f} s; {verdict['prompts']} prompts "
              f"({verdict['heldout']} held out), {len(evaluation['drafters'])} drafters of "
              f"{evaluation['settings']['steps']} steps ({trained} of training)")
        print(f"verdict: {verdict['sentence']}")
        runs = {}
        for name, path in (("with-pilot", with_pilot), ("without-pilot", without)):
            r, cpu_run, wall_run = eyrie(["run", str(path), "--no-progress"], work)
            if r.returncode != 0:
                print(r.stderr[-4000:])
                print(f"RESULT pilot error=eyrie-run-{name}-failed")
                return 1
            runs[name] = progress(work / name)
            print(f"eyrie run ({name}, local Ray): spent ${runs[name]['spentUSD']}, {runs[name]['samples']['done']} "
                  f"samples, CPU {cpu_run:.1f} s, wall {wall_run:.1f} s")
        spent_with, spent_without = (Decimal(runs[k]["spentUSD"]) for k in ("with-pilot", "without-pilot"))
        pilot_usd = Decimal(runs["with-pilot"].get("pilotUSD") or verdict["spentUSD"])
        added = spent_with - spent_without
        cpu_ok, money_ok = cpu <= CEILING_CPU_S, Decimal(0) <= added <= pilot_usd
        print(f"the pilot added ${added} to the run's spend; its answers cost ${pilot_usd} "
              f"(ratio {added / pilot_usd:.2f}: at most 1; the run kept {verdict['adopted']} of them)")
        print(f"pilot CPU {cpu:.1f} s against {CEILING_CPU_S:.0f} s: ratio {cpu / CEILING_CPU_S:.2f}")
        print(f"RESULT pilot cpu_s={cpu:.1f} ceiling_s={CEILING_CPU_S:.0f} cpu_ratio={cpu / CEILING_CPU_S:.2f} "
              f"added_usd={added} pilot_usd={pilot_usd} added_ratio={added / pilot_usd:.2f} "
              f"{'PASS' if cpu_ok and money_ok else 'MISS'}")
        return 0
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
