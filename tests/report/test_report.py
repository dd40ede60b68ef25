"""`eyrie report`: the time series, the aggregation over records, the tables, and the HTML page
opened in a real headless Chromium (no console error, every plot drawn, a screenshot kept)."""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from eyrie.jobs.contract import layout, records, timeseries
from eyrie.jobs.contract.progress import parse_progress
from eyrie.jobs.report import collect, publish
from eyrie.jobs.report.data import MAX_KEYS, OTHER, Answers, Reservoir
from eyrie.jobs.report.html import figures, render
from eyrie.jobs.report.terminal import print_report
from eyrie.jobs.report.verdict import verdict
from eyrie.jobs.store import FileStore

sys.path.insert(0, str(Path(__file__).parents[1]))
from browser import find_browser, open_page
from screen import too_wide

ARTIFACTS = Path(os.environ.get("EYRIE_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))

# ------------------------------------------------------------------------------------ time series


def test_timeseries_stays_bounded_evenly_spread_and_keeps_first_and_latest():
    ts = timeseries.TimeSeries(max_points=16)
    for i in range(1000):
        ts.add({"i": i})
        assert len(ts.points()) <= 17
    pts = [p["i"] for p in ts.points()]
    assert pts[0] == 0 and pts[-1] == 999
    steps = {b - a for a, b in itertools.pairwise(pts[:-1])}
    assert len(steps) == 1, steps  # evenly spread over the whole run
    assert len(pts) >= 8  # thinning halves, never empties


def test_timeseries_point_keeps_only_the_plotted_counters():
    snap = {"spentUSD": "0.5", "reservedUSD": "0.1", "forecastUSD": "0.9", "requests": 7, "retries": 2, "inFlight": 3,
            "errors": {"429": 2, "500": 1},
            "samples": {"total": 10, "done": 4, "rejected": 1, "discarded": 0, "failed": 0},
            "tools": {"perTool": {"x": {}}}}
    p = timeseries.point(parse_progress({**snap, "attempt": "a1", "outcome": "Running"}))
    assert p["errors"] == 3 and p["done"] == 4 and p["attempt"] == "a1" and "tools" not in p
    assert p["forecastUSD"] == "0.9"  # the projection as it stood then: the page plots how it moved
    assert datetime.fromisoformat(p["t"].replace("Z", "+00:00")).tzinfo is not None


# ------------------------------------------------------------------------------------ aggregation


def _record(i: int, source: str, provider: str, *, declared: list[str], calls: list[tuple[str, bool]],
            leaked: bool = False, status: str = "ok", prompt: int = 100, completion: int = 50) -> records.Record:
    return {
        "sample_id": f"s{i}", "source": source, "row": i, "status": status, "toolsMode": "structured",
        "request": {"tools": [{"type": "function", "function": {"name": n}} for n in declared]},
        "response": {"provider": provider, "content": "x"} if status == "ok" else None,
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion} if status == "ok" else None,
        "costUSD": "0.001" if status == "ok" else "0",
        "checks": {"declared": bool(declared), "called": bool(calls),
                   "invalidCalls": sum(not v for _, v in calls), "leaked": leaked,
                   "calls": [{"index": k, "name": n, "valid": v, "errors": []} for k, (n, v) in enumerate(calls)],
                   "leaks": {"content": ["<|tool_calls_section_begin|>"]} if leaked else {}},
        "policy": "keep",
    }


def test_answers_split_tool_semantics_by_source_provider_and_tool():
    a = Answers()
    a.add(_record(0, "glaive", "p1", declared=["get_weather", "bmi"], calls=[("get_weather", True)]))
    a.add(_record(1, "glaive", "p2", declared=["get_weather"], calls=[("get_weather", False)], leaked=True))
    a.add(_record(2, "chat", "p1", declared=[], calls=[]))
    a.add(_record(3, "chat", "p1", declared=[], calls=[], status="failed"))
    assert a.status == {"ok": 3, "failed": 1}
    g = a.by_source["glaive"]
    assert (g.answers, g.declared, g.called, g.calls, g.invalid, g.leaked) == (2, 2, 2, 2, 1, 1)
    assert a.by_source["chat"].declared == 0 and a.by_source["chat"].answers == 1
    assert a.by_provider["p1"].answers == 2 and a.by_provider["p2"].leak_rate == 1.0
    w, b = a.by_tool["get_weather"], a.by_tool["bmi"]
    assert (w.declared, w.called, w.calls, w.invalid) == (2, 2, 2, 1)
    assert (b.declared, b.called, b.call_rate) == (1, 0, 0.0)
    assert a.prompt_tokens.values == [100, 100, 100] and a.cost_by_provider["p1"].usd == 2 * a.cost_by_provider[
        "p2"].usd


def test_answers_key_sets_are_bounded():
    a = Answers()
    for i in range(MAX_KEYS + 50):
        a.add(_record(i, "s", f"provider-{i}", declared=[f"tool-{i}"], calls=[(f"tool-{i}", True)]))
    assert len(a.by_provider) == MAX_KEYS + 1 and a.by_provider[OTHER].answers == 50
    assert len(a.by_tool) == MAX_KEYS + 1 and a.by_tool[OTHER].calls == 50


def test_reservoir_is_exact_below_its_size_and_uniform_above():
    r = Reservoir(size=100)
    for v in range(50):
        r.add(v)
    assert r.values == list(range(50))
    r = Reservoir(size=1000)
    for v in range(100_000):
        r.add(v)
    assert len(r.values) == 1000 and r.seen == 100_000
    assert 40_000 < sum(r.values) / len(r.values) < 60_000  # a sample of the whole stream, not its head


# ------------------------------------------------------------------------------- a whole store


def _audit_doc() -> dict:
    """audit.json as `eyrie audit` writes it: 20 prompts both ways (figures from audit_stats)."""
    from eyrie.jobs.contract.audit import with_entry
    from eyrie.jobs.generate.audit import stats as st

    facts = []
    for i in range(20):
        calls = {"text": ("hermes",) if i % 2 else (), "structured": ("structured",) if i % 10 else ()}
        for mode, fmts in calls.items():
            facts.append(st.AnswerFact(f"s{i}", "glaive", mode, "ok", frozenset({"get_weather"}),
                                       tuple(st.CallFact("get_weather", i % 7 != 0, f, st.arguments_key({"c": i}), True)
                                             for f in fmts), i == 4, False, 300, 0.0006 if mode == "text" else 0.0004))
    figures = st.summarize(facts, {"prompts": 60, "declaredPrompts": 40})
    entry = {"kind": "prompts", "samples": 20, "seed": 0, "model": "moonshotai/kimi-k2.5", "outcome": "Done",
             "spentUSD": "0.02", "sent": 40, "reused": 0, "figures": figures, "verdict": st.verdict(figures),
             "examples": [{"sampleId": "s1", "source": "glaive", "user": "Weather in [Paris]?",
                           "text": {"status": "ok", "content": "<tool_call>...", "calls": ["get_weather({}) [hermes]"],
                                    "prose": False},
                           "structured": {"status": "ok", "content": "", "calls": ["get_weather({})"],
                                          "prose": False}}]}
    return with_entry(None, entry, Decimal("0.02"))


def _full_store(root: Path, evaluation: dict | None = None) -> FileStore:
    """A run's output with every document the report reads, as the stages write them (with
    `evaluation`, `eyrie evaluate`'s evaluation.json too)."""
    store = FileStore(root)
    if evaluation is not None:
        store.put(layout.EVALUATION, orjson.dumps(evaluation))
    recs = []
    for i in range(60):
        source = ("glaive", "chat", "agentic")[i % 3]
        provider = ("moonshotai", "fireworks")[i % 2]
        declared = ["get_weather", "calculate_bmi"] if source != "chat" else []
        calls = [("get_weather", i % 7 != 0)] if declared and i % 4 else []
        recs.append(_record(i, source, provider, declared=declared, calls=calls, leaked=(i == 5),
                            prompt=80 + 7 * i, completion=40 + (i * 37) % 400))
        if i % 10 == 3:  # paid, then dropped by the tool policy
            recs[-1]["policy"] = "drop"
    recs.append(_record(99, "chat", "moonshotai", declared=[], calls=[], status="failed"))
    store.put(layout.part_key(0, 0), records.encode_part(recs[:30]))
    store.put(layout.part_key(1, 0), records.encode_part(recs[30:]))
    t0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
    pts = []
    for k in range(12):  # two attempts, an hour of nothing between them
        attempt, at = ("a1", 10 * k) if k < 6 else ("a2", 3600 + 10 * k)
        pts.append({"t": (t0 + timedelta(seconds=at)).isoformat().replace("+00:00", "Z"), "attempt": attempt,
                    "spentUSD": str(round(0.04 * k, 4)), "reservedUSD": "0.02", "requests": 6 * (k % 6),
                    "retries": k // 3, "errors": k // 4, "done": 5 * k, "rejected": 0, "discarded": 0, "failed": 0,
                    "total": 60})
    store.put(layout.TIMESERIES, timeseries.encode(pts))
    progress = {"attempt": "a2", "stage": "done", "outcome": "Done", "spentUSD": "0.44", "reservedUSD": "0",
                "maxUSD": "1", "auditUSD": "0.02", "forecastUSD": "0.47", "requests": 66, "retries": 3,
                "errors": {"429": 2}, "samples": {"total": 61, "done": 55, "rejected": 3, "discarded": 2, "failed": 1},
                "discardedUSD": "0.0123456789",
                "failures": {"moderation": 1},
                "tokens": {"input": 9000, "output": 12000}, "tools": {"callRate": 0.7}}
    store.put(layout.PROGRESS, orjson.dumps(progress))
    store.put(layout.AUDIT, orjson.dumps(_audit_doc()))
    summary = {"tokenizer": {"name": "bundled:deepseek-v4"}, "chatTemplate": {"format": "kimi-k2.5"}, "samples": {
        "records": 61, "kept": 55, "tokens": 30000, "responseTokens": 12000,
        "excluded": {"policy_drop": 5, "status_failed": 1}, "flags": {"token_count_gap": 3},
        "completionTokenGap": {"count": 55, "exact": 50, "mean": 0.1, "min": -2, "p50": 0, "p90": 0, "p99": 3,
                               "max": 3, "histogram": {"-2": 1, "0": 50, "1": 2, "3": 2}},
        "promptTokenGap": {"count": 55, "exact": 55, "mean": 0, "min": 0, "p50": 0, "p90": 0, "p99": 0, "max": 0,
                           "histogram": {"0": 55}}}}
    store.put(layout.SAMPLES_SUMMARY, orjson.dumps(summary))
    fidelity = {"minTop1Agreement": 0.8, "onLow": "flag", "belowFloor": ["fireworks"],
                "overall": {"samples": 55, "tokens": 12000, "top1Agreement": 0.83, "meanNLL": 0.61, "lowSamples": 9},
                "byProvider": {"moonshotai": {"samples": 28, "top1Agreement": 0.91, "meanNLL": 0.4},
                               "fireworks": {"samples": 27, "top1Agreement": 0.74, "meanNLL": 0.9}},
                "bySource": {"glaive": {"samples": 20, "top1Agreement": 0.8, "meanNLL": 0.7}}}
    manifest = {"spentUSD": "0.44", "samples": progress["samples"], "reconstruction": summary,
                "extraction": {"engine": "sglang", "model": "/models/kimi", "modelName": "moonshotai/Kimi-K2.5",
                               "dtype": "bfloat16", "auxLayers": [2, 30, 58], "samples": 55,
                               "tokens": 30000, "bytes": 3 * 2**30, "bytesPerToken": 57344, "shardsDone": 2,
                               "skipped": {}},
                "fidelity": fidelity, "agentic": AGENTIC}
    store.put(layout.MANIFEST, orjson.dumps(manifest))
    buf = io.BytesIO()
    pq.write_table(pa.table({"sample_id": [f"s{i}" for i in range(55)],
                             "top1_agreement": [0.5 + (i % 10) / 20 for i in range(55)],
                             "mean_nll": [0.2 + (i % 7) / 5 for i in range(55)]}), buf)
    store.put(f"{layout.FIDELITY}/shard-00000.parquet", buf.getvalue())
    store.put(f"{layout.SAMPLES}/shard-00000.parquet", _samples_parquet())
    return store


AGENTIC = {"conversations": 20, "turnsRegenerated": 64, "turnsFailed": 1, "splicedToolResults": 30,
           "diverged": {"otherTool": 1, "otherArguments": 2, "missingCall": 0, "extraCall": 0},
           "ended": {"diverged": 3, "done": 15, "failed": 1, "maxTurns": 1}, "droppedTurns": 9}
PROMPT = "<｜begin▁of▁sentence｜><｜User｜>Weather in Paris? Grüße<｜Assistant｜><think>"
ANSWER = ("Check it.", "</think>Sunny in café land.", "<｜end▁of▁sentence｜>")  # reasoning, content, the end


def _samples_parquet() -> bytes:
    """One DeepSeek-V4 sample: a masked prompt, then reasoning and content in the loss."""
    from eyrie.jobs.reconstruct.tokenizers import load_tokenizer
    from eyrie.jobs.spec import TargetSpec

    tok = load_tokenizer(TargetSpec(model="m", tokenizer="bundled:deepseek-v4"))
    prompt, reasoning, content = tok.encode(PROMPT), tok.encode(ANSWER[0]), tok.encode(ANSWER[1] + ANSWER[2])
    ids = prompt + reasoning + content
    buf = io.BytesIO()
    pq.write_table(pa.table({"sample_id": ["s7"], "turn": pa.array([0], pa.int32()), "source": ["chat"],
                             "input_ids": [ids], "loss_mask": [[0] * len(prompt) + [1] * (len(ids) - len(prompt))],
                             "n_tokens": pa.array([len(ids)], pa.int32()), "flags": [[]], "provider": ["moonshotai"],
                             "segments": [[len(prompt), len(prompt) + len(reasoning), len(ids)]]}), buf)
    return buf.getvalue()


def test_terminal_report_shows_every_section_with_data(tmp_path):
    data = collect(_full_store(tmp_path / "out"))
    console = Console(record=True, width=160, file=io.StringIO())
    print_report(data, console)
    text = console.export_text()
    for expected in ("$0.44 (44.0% of $1.00)", "forecast", "$0.47", "glaive", "fireworks", "get_weather",
                     "tools as text vs structured", "policy_drop 5", "exact 50/55", "3.0 GiB",
                     "the answers scored by moonshotai/Kimi-K2.5 (floor 80.0%, on low: flag)",
                     "provider fireworks (below floor)", "91.0%", "failed: moderation 1",
                     "fireworks $0.03", "moonshotai $0.03", "discarded: paid $0.012346",
                     "divergences by kind", "otherTool 1, otherArguments 2, missingCall 0, extraCall 0 (3 in all)",
                     "how conversations ended", "diverged 3, done 15, failed 1, maxTurns 1"):
        assert expected in text, expected
    assert re.search(r"dataset tool results spliced +│ 30 ", text)
    # the verdict first, each of its questions answered
    assert text.index("verdict") < text.index("samples by outcome")
    for line in ("Tool semantics", "Reconstruction", "Fidelity", "What the money bought"):
        assert line in text[:text.index("samples by outcome")], line


def test_sections_without_data_are_left_out(tmp_path):
    store = FileStore(tmp_path / "out")
    store.put(layout.PROGRESS, orjson.dumps({"attempt": "a", "outcome": "Running", "spentUSD": "0", "maxUSD": "5",
                                             "samples": {"total": 3, "done": 0, "rejected": 0, "discarded": 0,
                                                         "failed": 0}}))
    data = collect(store)
    assert figures(data) == []
    console = Console(record=True, width=160, file=io.StringIO())
    print_report(data, console)
    text = console.export_text()
    assert "$0.00 (0.0% of $5.00)" in text and "reconstruction" not in text and "fidelity" not in text
    assert "<main>" in render(data) and "plotly-gz" not in render(data)  # still a page, no library without a plot


def test_a_run_without_extraction_has_no_fidelity_section(tmp_path):
    """`--until samples`: reconstruction writes the manifest's per-provider tool and gap figures, but
    nothing scored them: no fidelity table, chart or verdict line."""
    store = _full_store(tmp_path / "out")
    manifest = orjson.loads(store.get(layout.MANIFEST))
    manifest.pop("extraction")
    manifest["fidelity"] = {"minTop1Agreement": None, "onLow": "flag",
                            "overall": {"samples": 0, "tokens": 0, "top1Agreement": None, "toolCallRate": 0.7},
                            "byProvider": {"moonshotai": {"samples": 0, "top1Agreement": None, "toolCallRate": 0.7}}}
    store.put(layout.MANIFEST, orjson.dumps(manifest))
    store.delete(f"{layout.FIDELITY}/shard-00000.parquet")
    data = collect(store)
    assert data.fidelity is None
    assert not any(section == "Fidelity" for section, _t, _f in figures(data))
    console = Console(record=True, width=200, file=io.StringIO())
    print_report(data, console)
    text = console.export_text()
    assert "scored by" not in text and "top-1" not in text
    assert [v.key for v in verdict(data)] == ["tools", "reconstruction", "money"]


def test_the_verdict_answers_four_questions_with_the_runs_own_figures(tmp_path):
    data = collect(_full_store(tmp_path / "out"))
    lines = {v.key: v for v in verdict(data)}
    assert list(lines) == ["tools", "reconstruction", "fidelity", "money"]
    tools = lines["tools"]
    total = data.answers.total
    assert tools.figures["callRate"] == f"{100 * total.called / total.declared:.1f}%"
    assert tools.status == "warn"  # invalid calls and one leak
    rec = lines["reconstruction"]
    assert rec.figures == {"kept": "55", "records": "61", "excluded": "6", "promptExact": "55/55",
                           "completionExact": "50/55"} and rec.status == "warn"
    assert "(6 excluded: policy_drop 5, status_failed 1)" in rec.text
    fid = lines["fidelity"]
    assert fid.status == "bad" and "Scored by moonshotai/Kimi-K2.5: top-1 agreement 83.0%" in fid.text
    assert "lowest provider fireworks at 74.0%" in fid.text and "under it: fireworks" in fid.text
    money = lines["money"].figures
    assert money == {"spent": "$0.44", "budget": "$1.00", "perSample": "$0.008", "kept": "55",
                     "perMillionTokens": "$36.6667", "trained": "12,000", "discarded": "$0.012346",
                     "projected": "$0.47"}
    for v in lines.values():  # every figure is in the sentence, as printed
        assert all(f in v.text for f in v.figures.values()), v


def test_time_axes_mark_attempts_and_draw_nothing_across_the_gap(tmp_path):
    data = collect(_full_store(tmp_path / "out"))
    spend, throughput = (f for _s, _t, f in figures(data)[:2])
    for fig in (spend, throughput):
        for trace in fig.data[:2]:
            ys = list(trace.y)
            assert ys.count(None) == 1, trace.name  # one break: between the two attempts
            assert list(trace.x)[ys.index(None)] is None
        assert [a.text for a in fig.layout.annotations] == ["attempt 1", "attempt 2"]
        assert len(fig.layout.shapes) == 1
    # no rate is computed across the gap: requests restart at 0 in the second attempt
    y = list(throughput.data[1].y)
    assert y[:5] == [36.0] * 5 and y[6:] == [36.0] * 5


def _points(n: int, every_s: float = 10.0, **at: dict) -> list[dict]:
    """`n` points of one attempt, 6 requests and 5 answers per interval; `at[k]` overrides point k."""
    t0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    return [{"t": (t0 + timedelta(seconds=every_s * k)).isoformat().replace("+00:00", "Z"), "attempt": "a",
             "spentUSD": str(0.01 * k), "reservedUSD": "0", "requests": 6 * k, "retries": 0, "errors": 0,
             "done": 5 * k, "rejected": 0, "discarded": 0, "failed": 0, "total": 100, **at.get(str(k), {})}
            for k in range(n)]


def test_a_short_last_interval_joins_the_one_before_instead_of_spiking_the_rate(tmp_path):
    """The run's last point is written when it ends, often a moment after the one before: one request
    in 0.2 s is no rate of 300 a minute."""
    from eyrie.jobs.report.html import throughput_figure

    pts = _points(7)
    last = dict(pts[-1], requests=pts[-1]["requests"] + 1, done=pts[-1]["done"] + 1,
                t=(datetime.fromisoformat(pts[-1]["t"].replace("Z", "+00:00")) + timedelta(seconds=0.2))
                .isoformat().replace("+00:00", "Z"))
    data = collect(FileStore(tmp_path / "out"))
    data.series = [*pts, last]
    fig = throughput_figure(data)
    answers, requests = (list(fig.data[i].y) for i in (0, 1))
    assert requests[:5] == [36.0] * 5 and answers[:5] == [30.0] * 5
    assert requests[-1] == pytest.approx(60 * 7 / 10.2) and answers[-1] == pytest.approx(60 * 6 / 10.2)
    assert max(requests) < 45  # before: 300 a minute at the last point
    assert list(fig.data[1].x)[-1] == datetime.fromisoformat(last["t"].replace("Z", "+00:00"))  # still ends there


def test_the_forecast_line_follows_the_projection_from_the_canary_on(tmp_path):
    """The forecast as it stood at each point (none before the canary was measured), not one value
    drawn across the whole run: the spend never runs past a line that stopped meaning anything."""
    from eyrie.jobs.report.html import spend_figure

    store = FileStore(tmp_path / "out")
    store.put(layout.PROGRESS, orjson.dumps({"attempt": "a", "outcome": "Done", "spentUSD": "0.06", "maxUSD": "0.1",
                                             "forecastUSD": "0.06"}))
    data = collect(store)
    data.series = _points(7, **{str(k): {"forecastUSD": f} for k, f in ((3, "0.04"), (4, "0.05"), (5, "0.06"),
                                                                         (6, "0.06"))})
    forecast = next(t for t in spend_figure(data).data if t.name.startswith("forecast"))
    assert forecast.name == "forecast (now $0.06)"
    assert list(forecast.y) == [0.04, 0.05, 0.06, 0.06]
    assert list(forecast.x) == [datetime.fromisoformat(p["t"].replace("Z", "+00:00")) for p in data.series[3:]]


def test_the_pages_sample_is_coherent_where_that_can_be_told_and_of_median_length():
    from eyrie.jobs.report.data import SHOWN_WHY, Showcase, choose_sample, grounded

    def rec(user: str, args: str, system: str = "") -> dict:
        return {"status": "ok", "checks": {"called": True, "invalidCalls": 0, "leaked": False},
                "request": {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]},
                "response": {"tool_calls": [{"function": {"name": "get_weather", "arguments": args}}]}}

    assert not grounded(rec("What's the weather like in Lagos right now?", '{"city": "Berlin"}'))
    assert grounded(rec("What's the weather like in Lagos right now?", '{"city": "lagos"}'))
    assert grounded(rec("I weigh 70 kg and I am 1.75 m tall.", '{"weight": 70.0, "height": 1.75}'))
    assert not grounded(rec("I weigh 70 kg and I am 1.75 m tall.", '{"weight": 60.0, "height": 72.0}'))
    assert not grounded(rec("What's the weather?", '{"city": "Paris"}', system="cities: Paris, Rome"))
    assert not grounded(rec("Weather in Paris?", '{}'))  # nothing taken from the prompt: nothing to check
    rows = [{"sample_id": f"s{n}", "turn": 0, "n_tokens": n, "flags": []} for n in (10, 50, 60, 70, 500, 5000)]
    rows.append({"sample_id": "s65", "turn": 0, "n_tokens": 65, "flags": ["token_count_gap"]})
    show = Showcase(grounded={("s50", 0), ("s70", 0), ("s500", 0), ("s5000", 0), ("s65", 0)},
                    plain={("s10", 0), ("s60", 0)})
    assert choose_sample(rows, show) == (rows[3], "grounded")  # 70: the median of 50, 70, 500 (never 65, 5000)
    assert choose_sample(rows, Showcase(plain={("s10", 0), ("s60", 0)})) == (rows[0], "plain")  # the lower middle
    assert choose_sample(rows, Showcase()) == (rows[2], "any")
    assert "take every argument from the prompt" in SHOWN_WHY["grounded"]


