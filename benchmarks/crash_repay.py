"""What a crash costs: `eyrie run` (local Ray, the default) SIGKILLed with its whole process tree
at a random moment, then run again, ten times; then once more to the end. For each kill: the
answers the provider billed that the store does not hold (they are bought again by the rerun)
against the requests in flight at the kill (the client's slots: billed-not-durable answers plus
requests the provider had not answered). Target: never above it (answers durable before their
slot is freed), and never above maxConcurrency; every prompt persisted exactly once at the end.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import contextlib

from _common import children_of, cli_spec, run_eyrie, start_eyrie, write_prompt_file

from eyrie.jobs.contract import records
from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess
from eyrie.jobs.store import FileStore


def kill_tree(proc) -> None:
    pids = [proc.pid, *children_of(proc.pid)]
    os.killpg(proc.pid, signal.SIGKILL)
    for p in pids:  # anything that left the session (Ray's raylet, GCS)
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    proc.wait(timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--latency-ms", type=int, default=100)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--inline", action="store_true", help="EYRIE_NO_RAY=1 instead of local Ray")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    n, c = args.requests, args.concurrency
    rows = []
    with SimulatorProcess(SimulatorConfig(latency_ms=args.latency_ms)) as sim, tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        spec = cli_spec(Path(tmp) / "spec.yaml", write_prompt_file(Path(tmp) / "p.jsonl", n), out, sim.base_url, c,
                        workers=2)
        store = FileStore(out)
        gap = 0  # answers billed that no record holds: the re-paid ones, cumulative
        for k in range(args.kills):
            before = sim.stats()["completed"]
            ray_tmp = tempfile.mkdtemp(prefix="rc", dir="/tmp")
            proc = start_eyrie(spec, ray=not args.inline, ray_tmp=ray_tmp)
            try:
                deadline = time.time() + 120
                while sim.stats()["completed"] == before:  # answers are flowing
                    assert time.time() < deadline and proc.poll() is None, proc.stderr.read()[-2000:]
                    time.sleep(0.02)
                time.sleep(rng.uniform(0, 3))
                at_kill = sim.stats()
                kill_tree(proc)
            finally:
                shutil.rmtree(ray_tmp, ignore_errors=True)
            time.sleep(args.latency_ms / 1000 * 2)  # the provider finishes (and bills) what it had
            billed = sim.stats()["completed"]
            held = len(list(records.iter_records(store)))
            # in flight at the kill: answers billed then that no record holds, and requests the
            # provider was still answering (it bills those too once it answers a client now dead)
            in_flight = at_kill["completed"] - held - gap + at_kill["inFlight"]
            repaid, gap = billed - held - gap, billed - held
            rows.append((k, billed - before, repaid, in_flight))
            print(f"  kill {k + 1}: {billed - before:5d} answers billed this run, {repaid:3d} not in the store "
                  f"(re-paid by the rerun), {in_flight:3d} requests in flight at the kill")
        _wall, prog = run_eyrie(spec, ray=not args.inline)
        stats = sim.stats()
        ids = Counter(r["sample_id"] for r in records.iter_records(store))
    assert prog["outcome"] == "Done" and len(ids) == n and max(ids.values()) == 1, prog
    worst = max(rows, key=lambda r: r[2])
    over = [r for r in rows if r[2] > r[3] or r[2] > c]
    total_repaid = stats["completed"] - n
    print(f"crash_repay: {n} prompts, {args.kills} kills of `eyrie run` ({'inline' if args.inline else 'local Ray'}), "
          f"maxConcurrency {c}, provider latency {args.latency_ms} ms, {os.cpu_count()} cores")
    print(f"  max re-paid at one kill: {worst[2]} (in flight then: {worst[3]}; maxConcurrency {c}); "
          f"re-paid in all {total_repaid} over {args.kills} kills; every prompt persisted once")
    print(f"  target: re-paid <= in flight at every kill: {'met' if not over else f'missed at {len(over)} kills'}")
    print(f"RESULT crash_repay max_repaid={worst[2]} in_flight_then={worst[3]} max_concurrency={c} "
          f"total_repaid={total_repaid} kills={args.kills} target=repaid<=in_flight {'PASS' if not over else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
