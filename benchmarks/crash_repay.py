"""What a crash costs: `eyrie run` (local Ray, the default) killed with its whole process tree at
a random moment, then run again, ten times; then once more to the end.

At each kill the tree is first frozen (SIGSTOP: nothing more is sent or written), the provider's
own counters are read from outside the process (the simulator's /sim/stats, its own process):
the requests it had received and not yet answered, P. It is left to answer and bill those (the
frozen client's sockets are still open, as a provider that finishes what it was sent), then the
tree is SIGKILLed. Re-paid, R: answers the provider billed that the store does not hold (bought
again by the rerun). R and P come from different places (the provider's billing against the store;
the provider's open requests), and R - P is what the client had been answered and not yet made
durable. Targets: P <= R (every open request is paid again; the store holds nothing it was never
sent) and R <= maxConcurrency (answers durable before their slot is freed); every prompt persisted
exactly once at the end.

And the money booked: after each kill, what the resume books as spent (`read_checkpoint`: the
records' costs plus the killed workers' in-flight slots) is never below the provider's bill, and
each kill adds at most maxConcurrency x the worst case of one request above it (the requests in
flight, never the budget leased to the workers); the final run's spentUSD agrees, and the cap holds.
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
from decimal import Decimal

from _common import children_of, cli_spec, run_eyrie, start_eyrie, write_prompt_file

from eyrie.jobs.contract import records
from eyrie.jobs.generate.budget.checkpoint import read_checkpoint
from eyrie.jobs.generate.budget.pricing import Pricing, worst_case
from eyrie.jobs.generate.sending.requests import estimate_prompt_tokens
from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess
from eyrie.jobs.store import FileStore

MAX_TOKENS = 64  # cli_spec's default
MAX_USD = Decimal("1000")


def tree_of(proc) -> list[int]:
    return [proc.pid, *children_of(proc.pid)]  # with what left the session (Ray's raylet, GCS)


def signal_tree(proc, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    for p in tree_of(proc):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


def freeze_read_kill(proc, sim, wait_s: float = 10) -> int:
    """SIGSTOP the tree, read the provider's open requests, let it answer and bill them, SIGKILL
    the tree. Returns the requests the provider was answering at the kill (a request whose body
    had not fully arrived when the client froze is never answered, nor billed, and not counted)."""
    signal_tree(proc, signal.SIGSTOP)
    signal_tree(proc, signal.SIGSTOP)  # anything forked while the first pass ran
    opened = sim.stats()["inFlight"]
    deadline = time.time() + wait_s
    while (left := sim.stats()["inFlight"]) and time.time() < deadline:
        time.sleep(0.01)
    signal_tree(proc, signal.SIGKILL)
    proc.wait(timeout=30)
    return opened - left

def plain(d: Decimal) -> str:
    return format(d.normalize(), "f")


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
    # one request's worst case (the longest prompt's estimate at the spec's prices), and the most a
    # kill may add above the bill: all maxConcurrency requests in flight at it
    text = f"Benchmark prompt {n}: say something short."
    worst_usd = worst_case(Pricing(Decimal("0.60"), Decimal("2.50")),
                           estimate_prompt_tokens([{"role": "user", "content": text}], None), MAX_TOKENS)
    ceiling = c * worst_usd
    money = []  # per kill: (billed, booked, what this kill added above the bill)
    over_before = Decimal(0)
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
                provider_open = freeze_read_kill(proc, sim)
            finally:
                shutil.rmtree(ray_tmp, ignore_errors=True)
            billed = sim.stats()["completed"]
            billed_usd = Decimal(sim.stats()["billedUSD"])
            booked = read_checkpoint(store).spent  # what the resume starts from
            money.append((billed_usd, booked, booked - billed_usd - over_before))
            over_before = booked - billed_usd
            held = len(list(records.iter_records(store)))
            repaid, gap = billed - held - gap, billed - held
            rows.append((k, billed - before, repaid, provider_open))
            print(f"  kill {k + 1}: {billed - before:5d} answers billed this run; re-paid {repaid:3d} (billed, not "
                  f"in the store); the provider was answering {provider_open:3d} at the kill, so "
                  f"{repaid - provider_open:3d} had been answered and were not yet durable; booked ${booked} vs billed "
                  f"${billed_usd} (+${plain(money[-1][2])} this kill, ceiling ${plain(ceiling)})", flush=True)
        _wall, prog = run_eyrie(spec, ray=not args.inline)
        stats = sim.stats()
        ids = Counter(r["sample_id"] for r in records.iter_records(store))
    assert prog["outcome"] == "Done" and len(ids) == n and max(ids.values()) == 1, prog
    final_billed, final_booked = Decimal(stats["billedUSD"]), Decimal(prog["spentUSD"])
    money_miss = [k for k, (b, s, add) in enumerate(money) if not (b <= s <= MAX_USD and add <= ceiling)]
    final_ok = final_billed <= final_booked <= final_billed + over_before and final_booked <= MAX_USD
    most = max((add for _b, _s, add in money), default=Decimal(0))
    worst = max(rows, key=lambda r: r[2])
    over = [r for r in rows if r[2] > c or r[3] > r[2]]
    total_repaid = stats["completed"] - n
    print(f"crash_repay: {n} prompts, {args.kills} kills of `eyrie run` ({'inline' if args.inline else 'local Ray'}), "
          f"maxConcurrency {c}, provider latency {args.latency_ms} ms, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"  max re-paid at one kill: {worst[2]} (the provider was answering {worst[3]} then; maxConcurrency {c}); "
          f"provider-side in flight at the kills: {sorted(r[3] for r in rows)}; re-paid: {sorted(r[2] for r in rows)}; "
          f"re-paid in all {total_repaid} over {args.kills} kills; every prompt persisted once")
    print(f"  target: provider's in flight <= re-paid <= maxConcurrency at every kill: "
          f"{'met' if not over else f'missed at {len(over)} kills'}")
    print(f"  money: booked after each kill never below the bill, at most +${plain(most)} above it per kill (ceiling "
          f"maxConcurrency x worst case = {c} x ${plain(worst_usd)} = ${plain(ceiling)}); final spentUSD "
          f"${final_booked} vs billed ${final_billed} (+${final_booked - final_billed}): "
          f"{'met' if not money_miss and final_ok else f'missed at kills {money_miss}, final ok {final_ok}'}")
    ok = not over and not money_miss and final_ok
    print(f"RESULT crash_repay max_repaid={worst[2]} provider_in_flight_then={worst[3]} max_concurrency={c} "
          f"total_repaid={total_repaid} kills={args.kills} max_overbooked_per_kill={plain(most)} "
          f"overbook_ceiling={plain(ceiling)} ratio={most / ceiling if ceiling else 0:.2f} "
          f"worst_case={plain(worst_usd)} "
          f"target=in_flight<=repaid<=max_concurrency,bill<=booked<=bill+ceiling {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