@pytest.mark.integration
def test_report_to_a_file_or_pipe_fits_100_columns_and_cuts_nothing(tmp_path):
    _full_store(tmp_path / "out")
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "report", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": ""})
    assert r.returncode == 0, r.stderr
    assert too_wide(r.stdout) == [] and max(len(line.rstrip()) for line in r.stdout.splitlines()) > 80
    assert "…" not in r.stdout  # nothing cut with an ellipsis: cells wrap
    assert any("provider fireworks" in line and "74.0%" in line for line in r.stdout.splitlines())
    assert "otherTool 1, otherArguments 2, missingCall 0, extraCall 0" in r.stdout


@pytest.mark.integration
def test_report_cli_refuses_a_folder_that_is_no_run(tmp_path):
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "report", str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "no progress.json, manifest.json or audit.json" in r.stderr


# ------------------------------------------------------------------------------- in a browser

RENDERED = """JSON.stringify(Array.from(document.querySelectorAll('.plotly-graph-div')).map(d => ({
  id: d.id,
  title: (d.querySelector('.gtitle') || {}).textContent || '',
  svg: d.querySelectorAll('svg.main-svg').length,
  marks: Array.from(d.querySelectorAll('g.trace path, g.trace .point path'))
           .filter(p => (p.getAttribute('d') || '').length > 4).length,
  width: d.getBoundingClientRect().width, height: d.getBoundingClientRect().height,
  modebar: !!d.querySelector('.modebar'),
  // text the toolbar would hide: the title, subplot titles, attempt labels, the legend, the axes' titles
  covered: (() => {
    const m = d.querySelector('.modebar');
    if (!m) return [];
    const a = m.getBoundingClientRect();
    return Array.from(d.querySelectorAll('.gtitle, .annotation-text, .legendtext, .xtitle, .ytitle, .y2title'))
      .filter(t => {
      const b = t.getBoundingClientRect();
      return b.width > 0 && !(a.right <= b.left || b.right <= a.left || a.bottom <= b.top || b.bottom <= a.top);
    }).map(t => t.textContent);
  })(),
})))"""
READY = ("Array.from(document.querySelectorAll('.plotly-graph-div'))"
         ".every(d => d.querySelector('svg.main-svg') !== null)")


