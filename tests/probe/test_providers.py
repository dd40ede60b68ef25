"""The provider probe (issue 26) against an independent multi-provider fake of OpenRouter (fake_openrouter.py): its
measures equal what each endpoint was told to do, count for count; generation goes only to the
endpoints that pass; the probe's answers are paid once; bad input costs nothing."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parents[1]))
from fake_openrouter import MODEL, Behaviour, FakeOpenRouter, rows
from fault_helpers import API_KEY, persisted, progress, run_inline, spec_doc, write_rows, write_spec

from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import layout, records
from eyrie.jobs.generate.probe.run import ProbeError, ProbeSettings, run_probe
from eyrie.jobs.spec import load_spec
from eyrie.jobs.store import open_output

ROOT = Path(__file__).resolve().parents[2]
N = 8


def probe_spec(tmp_path: Path, base_url: str, *, n_rows: int = N, probe: dict[str, Any] | None = None,
               extra: dict[str, Any] | None = None, tools: bool = True, max_usd: str = "5.00") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = write_rows(tmp_path / f"p-{time.time_ns()}.jsonl", rows(n_rows, tools))
    doc = spec_doc(src, f"file://{tmp_path}/out", base_url, max_usd=max_usd, shards=2, concurrency=4,
                   max_retries=1, stream=False,
                   extra={"target.model": MODEL, "api.providerProbe": {"samples": N, **(probe or {})},
                          **(extra or {})})
    return write_spec(tmp_path, doc)


def probe_only(path: Path, monkeypatch, **flags: Any):
    monkeypatch.setenv("EYRIE_API_KEY", API_KEY)
    dg = load_spec(path)
    store = open_output(dg.spec)
    settings = ProbeSettings.from_spec(dg.spec, **flags)
    return run_probe(dg.spec, store, RunContext("probe-test", api_key=API_KEY), dg.spec.api.base_url, settings), store


def by_tag(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["tag"]: c for c in doc["candidates"]}


# Four endpoints, each told exactly what to do on prompts 0..7 (all declare get_weather).
def four() -> list[Behaviour]:
    return [
        # the model author's own endpoint: the reference. Calls on 0-5, all valid.
        Behaviour("acme", "Acme", calls={0, 1, 2, 3, 4, 5}, cost=Decimal("0.004")),
        # cheap, but 2 of its 6 calls lack the required argument: schema accuracy 4/6
        Behaviour("cheapo/fp8", "Cheapo", calls={0, 1, 2, 3, 4, 5}, invalid={1, 4}, quantization="fp8",
                  cost=Decimal("0.001"), per_million=("0.1", "0.4")),
        # calls on 0, 1 only and on 6 (the reference did not): tp 2, fp 1, fn 4 -> F1 4/9; one leak on 7
        Behaviour("lazy", "Lazy", calls={0, 1, 6}, leaks={7}, cost=Decimal("0.002")),
        # faithful and valid, one answer cut by a length limit, one error: passes (1/8 <= 0.1? no: 0.125)
        Behaviour("solid", "Solid", calls={0, 1, 2, 3, 4, 5}, length={6}, cost=Decimal("0.003")),
    ]


@pytest.mark.integration
def test_measures_equal_what_each_endpoint_was_told(tmp_path, monkeypatch):
    with FakeOpenRouter(four()).running() as fake:
        out, store = probe_only(probe_spec(tmp_path, fake.base_url), monkeypatch)
    doc = out.doc
    c = by_tag(doc)
    assert doc["reference"] == "acme" and c["acme"]["reference"]  # the model author's endpoint
    assert fake.listings == 1 and len(fake.log) == 4 * N and fake.served() == {t: N for t in c}
    # every probe request pinned to its one endpoint, no fallbacks
    for tag, body in fake.log:
        assert body["provider"]["only"] == [tag] and body["provider"]["allow_fallbacks"] is False
        assert body["tools"][0]["function"]["name"] == "get_weather"  # tools structural
    acme, cheap, lazy, solid = c["acme"], c["cheapo/fp8"], c["lazy"], c["solid"]
    assert (acme["answers"], acme["calls"], acme["invalidCalls"], acme["toolCallRate"]) == (8, 6, 0, 0.75)
    assert acme["triggerF1"] == 1.0 and acme["schemaAccuracy"] == 1.0 and acme["passed"]
    assert (cheap["calls"], cheap["invalidCalls"], cheap["schemaAccuracy"]) == (6, 2, round(4 / 6, 6))
    assert cheap["triggerF1"] == 1.0 and [f["measure"] for f in cheap["failures"]] == ["schemaAccuracy"]
    assert "schema accuracy 0.67 < minSchemaAccuracy 0.95 (2 of 6 calls invalid)" in cheap["failures"][0]["message"]
    # lazy: tp {0, 1}, fp {6}, fn {2, 3, 4, 5}: F1 = 4 / 9; leaks on 7
    assert lazy["triggerF1"] == round(4 / 9, 6) and lazy["comparedPrompts"] == 8
    assert (lazy["leaks"], lazy["leakRate"]) == (1, 0.125)
    assert {f["measure"] for f in lazy["failures"]} == {"triggerF1", "leakRate"}
    assert solid["finishReasons"] == {"tool_calls": 6, "length": 1, "stop": 1} and solid["truncationRate"] == 0.125
    assert [f["measure"] for f in solid["failures"]] == ["truncationRate"]
    assert all(x["reasoning"] == {"full": 0, "summarised": 0, "encrypted": 0, "none": 8} for x in c.values())
    assert (acme["spentUSD"], acme["costPerAnswerUSD"]) == ("0.032", "0.004")
    assert Decimal(doc["spentUSD"]) == fake.billed == 8 * Decimal("0.010")
    assert acme["endpoint"]["pricing"] == {"promptPerMillion": "0.5", "completionPerMillion": "2"}
    assert cheap["endpoint"]["quantization"] == "fp8" and acme["endpoint"]["maxCompletionTokens"] == 16384
    assert acme["latencySeconds"]["p50"] is not None
    assert doc["passing"] == ["acme"] and doc["provider"] == {"only": ["acme"], "order": ["acme"],
                                                              "allowFallbacks": False}
    assert out.stop is None
    # the stored answers: one record per (endpoint, prompt), each with its request key
    stored = list(records.iter_probe_records(store))
    assert len(stored) == 4 * N and len({(r["probe"]["endpoint"], r["sample_id"]) for r in stored}) == 4 * N


@pytest.mark.integration
def test_passing_endpoints_are_ordered_cheapest_first(tmp_path, monkeypatch):
    eps = [Behaviour("acme", calls={0, 1}, cost=Decimal("0.004")),
           Behaviour("mid", calls={0, 1}, cost=Decimal("0.002")),
           Behaviour("low", calls={0, 1}, cost=Decimal("0.001")),
           Behaviour("low/turbo", calls={0}, cost=Decimal("0.0005"))]  # F1 2/3: dropped
    with FakeOpenRouter(eps).running() as fake:
        out, _ = probe_only(probe_spec(tmp_path, fake.base_url), monkeypatch)
    assert out.passing == ["low", "mid", "acme"]
    # "low" as a base slug would also match low/turbo: the routing ignores the dropped variant
    assert out.doc["provider"] == {"only": ["low", "mid", "acme"], "order": ["low", "mid", "acme"],
                                   "ignore": ["low/turbo"], "allowFallbacks": False}
    probe_to_low = [b for t, b in fake.log if t == "low"]
    assert all(b["provider"]["ignore"] == ["low/turbo"] for b in probe_to_low)  # pinned to exactly "low"


@pytest.mark.integration
def test_a_template_revision_alone_fails_on_template_fit(tmp_path, monkeypatch):
    """Three endpoints identical in every answer; one counts its prompts 3 tokens longer (another
    chat-template revision). It fails on templateFit and nothing else; the others fit deepseek-v4."""
    counted = _faithful_counter()
    same = {"calls": set(range(N)), "prompt_tokens": counted}
    eps = [Behaviour("acme", **same), Behaviour("twin", **same), Behaviour("shifted", prompt_offset=3, **same)]
    with FakeOpenRouter(eps).running() as fake:
        out, _ = probe_only(probe_spec(tmp_path, fake.base_url, extra={
            "target.tokenizer": "bundled:deepseek-v4", "target.chatFormat": "deepseek-v4"}), monkeypatch)
    c = by_tag(out.doc)
    assert c["acme"]["template"]["how"] == "detected" and c["twin"]["template"]["fits"] == ["deepseek-v4"]
    assert c["shifted"]["template"]["how"] == "mismatch"
    assert [f["measure"] for f in c["shifted"]["failures"]] == ["templateFit"]
    for key in ("answers", "calls", "invalidCalls", "triggerF1", "leaks", "finishReasons", "reasoning"):
        assert c["shifted"][key] == c["twin"][key], key
    assert out.passing == ["acme", "twin"]


@pytest.mark.integration
def test_reasoning_errors_and_parameters_are_judged(tmp_path, monkeypatch):
    eps = [Behaviour("acme", calls={0, 1}),
           Behaviour("summ", calls={0, 1}, reasoning="summarised"),
           Behaviour("flaky", calls={0, 1}, errors={2, 3}),
           Behaviour("noseed", calls={0, 1}, supported=("max_tokens", "temperature", "tools", "reasoning"))]
    with FakeOpenRouter(eps).running() as fake:
        out, _ = probe_only(probe_spec(tmp_path, fake.base_url, extra={
            "api.sampling": {"maxTokens": 256, "seed": 7, "reasoning": {"effort": "high"}}}), monkeypatch)
    c = by_tag(out.doc)
    assert c["acme"]["reasoning"]["full"] == 8 and c["acme"]["passed"]
    assert c["summ"]["reasoning"] == {"full": 0, "summarised": 8, "encrypted": 0, "none": 0}
    assert [f["measure"] for f in c["summ"]["failures"]] == ["reasoning"]
    assert (c["flaky"]["answers"], c["flaky"]["errors"], c["flaky"]["errorRate"]) == (6, {"http-400": 2}, 0.25)
    assert [f["measure"] for f in c["flaky"]["failures"]] == ["errorRate"]
    assert c["noseed"]["unsupportedParameters"] == ["seed"]
    assert [f["measure"] for f in c["noseed"]["failures"]] == ["parameters"]
    # reported, not judged when told so
    with FakeOpenRouter(eps).running() as fake:
        out, _ = probe_only(probe_spec(tmp_path / "b", fake.base_url, probe={"thresholds": {
            "requireParameters": False, "maxErrorRate": 0.3, "maxOpaqueReasoningRate": 1}}, extra={
            "api.sampling": {"maxTokens": 256, "seed": 7, "reasoning": {"effort": "high"}}}), monkeypatch)
    assert sorted(out.passing) == ["acme", "flaky", "noseed", "summ"]


@pytest.mark.integration
def test_spend_per_answer_counts_byok_upstream_cost(tmp_path, monkeypatch):
    """usage-accounting: with BYOK, `cost` is OpenRouter's fee and cost_details.upstream_inference_cost
    what the provider charged the user's key; an endpoint's spend per answer is their sum."""
    eps = [Behaviour("acme", calls={0}, cost=Decimal("0.004")),
           Behaviour("byok", calls={0}, cost=Decimal("0.0002"), byok_upstream=Decimal("0.004"))]
    with FakeOpenRouter(eps).running() as fake:
        out, _ = probe_only(probe_spec(tmp_path, fake.base_url), monkeypatch)
    c = by_tag(out.doc)
    assert c["byok"]["costPerAnswerUSD"] == "0.0042" and c["acme"]["costPerAnswerUSD"] == "0.004"
    assert out.passing == ["acme", "byok"]  # cheapest first by what the user pays, not by OpenRouter's fee
    assert Decimal(out.doc["spentUSD"]) == fake.billed


@pytest.mark.integration
def test_an_endpoint_whose_listed_limits_cannot_hold_the_answer_is_judged_unsent(tmp_path, monkeypatch):
    eps = [Behaviour("acme", calls={0}), Behaviour("short", calls={0}, max_completion_tokens=128)]
    with FakeOpenRouter(eps).running() as fake:
        out, _ = probe_only(probe_spec(tmp_path, fake.base_url), monkeypatch)
    short = by_tag(out.doc)["short"]
    assert fake.served() == {"acme": N}  # nothing sent to it: OpenRouter would route none there
    assert short["failures"][0]["measure"] == "completionLimit"
    assert "max_completion_tokens 128 < api.sampling.maxTokens 256" in short["failures"][0]["message"]


# ------------------------------------------------------------------------------------ in a run


@pytest.mark.integration
def test_a_run_routes_only_to_passing_endpoints_and_pays_probe_answers_once(tmp_path, monkeypatch):
    total = 20
    with FakeOpenRouter(four()).running() as fake:
        path = probe_spec(tmp_path, fake.base_url, n_rows=total, probe={"thresholds": {"maxTruncationRate": 0.2}})
        result, store = run_inline(path, monkeypatch)
        assert result.outcome == "Done", result.message
        passing = ["solid", "acme"]  # cheapest first: solid $0.003 an answer, acme $0.004
        assert progress(store)["providers"]["passing"] == passing
        gen = fake.generation_requests()
        # generation: every request routed to the passing endpoints only, the cheapest first
        assert gen and all(b["provider"] == {"only": passing, "order": passing, "allow_fallbacks": False}
                           for _, b in gen)
        assert {t for t, _ in gen} == {"solid"}
        served = fake.served()
        assert served["cheapo/fp8"] == served["lazy"] == N  # the probe's, nothing after it
        # the probe's prompts are not sent again: N x 4 probe requests, then only the other rows
        assert len(gen) == total - N and len(fake.log) == 4 * N + total - N
        recs = persisted(store)
        assert len(recs) == total and len({r["sample_id"] for r in recs}) == total
        kept = [r for r in recs if "probe" in r]
        assert {r["row"] for r in kept} == set(range(N)) and {r["probe"]["endpoint"] for r in kept} == {"solid"}
        # spend: what the fake billed, the probe's answers counted once
        prog = progress(store)
        assert Decimal(prog["spentUSD"]) == fake.billed
        assert prog["samples"] == {"total": total, "done": total, "rejected": 0, "discarded": 0, "failed": 0}
        before = len(fake.log)
        again, store = run_inline(path, monkeypatch)  # resumed: the stored probe is reused, nothing sent
        assert again.outcome == "Done" and len(fake.log) == before and fake.listings == 1
        assert Decimal(progress(store)["spentUSD"]) == fake.billed


@pytest.mark.integration
def test_no_passing_endpoint_stops_the_run_before_generation(tmp_path, monkeypatch):
    eps = [Behaviour("acme", calls={0, 1, 2}, invalid={0, 1, 2}), Behaviour("lazy", calls={0}, invalid={0})]
    with FakeOpenRouter(eps).running() as fake:
        path = probe_spec(tmp_path, fake.base_url, n_rows=12)
        result, store = run_inline(path, monkeypatch)
    assert result.outcome == "NoProviderPasses"
    assert "acme: schema accuracy 0.00 < minSchemaAccuracy 0.95 (3 of 3 calls invalid)" in result.message
    assert "lazy: trigger F1 0.50 < minTriggerF1 0.73 against the reference over 8 prompts; schema accuracy 0.00" \
        in result.message
    assert fake.generation_requests() == [] and len(fake.log) == 2 * N
    assert persisted(store) == []  # nothing kept as a sample: no endpoint passed
    prog = progress(store)
    assert prog["outcome"] == "NoProviderPasses" and prog["providers"]["passing"] == []
    assert [e["passed"] for e in prog["providers"]["endpoints"]] == [False, False]
    assert Decimal(prog["spentUSD"]) == fake.billed  # the probe is paid, and counted


@pytest.mark.integration
def test_the_cli_exits_9_when_no_endpoint_passes_and_prints_the_routing_otherwise(tmp_path):
    eps = [Behaviour("acme", calls={0, 1}, cost=Decimal("0.002")), Behaviour("other", calls={0, 1}),
           Behaviour("bad", calls={0, 1}, invalid={0, 1})]
    env = {"EYRIE_API_KEY": API_KEY, "PATH": str(Path(sys.executable).parent)}
    with FakeOpenRouter(eps).running() as fake:
        path = probe_spec(tmp_path, fake.base_url)
        run = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "providers", str(path), "--samples", "4",
                              "--json", str(tmp_path / "probe.json")], capture_output=True, text=True, env=env,
                             timeout=300)
        assert run.returncode == 0, run.stderr
        assert "only: [other, acme]" in run.stdout and "allowFallbacks: false" in run.stdout
        doc = orjson.loads((tmp_path / "probe.json").read_bytes())
        assert doc["passing"] == ["other", "acme"] and len(fake.log) == 3 * 4
        strict = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "providers", str(path), "--samples", "4",
                                 "--providers", "bad"], capture_output=True, text=True, env=env, timeout=300)
        assert strict.returncode == 9, strict.stderr
        assert "bad: schema accuracy 0.00 < minSchemaAccuracy 0.95" in strict.stderr
        assert len(fake.log) == 3 * 4  # its 4 answers were stored by the first call: nothing re-sent


@pytest.mark.integration
def test_an_api_without_a_listing_is_probed_as_its_one_endpoint_and_nothing_is_routed(tmp_path, monkeypatch):
    with FakeOpenRouter([Behaviour("vllm", calls={0, 1})], listing=False).running() as fake:
        path = probe_spec(tmp_path, fake.base_url, n_rows=10)
        result, store = run_inline(path, monkeypatch)
        assert result.outcome == "Done", result.message
        doc = orjson.loads(store.get(layout.PROVIDERS))
        (only,) = doc["candidates"]
        assert not doc["listed"] and only["tag"].startswith("127.0.0.1:") and doc["passing"] == [only["tag"]]
        assert doc["provider"] is None and doc["reference"] is None and only["triggerF1"] is None
        assert all("provider" not in b for _, b in fake.log)  # nothing to route: no provider block sent
        assert len(fake.log) == 10  # 8 probe answers kept as samples, 2 more generated
        named = probe_spec(tmp_path / "named", fake.base_url, probe={"providers": ["vllm"]})
        with pytest.raises(ProbeError, match="has no endpoint listing"):
            probe_only(named, monkeypatch)
        assert len(fake.log) == 10


@pytest.mark.integration
def test_answers_kept_as_samples_count_in_the_runs_template_detection(tmp_path, monkeypatch):
    """Every prompt answered by the probe: generation sends nothing, and the run's template variant
    for the endpoint comes from the kept answers (as a worker's canary would give it), so the samples
    stage rebuilds them with the variant the provider renders."""
    counted = _faithful_counter()
    with FakeOpenRouter([Behaviour("acme", "Acme", calls=set(range(N)), prompt_tokens=counted)]).running() as fake:
        path = probe_spec(tmp_path, fake.base_url, n_rows=N, probe={"samples": N}, extra={
            "target.tokenizer": "bundled:deepseek-v4", "target.chatFormat": "deepseek-v4",
            "tools.gate.canarySamples": N})
        result, store = run_inline(path, monkeypatch)
    assert result.outcome == "Done", result.message
    assert fake.generation_requests() == [] and len(fake.log) == N
    choice = progress(store)["templateVariants"]["byProvider"]["Acme"]
    assert (choice["variant"], choice["how"], choice["answers"]) == ("deepseek-v4", "detected", N)


def _faithful_counter():
    """usage.prompt_tokens as a provider rendering deepseek-v4 counts it (for a get_weather call)."""
    from eyrie.jobs.reconstruct.formats import resolve_format
    from eyrie.jobs.reconstruct.tokenizers import load_tokenizer
    from eyrie.jobs.reconstruct.variants import candidates, prompt_lengths
    from eyrie.jobs.spec import TargetSpec

    tok = load_tokenizer(TargetSpec(model=MODEL, tokenizer="bundled:deepseek-v4", chat_format="deepseek-v4"))
    formats = candidates(resolve_format("deepseek-v4", tok))

    def counted(body: dict[str, Any]) -> int:
        i = int(body["messages"][-1]["content"].split()[2].rstrip(":"))
        calls = [{"id": f"call_{i}", "type": "function",
                  "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "c"}'}}]
        resp = {"content": None, "tool_calls": calls, "reasoning": None, "finish_reason": "tool_calls"}
        (n,) = prompt_lengths(formats, tok, body, resp, {}).values()
        return n if isinstance(n, int) else next(iter(n.values()))

    return counted


# ----------------------------------------------------------------------------- paid only once


@pytest.mark.integration
def test_changed_thresholds_rejudge_the_stored_answers_and_more_samples_send_only_the_new(tmp_path, monkeypatch):
    with FakeOpenRouter(four()).running() as fake:
        path = probe_spec(tmp_path, fake.base_url, n_rows=12)
        out, _ = probe_only(path, monkeypatch)
        assert out.passing == ["acme"] and len(fake.log) == 4 * N
        same, _ = probe_only(path, monkeypatch, samples=N)  # the same settings as flags: the stored verdict
        assert same.reused and same.sent_now == 0 and len(fake.log) == 4 * N and fake.listings == 1
        doc = yaml.safe_load(path.read_text())
        doc["spec"]["api"]["providerProbe"]["thresholds"] = {"minSchemaAccuracy": 0.5, "maxTruncationRate": 0.2}
        path.write_text(yaml.safe_dump(doc))
        rejudged, _ = probe_only(path, monkeypatch)
        assert rejudged.sent_now == 0 and not rejudged.reused and len(fake.log) == 4 * N and fake.listings == 2
        assert rejudged.passing == ["cheapo/fp8", "solid", "acme"]
        more, _ = probe_only(path, monkeypatch, samples=N + 2)
        assert more.sent_now == 4 * 2 and len(fake.log) == 4 * (N + 2)
        assert all(len([1 for t, b in fake.log if t == tag]) == N + 2 for tag in by_tag(more.doc))
    assert Decimal(more.doc["spentUSD"]) == fake.billed


def kill_mid_probe(cmd: list[str], env: dict[str, str], out: Any, of: int) -> set[tuple[str, str]]:
    """Start `cmd`, kill -9 it once 20 probe answers are durable; the (endpoint, sample) pairs stored."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 300  # only ends a hung run
    while len(list(records.iter_probe_records(out))) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.wait(30)
    durable = {(r["probe"]["endpoint"], r["sample_id"]) for r in records.iter_probe_records(out)}
    assert 20 <= len(durable) < of, "kill -9 landed too late to test anything"
    return durable


@pytest.mark.integration
def test_a_probe_killed_mid_way_resumes_paying_at_most_what_was_in_flight(tmp_path):
    """kill -9 of `eyrie providers` while answers are arriving: the rerun sends only what was not
    durable (at most the requests in flight), and the spend it starts from covers what was billed."""
    eps = [Behaviour(t, calls={0, 1, 2}, latency_s=0.15) for t in ("acme", "b", "c")]
    env = {"EYRIE_API_KEY": API_KEY, "PATH": str(Path(sys.executable).parent)}
    with FakeOpenRouter(eps).running() as fake:
        path = probe_spec(tmp_path, fake.base_url, n_rows=30, probe={"samples": 30})
        cmd = [sys.executable, "-m", "eyrie.jobs.cli", "providers", str(path)]
        out = open_output(load_spec(path).spec)
        durable = kill_mid_probe(cmd, env, out, of=90)
        asked_before = len(fake.log)
        billed_before = fake.billed
        rerun = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert rerun.returncode == 0, rerun.stderr
    per_pair: dict[tuple[str | None, str], int] = {}
    for tag, body in fake.log:
        key = (tag, body["messages"][-1]["content"])
        per_pair[key] = per_pair.get(key, 0) + 1
    repaid = sum(n - 1 for n in per_pair.values())
    # maxConcurrency 4, its slots shared by the 3 endpoints' senders: at most 4 answers paid but not durable
    assert len(per_pair) == 90 and repaid <= 4 and len(fake.log) == 90 + repaid
    assert len(fake.log) - asked_before == 90 - len(durable)  # the rerun sent exactly what was not stored
    from eyrie.jobs.generate.budget.checkpoint import read_checkpoint

    assert read_checkpoint(out).spent >= fake.billed >= billed_before  # the bound covers what was paid
    doc = orjson.loads(out.get(layout.PROVIDERS))
    assert len(doc["candidates"]) == 3 and all(c["answers"] == 30 for c in doc["candidates"])


def _eyrie_run(path: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "eyrie.jobs.cli", "run", str(path), "--no-progress", *flags]


RUN_ENV = {"EYRIE_API_KEY": API_KEY, "PATH": str(Path(sys.executable).parent), "RAY_AUTH_MODE": "disabled"}


@pytest.mark.integration
def test_progress_json_shows_the_probe_while_it_sends(tmp_path):
    """`eyrie run` with api.providerProbe: progress.json is at stage probe while the probe sends (its
    answers in of those planned, its spend, the run's spend), and the operator reads that doc as a
    probe under way: phase Canary, ProvidersChecked False reason Probing."""
    from eyrie.jobs.contract.progress import parse_progress
    from eyrie.operator import conditions
    from eyrie.operator.reconcile import GenerationChild, Observation, reconcile

    eps = [Behaviour(t, calls={0, 1, 2}, latency_s=0.4) for t in ("acme", "b", "c")]
    with FakeOpenRouter(eps).running() as fake:
        path = probe_spec(tmp_path, fake.base_url, n_rows=14, probe={"samples": 10})
        out = open_output(load_spec(path).spec)
        # as the operator's job runs it: attempt 1 of DatasetGeneration uid-1
        env = {**RUN_ENV, "EYRIE_ATTEMPT": "1", "EYRIE_RUN_ID": "uid-1"}
        proc = subprocess.Popen(_eyrie_run(path, "--inline"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=env)
        seen = []
        deadline = time.monotonic() + 300  # only ends a hung run
        while proc.poll() is None and time.monotonic() < deadline:
            if out.exists(layout.PROGRESS):
                doc = orjson.loads(out.get(layout.PROGRESS))
                billed = fake.billed  # read after the doc: what was paid by then is at least its figure
                if doc.get("stage") == "probe" and 0 < doc["probe"]["answers"] < 30:
                    seen.append((doc, billed))
            time.sleep(0.05)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    assert seen, "progress.json never showed the probe part way"
    doc, billed = seen[-1]
    assert doc["outcome"] == "Running" and doc["attempts"] == [doc["attempt"]]
    assert doc["probe"]["endpoints"] == ["acme", "b", "c"] and doc["probe"]["answersPlanned"] == 30
    assert doc["samples"] == {"total": 14, "done": 0, "rejected": 0, "discarded": 0, "failed": 0}
    probe_usd = Decimal(doc["probe"]["spentUSD"])
    assert 0 < probe_usd <= Decimal(doc["spentUSD"]) <= billed
    assert probe_usd == doc["probe"]["answers"] * Behaviour("x").cost  # the answers durable, each billed once
    assert f"{doc['probe']['answers']} of 30 answers" in doc["message"]
    prog = parse_progress(doc)
    sp = load_spec(path).spec.model_copy(deep=True)  # as the cluster runs it
    sp.generation.ray.mode, sp.generation.ray.image = "RayJob", "ray:1"
    assert (prog.attempt, prog.run_id, prog.stage) == ("1", "uid-1", "probe")
    d = reconcile(Observation("dg", "ns", 1, {}, sp, {"attempt": "1"}, "2026-01-01T00:00:00Z", 0.0, uid="uid-1",
                              generation_children=(GenerationChild("1", "dg-gen-1", "Running"),), progress=prog))
    c = conditions.find(d.status["conditions"], "ProvidersChecked")
    assert d.status["phase"] == "Canary" and c is not None and (c["status"], c["reason"]) == ("False", "Probing")
    final = progress(out)  # then generation took over the same document
    assert final["outcome"] == "Done" and "probe" not in final and final["providers"]["passing"]
    assert len(fake.log) == 30 + 4  # the probe's 10 prompts x 3, then the 4 other rows once


@pytest.mark.integration
def test_eyrie_run_killed_mid_probe_resumes_paying_at_most_what_was_in_flight(tmp_path):
    """kill -9 of `eyrie run` (local Ray, its defaults) while the probe's answers arrive: the rerun
    sends only the probe requests no stored answer has, generation does not send the probe's prompts
    again, and the budget starts from at least what was billed."""
    eps = [Behaviour(t, calls={0, 1, 2}, latency_s=0.15) for t in ("acme", "b", "c")]
    with FakeOpenRouter(eps).running() as fake:
        path = probe_spec(tmp_path, fake.base_url, n_rows=36, probe={"samples": 30})
        out = open_output(load_spec(path).spec)
        durable = kill_mid_probe(_eyrie_run(path), RUN_ENV, out, of=90)
        asked_before = len(fake.log)
        at_kill = progress(out)
        assert at_kill["stage"] == "probe" and at_kill["outcome"] == "Running"  # what the operator saw
        billed_before = fake.billed
        rerun = subprocess.run(_eyrie_run(path), capture_output=True, text=True, env=RUN_ENV, timeout=600)
        assert rerun.returncode == 0, rerun.stderr
    probe_pairs: dict[tuple[str | None, str], int] = {}
    for tag, body in fake.probe_requests():
        key = (tag, body["messages"][-1]["content"])
        probe_pairs[key] = probe_pairs.get(key, 0) + 1
    repaid = sum(n - 1 for n in probe_pairs.values())
    # maxConcurrency 4, its slots shared by the 3 endpoints' senders: at most 4 answers paid but not durable
    assert len(probe_pairs) == 90 and repaid <= 4
    assert len(fake.log) - asked_before == 90 - len(durable) + 6  # the rerun: what was not stored, then 6 rows
    gen = [b["messages"][-1]["content"] for _, b in fake.generation_requests()]
    probed = {content for _, content in probe_pairs}
    assert len(gen) == len(set(gen)) == 6 and not probed & set(gen)  # the probe's prompts are not bought again
    from eyrie.jobs.generate.budget.checkpoint import read_checkpoint

    final = progress(out)
    assert final["outcome"] == "Done" and len(final["attempts"]) == 2  # the killed attempt is remembered
    assert final["samples"]["done"] == 36 and len(persisted(out)) == 36
    assert read_checkpoint(out).spent >= fake.billed >= billed_before  # the bound covers what was paid


@pytest.mark.integration
def test_probe_spend_counts_against_the_budget(tmp_path, monkeypatch):
    """A budget that holds part of the probe: it stops with BudgetExhausted, spend within maxUSD."""
    eps = [Behaviour(t, calls={0}, cost=Decimal("0.0002")) for t in ("acme", "b", "c", "d")]
    with FakeOpenRouter(eps).running() as fake:
        path = probe_spec(tmp_path, fake.base_url, max_usd="0.004", extra={"budget.pricing": {
            "inputPerMillion": "0.5", "outputPerMillion": "2.0"}})
        result, store = run_inline(path, monkeypatch)
    assert result.outcome == "BudgetExhausted", result.message
    assert "provider probe" in result.message and fake.generation_requests() == []
    spent = Decimal(progress(store)["spentUSD"])
    assert spent == fake.billed <= Decimal("0.004") and 0 < len(fake.log) < 4 * N


# ------------------------------------------------------------------------------ bad input


@pytest.mark.integration
@pytest.mark.parametrize(("probe", "flags", "model", "says"), [
    ({"providers": ["acme", "nosuch"]}, {}, MODEL, "spec.api.providerProbe.providers: nosuch not in the endpoint "
     "listing of acme/model-x (listed: acme, other)"),
    ({}, {"reference": "nosuch"}, MODEL, "--samples/--providers/--reference.reference: nosuch is not among the "
     "candidates (acme, other)"),
    ({}, {}, "acme/unknown", "target.model: the endpoint listing at"),
    ({"samples": 50}, {}, MODEL, "spec.api.providerProbe.samples: 50 prompts asked, the sources hold 12"),
], ids=["unknown-tag", "reference-not-a-candidate", "unknown-model", "too-many-samples"])
def test_bad_input_is_refused_before_anything_is_paid(tmp_path, monkeypatch, probe, flags, model, says):
    with FakeOpenRouter([Behaviour("acme"), Behaviour("other")]).running() as fake:
        path = probe_spec(tmp_path, fake.base_url, n_rows=12, probe=probe, extra={"target.model": model})
        with pytest.raises((ProbeError, Exception)) as e:
            probe_only(path, monkeypatch, **flags)
        assert says in str(e.value)
        assert getattr(e.value, "exit_code", None) == 2
        assert fake.log == []  # nothing sent, nothing paid


def test_a_reference_outside_the_named_providers_is_a_spec_error(tmp_path):
    from eyrie.jobs.spec import SpecError

    path = probe_spec(tmp_path, "http://127.0.0.1:9/v1", probe={"providers": ["a", "b"], "reference": "c"})
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert "spec.api.providerProbe.reference" in str(e.value) and "c is not among providers (a, b)" in str(e.value)


@pytest.mark.integration
def test_the_progress_bar_shows_the_probe_then_generation(tmp_path, monkeypatch):
    """`eyrie run`'s bar is fed the probe stage's snapshots as they are written (its answers of those
    its verdict needs), then generation's: never a blank bar while the probe sends."""
    import io

    from rich.console import Console

    from eyrie.jobs.cli.run import LiveProgress
    from eyrie.jobs.generate.driver import run_generation

    eps = [Behaviour(t, calls={0, 1, 2}, latency_s=0.2) for t in ("acme", "b")]
    monkeypatch.setenv("EYRIE_API_KEY", API_KEY)
    snaps: list[Any] = []  # contract.progress.Progress, as the CLI's bar gets them
    with FakeOpenRouter(eps).running() as fake:
        dg = load_spec(probe_spec(tmp_path, fake.base_url, n_rows=12, probe={"samples": 6}))
        result = run_generation(dg, open_output(dg.spec), RunContext("bar", api_key=API_KEY), fake.base_url,
                                inline=True, on_progress=snaps.append)
    assert result.outcome == "Done", result.message
    probing = [s for s in snaps if s.probe is not None]
    assert probing and snaps.index(probing[-1]) < min(i for i, s in enumerate(snaps) if s.probe is None)
    assert probing[0].probe.answers == 0 and probing[-1].probe.answers == 12
    assert all(s.probe.planned == 12 for s in probing)
    screen = io.StringIO()
    with LiveProgress("bar", Console(file=screen, force_terminal=True, width=200)) as bar:
        bar.update(probing[-1])
        bar._p.refresh()
        shown_probe = screen.getvalue()
        bar.update(snaps[-1])
    assert "probing providers" in shown_probe and "12/12" in shown_probe
    last = screen.getvalue()[len(shown_probe):]
    assert "generating" in last and "12/12" in last and "probing" not in last
    # off a terminal: lines in a log, no bar's control codes, each stage's own figures
    log = io.StringIO()
    with LiveProgress("log", Console(file=log, width=100), every_s=0) as lines:
        lines.update(probing[-1])
        lines.update(snaps[-1])
    said = log.getvalue().splitlines()
    assert len(said) == 2 and "\x1b" not in log.getvalue()
    assert re.fullmatch(r"eyrie: 0:00:0\d probing providers 12/12 done, spent \$[\d.]+ of \$[\d.]+, [\d.]+ req/s.*",
                        said[0]), said
    assert " generating 12/12 done, spent " in said[1] and all(len(x) <= 100 for x in said)
