"""The generation job end to end: real HTTP to the simulator, real Ray, a real S3 server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from eyrie.jobs.contract import layout, records
from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess
from eyrie.jobs.store import open_store

# tier (tests/conftest.py): `eyrie run` as a process against the simulator, local Ray
pytestmark = pytest.mark.integration

API_KEY = "sk-or-v1-eyrie-test-key-0123456789abcdef"
PRICING = {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}


def write_prompts(path: Path, n: int, tools_every: int = 3) -> Path:
    weather = {"type": "function", "function": {"name": "get_weather", "description": "weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                              "required": ["city"]}}}
    with path.open("w") as f:
        for i in range(n):
            row = {"messages": [{"role": "user", "content": f"Question number {i}: explain topic {i * 7}."}]}
            if tools_every and i % tools_every == 0:
                row["tools"] = [weather]
            f.write(json.dumps(row) + "\n")
    return path


def largest_reservation(prompts: Path, max_tokens: int) -> Decimal:
    """The worst case eyrie reserves for the largest of these prompts."""
    from eyrie.jobs.generate.budget.pricing import Pricing, worst_case
    from eyrie.jobs.generate.sending.requests import estimate_prompt_tokens

    pricing = Pricing(Decimal(PRICING["inputPerMillion"]), Decimal(PRICING["outputPerMillion"]))
    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    return max(worst_case(pricing, estimate_prompt_tokens(r["messages"], r.get("tools")), max_tokens)
               for r in rows)


def make_spec(tmp_path: Path, prompts: Path, output: str, *, max_usd="5.00", base_url="simulated",
              simulator=None, mode="Local", workers=1, shards=3, concurrency=8, extra=None) -> Path:
    spec = {
        "apiVersion": "eyrie.dev/v1alpha1", "kind": "DatasetGeneration", "metadata": {"name": "t"},
        "spec": {
            "sources": [{"name": "p", "uri": str(prompts), "format": "openai"}],
            "target": {"model": "test/model"},
            "api": {"baseUrl": base_url, "maxConcurrency": concurrency, "maxRetries": 6,
                    "requestTimeoutSeconds": 10, "sampling": {"maxTokens": 256},
                    **({"simulator": simulator} if simulator else {})},
            "tools": {"gate": {"enabled": False}},
            "budget": {"maxUSD": max_usd, "pricing": PRICING},
            "generation": {"shards": shards, "ray": {"mode": mode, "workers": workers}},
            "output": {"uri": output},
        },
    }
    for dotted, value in (extra or {}).items():
        node = spec["spec"]
        *head, last = dotted.split(".")
        for k in head:
            node = node.setdefault(k, {})
        node[last] = value
    path = tmp_path / f"spec-{time.time_ns()}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def run_cli(spec: Path, *args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "EYRIE_API_KEY": API_KEY, **(env or {})}
    return subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "run", str(spec), "--no-progress", *args],
                          capture_output=True, text=True, env=full_env, timeout=timeout)


def persisted(store_uri: str) -> list[dict]:
    return list(records.iter_records(open_store(store_uri)))


def progress(store_uri: str) -> dict:
    return json.loads(open_store(store_uri).get(layout.PROGRESS))


def test_local_ray_run_persists_every_prompt_once_and_spend_matches_the_provider(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 30)
    out = f"file://{tmp_path}/out"
    with SimulatorProcess(SimulatorConfig(latency_ms=20, fault_rate=0.3,
                                          faults=["429", "500", "stream-cut", "200-error"])) as sim:
        spec = make_spec(tmp_path, prompts, out, base_url=sim.base_url, workers=2)
        r = run_cli(spec)
        stats = sim.stats()
    assert r.returncode == 0, r.stderr
    recs = persisted(out)
    ids = [x["sample_id"] for x in recs]
    assert len(ids) == 30 and len(set(ids)) == 30
    assert all(x["status"] == "ok" for x in recs)
    assert {x["row"] for x in recs} == set(range(30))
    # shards are row ranges (generations/plan.json): 30 rows in 3 shards of 10
    for s, _p, key in records.list_parts(open_store(out)):
        assert {x["row"] // 10 for x in records.decode_part(open_store(out).get(key))} == {s}
    prog = progress(out)
    assert prog["outcome"] == "Done"
    assert prog["samples"] == {"total": 30, "done": 30, "rejected": 0, "discarded": 0, "failed": 0}
    assert Decimal(prog["spentUSD"]) == Decimal(stats["billedUSD"]) == sum(Decimal(x["costUSD"]) for x in recs)
    assert prog["retries"] > 0 and sum(x["attempts"] for x in recs) == 30 + prog["retries"]
    with_tools = [x for x in recs if x["request"].get("tools")]
    assert len(with_tools) == 10 and all("messages" in x["request"] for x in recs)


def test_budget_exhaustion_then_resume_pays_nothing_twice(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 60, tools_every=2)
    out = f"file://{tmp_path}/out"
    with SimulatorProcess(SimulatorConfig(latency_ms=5)) as sim:
        # worst case per request: ~(prompt bytes) x 0.6/M + 256 x 2.5/M ~= 0.00069
        spec = make_spec(tmp_path, prompts, out, base_url=sim.base_url, max_usd="0.006", mode="Local")
        r = run_cli(spec, env={"EYRIE_NO_RAY": "1"})
        assert r.returncode == 3, r.stderr
        assert "budget exhausted" in " ".join(r.stderr.split())  # wrapped at 100 columns
        first = progress(out)
        spent1 = Decimal(first["spentUSD"])
        assert first["outcome"] == "BudgetExhausted"
        assert spent1 <= Decimal("0.006")
        assert spent1 > Decimal("0.006") - largest_reservation(prompts, 256)  # no stop earlier than that
        n1 = len(persisted(out))
        assert 0 < n1 < 60
        assert Decimal(sim.stats()["billedUSD"]) == spent1
        spec2 = make_spec(tmp_path, prompts, out, base_url=sim.base_url, max_usd="1.00")
        r = run_cli(spec2, env={"EYRIE_NO_RAY": "1"})
        assert r.returncode == 0, r.stderr
        stats = sim.stats()
    recs = persisted(out)
    assert len(recs) == 60 and len({x["sample_id"] for x in recs}) == 60
    final = progress(out)
    assert final["outcome"] == "Done"
    # tool metrics are cumulative over both attempts, like the sample counts
    assert final["tools"]["declaredPrompts"] == 30
    assert final["tools"]["calls"] == sum(len(x["response"]["tool_calls"] or []) for x in recs)
    # spend is cumulative over both attempts and equals what the provider billed in total
    assert Decimal(final["spentUSD"]) == Decimal(stats["billedUSD"])
    assert stats["completed"] == 60


def test_insufficient_credits_stops_without_retrying(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 10)
    out = f"file://{tmp_path}/out"
    with SimulatorProcess(SimulatorConfig(fault_rate=1.0, faults=["402"])) as sim:
        spec = make_spec(tmp_path, prompts, out, base_url=sim.base_url, concurrency=2)
        r = run_cli(spec, env={"EYRIE_NO_RAY": "1"})
        stats = sim.stats()
    assert r.returncode == 5, r.stderr
    assert "insufficient credits" in " ".join(r.stderr.split())  # wrapped at 100 columns
    assert progress(out)["outcome"] == "InsufficientCredits"
    assert stats["requests"] <= 2  # in-flight ones only, never retried
    assert persisted(out) == []


def test_kill_minus_9_then_rerun_is_exactly_once(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 80, tools_every=0)
    out = f"file://{tmp_path}/out"
    with SimulatorProcess(SimulatorConfig(latency_ms=150)) as sim:
        spec = make_spec(tmp_path, prompts, out, base_url=sim.base_url, concurrency=4)
        env = {**os.environ, "EYRIE_API_KEY": API_KEY, "EYRIE_NO_RAY": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "eyrie.jobs.cli", "run", str(spec), "--no-progress"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline and len(persisted(out)) < 12:
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        before = len(persisted(out))
        assert 0 < before < 80
        r = run_cli(spec, env={"EYRIE_NO_RAY": "1"})
        assert r.returncode == 0, r.stderr
        stats = sim.stats()
    recs = persisted(out)
    counts = Counter(x["sample_id"] for x in recs)
    assert len(counts) == 80 and max(counts.values()) == 1
    # paid twice: only the requests in flight when killed (concurrency 4): answers are durable
    # before their slot is freed
    assert 80 <= stats["completed"] <= 80 + 4


def test_s3_output_keeps_secrets_out_of_every_byte(tmp_path, s3_bucket, s3_env):
    prompts = write_prompts(tmp_path / "p.jsonl", 12)
    out = f"{s3_bucket}/runs/one"
    with SimulatorProcess(SimulatorConfig(fault_rate=0.3, faults=["500", "429"])) as sim:
        spec = make_spec(tmp_path, prompts, out, base_url=sim.base_url, extra={"output.endpoint": s3_env.endpoint})
        r = run_cli(spec, env=s3_env.env())
    assert r.returncode == 0, r.stderr
    store = open_store(out)
    keys = store.list()
    assert layout.PROGRESS in keys and len(persisted(out)) == 12
    blobs = [r.stdout, r.stderr] + [store.get(k) for k in keys]
    for k in keys:
        if k.endswith(".gz"):
            import gzip

            blobs.append(gzip.decompress(store.get(k)))
    for secret in (API_KEY, s3_env.secret_key, s3_env.access_key):
        for b in blobs:
            assert secret not in (b if isinstance(b, str) else b.decode("utf-8", "replace"))


def test_preflight_failures_cost_nothing(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", 3)
    # unreachable API
    spec = make_spec(tmp_path, prompts, f"file://{tmp_path}/o1", base_url="http://127.0.0.1:9/v1")
    r = run_cli(spec)
    assert r.returncode == 2 and "api.baseUrl" in r.stderr
    # missing key for a real (non-loopback) provider
    spec = make_spec(tmp_path, prompts, f"file://{tmp_path}/o2", base_url="https://openrouter.ai/api/v1")
    env = {k: v for k, v in os.environ.items() if k != "EYRIE_API_KEY"}
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "run", str(spec), "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "EYRIE_API_KEY" in r.stderr
    # unwritable store
    (tmp_path / "file").write_text("x")
    with SimulatorProcess(SimulatorConfig()) as sim:
        spec = make_spec(tmp_path, prompts, f"file://{tmp_path}/file/out", base_url=sim.base_url)
        r = run_cli(spec)
        assert r.returncode == 2 and "output.uri" in r.stderr
        # a missing source, and one that is not a file: named, before anything is paid
        for bad in (tmp_path / "missing.jsonl", tmp_path):
            spec = make_spec(tmp_path, bad, f"file://{tmp_path}/o3", base_url=sim.base_url)
            r = run_cli(spec)
            assert r.returncode == 2, r.stderr
            assert "sources[0].uri" in r.stderr and f"source 'p': {bad}" in r.stderr
            assert "Traceback" not in r.stderr
        assert sim.stats()["requests"] == 0


def test_bad_rows_are_recorded_with_their_row_and_never_sent(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_bytes(b'{"messages": [{"role": "user", "content": "ok"}]}\n[1, 2]\n{"broken": \n\xff\xfe\n'
                  b'{"messages": [{"role": "user", "content": "fine too"}]}\n')
    out = f"file://{tmp_path}/out"
    with SimulatorProcess(SimulatorConfig()) as sim:
        r = run_cli(make_spec(tmp_path, p, out, base_url=sim.base_url),
                    env={"EYRIE_NO_RAY": "1", "EYRIE_ATTEMPT": "3", "EYRIE_RUN_ID": "uid-of-the-object"})
        stats = sim.stats()
    assert r.returncode == 0, r.stderr
    # the operator's attempt and object uid come back in progress.json
    assert (progress(out)["attempt"], progress(out)["runId"]) == ("3", "uid-of-the-object")
    recs = {x["row"]: x for x in persisted(out)}
    assert sorted(recs) == [0, 1, 2, 3, 4]
    assert [recs[i]["status"] for i in range(5)] == ["ok", "rejected", "rejected", "rejected", "ok"]
    assert stats["requests"] == 2
    assert progress(out)["samples"] == {"total": 5, "done": 2, "rejected": 3, "discarded": 0, "failed": 0}


def test_the_datasets_own_answers_are_taken_sent_nowhere_paid_nothing_and_rebuilt(tmp_path):
    """`generation.answers: dataset`: each row's answer is the record's response (provider `dataset`,
    cost 0), checked like a bought one (an invalid call dropped), and rebuilt into samples; a row with
    no answer is never sent; the provider is never asked anything."""
    import pyarrow.parquet as pq

    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}}}

    def call(args: dict) -> dict:
        return {"role": "assistant", "content": None,
                "tool_calls": [{"id": "c1", "type": "function",
                                "function": {"name": "get_weather", "arguments": json.dumps(args)}}]}

    rows = [{"messages": [{"role": "user", "content": "Explain tides."},
                          {"role": "assistant", "content": "Tides rise and fall.", "reasoning_content": "The moon."}]},
            {"messages": [{"role": "user", "content": "Weather in Oslo?"}, call({"city": "Oslo"})], "tools": [weather]},
            {"messages": [{"role": "user", "content": "No answer here."}]},
            {"messages": [{"role": "user", "content": "Weather in Lima?"}, call({"town": "Lima"})], "tools": [weather]}]
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = f"file://{tmp_path}/out"
    with SimulatorProcess(SimulatorConfig()) as sim:
        r = run_cli(make_spec(tmp_path, p, out, base_url=sim.base_url,
                              extra={"generation.answers": "dataset", "target.tokenizer": "builtin:tiny-chat"}),
                    env={"EYRIE_NO_RAY": "1"})
        stats = sim.stats()
    assert r.returncode == 0, r.stderr
    assert stats["requests"] == 0
    recs = {x["row"]: x for x in persisted(out)}
    assert [recs[i]["status"] for i in range(4)] == ["ok", "ok", "rejected", "ok"]
    for i in (0, 1, 3):
        assert recs[i]["response"]["provider"] == "dataset" and recs[i]["costUSD"] == "0" and recs[i]["usage"] is None
        assert recs[i]["request"]["messages"][-1] == rows[i]["messages"][-2]  # the request that would have been sent
    assert (recs[0]["response"]["content"], recs[0]["response"]["reasoning"]) == ("Tides rise and fall.", "The moon.")
    assert recs[1]["response"]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert recs[1]["policy"] == "keep" and recs[3]["policy"] == "drop"  # its call does not validate: dropped
    assert recs[2]["error"]["type"] == "no_answer"
    got = progress(out)
    assert got["spentUSD"] in ("0", "0.000000") and got["samples"] == {
        "total": 4, "done": 2, "rejected": 1, "discarded": 1, "failed": 0}
    samples = [s for f in sorted((tmp_path / "out" / "samples").glob("shard-*.parquet"))
               for s in pq.read_table(f).to_pylist()]
    assert sorted(s["sample_id"] for s in samples) == sorted(recs[i]["sample_id"] for i in (0, 1))
    from transformers import AutoTokenizer

    from eyrie.jobs.shipped import tokenizer_folder

    tok = AutoTokenizer.from_pretrained(tokenizer_folder("builtin:tiny-chat"))
    first = next(s for s in samples if s["sample_id"] == recs[0]["sample_id"])
    trained = [t for t, m in zip(first["input_ids"], first["loss_mask"], strict=True) if m]
    assert "The moon." in tok.decode(trained) and "Tides rise and fall." in tok.decode(trained)


def test_a_budget_that_fits_no_first_request_stops_before_the_workers_start(tmp_path):
    """maxTokens x the output price fits maxUSD (validation lets it through) but no shard's first
    request, its prompt's tokens added, does: the run stops before any worker starts (no Ray, no
    wait), nothing sent, and the message names maxTokens and maxUSD as the levers."""
    prompts = write_prompts(tmp_path / "p.jsonl", 6, tools_every=0)
    out = f"file://{tmp_path}/out"
    output_only = Decimal(256) * Decimal(PRICING["outputPerMillion"]) / 1_000_000  # 0.00064
    max_usd = output_only + Decimal("0.000001")
    assert largest_reservation(prompts, 256) > max_usd
    with SimulatorProcess(SimulatorConfig(latency_ms=5)) as sim:
        spec = make_spec(tmp_path, prompts, out, base_url=sim.base_url, max_usd=str(max_usd), mode="Local")
        r = run_cli(spec)  # local Ray, the default: refused before it starts
        assert sim.stats()["requests"] == 0
    assert r.returncode == 3, r.stderr
    prog = progress(out)
    assert prog["outcome"] == "BudgetExhausted" and Decimal(prog["spentUSD"]) == 0
    assert "before the first request" in prog["message"] and "api.sampling.maxTokens" in prog["message"]
    assert "budget.maxUSD" in prog["message"]