def check_page(page: Path, expected_titles: list[str], shot: str) -> list[dict]:
    """Open `page` from disk in headless Chromium; assert no error and every plot drawn; keep a screenshot."""
    if find_browser() is None:
        pytest.fail("headless chromium is needed for this test (hack/test-deps.sh installs Debian's `chromium`)")
    markup = re.sub(r"<script[^>]*>.*?</script>", "", page.read_text(), flags=re.S)
    assert not re.search(r"(src|href)\s*=\s*[\"']?https?://", markup), "the page must not load from a network"
    result = open_page(page, RENDERED, READY)
    assert result.errors == [], result.errors
    assert all(u.startswith(("file://", "data:", "blob:", "about:")) for u in result.requests), result.requests
    plots = json.loads(result.value)
    assert [p["title"] for p in plots] == expected_titles
    for p in plots:
        assert p["svg"] >= 1 and p["marks"] >= 1 and p["width"] > 200 and p["height"] > 200, p
        assert p["modebar"] and p["covered"] == [], p  # the toolbar is there, and hides no text
    # plotly.js travels gzipped: the page is a fraction of the 4.8 MB it weighed with the bundle as it is
    assert page.stat().st_size < 2_300_000, page.stat().st_size
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / shot).write_bytes(result.screenshot)
    assert result.screenshot[:8] == b"\x89PNG\r\n\x1a\n" and len(result.screenshot) > 20_000
    return plots


