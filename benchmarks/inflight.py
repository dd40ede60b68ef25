"""2,000 concurrent requests at 2 s simulated latency on one worker: achieved requests/s against
the 1,000/s that concurrency allows (target >= 0.85), and the worker's peak RSS (target < 600 MB)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import bare_aiohttp, eyrie_run, peak_rss_mb

from eyrie.jobs.generate.sending.actor import run_loop
from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess

TARGET_RATIO, TARGET_RSS_MB = 0.85, 600


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--concurrency", type=int, default=2000)
    ap.add_argument("--latency-s", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=5, help="requests = concurrency x rounds")
    args = ap.parse_args()
    n = args.concurrency * args.rounds
    allowed = args.concurrency / args.latency_s
    with SimulatorProcess(SimulatorConfig(latency_ms=args.latency_s * 1000)) as sim:
        rps, cpu = run_loop(eyrie_run(sim.base_url, n, args.concurrency, stream=True))
        rss = peak_rss_mb()  # the worker's own peak, before the bare loop runs in this process
        bare, bare_cpu = run_loop(bare_aiohttp(sim.base_url, n, args.concurrency))
    ratio = rps / allowed
    print(f"inflight: {n} requests, concurrency {args.concurrency}, latency {args.latency_s}s")
    print(f"  achieved {rps:.1f} req/s of {allowed:.0f} allowed: ratio {ratio:.2f} (target >= {TARGET_RATIO})")
    print(f"  worker peak RSS {rss:.0f} MB (target < {TARGET_RSS_MB})")
    print(f"  for scale, a bare raw-aiohttp loop on this machine: {bare:.1f} req/s ({bare / allowed:.2f} of "
          f"allowed); CPU per request eyrie {cpu * 1e6:.0f} us, bare {bare_cpu * 1e6:.0f} us")
    ok = ratio >= TARGET_RATIO and rss < TARGET_RSS_MB
    print(f"RESULT inflight ratio={ratio:.2f} rss_mb={rss:.0f} bare_aiohttp_ratio={bare / allowed:.2f} "
          f"{'PASS' if ok else 'MISS'}")


if __name__ == "__main__":
    main()
