"""Start-up and stop of `eyrie run` as a user runs it: a process of its own with the spec's defaults (local Ray,
one worker), the code before issue 44 beside the code of this tree, in turns (before, now, before, now ...),
against an independent slow fake provider on loopback (not the simulator: any OpenAI-compatible server):

- first request: seconds from the command's start to the first request the provider receives (target <= 2 s);
- stop, answers in flight: SIGINT once requests are out (each answered after `--latency-s`); seconds from the
  last answer owed (the end of the last request the provider received before the signal) to the process's exit
  (target <= 1 s);
- stop, none in flight: the run paced by a requests-per-minute limit, SIGINT while it waits for the window with
  nothing in flight; seconds to the exit (target <= 1 s), and requests the provider received after the signal
  (target 0: a stop sends nothing more).

The code before is `--before REV` (default: main before the change) extracted from git into a cache folder and
imported through a path of its own, by this same Python and packages. The figures are medians over `--repeats`
turns with their ranges; the machine's load is printed (these are wall times of whole processes).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import yaml
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, cli_spec, eyrie_python, write_prompt_file
from loopback_app import serve

from eyrie.jobs.cache import cache_dir

BEFORE = "b4cb42b"  # main before issue 44's start-up changes
TARGET_FIRST_S, TARGET_EXIT_S = 2.0, 1.0
WAIT_LIMIT_S = 25.0  # a stop not done by then is killed and counted as this long


@dataclass
class Fake:
    """A provider answering every request after `latency_s`; it keeps when each request arrived and ended."""

    latency_s: float
    arrived: list[float] = field(default_factory=list)
    ended: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def chat(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        with self.lock:
            self.arrived.append(time.time())
        await asyncio.sleep(self.latency_s)
        with self.lock:
            self.ended.append(time.time())
        return web.json_response({
            "id": "gen-1", "object": "chat.completion", "model": body.get("model"),
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "bench/model"}]})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        return app


def before_tree(rev: str) -> Path:
    """A folder whose `eyrie` package is the code at `rev` (extracted once, kept in eyrie's cache)."""
    root = cache_dir() / "bench-before" / rev
    shim = root / "shim"
    if not (shim / "eyrie" / "jobs").exists():
        root.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "jobs", "operator"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
        (shim / "eyrie").mkdir(parents=True, exist_ok=True)
        for part in ("jobs", "operator"):
            os.symlink(root / part, shim / "eyrie" / part)
    return shim


def launch(spec: Path, shim: Path | None, ray_tmp: str) -> subprocess.Popen:
    env = {**os.environ, "EYRIE_API_KEY": "sk-bench", "RAY_TMPDIR": ray_tmp}
    env.pop("RAY_ADDRESS", None)
    env.pop("EYRIE_NO_RAY", None)
    if shim is not None:
        env["PYTHONPATH"] = str(shim)
    return subprocess.Popen([eyrie_python(), "-m", "eyrie.jobs.cli", "run", str(spec), "--no-progress"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def wait_exit(proc: subprocess.Popen) -> float:
    """When the process ended (a stop not done in WAIT_LIMIT_S is killed: its time is that limit)."""
    try:
        proc.wait(WAIT_LIMIT_S)
        return time.time()
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return float("inf")


def until(cond, proc: subprocess.Popen, limit: float = 120.0) -> None:
    deadline = time.time() + limit
    while not cond():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"eyrie run ended or stalled (exit {proc.poll()})")
        time.sleep(0.002)


def in_flight_case(shim: Path | None, work: Path, latency_s: float) -> tuple[float, float]:
    """(seconds to the first request, seconds from the last answer owed to the exit)."""
    fake = Fake(latency_s)
    with serve(fake.app()) as url, tempfile.TemporaryDirectory(prefix="rb", dir="/tmp") as ray_tmp:
        prompts = write_prompt_file(work / "p.jsonl", 2000)
        spec = cli_spec(work / "s.yaml", prompts, work / "out-flight", url, 16)
        t0 = time.time()
        proc = launch(spec, shim, ray_tmp)
        until(lambda: fake.arrived, proc)
        first = fake.arrived[0] - t0
        time.sleep(0.5)
        signalled = time.time()
        proc.send_signal(signal.SIGINT)
        exited = wait_exit(proc)
        with fake.lock:
            owed = max(a + latency_s for a in fake.arrived if a <= signalled)
        return first, exited - max(owed, signalled)


def idle_case(shim: Path | None, work: Path) -> tuple[float, int]:
    """(seconds from SIGINT to the exit with nothing in flight, requests received after the signal)."""
    fake = Fake(0.0)
    with serve(fake.app()) as url, tempfile.TemporaryDirectory(prefix="rb", dir="/tmp") as ray_tmp:
        prompts = write_prompt_file(work / "p.jsonl", 50)
        spec = cli_spec(work / "s.yaml", prompts, work / "out-idle", url, 4)
        doc = yaml.safe_load(spec.read_text())
        doc["spec"]["api"]["requestsPerMinute"] = 2  # two answers, then a wait for the window: nothing in flight
        spec.write_text(yaml.safe_dump(doc))
        proc = launch(spec, shim, ray_tmp)
        until(lambda: len(fake.ended) >= 2, proc)
        time.sleep(1.0)
        signalled = time.time()
        proc.send_signal(signal.SIGINT)
        exited = wait_exit(proc)
        return exited - signalled, sum(a > signalled for a in fake.arrived)


def spread(xs: list[float]) -> str:
    shown = [x for x in xs if x != float("inf")]
    killed = len(xs) - len(shown)
    text = (f"{statistics.median(xs):6.2f} s [{min(shown):.2f}-{max(shown):.2f}]" if shown else "  (none)")
    return text + (f" ({killed} killed at {WAIT_LIMIT_S:.0f} s)" if killed else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default=BEFORE, help="the code to compare with (a git revision; default %(default)s)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--latency-s", type=float, default=3.0)
    args = ap.parse_args()
    trees = {"before": before_tree(args.before), "now": None}
    got: dict[str, dict[str, list[float]]] = {k: {"first": [], "owed": [], "idle": [], "after": []} for k in trees}
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, shim in trees.items():
                work = Path(tmp) / f"{name}-{r}"
                work.mkdir()
                first, owed = in_flight_case(shim, work, args.latency_s)
                idle, after = idle_case(shim, work)
                for key, v in (("first", first), ("owed", owed), ("idle", idle), ("after", after)):
                    got[name][key].append(v)
    load1 = os.getloadavg()[0]
    b, n = got["before"], got["now"]
    print(f"startup: `eyrie run` (defaults: local Ray, 1 worker; a whole process) against a fake provider, "
          f"{args.repeats} turns each, before = {args.before}, load {load0:.1f} -> {load1:.1f}, {os.cpu_count()} cores")
    rows = (("first request", "first", TARGET_FIRST_S), ("exit beyond the answers owed", "owed", TARGET_EXIT_S),
            ("exit, none in flight", "idle", TARGET_EXIT_S))
    for label, key, target in rows:
        ratio = statistics.median(b[key]) / statistics.median(n[key])
        print(f"  {label:30s} before {spread(b[key])}   now {spread(n[key])}   before/now {ratio:5.2f} "
              f"(target now <= {target:g} s)")
    print(f"  requests sent after the stop   before {b['after']}   now {n['after']} (target 0)")
    med = {k: statistics.median(n[k]) for k in ("first", "owed", "idle")}
    ok = med["first"] <= TARGET_FIRST_S and med["owed"] <= TARGET_EXIT_S and med["idle"] <= TARGET_EXIT_S \
        and not any(n["after"])
    print(f"RESULT startup first_request_s={med['first']:.2f} before={statistics.median(b['first']):.2f} "
          f"exit_beyond_owed_s={med['owed']:.2f} before={statistics.median(b['owed']):.2f} "
          f"exit_idle_s={med['idle']:.2f} before={statistics.median(b['idle']):.2f} "
          f"sent_after_stop={sum(n['after'])} before={sum(b['after'])} {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