FIRST_SCREEN = """JSON.stringify({
  lines: Array.from(document.querySelectorAll('#verdict dl.verdict > div')).map(d => ({
    key: d.dataset.line, status: d.className, text: d.querySelector('dd').textContent,
    figures: JSON.parse(d.dataset.figures)})),
  verdictTop: document.querySelector('#verdict').getBoundingClientRect().top,
  verdictBottom: document.querySelector('#verdict').getBoundingClientRect().bottom,
  sampleTop: (document.querySelector('#sample') || {getBoundingClientRect: () => ({top: -1})})
    .getBoundingClientRect().top,
  firstPlotTop: document.querySelector('.plotly-graph-div').getBoundingClientRect().top,
  why: (document.querySelector('#sample .why') || {}).textContent || '',
  prompt: Array.from(document.querySelectorAll('pre.sample span.p')).map(s => s.textContent).join(''),
  trained: Array.from(document.querySelectorAll('pre.sample span.t')).map(s => s.textContent).join(''),
  trainedColour: Array.from(new Set(Array.from(document.querySelectorAll('pre.sample span.t'))
    .map(s => getComputedStyle(s).backgroundColor))),
  promptColour: Array.from(new Set(Array.from(document.querySelectorAll('pre.sample span.p'))
    .map(s => getComputedStyle(s).backgroundColor))),
  plots: Object.fromEntries(Array.from(document.querySelectorAll('.plotly-graph-div')).map(d => [
    (d.querySelector('.gtitle') || {}).textContent || d.id, {
      y2ticks: Array.from(d.querySelectorAll('.y2tick text')).map(t => t.textContent),
      yrange: d._fullLayout.yaxis.range, xrange: d._fullLayout.xaxis.range,
      spentGap: Array.from(d.data[0].y || []).indexOf(null),
      annotations: (d._fullLayout.annotations || []).map(a => a.text)}])),
})"""


