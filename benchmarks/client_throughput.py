"""eyrie's full per-request path on one worker vs a bare httpx loop (the ceiling). Target >= 0.7.

The simulator runs at zero latency in its own process, so the figure is the client's own cost:
send, parse, account (reserve + settle), check tools, persist parts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import bare_httpx, eyrie_run

from eyrie.jobs.generate.sending.actor import run_loop
from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess

TARGET = 0.7


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    with SimulatorProcess(SimulatorConfig(latency_ms=0)) as sim:
        run_loop(bare_httpx(sim.base_url, 200, args.concurrency))  # warm both sides
        plain, plain_cpu = run_loop(bare_httpx(sim.base_url, args.requests, args.concurrency))
        same, same_cpu = run_loop(bare_httpx(sim.base_url, args.requests, args.concurrency, True))
        ours, ours_cpu = run_loop(eyrie_run(sim.base_url, args.requests, args.concurrency, stream=False))
        sse, sse_cpu = run_loop(eyrie_run(sim.base_url, args.requests, args.concurrency, stream=True))
    # every loop runs on the same event loop implementation (uvloop where available)
    ceiling, ceiling_cpu = max((plain, plain_cpu), (same, same_cpu))
    ratio = ours / ceiling
    cpu_ratio = ceiling_cpu / ours_cpu
    us = 1e6
    print(f"client_throughput: {args.requests} requests at concurrency {args.concurrency}")
    print(f"  bare httpx loop:                    {plain:8.1f} req/s  {plain_cpu * us:7.0f} us CPU/req")
    print(f"  bare httpx loop, aiohttp transport: {same:8.1f} req/s  {same_cpu * us:7.0f} us CPU/req")
    print(f"  eyrie full path (JSON):             {ours:8.1f} req/s  {ours_cpu * us:7.0f} us CPU/req")
    print(f"  eyrie full path (SSE):              {sse:8.1f} req/s  {sse_cpu * us:7.0f} us CPU/req")
    print(f"  ceiling = the faster bare loop; ratio by req/s {ratio:.2f}, by CPU/req {cpu_ratio:.2f} "
          f"(target >= {TARGET})")
    print(f"RESULT client_throughput ratio={ratio:.2f} cpu_ratio={cpu_ratio:.2f} target>={TARGET} "
          f"{'PASS' if ratio >= TARGET else 'MISS'}")

if __name__ == "__main__":
    main()
