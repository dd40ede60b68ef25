"""Run every benchmark in benchmarks/ one after another and print each one's RESULT line.

Each benchmark runs in its own process with its default arguments (so one's memory and event loop do
not colour the next). peer_curator needs bespokelabs-curator, which lives in its own venv: it runs
with $EYRIE_PEER_PYTHON, else .venv-peer/bin/python when that exists, else this Python (where it says
how to install curator). `--timeout` is per benchmark (at least LONGER's seconds for those named there).
A benchmark that crashes or times out is reported and makes the exit status
non-zero; a figure that misses its target is a result, not a crash.

    python benchmarks/run_all.py [--only NAME ...] [--skip NAME ...] [--timeout S] [--verbose]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NOT_BENCHMARKS = {"run_all", "_common"}
# benchmarks whose default size takes longer than --timeout's default on a small machine: at least this many seconds
# (specforge_online: SpecForge's parser over 50,000 samples, about 5 ms of CPU each, three times over)
LONGER = {"specforge_online": 3600.0}


def benchmarks() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.py") if p.stem not in NOT_BENCHMARKS and not p.stem.startswith("_"))


def python_for(name: str) -> str:
    if name == "peer_curator":
        peer = os.environ.get("EYRIE_PEER_PYTHON") or str(ROOT / ".venv-peer" / "bin" / "python")
        if Path(peer).exists():
            return peer
    return sys.executable


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{os.cpu_count()} cores ({cpu}){mem}, Python {platform.python_version()}"


def run_one(name: str, timeout: float, verbose: bool) -> tuple[list[str], str | None, float]:
    """(RESULT lines, failure or None, seconds)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run([python_for(name), str(HERE / f"{name}.py")], capture_output=True, text=True,
                           timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return [], f"timed out after {timeout:g} s", time.monotonic() - t0
    dt = time.monotonic() - t0
    lines = p.stdout.splitlines()
    if verbose:
        sys.stdout.write(p.stdout)
    results = [ln for ln in lines if ln.startswith("RESULT ")]
    if p.returncode != 0 and not any("SKIPPED" in r for r in results):
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        return results, f"exit {p.returncode}: {tail}", dt
    if not results:
        last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "(no output)")
        results = [f"RESULT {name} (no RESULT line) last: {last}"]
    return results, None, dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=None, help="run just these benchmarks")
    ap.add_argument("--skip", nargs="*", default=[], help="leave these out")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per benchmark")
    ap.add_argument("--verbose", action="store_true", help="also print each benchmark's full output")
    args = ap.parse_args()
    names = [n for n in benchmarks() if (args.only is None or n in args.only) and n not in args.skip]
    unknown = sorted(set(args.only or []) - set(benchmarks()))
    if unknown:
        print(f"run_all: no such benchmark {unknown}; known: {benchmarks()}", file=sys.stderr)
        return 2
    print(f"# {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} on {machine()}", flush=True)
    failed = []
    for name in names:
        results, failure, dt = run_one(name, max(args.timeout, LONGER.get(name, 0.0)), args.verbose)
        for r in results:
            if not (args.verbose and r.startswith("RESULT ") and "(no RESULT line)" not in r):
                print(r, flush=True)  # verbose output already showed it
        if failure:
            failed.append(name)
            print(f"RESULT {name} FAILED ({failure})", flush=True)
        print(f"#   {name}: {dt:.0f} s", flush=True)
    if failed:
        print(f"# failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