def _usd(text: str) -> Decimal:
    return Decimal(text.removeprefix("$").replace(",", ""))


def check_verdict(page: Path, output: Path, shot: str) -> dict:
    """Open the page in Chromium; the verdict is the first screen, its figures as printed in its
    sentences, and its money figures are those progress.json (and the samples summary) give."""
    if find_browser() is None:
        pytest.fail("headless chromium is needed for this test (hack/test-deps.sh installs Debian's `chromium`)")
    result = open_page(page, FIRST_SCREEN, READY)
    assert result.errors == [], result.errors
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / shot).write_bytes(result.screenshot)
    got = json.loads(result.value)
    assert 0 <= got["verdictTop"] < got["verdictBottom"] <= 900  # on the first screen (1400x900)
    assert got["verdictBottom"] <= got["sampleTop"] < got["firstPlotTop"]  # then the sample, then the plots
    lines = {x["key"]: x for x in got["lines"]}
    for x in lines.values():
        assert all(f in x["text"] for f in x["figures"].values()), x
    progress = json.loads((output / layout.PROGRESS).read_text())
    summary = json.loads((output / layout.SAMPLES_SUMMARY).read_text())["samples"]
    money = lines["money"]["figures"]
    spent = Decimal(progress["spentUSD"])
    half = Decimal("0.0000005")  # dollars() rounds to 6 decimals
    assert abs(_usd(money["spent"]) - spent) <= half
    assert int(money["kept"].replace(",", "")) == summary["kept"]
    assert abs(_usd(money["perSample"]) - spent / summary["kept"]) <= half
    assert int(money["trained"].replace(",", "")) == summary["responseTokens"]
    price_half = Decimal("0.00005")  # a price per million tokens: 4 decimals
    assert abs(_usd(money["perMillionTokens"]) - spent * 1_000_000 / summary["responseTokens"]) <= price_half
    assert abs(_usd(money["projected"]) - Decimal(progress["forecastUSD"])) <= half
    if "discardedUSD" in progress:
        assert abs(_usd(money["discarded"]) - Decimal(progress["discardedUSD"])) <= half
    if "budget" in money:
        assert _usd(money["budget"]) == Decimal(progress["maxUSD"])
    rec = lines["reconstruction"]["figures"]
    assert rec["kept"] == f"{summary['kept']:,}" and rec["records"] == f"{summary['records']:,}"
    for key, gap in (("promptExact", "promptTokenGap"), ("completionExact", "completionTokenGap")):
        assert rec[key] == f"{summary[gap]['exact']:,}/{summary[gap]['count']:,}"
    tools = progress.get("tools") or {}
    if tools.get("declaredPrompts"):
        assert lines["tools"]["figures"]["declared"] == f"{tools['declaredPrompts']:,}"
        assert lines["tools"]["figures"]["callRate"] == f"{100 * tools['callRate']:.1f}%"
    # the sample: its loss tokens highlighted, the prompt not
    assert got["trained"] and got["prompt"]
    assert not set(got["trainedColour"]) & set(got["promptColour"]), (got["trainedColour"], got["promptColour"])
    return got


