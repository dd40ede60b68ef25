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
from eyrie.jobs.report import collect, publish
from eyrie.jobs.report.data import MAX_KEYS, OTHER, Answers, Reservoir
from eyrie.jobs.report.html import figures, render
from eyrie.jobs.report.terminal import print_report
from eyrie.jobs.store import FileStore

sys.path.insert(0, str(Path(__file__).parent))
from browser import find_browser, open_page

ARTIFACTS = Path(os.environ.get("EYRIE_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "test-artifacts"))

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
    snap = {"spentUSD": "0.5", "reservedUSD": "0.1", "requests": 7, "retries": 2, "inFlight": 3,
            "errors": {"429": 2, "500": 1},
            "samples": {"total": 10, "done": 4, "rejected": 1, "discarded": 0, "failed": 0},
            "tools": {"perTool": {"x": {}}}}
    p = timeseries.point(snap, "a1")
    assert p["errors"] == 3 and p["done"] == 4 and p["attempt"] == "a1" and "tools" not in p
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
    from eyrie.jobs.tools import audit_stats as st

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


def _full_store(root: Path) -> FileStore:
    """A run's output with every document the report reads, as the stages write them."""
    store = FileStore(root)
    recs = []
    for i in range(60):
        source = ("glaive", "chat", "agentic")[i % 3]
        provider = ("moonshotai", "fireworks")[i % 2]
        declared = ["get_weather", "calculate_bmi"] if source != "chat" else []
        calls = [("get_weather", i % 7 != 0)] if declared and i % 4 else []
        recs.append(_record(i, source, provider, declared=declared, calls=calls, leaked=(i == 5),
                            prompt=80 + 7 * i, completion=40 + (i * 37) % 400))
    recs.append(_record(99, "chat", "moonshotai", declared=[], calls=[], status="failed"))
    store.put(layout.part_key(0, 0), records.encode_part(recs[:30]))
    store.put(layout.part_key(1, 0), records.encode_part(recs[30:]))
    t0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
    pts = []
    for k in range(12):
        pts.append({"t": (t0 + timedelta(seconds=10 * k)).isoformat().replace("+00:00", "Z"), "attempt": "a1",
                    "spentUSD": str(round(0.04 * k, 4)), "reservedUSD": "0.02", "requests": 6 * k,
                    "retries": k // 3, "errors": k // 4, "done": 5 * k, "rejected": 0, "discarded": 0, "failed": 0,
                    "total": 60})
    store.put(layout.TIMESERIES, timeseries.encode(pts))
    progress = {"attempt": "a1", "stage": "done", "outcome": "Done", "spentUSD": "0.44", "reservedUSD": "0",
                "maxUSD": "1", "auditUSD": "0.02", "forecastUSD": "0.47", "requests": 66, "retries": 3,
                "errors": {"429": 2}, "samples": {"total": 61, "done": 55, "rejected": 3, "discarded": 2, "failed": 1},
                "discardedUSD": "0.0123456789",
                "failures": {"moderation": 1},
                "tokens": {"input": 9000, "output": 12000}, "tools": {"callRate": 0.7}}
    store.put(layout.PROGRESS, orjson.dumps(progress))
    store.put(layout.AUDIT, orjson.dumps(_audit_doc()))
    summary = {"chatTemplate": {"format": "kimi-k2.5"}, "samples": {
        "records": 61, "kept": 55, "tokens": 30000, "responseTokens": 12000,
        "excluded": {"policy_drop": 5, "status_failed": 1}, "flags": {"token_count_gap": 3},
        "completionTokenGap": {"count": 55, "exact": 50, "mean": 0.1, "min": -2, "p50": 0, "p90": 0, "p99": 3,
                               "max": 3, "histogram": {"-2": 1, "0": 50, "1": 2, "3": 2}},
        "promptTokenGap": {"count": 55, "exact": 55, "mean": 0, "min": 0, "p50": 0, "p90": 0, "p99": 0, "max": 0,
                           "histogram": {"0": 55}}}}
    store.put(layout.SAMPLES_SUMMARY, orjson.dumps(summary))
    fidelity = {"overall": {"samples": 55, "top1Agreement": 0.83, "meanNLL": 0.61},
                "byProvider": {"moonshotai": {"samples": 28, "top1Agreement": 0.91, "meanNLL": 0.4},
                               "fireworks": {"samples": 27, "top1Agreement": 0.74, "meanNLL": 0.9}},
                "bySource": {"glaive": {"samples": 20, "top1Agreement": 0.8, "meanNLL": 0.7}}}
    manifest = {"spentUSD": "0.44", "samples": progress["samples"], "reconstruction": summary,
                "extraction": {"engine": "sglang", "dtype": "bfloat16", "auxLayers": [2, 30, 58], "samples": 55,
                               "tokens": 30000, "bytes": 3 * 2**30, "bytesPerToken": 57344, "shardsDone": 2,
                               "skipped": {}},
                "fidelity": fidelity, "agentic": {"conversations": 20, "turnsRegenerated": 64, "diverged": 3}}
    store.put(layout.MANIFEST, orjson.dumps(manifest))
    buf = io.BytesIO()
    pq.write_table(pa.table({"sample_id": [f"s{i}" for i in range(55)],
                             "top1_agreement": [0.5 + (i % 10) / 20 for i in range(55)],
                             "mean_nll": [0.2 + (i % 7) / 5 for i in range(55)]}), buf)
    store.put(f"{layout.FIDELITY}/shard-00000.parquet", buf.getvalue())
    return store


def test_terminal_report_shows_every_section_with_data(tmp_path):
    data = collect(_full_store(tmp_path / "out"))
    console = Console(record=True, width=160, file=io.StringIO())
    print_report(data, console)
    text = console.export_text()
    for expected in ("$0.44 (44.0% of $1.00)", "forecast", "$0.47", "glaive", "fireworks", "get_weather",
                     "tools as text vs structured", "policy_drop 5", "exact 50/55", "3.0 GiB",
                     "the answers scored by the target model", "provider moonshotai", "0.910",
                     "turnsRegenerated", "failed: moderation 1",
                     "fireworks $0.03", "moonshotai $0.03", "discarded: paid $0.012346"):
        assert expected in text, expected


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
    assert "<script" in render(data)  # still a page


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
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / shot).write_bytes(result.screenshot)
    assert result.screenshot[:8] == b"\x89PNG\r\n\x1a\n" and len(result.screenshot) > 20_000
    return plots


def test_html_page_renders_every_plot_in_chromium(tmp_path):
    store = _full_store(tmp_path / "out")
    data = collect(store)
    expected = [title for _s, title, _f in figures(data)]
    assert len(expected) == 14  # spend, throughput, 3 tool plots, 2 audit, 2 tokens, 2 gaps, 3 fidelity
    spend = figures(data)[0][2]
    assert [t.name for t in spend.data] == ["spent", "spent + reserved (in flight)", "budget $1.00", "forecast $0.47"]
    url = publish(store, data)
    page = Path(url.removeprefix("file://"))
    assert page == tmp_path / "out" / layout.REPORT
    check_page(page, expected, "report-full.png")


def test_the_audit_verdict_opens_the_page_and_an_older_audit_json_still_reads(tmp_path):
    import html

    data = collect(_full_store(tmp_path / "out"))
    page = render(data)
    assert page.index("<p class='verdict'>") < page.index("<h2>Summary</h2>") < page.index("plot-0")
    assert html.escape(data.audit["verdict"]) in page and "As text, the model called a tool on" in page
    assert page.count("side by side: the same prompt in both modes") == 1  # the audit's tables once
    console = Console(record=True, width=160, file=io.StringIO())
    print_report(data, console, full=False)  # eyrie run's one screen: the verdict right after the run table
    text = console.export_text()
    assert text.index("audit verdict") < text.index("samples by outcome")
    old = FileStore(tmp_path / "old")
    old.put(layout.PROGRESS, orjson.dumps({"attempt": "a", "outcome": "Done", "spentUSD": "0.5", "maxUSD": "5",
                                           "auditUSD": "0.02"}))
    old.put(layout.AUDIT, orjson.dumps({"samples": 20, "model": "m", "outcome": "Done", "spentUSD": "0.02",
                                        "cumulativeSpentUSD": "0.05", "modes": {"text": {"callRate": 0.5},
                                                                                "structured": {"callRate": 0.9}}}))
    data = collect(old)
    assert data.audit_spent == Decimal("0.05") and data.spent == Decimal("0.53")  # 0.03 paid by audits since
    console = Console(record=True, width=160, file=io.StringIO())
    print_report(data, console)
    assert "an older audit.json" in console.export_text()
