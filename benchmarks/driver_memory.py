"""Memory flat in dataset size: `eyrie run` (local Ray, the default) on 20,000 and on 200,000
prompts, simulator at zero latency; the peak resident set (VmHWM, sampled while they live) of the
driver process and of the shard worker processes. Target: each grows by less than 50 MB from the
small run to the large one (shards read their own rows; a worker holds O(concurrency) prompts).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import children_of, cli_spec, cmdline, peak_rss_of, start_eyrie, write_prompt_file

from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess

TARGET_MB = 50.0


def measure(n: int, concurrency: int, tmp: Path, base_url: str) -> tuple[float, float, float]:
    """(driver peak MB, largest worker peak MB, seconds) of one run of n prompts."""
    spec = cli_spec(tmp / f"spec-{n}.yaml", write_prompt_file(tmp / f"p-{n}.jsonl", n), tmp / f"out-{n}",
                    base_url, concurrency, workers=2)
    ray_tmp = tempfile.mkdtemp(prefix="rm", dir="/tmp")
    driver = worker = 0.0
    t0 = time.perf_counter()
    try:
        proc = start_eyrie(spec, ray_tmp=ray_tmp)
        while proc.poll() is None:
            driver = max(driver, peak_rss_of(proc.pid))
            for pid in children_of(proc.pid):
                if cmdline(pid).startswith("ray::ShardWorker"):
                    worker = max(worker, peak_rss_of(pid))
            time.sleep(0.25)
        if proc.returncode != 0:
            raise RuntimeError(f"eyrie run exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return driver, worker, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, default=20_000)
    ap.add_argument("--large", type=int, default=200_000)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    with SimulatorProcess(SimulatorConfig(latency_ms=0)) as sim, tempfile.TemporaryDirectory() as tmp:
        small = measure(args.small, args.concurrency, Path(tmp), sim.base_url)
        large = measure(args.large, args.concurrency, Path(tmp), sim.base_url)
    d_growth, w_growth = large[0] - small[0], large[1] - small[1]
    print(f"driver_memory: `eyrie run` (local Ray, 2 workers), concurrency {args.concurrency}, {os.cpu_count()} cores")
    for n, (d, w, s) in ((args.small, small), (args.large, large)):
        print(f"  {n:8d} prompts: driver peak {d:6.0f} MB, worker peak {w:6.0f} MB ({s:.0f} s)")
    print(f"  growth: driver {d_growth:+.0f} MB, worker {w_growth:+.0f} MB (target < {TARGET_MB:.0f} MB each)")
    ok = d_growth < TARGET_MB and w_growth < TARGET_MB
    print(f"RESULT driver_memory driver_small={small[0]:.0f}MB driver_large={large[0]:.0f}MB "
          f"worker_small={small[1]:.0f}MB worker_large={large[1]:.0f}MB driver_growth={d_growth:+.0f}MB "
          f"worker_growth={w_growth:+.0f}MB target<{TARGET_MB:.0f}MB {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
