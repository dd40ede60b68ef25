"""What the provider probe costs per candidate endpoint (requests, seconds, dollars) against the
canary it replaces: `eyrie run` (local Ray, the default path, the whole process) on the same prompts
with and without `api.providerProbe`, against the simulator serving K endpoints of the model at a
fixed latency.

- run B: the spec with `api.providerProbe: {samples: canarySamples}` over the K endpoints.
- run A: the same spec without the probe, pinned to the endpoint B's generation went to (so the two
  differ by the probe alone): the run a user makes today, whose canary (the drift gate's first
  `canarySamples` answers, its one look at the provider before the money goes) is `canarySamples`
  requests, their dollars, and the seconds from the first request to the canary's last answer.

The probe's overhead is B - A in requests and dollars; in seconds, the probe's own time (providers.json
`elapsedSeconds`: listing, requests, judging) beside B - A of the whole process (which Ray's start-up
and the machine's load move by more than the probe takes); per candidate, / K. The passing endpoints'
first answers are kept as samples, so B re-sends none of the probe's prompts: its overhead in
requests is samples x (K - 1), not samples x K. Target: per candidate, no more requests than the canary
it replaces (ratio <= 1.0). Dollars follow each endpoint's price against the one generation goes to,
and seconds the concurrency split over the endpoints: both printed beside it, not judged.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import run_eyrie

from eyrie.jobs.contract import records
from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess
from eyrie.jobs.store import FileStore

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ENDPOINTS = [  # the reference, two that pass, one dropped
    {"tag": "bench", "name": "Bench", "input_per_million": "0.60", "output_per_million": "2.50"},
    {"tag": "cheap", "name": "Cheap", "input_per_million": "0.30", "output_per_million": "1.20"},
    {"tag": "slow", "name": "Slow", "input_per_million": "0.45", "output_per_million": "1.80"},
    {"tag": "broken/fp8", "name": "Broken", "input_per_million": "0.20", "output_per_million": "0.80",
     "schema_error_rate": 0.5},
]


def write_prompts(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Weather question {i}?"}],
                                        "tools": [WEATHER]}) + "\n" for i in range(n)))
    return path


def spec(path: Path, prompts: Path, out: Path, base_url: str, canary: int, concurrency: int,
         pinned: str | None) -> Path:
    api: dict = {"baseUrl": base_url, "maxConcurrency": concurrency, "stream": False, "maxRetries": 2,
                 "requestTimeoutSeconds": 60, "sampling": {"maxTokens": 256}}
    if pinned is None:
        api["providerProbe"] = {"samples": canary}
    else:
        api["provider"] = {"only": [pinned], "order": [pinned], "allowFallbacks": False}
    doc = {"apiVersion": "eyrie.dev/v1alpha1", "kind": "DatasetGeneration", "metadata": {"name": "probe-bench"},
           "spec": {"sources": [{"name": "bench", "uri": str(prompts)}], "target": {"model": "bench/model"},
                    "api": api, "tools": {"gate": {"canarySamples": canary, "minToolCallRate": 0.1}},
                    "budget": {"maxUSD": "100", "pricing": {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}},
                    "generation": {"shards": 4, "ray": {"workers": 1}}, "output": {"uri": f"file://{out}"}}}
    path.write_text(yaml.safe_dump(doc))
    return path


def canary_of(out: Path, canary: int) -> tuple[Decimal, float]:
    """Dollars of the first `canary` answers of a run, and the seconds from its first request to the
    last of them (a record's createdAt is when its request was built; latencyS until its answer)."""
    def ts(r: dict) -> float:
        return datetime.fromisoformat(r["createdAt"].replace("Z", "+00:00")).timestamp()

    recs = [r for r in records.iter_records(FileStore(out)) if r.get("status") == "ok"]
    first = sorted(recs, key=lambda r: ts(r) + float(r.get("latencyS") or 0))[:canary]
    dollars = sum((Decimal(r["costUSD"]) for r in first), Decimal(0))
    return dollars, max(ts(r) + float(r.get("latencyS") or 0) for r in first) - min(ts(r) for r in recs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--canary", type=int, default=20, help="tools.gate.canarySamples = providerProbe.samples")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--latency-ms", type=int, default=200)
    args = ap.parse_args()
    k = len(ENDPOINTS)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        prompts = write_prompts(root / "prompts.jsonl", args.prompts)
        cfg = SimulatorConfig(latency_ms=args.latency_ms, providers=ENDPOINTS, tool_call_rate=0.9)
        results: dict[str, dict] = {}
        pinned: str | None = None
        for name in ("B", "A"):
            with SimulatorProcess(cfg) as sim:
                out = root / f"out-{name}"
                seconds, prog = run_eyrie(spec(root / f"{name}.yaml", prompts, out, sim.base_url, args.canary,
                                               args.concurrency, pinned))
                stats = sim.stats()
            results[name] = {"seconds": seconds, "requests": stats["requests"], "dollars": Decimal(stats["billedUSD"]),
                             "out": out, "progress": prog}
            print(f"run {name} ({'with the probe' if pinned is None else f'pinned to {pinned}'}): "
                  f"{stats['requests']} requests {stats.get('byProvider')}, ${stats['billedUSD']}, {seconds:.1f} s "
                  "(eyrie run, local Ray, whole process)")
            if pinned is None:
                pinned = (prog.get("providers") or {}).get("passing", ["bench"])[0]
        a, b = results["A"], results["B"]
        passing = (b["progress"].get("providers") or {}).get("passing")
        c_dollars, c_seconds = canary_of(a["out"], args.canary)
        probe_s = json.loads((b["out"] / "providers.json").read_text())["elapsedSeconds"]
        over = {"requests": b["requests"] - a["requests"], "dollars": b["dollars"] - a["dollars"], "seconds": probe_s}
        per = {key: v / k for key, v in over.items()}
        print(f"probe over {k} endpoints ({args.canary} prompts each), passing {passing}: overhead "
              f"{over['requests']} requests, ${over['dollars']:.6f}, {probe_s:.1f} s of probing "
              f"(whole process B - A: {b['seconds'] - a['seconds']:.1f} s)")
        print(f"per candidate: {per['requests']:.1f} requests, ${per['dollars']:.6f}, {per['seconds']:.1f} s; "
              f"the canary it replaces: {args.canary} requests, ${c_dollars:.6f}, {c_seconds:.1f} s")
        r_req = per["requests"] / args.canary
        r_usd = float(per["dollars"] / c_dollars) if c_dollars else float("inf")
        r_s = per["seconds"] / c_seconds if c_seconds else float("inf")
        met = r_req <= 1.0
        print(f"ratio per candidate / canary: requests {r_req:.2f} (target <= 1.0: {'met' if met else 'missed'}), "
              f"dollars {r_usd:.2f}, seconds {r_s:.2f}")
        print(f"RESULT provider_probe requests_ratio={r_req:.2f} dollars_ratio={r_usd:.2f} seconds_ratio={r_s:.2f} "
              f"per_candidate_requests={per['requests']:.1f} per_candidate_usd={per['dollars']:.6f} "
              f"per_candidate_s={per['seconds']:.1f} canary_requests={args.canary} canary_usd={c_dollars:.6f} "
              f"canary_s={c_seconds:.1f} target={'met' if met else 'missed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
