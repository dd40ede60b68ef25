"""Reconstruction throughput vs the bare tokenizer, on one core.

Reconstruction = render the chat format + tokenize prompt and response + verify (decode round trip,
pieces, markers, token-count gap). The peer is the same tokenizer's batch encode of the very same
full texts (prompt + response), i.e. the least any reconstruction must do. Both run single-threaded
(RAYON_NUM_THREADS=1) and are timed in CPU seconds of this process, interleaved in chunks, best of
--repeat per chunk, so other load on the machine does not skew the ratio. Target: ratio >= 0.8.

    python benchmarks/reconstruction.py [--samples 400] [--format deepseek-v4] [--repeat 3]
"""

from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported: one core, like for like
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse
import random
import time
from typing import Any

from eyrie.jobs.reconstruct.formats import resolve_format
from eyrie.jobs.reconstruct.reconstructor import Reconstructor, Sample
from eyrie.jobs.reconstruct.tokenizers import load_tokenizer
from eyrie.jobs.spec import TargetSpec

TARGET = 0.8
CHUNK = 25
WORDS = ["the", "weather", "model", "city", "forecast", "rain", "sunny", "because", "therefore", "compute",
         "value", "result", "check", "tool", "answer", "user", "question", "step", "first", "then", "finally",
         "consider", "option", "über", "naïve", "café", "東京", "数学", "✓", "🌧️"]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather for a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14}}}}}]


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)) + "."


def records(n: int, seed: int = 7) -> list[dict[str, Any]]:
    """Records shaped like generation output (a thinking model: reasoning of 300-1500 words): a system
    prompt, a question, the reasoning, an answer;
    every third with a tool call, every fourth with an earlier exchange."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        messages = [{"role": "system", "content": text(rng, 60)}]
        if i % 4 == 0:
            messages += [{"role": "user", "content": text(rng, 30)}, {"role": "assistant", "content": text(rng, 80)}]
        messages.append({"role": "user", "content": text(rng, rng.randint(20, 120))})
        calls = ([{"id": f"call_{i}", "type": "function",
                   "function": {"name": "get_weather", "arguments": f'{{"city": "Paris", "days": {i % 7 + 1}}}'}}]
                 if i % 3 == 0 else [])
        out.append({"sample_id": f"s{i}", "source": "bench", "row": i, "status": "ok", "policy": "keep",
                    "request": {"model": "m", "messages": messages, "tools": TOOLS if calls else None,
                                "reasoning": {"effort": "high"}},
                    "response": {"reasoning": text(rng, rng.randint(300, 1500)), "content": text(rng, 200),
                                 "tool_calls": calls, "finish_reason": "tool_calls" if calls else "stop"},
                    "usage": {"prompt_tokens": 0, "completion_tokens": 0}})
    return out


def cpu_seconds(fn) -> float:
    """CPU time of this process (one thread): unlike wall time, not inflated by other load."""
    t = time.process_time()
    fn()
    return time.process_time() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--format", default="deepseek-v4")
    ap.add_argument("--tokenizer", default="bundled:deepseek-v4")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    tok = load_tokenizer(TargetSpec(model="bench", tokenizer=args.tokenizer))
    rebuild = Reconstructor(resolve_format(args.format, tok), tok)
    recs = records(args.samples)
    samples = [rebuild(r) for r in recs]  # warm-up, and the texts for the peer
    kept = [s for s in samples if isinstance(s, Sample)]
    assert len(kept) == len(recs), [s for s in samples if not isinstance(s, Sample)][:2]
    texts = [tok.decode(s.input_ids) for s in kept]
    tokens = sum(s.n_tokens for s in kept)
    assert [len(ids) for ids in tok.encode_batch(texts)] == [s.n_tokens for s in kept]

    # Interleaved in chunks, best of --repeat per chunk and side, summed: a burst of other load on
    # the machine spoils one chunk of one round, not the figure.
    chunks = [(recs[i:i + CHUNK], texts[i:i + CHUNK]) for i in range(0, len(recs), CHUNK)]
    best_recon, best_bare = [float("inf")] * len(chunks), [float("inf")] * len(chunks)
    for _ in range(args.repeat):
        for j, (rs, ts) in enumerate(chunks):
            best_recon[j] = min(best_recon[j], cpu_seconds(lambda rs=rs: [rebuild(r) for r in rs]))
            best_bare[j] = min(best_bare[j], cpu_seconds(lambda ts=ts: tok.encode_batch(ts)))
    t_recon, t_bare = sum(best_recon), sum(best_bare)
    ratio = t_bare / t_recon
    print(f"tokenizer {args.tokenizer}, format {args.format}: {len(recs)} samples, {tokens} tokens "
          f"({tokens / len(recs):.0f} per sample), one core, CPU time")
    print(f"reconstruction (render+tokenize+verify): {len(recs) / t_recon:9.1f} samples/s "
          f"{tokens / t_recon:12.0f} tokens/s")
    print(f"bare batch encode of the same texts:      {len(recs) / t_bare:9.1f} samples/s "
          f"{tokens / t_bare:12.0f} tokens/s")
    print(f"ratio {ratio:.2f} (target >= {TARGET}) -> {'OK' if ratio >= TARGET else 'BELOW TARGET'}")
    print(f"RESULT reconstruction ratio={ratio:.2f} target>={TARGET} {'PASS' if ratio >= TARGET else 'MISS'}")


if __name__ == "__main__":
    main()