@pytest.mark.integration
def test_the_page_opens_with_the_verdict_then_the_sample_then_the_plots(tmp_path):
    store = _full_store(tmp_path / "out")
    page = Path(publish(store).removeprefix("file://"))
    got = check_verdict(page, tmp_path / "out", "report-verdict.png")
    assert got["prompt"] == PROMPT and got["trained"] == "".join(ANSWER)  # every token, in its place
    assert got["why"] == "Chosen: no answer's tool calls take all their arguments from the prompt; of the answers " \
                         "without a tool call, the one of median length."
    assert [x["status"] for x in got["lines"]] == ["warn", "warn", "bad", "info"]
    plots = got["plots"]
    ticks = plots["per tool"]["y2ticks"]
    assert ticks and all(t.isdigit() for t in ticks) and len(set(ticks)) == len(ticks), ticks  # whole, distinct
    assert plots["fidelity per provider (scored by moonshotai/Kimi-K2.5)"]["yrange"] == [0, 1]  # never auto-scaled
    assert plots["fidelity: top-1 agreement per sample"]["xrange"] == [0, 1]
    spend = next(v for k, v in plots.items() if k.startswith("spend over time"))
    assert spend["spentGap"] == 6 and spend["annotations"] == ["attempt 1", "attempt 2"]


