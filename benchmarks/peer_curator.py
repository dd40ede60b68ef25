"""Peer: the same N chat requests to the same simulator at the same concurrency, through
bespokelabs-curator's online OpenAI processor and through eyrie: as a user runs it (`eyrie run`, a
process of its own on the spec's defaults: one worker, no Ray; the headline ratio) and its generation
stage inline in this process. Figures: requests/s end to end, ratio eyrie/curator (target >= 1.5), and
each tool's spend accuracy against what the simulator billed (`/sim/stats`, reset between runs).

curator pins older pydantic/rich/tiktoken/huggingface-hub than eyrie's environment, so it runs in its
own venv (see benchmarks/README.md):

    python -m venv .venv-peer
    .venv-peer/bin/pip install bespokelabs-curator httpx-aiohttp orjson minio pyarrow jsonschema jsonschema-rs \
        pyyaml uvloop
    .venv-peer/bin/pip install --no-deps -e .
    .venv-peer/bin/python benchmarks/peer_curator.py

Offline, three things are arranged in this process: curator counts tokens with tiktoken's
`cl100k_base`, which tiktoken would download, so a byte-level stand-in is registered under that name
(it only feeds curator's rate limiter); the model is `gpt-4o-mini`, which LiteLLM's bundled price map
knows (LITELLM_LOCAL_MODEL_COST_MAP keeps LiteLLM from fetching a newer one), and the simulator bills
at that map's prices so curator's own cost model can be exact; telemetry is off (TELEMETRY_ENABLED).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

os.environ.setdefault("TELEMETRY_ENABLED", "false")  # curator's PostHog client reads this at import
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("CURATOR_DISABLE_CACHE", "1")

TARGET = 1.5
MODEL = "gpt-4o-mini"
PRICE_IN, PRICE_OUT = Decimal("0.15"), Decimal("0.60")  # LiteLLM's gpt-4o-mini, USD per million
INSTALL = ("bespokelabs-curator is not installed in this Python. Run this benchmark from its own venv:\n"
           "  python -m venv .venv-peer\n"
           "  .venv-peer/bin/pip install bespokelabs-curator httpx-aiohttp orjson minio pyarrow jsonschema "
           "jsonschema-rs pyyaml uvloop\n"
           "  .venv-peer/bin/pip install --no-deps -e .\n"
           "  .venv-peer/bin/python benchmarks/peer_curator.py")


SIM_PYTHON = "EYRIE_SIMULATOR_PYTHON"  # the Python the simulator runs in (eyrie's own), when this runs in curator's
PEER_VENV = Path(__file__).resolve().parents[1] / ".venv-peer"
PEER_PACKAGES = ("bespokelabs-curator", "httpx-aiohttp", "orjson", "minio", "pyarrow", "jsonschema", "jsonschema-rs",
                 "pyyaml", "uvloop")


def peer_python() -> str | None:
    """$EYRIE_PEER_PYTHON, else .venv-peer's Python, made here when missing (the README's three commands, from
    PyPI: a few minutes once); None when it cannot be made (offline). eyrie itself is linked again on every run:
    a strict editable install is a tree of links to the files there were, and a module added since is missing."""
    if os.environ.get("EYRIE_PEER_PYTHON"):
        return os.environ["EYRIE_PEER_PYTHON"]
    python, built = PEER_VENV / "bin" / "python", PEER_VENV / ".built"
    # pip runs outside the repository: its folder `operator/` would shadow the standard library's module
    elsewhere = {"cwd": tempfile.gettempdir(), "check": True}
    try:
        if not built.exists():
            print(f"peer_curator: building curator's venv in {PEER_VENV} (once)", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], **elsewhere)
            subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_PACKAGES], **elsewhere)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(PEER_VENV.parent),
                        "--config-settings", "editable_mode=strict"], **elsewhere)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"peer_curator: the venv could not be built: {e}", file=sys.stderr)
        return None
    built.touch()
    return str(python)


def register_stand_in_cl100k() -> None:
    """A byte-level BPE under the name `cl100k_base` (no merges: one token per byte, an upper bound)."""
    import tiktoken
    import tiktoken.registry

    enc = tiktoken.Encoding(name="cl100k_base", pat_str=r"""[^\s]+|\s+""",
                            mergeable_ranks={bytes([i]): i for i in range(256)},
                            special_tokens={"<|endoftext|>": 256})
    tiktoken.registry.ENCODINGS["cl100k_base"] = enc


def prompt_texts(n: int) -> list[str]:
    return [f"Benchmark prompt {i}: say something short." for i in range(n)]


def sim_post(base_url: str, path: str) -> dict:
    import httpx

    r = httpx.post(base_url.removesuffix("/v1") + path, timeout=10, trust_env=False)
    r.raise_for_status()
    return r.json()


def curator_run(base_url: str, n: int, concurrency: int, max_tokens: int, workdir: str) -> tuple[float, Decimal, int]:
    """(requests/s, curator's reported total cost, responses) for n prompts."""
    from bespokelabs import curator

    llm = curator.LLM(
        model_name=MODEL, backend="openai", generation_params={"max_tokens": max_tokens},
        backend_params={"base_url": base_url, "api_key": "sk-bench", "max_concurrent_requests": concurrency,
                        "max_requests_per_minute": 10_000_000, "max_tokens_per_minute": 10_000_000_000,
                        "max_retries": 2, "request_timeout": 60, "require_all_responses": True})
    # curator probes the endpoint once for rate-limit headers when it is built: not part of the run
    sim_post(base_url, "/sim/reset")
    t0 = time.perf_counter()
    out = llm(prompt_texts(n), working_dir=workdir)
    dt = time.perf_counter() - t0
    return n / dt, Decimal(str(out.cost_info.total_cost)), len(out.dataset)


def eyrie_run(base_url: str, n: int, concurrency: int, max_tokens: int, workdir: Path) -> tuple[float, Decimal, int]:
    """(requests/s, eyrie's spentUSD, records) for the same n prompts through run_generation inline."""
    from eyrie.jobs.context import RunContext
    from eyrie.jobs.contract import records
    from eyrie.jobs.generate.driver import run_generation
    from eyrie.jobs.pipeline import provider
    from eyrie.jobs.spec import parse_spec
    from eyrie.jobs.store import FileStore

    src = workdir / "prompts.jsonl"
    src.write_text("".join(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n"
                           for p in prompt_texts(n)))
    dg = parse_spec({
        "sources": [{"name": "bench", "uri": str(src)}], "target": {"model": MODEL},
        "api": {"baseUrl": base_url, "maxConcurrency": concurrency, "stream": False, "maxRetries": 2,
                "requestTimeoutSeconds": 60, "sampling": {"maxTokens": max_tokens}},
        "tools": {"gate": {"enabled": False}},
        "budget": {"maxUSD": "1000", "pricing": {"inputPerMillion": str(PRICE_IN),
                                                 "outputPerMillion": str(PRICE_OUT)}},
        "generation": {"shards": 8, "partRecords": 512, "ray": {"workers": 1}},
        "output": {"uri": f"file://{workdir}/out"},
    })
    store = FileStore(workdir / "out")
    os.environ.setdefault("EYRIE_API_KEY", "sk-bench")
    t0 = time.perf_counter()
    with provider(dg.spec) as base_url:
        result = run_generation(dg, store, RunContext("bench"), base_url, inline=True)
    dt = time.perf_counter() - t0
    assert result.outcome == "Done", result.message
    return n / dt, result.snapshot.spent, sum(1 for _ in records.iter_records(store))


def eyrie_cli(base_url: str, n: int, concurrency: int, max_tokens: int, workdir: Path) -> tuple[float, Decimal, int]:
    """(requests/s, spentUSD, records) of `eyrie run` with its defaults (one worker: no Ray), whole process:
    start-up, preflight, planning, Ray, generation, the final recount, exit."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import cli_spec, run_eyrie

    prompts = workdir / "prompts.jsonl"  # the same prompts curator gets
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": t}]}) + "\n"
                               for t in prompt_texts(n)))
    spec = cli_spec(workdir / "spec.yaml", prompts, workdir / "out", base_url, concurrency, max_tokens=max_tokens,
                    model=MODEL, price_in=str(PRICE_IN), price_out=str(PRICE_OUT))
    wall, prog = run_eyrie(spec)
    assert prog["outcome"] == "Done", prog
    return n / wall, Decimal(prog["spentUSD"]), prog["samples"]["done"]


def accuracy(reported: Decimal, billed: Decimal) -> str:
    return f"{(reported - billed) / billed * 100:+.2f}%" if billed else "n/a"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=512, help="high enough that no answer ends in `length`")
    args = ap.parse_args()
    try:
        import bespokelabs.curator  # noqa: F401
    except ImportError:
        peer = peer_python()  # curator's own venv, built on first use (a fresh machine runs this as it is)
        # not resolved: every venv's python links to the same interpreter
        if peer is None or os.path.abspath(sys.executable) == os.path.abspath(peer):
            print(INSTALL, file=sys.stderr)
            print("RESULT peer_curator SKIPPED (bespokelabs-curator not installed)")
            return 2
        # the simulator stays in this Python: curator pins an aiohttp older than the simulator's server needs
        return subprocess.call([peer, __file__, *sys.argv[1:]], env={**os.environ, SIM_PYTHON: sys.executable})
    register_stand_in_cl100k()
    import logging

    logging.getLogger("curator").setLevel(logging.WARNING)  # generous to the peer: no per-request log I/O

    from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess

    n, c = args.requests, args.concurrency
    cfg = SimulatorConfig(latency_ms=0, input_per_million=PRICE_IN, output_per_million=PRICE_OUT)
    with SimulatorProcess(cfg, python=os.environ.get(SIM_PYTHON)) as sim, tempfile.TemporaryDirectory() as tmp:
        # warm both paths once (imports, connection pools), then measure
        curator_run(sim.base_url, 100, c, args.max_tokens, f"{tmp}/cw")
        eyrie_run(sim.base_url, 100, c, args.max_tokens, Path(tempfile.mkdtemp(dir=tmp)))
        sim_post(sim.base_url, "/sim/reset")
        d_rps, d_spent, d_n = eyrie_cli(sim.base_url, n, c, args.max_tokens, Path(tempfile.mkdtemp(dir=tmp)))
        d_billed = Decimal(sim.stats()["billedUSD"])
        sim_post(sim.base_url, "/sim/reset")
        e_rps, e_spent, e_n = eyrie_run(sim.base_url, n, c, args.max_tokens, Path(tempfile.mkdtemp(dir=tmp)))
        e_billed = Decimal(sim.stats()["billedUSD"])
        sim_post(sim.base_url, "/sim/reset")
        c_rps, c_cost, c_n = curator_run(sim.base_url, n, c, args.max_tokens, f"{tmp}/cm")
        c_billed = Decimal(sim.stats()["billedUSD"])
    # A provider whose price is not the price map's (OpenRouter routes one model id to providers with
    # different prices): curator's cost comes from the map, eyrie's from the provider's usage.cost.
    m = max(100, n // 4)
    off = SimulatorConfig(latency_ms=0, input_per_million=Decimal("0.60"), output_per_million=Decimal("2.50"))
    with SimulatorProcess(off, python=os.environ.get(SIM_PYTHON)) as sim, tempfile.TemporaryDirectory() as tmp:
        _, e_spent2, _ = eyrie_run(sim.base_url, m, c, args.max_tokens, Path(tempfile.mkdtemp(dir=tmp)))
        e_billed2 = Decimal(sim.stats()["billedUSD"])
        _, c_cost2, _ = curator_run(sim.base_url, m, c, args.max_tokens, f"{tmp}/cm")
        c_billed2 = Decimal(sim.stats()["billedUSD"])
    ratio, inline_ratio = d_rps / c_rps, e_rps / c_rps
    print(f"peer_curator: {n} requests at concurrency {c}, simulator at zero latency, {os.cpu_count()} cores")
    print(f"  curator (online OpenAI processor): {c_rps:8.1f} req/s  {c_n} responses  "
          f"cost ${c_cost:.7f} vs billed ${c_billed:.7f} ({accuracy(c_cost, c_billed)})")
    print(f"  eyrie run (its defaults, whole process):{d_rps:8.1f} req/s  {d_n} records    "
          f"spent ${d_spent} vs billed ${d_billed} ({accuracy(d_spent, d_billed)})")
    print(f"  eyrie (run_generation, inline):     {e_rps:8.1f} req/s  {e_n} records    "
          f"spent ${e_spent} vs billed ${e_billed} ({accuracy(e_spent, e_billed)})")
    print(f"  ratio eyrie run/curator {ratio:.2f} (target >= {TARGET}); inline/curator {inline_ratio:.2f}")
    print(f"  provider priced off the map ($0.60/$2.50 per M), {m} requests: eyrie spend error "
          f"{accuracy(e_spent2, e_billed2)}, curator cost error {accuracy(c_cost2, c_billed2)}")
    ok = ratio >= TARGET
    print(f"RESULT peer_curator ratio={ratio:.2f} eyrie_run_rps={d_rps:.0f} inline_ratio={inline_ratio:.2f} "
          f"eyrie_inline_rps={e_rps:.0f} curator_rps={c_rps:.0f} "
          f"eyrie_spend_error={accuracy(e_spent, e_billed)} curator_spend_error={accuracy(c_cost, c_billed)} "
          f"offmap_eyrie_error={accuracy(e_spent2, e_billed2)} offmap_curator_error={accuracy(c_cost2, c_billed2)} "
          f"target>={TARGET} {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
