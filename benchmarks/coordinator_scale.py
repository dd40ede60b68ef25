"""The run coordinator at scale (issue 35 item 4): what 64 and more Ray workers ask of the one coordinator actor.

Three measurements, each of the real code:

1. The budget protocol with W workers: the real `RunCoordinator` and one real `LeaseHolder` per worker (what each
   shard worker runs), in one process, the Ray hop modelled as a fixed delay; each worker runs `c` requests at a
   time (reserve the worst case, wait the provider's latency, settle at a random share of it) until the budget is
   exhausted. Figures per W: coordinator calls per second and per request, by kind (periodic reports, renewals,
   give-backs); the renewals the lease book refused before the run stopped and how often it re-evaluated a waiting
   renewal (lease contention: every report wakes every waiting renewal); how far below maxUSD it stopped, in
   worst-case reservations (the guarantee: less than one, however many workers), and never above.
2. What one call costs the coordinator's event loop: `RunCoordinator.lease` in a loop, a report carrying 0, 16 and
   128 answers' observations (each an answer with its tool check, as the gate reads them): CPU µs per call and per
   observation.
3. The Ray hop: one real `RunCoordinator` actor on a `ray.cluster_utils.Cluster` head, called by K caller actors on
   two other Ray nodes of that cluster (their own raylets, on this machine), each making M calls at once: calls per
   second the one actor serves, and the round trip.

Extrapolated at the end for W = 64 and W = 128 (calls/s the coordinator must serve against what it can), with the
ceiling each figure is compared with. Targets: the budget bounds hold at every W (spend <= maxUSD, stopped within
one reservation); at W = 64 the coordinator needs <= 25% of its capacity at 1,000 answers/s (4x headroom).

    python benchmarks/coordinator_scale.py [--workers 4,16,64,128] [--per-worker 2] [--latency 0.5] [--no-ray]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Ray on loopback only: without this it takes the machine's own address for every node it starts (this process
# is the benchmark's own; the setting is read when ray is first imported)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from eyrie.jobs.generate.budget import holder as holder_mod
from eyrie.jobs.generate.budget.coordinator import Counts, RequestResult, RunCoordinator
from eyrie.jobs.generate.budget.holder import LeaseHolder
from eyrie.jobs.generate.budget.lease import Renewal, Report

WORST = Decimal("0.0120")  # a request's worst case: 4k prompt tokens at $0.60/M + 4k output at $2.40/M
UTILISATION_TARGET = 0.25  # share of the coordinator's capacity 64 workers may use at 1,000 answers/s: 4x headroom


@dataclass
class Protocol:
    workers: int
    requests: int
    seconds: float
    calls: Counter[str]
    renew_evaluations: int
    waits: int
    spent: Decimal
    max_usd: Decimal
    tail_seconds: float  # from the first refused renewal to the stop


async def protocol(workers: int, per_worker: int, latency: float, rpc: float, budget_requests: int,
                   seed: int) -> Protocol:
    """The budget protocol with `workers` LeaseHolders against one RunCoordinator until exhaustion."""
    rng = random.Random(seed)
    max_usd = WORST * Decimal(budget_requests) * Decimal("0.3")  # answers cost 10-50% of their worst case
    coord = RunCoordinator(max_usd=max_usd, spent=Decimal(0), counts=Counts(), total=10**9, shards=[],
                           workers=workers)
    calls: Counter[str] = Counter()
    evaluations = {"n": 0, "waits": 0, "first_wait": None}
    renew = coord.book.renew

    def counting_renew(*a: Any, **k: Any) -> Renewal:
        evaluations["n"] += 1
        v = renew(*a, **k)
        if v is Renewal.WAIT:
            evaluations["waits"] += 1
            evaluations["first_wait"] = evaluations["first_wait"] or time.monotonic()
        return v

    coord.book.renew = counting_renew  # type: ignore[method-assign]

    async def call(name: str, *args: Any) -> Any:
        if name == "lease":
            calls["renewal" if args[1] > 0 else "report"] += 1  # args: report, want, hint
        else:
            calls[name] += 1
        await asyncio.sleep(rpc)  # to the actor
        result = await getattr(coord, name)(*args)
        await asyncio.sleep(rpc)  # and back
        return result

    done = {"requests": 0}

    async def request_loop(h: LeaseHolder) -> None:
        while True:
            rid = await h.reserve(WORST)
            if rid is None:
                return
            await asyncio.sleep(rng.uniform(0.5, 1.5) * latency)
            cost = WORST * Decimal(rng.randint(10, 50)) / 100
            h.settle(rid, cost, RequestResult(status="ok", input_tokens=1000, output_tokens=800, cost=cost))
            done["requests"] += 1

    async def worker(i: int) -> None:
        h = LeaseHolder(call, f"w{i}", per_worker)
        reporter = asyncio.create_task(h.report_forever())
        async with asyncio.TaskGroup() as tg:
            for _ in range(per_worker):
                tg.create_task(request_loop(h))
        h.close()
        await reporter
        await h.give_back()

    t0 = time.monotonic()
    async with asyncio.TaskGroup() as tg:
        for i in range(workers):
            tg.create_task(worker(i))
    end = time.monotonic()
    first = evaluations["first_wait"]
    return Protocol(workers, done["requests"], end - t0, calls, evaluations["n"], evaluations["waits"],
                    coord.book.spent, max_usd, end - first if first else 0.0)


def call_cost(observations: int, rounds: int = 2000) -> float:
    """CPU seconds of one `RunCoordinator.lease` call carrying `observations` answers, in this process."""
    from eyrie.jobs.spec import GateSpec
    from eyrie.jobs.tools.checks import ResponseCheck
    from eyrie.jobs.tools.gate import ToolGate
    from eyrie.jobs.tools.validation import CallVerdict

    async def run() -> float:
        # past the canary (the gate judges every answer in its sliding window, as for most of a run)
        coord = RunCoordinator(max_usd=Decimal(10**6), spent=Decimal(0), counts=Counts(), total=10**9, shards=[],
                               workers=64, gate=ToolGate(GateSpec(canary_samples=16)))
        spent = Decimal(0)
        cpu = 0.0
        for seq in range(rounds):
            obs = [RequestResult(status="ok", input_tokens=1000, output_tokens=800, cost=Decimal("0.003"),
                               check=ResponseCheck(True, [CallVerdict(0, "get_weather", True, [])]))
                   for _ in range(observations)]
            spent += Decimal("0.003") * observations
            r = Report("w0", seq, spent, Decimal("0.05"), 8, Decimal(1), obs)
            t = time.process_time()
            g = await coord.lease(r, Decimal(0), Decimal("0.1"))
            cpu += time.process_time() - t
            assert g.renewal is Renewal.GRANTED
        return cpu / rounds

    return asyncio.run(run())


def ray_hop(callers: int, in_flight: int, calls_each: int) -> tuple[float, float]:
    """(calls/s one coordinator actor serves, mean round trip in seconds) with `callers` caller actors on two other
    nodes of a ray.cluster_utils.Cluster, each keeping `in_flight` report calls open at once."""
    import tempfile

    import ray
    from ray.cluster_utils import Cluster

    # a temp dir of its own: Ray writes its current-cluster address there, not in the shared /tmp/ray
    tmp = tempfile.mkdtemp(prefix="rcs", dir="/tmp")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                            "temp_dir": tmp})
    for _ in range(2):
        cluster.add_node(num_cpus=callers, resources={"callers": callers})
    try:
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        coord = ray.remote(RunCoordinator).options(num_cpus=0, max_concurrency=100_000).remote(
            max_usd=Decimal(10**6), spent=Decimal(0), counts=Counts(), total=10**9, shards=[], workers=callers)

        @ray.remote(num_cpus=1, resources={"callers": 1})
        class Caller:
            async def run(self, name: str, n: int, k: int) -> tuple[float, float]:
                seq = 0
                trips: list[float] = []

                async def one() -> None:
                    nonlocal seq
                    while seq < n:
                        seq += 1
                        r = Report(name, seq, Decimal(seq) / 1000, Decimal("0.05"), 8, Decimal(1), [])
                        t = time.perf_counter()
                        await coord.lease.remote(r, Decimal(0), Decimal("0.1"))
                        trips.append(time.perf_counter() - t)

                t0 = time.perf_counter()
                await asyncio.gather(*(one() for _ in range(k)))
                return time.perf_counter() - t0, statistics.fmean(trips)

        cs = [Caller.remote() for _ in range(callers)]
        ray.get([c.run.remote(f"warm{i}", 50, 1) for i, c in enumerate(cs)])
        t0 = time.perf_counter()
        out = ray.get([c.run.remote(f"c{i}", calls_each, in_flight) for i, c in enumerate(cs)])
        wall = time.perf_counter() - t0
        return callers * calls_each / wall, statistics.fmean(t for _, t in out)
    finally:
        ray.shutdown()
        cluster.shutdown()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="4,16,64,128")
    ap.add_argument("--per-worker", type=int, default=2, help="requests in flight per worker")
    ap.add_argument("--latency", type=float, default=0.5, help="the provider's mean latency, seconds")
    ap.add_argument("--rpc", type=float, default=0.0005, help="one way of the modelled Ray hop, seconds")
    ap.add_argument("--budget-requests", type=int, default=3000,
                    help="budget in requests' worst cases x 0.3 (at least 20 per request slot)")
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray cluster measurement")
    args = ap.parse_args()
    print(f"coordinator_scale: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; REPORT_SECONDS "
          f"{holder_mod.REPORT_SECONDS}, LEASE_REQUESTS {holder_mod.LEASE_REQUESTS}")

    ok = True
    print(f"1. budget protocol (real RunCoordinator + LeaseHolders, Ray hop modelled as {args.rpc * 1e3:.1f} ms each "
          f"way), {args.per_worker} requests in flight per worker, latency ~{args.latency} s, budget "
          f"{args.budget_requests} x 0.3 worst cases")
    results = []
    for w in (int(x) for x in args.workers.split(",")):
        # at least ~20 answers per request slot, so that the steady state, not the start, is measured
        budget = max(args.budget_requests, 20 * w * args.per_worker)
        p = asyncio.run(protocol(w, args.per_worker, args.latency, args.rpc, budget, seed=w))
        results.append(p)
        total = sum(p.calls.values())
        gap = (p.max_usd - p.spent) / WORST
        bounds = p.spent <= p.max_usd and gap < 1
        ok &= bounds
        print(f"  W={w:4d}: {p.requests:5d} requests in {p.seconds:5.1f} s; coordinator calls {total:6d} = "
              f"{total / p.seconds:6.1f}/s, {total / max(1, p.requests):.3f} per request (reports "
              f"{p.calls['report']}, renewals {p.calls['renewal']}, give-backs {p.calls['give_back']}); renewals "
              f"evaluated {p.renew_evaluations} ({p.waits} waited), tail {p.tail_seconds:.1f} s; stopped "
              f"{gap:.2f} worst cases below maxUSD, spent <= maxUSD: {'yes' if p.spent <= p.max_usd else 'NO'}")

    print("2. CPU of one RunCoordinator.lease call in this process (no Ray):")
    costs = {k: call_cost(k, rounds=2000 if k < 100 else 300) for k in (0, 16, 128)}
    per_obs = (costs[128] - costs[0]) / 128
    for k, c in costs.items():
        print(f"  a report carrying {k:3d} observations: {c * 1e6:7.1f} µs")
    print(f"  per observation {per_obs * 1e6:.1f} µs")

    if not args.no_ray:
        print("3. the Ray hop (ray.cluster_utils.Cluster: the coordinator actor on the head, callers on 2 other nodes)")
        _, alone = ray_hop(callers=1, in_flight=1, calls_each=500)
        print(f"  one call at a time: round trip {alone * 1e3:.2f} ms")
        rate, trip = ray_hop(callers=2, in_flight=16, calls_each=1500)
        print(f"  2 callers x 16 calls at once: {rate:7.0f} calls/s served by one actor, "
              f"round trip {trip * 1e3:.2f} ms")
    else:
        rate = 1 / (2 * args.rpc + costs[0])
        print(f"3. skipped (--no-ray): capacity taken as 1 / (modelled hop + call CPU) = {rate:.0f} calls/s")

    print("extrapolated (calls/s the coordinator must serve: W reports a second, one renewal per "
          f"~{holder_mod.LEASE_REQUESTS} answers, each answer's observation):")
    for w in (64, 128):
        for answers in (100, 1000):
            calls = w / holder_mod.REPORT_SECONDS + answers / holder_mod.LEASE_REQUESTS
            busy = calls / rate + answers * per_obs
            print(f"  W={w:4d}, {answers:5d} answers/s: {calls:6.0f} calls/s + {answers} observations/s -> "
                  f"{busy:.1%} of one coordinator's time")
            if w == 64 and answers == 1000:
                ok &= busy <= UTILISATION_TARGET
                headline = busy
    held = all(r.spent <= r.max_usd and (r.max_usd - r.spent) / WORST < 1 for r in results)
    print(f"RESULT coordinator_scale busy_at_64_workers_1000_answers={headline:.3f} "
          f"capacity_calls_per_s={rate:.0f} obs_us={per_obs * 1e6:.1f} bounds_held={held} "
          f"target=busy<={UTILISATION_TARGET},bounds {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