@pytest.mark.integration
def test_html_page_renders_every_plot_in_chromium(tmp_path):
    store = _full_store(tmp_path / "out")
    data = collect(store)
    expected = [title for _s, title, _f in figures(data)]
    assert len(expected) == 14  # spend, throughput, 3 tool plots, 2 audit, 2 tokens, 2 gaps, 3 fidelity
    spend = figures(data)[0][2]
    assert [t.name for t in spend.data] == ["spent", "spent + reserved (in flight)", "budget $1.00",
                                            "forecast $0.47"]
    url = publish(store, data)
    page = Path(url.removeprefix("file://"))
    assert page == tmp_path / "out" / layout.REPORT
    check_page(page, expected, "report-full.png")


def test_the_audit_verdict_opens_the_page_and_an_older_audit_json_still_reads(tmp_path):
    import html

    data = collect(_full_store(tmp_path / "out"))
    page = render(data)
    order = [page.index(m) for m in ("<section id='verdict'>", "<p class='verdict'>", "<section id='sample'>",
                                     "plot-0", "<section id='audit'>", "<section id='tables'>")]
    assert order == sorted(order)
    assert html.escape(data.audit["verdict"]) in page and "As text, the model called a tool on" in page
    assert page.count("side by side: the same prompt in both modes") == 1  # the audit's tables once
    console = Console(record=True, width=160, file=io.StringIO())
    print_report(data, console)  # the audit's verdict right after the run table
    text = console.export_text()
    assert text.index("audit verdict") < text.index("samples by outcome")

# ------------------------------------------------------------------- what the data is worth (eyrie evaluate)


def _evaluation_doc(against_acc: float = 0.6, heldout: int = 40) -> dict:
    """evaluation.json as `eyrie evaluate OUT --against OTHER --control` writes it (run.document), from
    SpecForge's per-sample counts drawn at these accuracies: the reference 0.8 at every draft position,
    the other output `against_acc`, the control 0.05."""
    import numpy as np

    from eyrie.jobs.evaluate.run import Trained, document

    rng = np.random.default_rng(7)
    trained = []
    for name, kind, acc in (("out", "reference", 0.8), ("other", "against", against_acc),
                            ("control: shuffled tokens", "control", 0.05)):
        denom = rng.integers(20, 60, size=(heldout, 1)) * np.ones((1, 7))
        correct = rng.binomial(denom.astype(int), acc).astype(float)
        training = {"samples": 160, "heldoutPromptsLeftOut": heldout, "lossTokens": 9000, "passes": 8.5,
                    "steps": 300, "tokensPerStep": 256, "seconds": 90.0}
        per = (correct.sum(0) / denom.sum(0)).tolist()
        trained.append(Trained(name, kind, f"file:///runs/{name}", training, [9.0 - i / 50 for i in range(300)],
                               correct, denom, {"eval/per_position_acc": per}))
    held = {"uri": "file:///runs/out", "samples": heldout, "seed": 0, "tokens": int(trained[0].denom[:, 0].sum()),
            "idsSha256": "0" * 64}
    settings = {"steps": 300, "tokens_per_step": 256, "ttt_length": 7, "seed": 0}
    return document("k", {"model": "builtin:tiny-chat"}, [], held, settings, True, "cpu", trained)


def test_the_worth_line_reads_the_evaluation_and_eyrie_report_prints_it(tmp_path):
    """`eyrie report`'s verdict row "What the data is worth": the first drafter's accepted length with
    its interval and the evaluation's verdict; ok when every other output's drafter is told apart
    below it, warn when one serves the target's traffic better, info when the held-out set cannot
    tell."""
    doc = _evaluation_doc()
    data = collect(_full_store(tmp_path / "out", doc))
    worth = {v.key: v for v in verdict(data)}["worth"]
    length = doc["drafters"][0]["acceptance"]["acceptedLength"]
    assert worth.title == "What the data is worth" and worth.status == "ok"
    assert float(worth.figures["acceptedLength"]) == pytest.approx(length["value"], abs=5e-4)
    assert (float(worth.figures["low"]), float(worth.figures["high"])) == pytest.approx(
        (length["low"], length["high"]), abs=5e-4) and worth.figures["heldout"] == "40"
    assert all(f in worth.text for f in worth.figures.values()) and doc["verdict"] in worth.text
    assert "a drafter trained on other accepts" in worth.text and "fewer tokens per step" in worth.text
    console = Console(record=True, width=240, file=io.StringIO())
    print_report(data, console)
    row = next(line for line in console.export_text().splitlines() if "What the data is worth" in line)
    assert f"A drafter trained on out accepts {worth.figures['acceptedLength']} [" in row
    assert {v.key: v.status for v in verdict(collect(_full_store(tmp_path / "better", _evaluation_doc(0.95))))}[
        "worth"] == "warn"  # another output's drafter accepts more of this target's tokens
    assert {v.key: v.status for v in verdict(collect(_full_store(tmp_path / "same", _evaluation_doc(0.8))))}[
        "worth"] == "info"


