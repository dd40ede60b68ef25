"""Budget overshoot at 1,000 concurrent requests: eyrie's reservation ledger next to a check-then-spend
loop (the post-call accounting LiteLLM-style budgets do: check spend < cap, send, add the cost when
the answer is back), in the same run, against the same simulator, with the same cap and prompts.

Overshoot is measured on the simulator's own bill (`/sim/stats` billedUSD, reset between the two),
not on what either client believes it spent. Targets: eyrie's overshoot is zero, and eyrie stops no
earlier than one worst-case reservation below the cap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from decimal import Decimal
from pathlib import Path

import httpx
import orjson
from httpx_aiohttp import AiohttpTransport

from eyrie.jobs.context import RunContext
from eyrie.jobs.generate.budget.pricing import Pricing, worst_case
from eyrie.jobs.generate.driver import run_generation
from eyrie.jobs.generate.sending.requests import estimate_prompt_tokens
from eyrie.jobs.pipeline import provider
from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess
from eyrie.jobs.spec import parse_spec
from eyrie.jobs.store import FileStore

PRICE_IN, PRICE_OUT = Decimal("0.60"), Decimal("2.50")
MAX_TOKENS = 256


def messages(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Budget benchmark prompt {i}: explain topic {i * 7}."}]


def reset(base_url: str) -> None:
    httpx.post(base_url.removesuffix("/v1") + "/sim/reset", timeout=10, trust_env=False).raise_for_status()


def billed(base_url: str) -> tuple[Decimal, int]:
    s = httpx.get(base_url.removesuffix("/v1") + "/sim/stats", timeout=10, trust_env=False).json()
    return Decimal(s["billedUSD"]), s["completed"]


def eyrie(base_url: str, n: int, concurrency: int, cap: Decimal, work: Path) -> tuple[str, float]:
    src = work / "prompts.jsonl"
    src.write_text("".join(json.dumps({"messages": messages(i)}) + "\n" for i in range(n)))
    dg = parse_spec({
        "sources": [{"name": "bench", "uri": str(src)}], "target": {"model": "bench/model"},
        "api": {"baseUrl": base_url, "maxConcurrency": concurrency, "stream": False, "maxRetries": 2,
                "requestTimeoutSeconds": 60, "sampling": {"maxTokens": MAX_TOKENS}},
        "tools": {"gate": {"enabled": False}},
        "budget": {"maxUSD": str(cap), "pricing": {"inputPerMillion": str(PRICE_IN),
                                                   "outputPerMillion": str(PRICE_OUT)}},
        "generation": {"shards": 8, "partRecords": 512, "ray": {"workers": 1}},
        "output": {"uri": f"file://{work}/out"},
    })
    t0 = time.perf_counter()
    with provider(dg.spec) as base_url:
        result = run_generation(dg, FileStore(work / "out"), RunContext("bench"), base_url, inline=True)
    return result.outcome, time.perf_counter() - t0


async def check_then_spend(base_url: str, n: int, concurrency: int, cap: Decimal) -> float:
    """Post-call accounting: every request checks `spent < cap` before it goes, and adds its cost after."""
    spent = Decimal(0)
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(transport=AiohttpTransport(limits=limits), timeout=60, trust_env=False) as client:
        async def one(i: int) -> None:
            nonlocal spent
            async with sem:
                if spent >= cap:
                    return
                body = {"model": "bench/model", "messages": messages(i), "max_tokens": MAX_TOKENS}
                r = await client.post(base_url + "/chat/completions", content=orjson.dumps(body),
                                      headers={"content-type": "application/json"})
                spent += Decimal(str(orjson.loads(r.content)["usage"]["cost"]))

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--concurrency", type=int, default=1000)
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--cap", default="0.05", help="USD; small enough that both runs hit it")
    ap.add_argument("--latency-ms", type=float, default=300)
    args = ap.parse_args()
    cap, n, c = Decimal(args.cap), args.prompts, args.concurrency
    one_worst = max(worst_case(Pricing(PRICE_IN, PRICE_OUT), estimate_prompt_tokens(messages(i), None), MAX_TOKENS)
                    for i in range(n))
    cfg = SimulatorConfig(latency_ms=args.latency_ms, input_per_million=PRICE_IN, output_per_million=PRICE_OUT)
    with SimulatorProcess(cfg) as sim, tempfile.TemporaryDirectory() as tmp:
        reset(sim.base_url)
        outcome, e_s = eyrie(sim.base_url, n, c, cap, Path(tmp))
        e_billed, e_done = billed(sim.base_url)
        reset(sim.base_url)
        n_s = asyncio.run(check_then_spend(sim.base_url, n, c, cap))
        n_billed, n_done = billed(sim.base_url)
    e_over, n_over = max(Decimal(0), e_billed - cap), max(Decimal(0), n_billed - cap)
    e_left = cap - e_billed
    print(f"budget_overshoot: cap ${cap}, {n} prompts, concurrency {c}, latency {args.latency_ms:g} ms, "
          f"one worst-case reservation ${one_worst}")
    print(f"  eyrie ledger:       billed ${e_billed} for {e_done} answers in {e_s:.1f} s ({outcome}); "
          f"overshoot ${e_over} ({e_over / cap * 100:.1f}% of cap); left unspent ${e_left} "
          f"({'<=' if e_left <= one_worst else '>'} one worst case)")
    print(f"  check-then-spend:   billed ${n_billed} for {n_done} answers in {n_s:.1f} s; "
          f"overshoot ${n_over} ({n_over / cap * 100:.1f}% of cap)")
    ok = e_over == 0 and e_left <= one_worst
    print(f"RESULT budget_overshoot eyrie_overshoot_pct={e_over / cap * 100:.1f} "
          f"check_then_spend_overshoot_pct={n_over / cap * 100:.1f} eyrie_early_stop_within_one_reservation="
          f"{e_left <= one_worst} target=0 {'PASS' if ok else 'MISS'}")


if __name__ == "__main__":
    main()
