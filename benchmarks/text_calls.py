"""Text-call checking cost per answer: `check_response` in text mode vs the structured check of the
same answers.

The same calls (tool_validation's mix: 1-3 per answer, about 25% invalid in varied ways) are
written two ways: as the provider's structured `tool_calls` beside a short content, and as text in
the content (glaive, Hermes, Kimi, DeepSeek and JSON in turn, written by the simulator's writers,
not by eyrie's reader), beside the same content. Each is checked as the generation worker checks an
answer (`check_response`: validator lookup, the calls' validation, leak scan or text parse, prose);
the verdicts must agree call for call. Times are this process's CPU seconds, which other processes
on a shared machine inflate less than the clock, but not by nothing (they share the caches and the
cores' other threads): so the answers are checked in chunks of CHUNK, structured and text in turn,
each side's time the sum over chunks of the least of the repeats, and a slow spell of the machine
falls on both sides alike (timed a whole pass at a time, the same code read 1.2 to 1.8 at load ~7).
Target: text / structured <= 1.5. Also printed for information: answers without a call (the text
scan against the leak scan) and the per-format cost.

Run: python benchmarks/text_calls.py [--calls N] [--repeats R]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tool_validation import TOOLS, best_of, make_answers

from eyrie.jobs.simulator.text import FORMATS, PlannedCall, write_calls
from eyrie.jobs.tools.checks import check_response
from eyrie.jobs.tools.declarations import Prepared

TARGET = 1.5
CHUNK = 64  # answers checked at a time, the two sides in turn
CPU = time.process_time  # this process's CPU seconds: a shared machine's load does not inflate them
LEAD = "Let me look that up for you; one moment while I call the tool."
PROSE = ("Paris is the capital of France. It has about two million people in the city itself and "
         "twelve million in the region; the Seine runs through it from east to west.")


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def as_text(calls: list[dict[str, Any]], fmt: str) -> str:
    """The answer's calls written as the family writes them (glaive: one per turn, so its first)."""
    planned = [PlannedCall(c["function"]["name"], c["function"]["arguments"], _is_json(c["function"]["arguments"]))
               for c in (calls[:1] if fmt == "glaive" else calls)]
    return f"{LEAD}\n{write_calls(fmt, planned)}"


def in_turn(sides: list[tuple[Prepared, list[dict[str, Any]]]], repeats: int) -> list[tuple[float, list[Any]]]:
    """(CPU seconds, checks) of each side: each chunk of CHUNK answers checked `repeats` times by
    every side in turn, a side's time the sum of its chunks' least times."""
    total = [0.0] * len(sides)
    checks: list[list[Any]] = [[] for _ in sides]
    for a in range(0, len(sides[0][1]), CHUNK):
        best = [float("inf")] * len(sides)
        got: list[list[Any]] = [[] for _ in sides]
        for _ in range(repeats):
            for i, (prepared, responses) in enumerate(sides):
                chunk = responses[a:a + CHUNK]
                t0 = CPU()
                got[i] = [check_response(prepared, r) for r in chunk]
                best[i] = min(best[i], CPU() - t0)
        for i in range(len(sides)):
            total[i] += best[i]
            checks[i] += got[i]
    return list(zip(total, checks, strict=True))


def verdicts(checks: list[Any]) -> list[list[tuple[str | None, bool]]]:
    return [[(v.name, v.valid) for v in c.calls] for c in checks]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()

    answers = make_answers(args.calls)
    structured = Prepared([], TOOLS, TOOLS, "row", "structured")
    text = Prepared([], None, TOOLS, "text", "text")
    fmts = [FORMATS[i % len(FORMATS)] for i in range(len(answers))]
    # glaive writes one call per turn: both sides get the calls that are written
    answers = [a[:1] if f == "glaive" else a for a, f in zip(answers, fmts, strict=True)]
    n = len(answers)
    as_structured = [{"content": LEAD, "reasoning": "The user asked.", "tool_calls": a} for a in answers]
    as_written = [{"content": as_text(a, f), "reasoning": "The user asked."}
                  for a, f in zip(answers, fmts, strict=True)]
    prose_structured = [{"content": PROSE, "reasoning": "No tool needed."} for _ in range(n)]

    def run(prepared: Prepared, responses: list[dict[str, Any]]) -> list[Any]:
        return [check_response(prepared, r) for r in responses]

    for _ in range(2):  # warm caches (validators, jsonschema's regexes)
        run(structured, as_structured[:300])
        run(text, as_written[:300])
    (t_s, c_s), (t_t, c_t) = in_turn([(structured, as_structured), (text, as_written)], args.repeats)
    (t_ps, _), (t_pt, c_pt) = in_turn([(structured, prose_structured), (text, prose_structured)], args.repeats)
    assert verdicts(c_s) == verdicts(c_t), "text and structured verdicts differ"
    assert not any(c.calls for c in c_pt)

    per_format: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r, f in zip(as_written, fmts, strict=True):
        per_format[f].append(r)
    fmt_times = {f: best_of([lambda rs=rs: run(text, rs)], args.repeats, CPU)[0][0] / len(rs)
                 for f, rs in per_format.items()}

    calls = sum(len(a) for a in answers)
    invalid = sum(c.invalid_calls for c in c_t)
    ratio = t_t / t_s
    us = 1e6 / n
    print(f"answers: {n} with {calls} tool calls ({invalid} invalid), formats in turn: {', '.join(FORMATS)}")
    print(f"structured check_response (tool_calls):  {t_s * us:7.2f} us/answer (CPU)")
    print(f"text check_response (calls in content):   {t_t * us:7.2f} us/answer (CPU)")
    print("  per format: " + ", ".join(f"{f} {t * 1e6:.1f}" for f, t in sorted(fmt_times.items())) + " us/answer")
    print(f"answers without a call: structured (leak scan) {t_ps * us:.2f} us, text (parse + prose) "
          f"{t_pt * us:.2f} us (ratio {t_pt / t_ps:.2f}, for information)")
    print(f"ratio text / structured: {ratio:.2f}  (target <= {TARGET})  {'OK' if ratio <= TARGET else 'MISSED'}")
    print(f"RESULT text_calls ratio={ratio:.2f} target<={TARGET} {'PASS' if ratio <= TARGET else 'MISS'}")


if __name__ == "__main__":
    main()