ACCEPTANCE = """JSON.stringify({
  order: ['verdict', 'sample', 'acceptance'].map(id => document.getElementById(id).getBoundingClientRect().top),
  worth: (l => l && {status: l.className, text: l.querySelector('dd').textContent,
                     figures: JSON.parse(l.dataset.figures)})(document.querySelector("#verdict [data-line='worth']")),
  verdict: document.querySelector('#acceptance p.verdict').textContent,
  rows: Array.from(document.querySelectorAll('#acceptance tr[data-drafter]')).map(r => ({
    name: r.dataset.drafter, length: Number(r.dataset.length), cells: Array.from(r.cells).map(c => c.textContent)})),
  traces: (d => d.data.map(t => ({name: t.name, y: t.y, up: t.error_y.array, down: t.error_y.arrayminus})))(
    document.getElementById('plot-acceptance')),
  points: document.querySelectorAll('#plot-acceptance g.trace.scatter .points path').length,
  bars: document.querySelectorAll('#plot-acceptance g.errorbar').length,
})"""


@pytest.mark.integration
def test_the_acceptance_section_renders_in_chromium(tmp_path):
    """The page of a run with evaluation.json: the verdict's worth line, then (after the sample) the
    acceptance section with its table, its verdict and its plot, every drafter drawn with 95% bars."""
    doc = _evaluation_doc()
    store = _full_store(tmp_path / "out", doc)
    data = collect(store)
    page = Path(publish(store, data).removeprefix("file://"))
    title = f"acceptance by draft position ({doc['heldout']['samples']} held-out answers)"
    check_page(page, [title, *(t for _s, t, _f in figures(data))], "report-acceptance.png")
    got = json.loads(open_page(page, ACCEPTANCE, READY).value)
    assert got["order"] == sorted(got["order"])  # the verdict, the sample, then what the data is worth
    assert got["worth"]["status"] == "ok" and doc["verdict"] in got["worth"]["text"]
    assert all(f in got["worth"]["text"] for f in got["worth"]["figures"].values())
    assert got["verdict"] == doc["verdict"]
    assert [r["name"] for r in got["rows"]] == [d["name"] for d in doc["drafters"]]
    for row, d, trace in zip(got["rows"], doc["drafters"], got["traces"], strict=True):
        a = d["acceptance"]
        assert row["length"] == pytest.approx(a["acceptedLength"]["value"])
        assert row["cells"][2:9] == [f"{e['value']:.3f}" for e in a["accByPosition"]]
        assert row["cells"][9].startswith(f"{a['acceptedLength']['value']:.3f} [")
        assert trace["name"] == f"{d['name']}: {a['acceptedLength']['value']:.2f} per step"
        assert trace["y"] == pytest.approx([e["value"] for e in a["accByPosition"]])
        assert trace["up"] == pytest.approx([e["high"] - e["value"] for e in a["accByPosition"]])
        assert trace["down"] == pytest.approx([e["value"] - e["low"] for e in a["accByPosition"]])
    assert got["rows"][0]["cells"][10] == "-" and got["rows"][1]["cells"][10].startswith("-")
    assert got["points"] == 3 * 7 and got["bars"] == 3 * 7  # every drafter's every position, with its interval


HISTOGRAMS = """JSON.stringify(Array.from(document.querySelectorAll('.plotly-graph-div'))
  .filter(d => ((d.querySelector('.gtitle') || {}).textContent || '').includes('per sample'))
  .map(d => {
    const area = d.querySelector('.nsewdrag').getBoundingClientRect();
    const bars = Array.from(d.querySelectorAll('g.trace.bars path')).map(p => p.getBoundingClientRect())
      .filter(b => b.width > 0.5 && b.height > 0.5);
    return {title: d.querySelector('.gtitle').textContent, bars: bars.length,
            inside: bars.filter(b => b.left >= area.left - 0.5 && b.right <= area.right + 0.5).length,
            counted: d.calcdata[0].reduce((n, c) => n + (c.s || 0), 0)};
  }))"""


@pytest.mark.integration
def test_a_top1_histogram_where_every_answer_agrees_is_drawn_inside_its_axis(tmp_path):
    """The quickstart's usual case: every sample's top-1 agreement is 1.0. Its bar is drawn inside the
    plot's [0, 1] axis (it was drawn in a bin from 1.0 to 1.025, past the axis: an empty plot)."""
    if find_browser() is None:
        pytest.fail("headless chromium is needed for this test (hack/test-deps.sh installs Debian's `chromium`)")
    store = _full_store(tmp_path / "out")
    buf = io.BytesIO()
    pq.write_table(pa.table({"sample_id": [f"s{i}" for i in range(55)], "top1_agreement": [1.0] * 55,
                             "mean_nll": [0.2 + (i % 7) / 5 for i in range(55)]}), buf)
    store.put(f"{layout.FIDELITY}/shard-00000.parquet", buf.getvalue())
    page = Path(publish(store).removeprefix("file://"))
    result = open_page(page, HISTOGRAMS, READY)
    assert result.errors == [], result.errors
    plots = {p["title"]: p for p in json.loads(result.value)}
    top1 = plots["fidelity: top-1 agreement per sample"]
    assert top1["counted"] == 55 and top1["bars"] >= 1 and top1["inside"] == top1["bars"], top1
    nll = plots["fidelity: mean NLL per sample"]
    assert nll["counted"] == 55 and nll["inside"] == nll["bars"] >= 1, nll
