"""The default path's cost: `eyrie run` with its defaults (`generation.ray.mode: Local`, one worker) against the
same spec inline (`EYRIE_NO_RAY=1`), same prompts, same simulator at zero latency, same concurrency. The figure is
the whole process as a user runs it (wall time of `eyrie run`, start-up, planning, generation and the final
recount): ratio inline wall / default wall, target >= 0.8. Since issue 44 a local run's first worker works in the
driver's process and Ray starts only for a second worker, so the default (one worker) starts no Ray: the third
line is `eyrie run` with two workers (worker 0 here, worker 1 a Ray actor once Ray is up), the path that pays for
Ray. Beside each: the steady rate (requests/s between the 10th and 90th percentile of the records' start times,
start-up left out) and coordinator calls per request (from progress.json), target <= 0.05.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cli_spec, run_eyrie, steady_rate, write_prompt_file

from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess

TARGET, CALLS_TARGET = 0.8, 0.05


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    n, c = args.requests, args.concurrency
    figures = {}
    with SimulatorProcess(SimulatorConfig(latency_ms=0)) as sim, tempfile.TemporaryDirectory() as tmp:
        prompts = write_prompt_file(Path(tmp) / "p.jsonl", n)
        for path, ray, workers in (("inline", False, 1), ("ray", True, 1), ("ray2", True, 2)):
            out = Path(tmp) / f"out-{path}"
            wall, prog = run_eyrie(cli_spec(Path(tmp) / f"{path}.yaml", prompts, out, sim.base_url, c,
                                            workers=workers), ray=ray)
            assert prog["outcome"] == "Done" and prog["samples"]["done"] == n, prog
            figures[path] = (steady_rate(out), wall, prog.get("coordinatorCalls", 0) / max(1, prog["requests"]))
    (i_rate, i_wall, _), (r_rate, r_wall, r_calls) = figures["inline"], figures["ray"]
    t_rate, t_wall, t_calls = figures["ray2"]
    whole, steady = i_wall / r_wall, r_rate / i_rate
    print(f"ray_overhead: {n} requests at concurrency {c}, simulator at zero latency, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"  inline (EYRIE_NO_RAY=1):   whole process {i_wall:6.1f} s, {i_rate:8.0f} req/s steady")
    print(f"  eyrie run (its defaults):  whole process {r_wall:6.1f} s, {r_rate:8.0f} req/s steady, "
          f"{r_calls:.4f} coordinator calls per request (target <= {CALLS_TARGET})")
    print(f"  eyrie run, 2 workers (Ray): whole process {t_wall:5.1f} s, {t_rate:8.0f} req/s steady, "
          f"{t_calls:.4f} coordinator calls per request; inline/this {i_wall / t_wall:.2f}")
    print(f"  ratio inline/ray, whole process: {whole:.2f} (target >= {TARGET}); steady state ray/inline {steady:.2f}")
    ok = whole >= TARGET and r_calls <= CALLS_TARGET
    print(f"RESULT ray_overhead ratio={whole:.2f} steady_ratio={steady:.2f} ray_wall_s={r_wall:.1f} "
          f"inline_wall_s={i_wall:.1f} ray_rps={r_rate:.0f} inline_rps={i_rate:.0f} calls_per_request={r_calls:.4f} "
          f"two_workers_wall_s={t_wall:.1f} two_workers_ratio={i_wall / t_wall:.2f} "
          f"target=whole>={TARGET},calls<={CALLS_TARGET} {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
