"""Requests in flight at a real provider's scale: `eyrie run` as a user runs it (a process of its own, the spec's
defaults: local, one worker) with `api.maxConcurrency` = 10,000 against the simulator answering each request after
a latency drawn from 2 to 60 s (its config file's `latency`), then a bare aiohttp loop (a process of its own, the
same bodies, the same 10,000 allowed) against the same simulator, in the same run.

- occupancy: the simulator counts its open requests every 0.25 s; the figure is their mean over the steady part
  (from when the client has sent `allowed` requests until it sent its last one) over the allowed (target >= 0.95);
- RSS: the eyrie processes' resident memory together, at its peak (sampled every second; target < 1 GB);
- CPU per request: the client processes' CPU over the steady part, per answer the simulator completed meanwhile,
  eyrie beside the bare loop (target <= 2x); each process's whole-run CPU per request is printed beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import children_of, cli_spec, eyrie_python, spec_for, status_mb, write_prompt_file

from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess, read_behaviour

TARGET_OCCUPANCY, TARGET_RSS_MB, TARGET_CPU_RATIO = 0.95, 1024, 2.0
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of a live process, seconds (0 when gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


class Watch:
    """A client process tree while it runs: its CPU (summed over the tree) each second, its RSS together at peak."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.samples: list[tuple[float, float]] = []  # (monotonic, tree CPU seconds so far)
        self.peak_rss = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        seen: dict[int, float] = {}
        while self.proc.poll() is None:
            pids = [self.proc.pid, *children_of(self.proc.pid)]
            for p in pids:
                seen[p] = max(seen.get(p, 0.0), cpu_s(p))
            self.samples.append((time.monotonic(), sum(seen.values())))
            self.peak_rss = max(self.peak_rss, sum(status_mb(p, "VmRSS") for p in pids))
            time.sleep(1.0)

    def cpu_between(self, t0: float, t1: float) -> float:
        def at(t: float) -> float:
            before = [c for s, c in self.samples if s <= t]
            return before[-1] if before else 0.0
        return at(t1) - at(t0)


def steady(occupancy: list[list[float]], allowed: int, total: int) -> tuple[float, float, int]:
    """(start, end, answers completed between): from the sample where `allowed` requests had been received to the
    first where all `total` had (simulator seconds)."""
    start = next((s for s in occupancy if s[2] >= allowed), None)
    end = next((s for s in occupancy if s[2] >= total), occupancy[-1] if occupancy else None)
    if start is None or end is None or end[0] <= start[0]:
        raise RuntimeError("the client never had `allowed` requests out: no steady part to measure")
    return start[0], end[0], end[3] - start[3]


def measure(name: str, cmd: list[str], env: dict[str, str], sim: SimulatorProcess, allowed: int,
            total: int) -> dict[str, float]:
    import httpx

    httpx.post(sim.base_url.removesuffix("/v1") + "/sim/reset", timeout=30)
    t0, c0 = time.monotonic(), os.times()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    watch = Watch(proc)
    _, err = proc.communicate()
    wall = time.monotonic() - t0
    c1 = os.times()
    whole_cpu = (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} exited {proc.returncode}: {err[-2000:]}")
    stats = sim.stats()
    t_sim0 = stats["startedMonotonic"]  # the simulator's clock is this machine's monotonic clock too
    occ = stats["occupancy"]
    start, end, answered = steady(occ, allowed, total)
    inside = [s[1] for s in occ if start <= s[0] <= end]
    cpu = watch.cpu_between(t_sim0 + start, t_sim0 + end)
    return {"occupancy": statistics.fmean(inside) / allowed, "min_open": min(inside), "steady_s": end - start,
            "cpu_us": cpu / max(1, answered) * 1e6, "whole_cpu_us": whole_cpu / total * 1e6, "rss_mb": watch.peak_rss,
            "wall_s": wall, "completed": stats["completed"]}


