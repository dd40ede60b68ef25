"""What template-variant detection costs a worker: for each provider's first `canarySamples` answers
the worker renders the request's prompt with every variant of the chat format and counts its
tokens (`reconstruct/variants.TemplateCanary.lengths`); past the canary it only asks whether an answer
is still in it (`TemplateCanary.wants`, on every answer).

Kimi K2.5 (two variants: current, release) with its real special ids and split pattern (the
synthetic vocabulary the tests use, tests/data/kimi_synthetic), on requests shaped like agentic
traffic: a system prompt, two tools, earlier turns with a call and its result, a question; as the
default spec sends them (no `reasoning`) and the answers return none, so nothing says whether the
model thought and every variant is rendered under both thinking readings.
Figures: milliseconds of CPU per canary answer, and its ratio to the peer, the same prompts
rendered once with the default variant and tokenized (what any reconstruction pays per answer,
times the number of prompts the probe renders); microseconds per answer past the canary. Targets:
canary cost <= 1.3 x the peer, past the canary <= 5 µs per answer. One core, CPU time of this
process, best of --repeat.

    python benchmarks/variants.py [--requests 200] [--repeat 5]
"""

from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported: one core
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse
import random
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from eyrie.jobs.reconstruct.formats import resolve_format
from eyrie.jobs.reconstruct.reconstructor import turn_of
from eyrie.jobs.reconstruct.tokenizers import load_tokenizer
from eyrie.jobs.reconstruct.variants import TemplateCanary
from eyrie.jobs.spec import TargetSpec, parse_spec

ROOT = Path(__file__).resolve().parents[1]
KIMI = ROOT / "tests" / "data" / "kimi_synthetic"
TARGET, PAST_TARGET_US = 1.3, 5.0
WORDS = ["the", "weather", "city", "forecast", "rain", "because", "compute", "value", "tool", "answer",
         "question", "first", "then", "café", "東京", "✓"]
TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name} for a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14}}}}} for name in ("get_weather", "get_time")]


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)) + "."


def requests(n: int, seed: int = 5) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(request, response, usage) triples as a worker holds them after an answer."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        call = {"id": f"functions.get_weather:{i}", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
        messages = [{"role": "system", "content": text(rng, 40)},
                    {"role": "user", "content": text(rng, rng.randint(10, 60))},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": call["id"], "content": text(rng, 30)},
                    {"role": "assistant", "content": text(rng, 50)},
                    {"role": "user", "content": text(rng, rng.randint(10, 60))}]
        response = {"provider": "Moonshot AI", "content": text(rng, 80), "reasoning": None, "tool_calls": [],
                    "finish_reason": "stop"}
        out.append(({"model": "moonshotai/kimi-k2.5", "messages": messages, "tools": TOOLS}, response,
                    {"prompt_tokens": 0, "completion_tokens": 80}))
    return out


def _readings(lengths: Mapping[str, Any] | None) -> int:
    """Prompts rendered and counted for one answer: per variant, one per thinking reading tried."""
    return sum(len(v) if isinstance(v, Mapping) else 1 for v in (lengths or {}).values())


def cpu(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    target = {"model": "moonshotai/kimi-k2.5", "tokenizer": str(KIMI), "chatFormat": "kimi-k2.5"}
    spec = parse_spec({"sources": [{"name": "s", "uri": "file:///dev/null"}], "target": target,
                       "api": {"baseUrl": "simulated"}, "budget": {"maxUSD": "1"}, "output": {"uri": "/tmp/x"},
                       "tools": {"gate": {"canarySamples": args.requests}}}).spec
    tok = load_tokenizer(TargetSpec(**target))
    fmt = resolve_format("kimi-k2.5", tok)
    work = requests(args.requests)

    def canary() -> int:
        probe = TemplateCanary(spec, lambda: tok)  # a fresh worker: every answer is in its canary
        return sum(_readings(probe.lengths(*w)) for w in work)

    def peer() -> int:  # the default variant's prompt, rendered once and tokenized
        return sum(len(tok.encode(fmt.render(r["messages"], r["tools"], turn_of(resp), fmt.default_thinking).prompt))
                   for r, resp, _u in work)

    readings = canary() / len(work)  # prompt lengths the probe reports per answer (variants x thinking)
    past = TemplateCanary(spec, lambda: tok)
    for w in work:  # its canary measured
        past.lengths(*w)
    answers = [resp for _r, resp, _u in work] * 50

    def after() -> int:
        return sum(past.wants(resp) for resp in answers)

    assert after() == 0
    t_canary, t_peer, t_after = cpu(canary, args.repeat), cpu(peer, args.repeat), cpu(after, args.repeat)
    per_canary_ms = 1e3 * t_canary / len(work)
    per_peer_ms = 1e3 * t_peer / len(work)
    past_us = 1e6 * t_after / len(answers)
    ratio = t_canary / (t_peer * readings)
    ok = ratio <= TARGET and past_us <= PAST_TARGET_US
    print(f"variants: kimi-k2.5 ({len(fmt.variants)} variants), {len(work)} agentic requests, one core, "
          f"best of {args.repeat} (CPU time)")
    print(f"  canary answer: {per_canary_ms:.2f} ms ({readings:.1f} prompts rendered and counted: variants x "
          "thinking readings)")
    print(f"  peer: one render + tokenize of the same prompt {per_peer_ms:.2f} ms; canary / ({readings:.1f} x peer) "
          f"{ratio:.2f} (target <= {TARGET})")
    print(f"  past the canary: {past_us:.2f} µs per answer (target <= {PAST_TARGET_US})")
    print(f"RESULT variants canary_ms={per_canary_ms:.2f} readings={readings:.1f} ratio={ratio:.2f} "
          f"past_canary_us={past_us:.2f} target=ratio<={TARGET},past<={PAST_TARGET_US}us {'PASS' if ok else 'MISS'}")


if __name__ == "__main__":
    main()