async def bare_loop(base_url: str, prompts: Path, concurrency: int) -> None:
    """The leanest client: raw aiohttp posting the bodies eyrie builds for the same prompts, parsing the JSON."""
    import aiohttp

    from eyrie.jobs.api.client import raise_open_files
    from eyrie.jobs.generate.sending.requests import build_body

    raise_open_files(concurrency)
    spec = spec_for(base_url, concurrency, False)
    rows = [orjson.loads(line) for line in prompts.read_bytes().splitlines()]
    sem = asyncio.Semaphore(concurrency)
    url = base_url + "/chat/completions"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency + 1)) as session:
        async def one(row: dict) -> None:
            async with sem:
                body = orjson.dumps({**build_body(spec, row["messages"], None), "stream": False})
                async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
                    orjson.loads(await r.read())

        await asyncio.gather(*(one(r) for r in rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=10_000, help="api.maxConcurrency (and the bare loop's)")
    ap.add_argument("--requests", type=int, default=40_000)
    ap.add_argument("--latency", default="2-60", help="MIN-MAX seconds, drawn uniformly per request")
    ap.add_argument("--workers", type=int, default=1, help="generation.ray.workers (default: the spec's default)")
    ap.add_argument("--bare", nargs=2, metavar=("URL", "PROMPTS"), help=argparse.SUPPRESS)  # the bare loop's process
    args = ap.parse_args()
    if args.bare:
        from eyrie.jobs.generate.sending.actor import run_loop

        run_loop(bare_loop(args.bare[0], Path(args.bare[1]), args.concurrency))
        return 0
    lo, hi = (float(x) for x in args.latency.split("-"))
    n, c = args.requests, args.concurrency
    with tempfile.TemporaryDirectory() as tmp:
        behaviour = Path(tmp) / "simulator.yaml"
        behaviour.write_text(yaml.safe_dump({"latency": {"minSeconds": lo, "maxSeconds": hi}}))
        cfg = SimulatorConfig().with_behaviour(read_behaviour(behaviour))
        prompts = write_prompt_file(Path(tmp) / "p.jsonl", n)
        env = {**os.environ, "EYRIE_API_KEY": "sk-bench", "RAY_TMPDIR": tempfile.mkdtemp(prefix="rb", dir="/tmp")}
        env.pop("RAY_ADDRESS", None)
        env.pop("EYRIE_NO_RAY", None)
        with SimulatorProcess(cfg, startup_timeout=60) as sim:
            spec = cli_spec(Path(tmp) / "s.yaml", prompts, Path(tmp) / "out", sim.base_url, c, workers=args.workers,
                            shards=max(8, args.workers))
            eyrie = measure("eyrie run", [eyrie_python(), "-m", "eyrie.jobs.cli", "run", str(spec), "--no-progress"],
                            env, sim, c, n)
            bare = measure("the bare loop", [sys.executable, __file__, "--concurrency", str(c), "--bare",
                                             sim.base_url, str(prompts)], env, sim, c, n)
    ratio = eyrie["cpu_us"] / bare["cpu_us"]
    print(f"inflight: {n} requests, {c} allowed in flight, latency {lo:g}-{hi:g} s (uniform), simulator in a process,"
          f" {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    for name, f in (("eyrie run (local, whole process)", eyrie), ("bare aiohttp loop", bare)):
        print(f"  {name:34s} occupancy {f['occupancy']:.3f} of allowed (lowest {f['min_open']:.0f} open) over "
              f"{f['steady_s']:.0f} s; CPU {f['cpu_us']:.0f} us/request steady ({f['whole_cpu_us']:.0f} whole run); "
              f"RSS {f['rss_mb']:.0f} MB; {f['wall_s']:.0f} s")
    print(f"  eyrie/bare CPU per request {ratio:.2f} (target <= {TARGET_CPU_RATIO}); occupancy target >= "
          f"{TARGET_OCCUPANCY}; RSS target < {TARGET_RSS_MB} MB")
    ok = eyrie["occupancy"] >= TARGET_OCCUPANCY and eyrie["rss_mb"] < TARGET_RSS_MB and ratio <= TARGET_CPU_RATIO
    print(f"RESULT inflight occupancy={eyrie['occupancy']:.3f} bare_occupancy={bare['occupancy']:.3f} "
          f"rss_mb={eyrie['rss_mb']:.0f} cpu_us={eyrie['cpu_us']:.0f} bare_cpu_us={bare['cpu_us']:.0f} "
          f"cpu_ratio={ratio:.2f} {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
