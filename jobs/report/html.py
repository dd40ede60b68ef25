"""The report as one self-contained HTML page, assembled from sections.

The first screen answers before any table: the verdict (tool semantics, reconstruction, fidelity,
what the money bought; `verdict.py`) and the audit's verdict when there is one; then one sample
rendered as the drafter trains on it, its loss mask coloured; then the plots; then every table.
Each section is a function of the ReportData returning its HTML or None (nothing to show); `SECTIONS`
is the page's order, and a new section is one more function in it.

Plotting library: plotly. Its wheel ships plotly.js, so the page inlines the script once and works
offline, from disk or from an S3 console download, with hover, zoom and per-trace toggles; it is
pure Python (no compiled dependency, nothing for the operator image to build). Vega-Altair, the
other candidate, needs vl-convert's native wheel to inline its three JS bundles. The bundle is 4.6
MB, so it travels gzipped in base64 (`plotly_gz`) and the browser inflates it (`LOADER`); each plot
is its figure's JSON, drawn once the library runs.

Every figure comes from `figures(data)`, which leaves out a plot whose data the run has not
produced (no audit, no extraction, no fidelity yet): the page of a run at any stage is complete.
Time axes mark each attempt and draw no line across the idle time between two attempts.
"""

from __future__ import annotations

import base64
import functools
import gzip
import html
import io
import itertools
import json
import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots
from rich.console import Console, Group

from eyrie.jobs.contract.calltally import CallTally
from eyrie.jobs.report.data import ReportData
from eyrie.jobs.report.terminal import audit_renderables, print_report
from eyrie.jobs.report.text import bracket, dollars
from eyrie.jobs.report.verdict import scoring_model, verdict

TEMPLATE = "plotly_white"
HEIGHT = 340
ON_SCALE = 0.2  # the budget line is drawn once spend reaches this share of it
WIDTH = 640  # fixed: a responsive plot re-lays itself out on every resize (and mid-screenshot)

Figure = tuple[str, str, go.Figure]  # (section, title, figure)
# a dollar axis: its ticks and hover labels at most 6 decimals, as `dollars` prints money (d3-format)
USD_AXIS = {"title": "USD", "tickprefix": "$", "hoverformat": ",.6~f", "rangemode": "tozero"}


# plotly's toolbar (the modebar) stands upright in a right margin of its own: lying along the top it
# covered the plots' titles
MODEBAR = {"orientation": "v"}
MARGIN = {"l": 50, "r": 44, "t": 50, "b": 40}
# a figure with a right-hand axis: its title gets room left of the upright toolbar, which covered it
RIGHT_AXIS_MARGIN = {**MARGIN, "r": 96}
TOP_BIN = 1 - 1e-9  # a top-1 agreement of 1.0 is drawn in the last bin, [0.975, 1]


def _fig(title: str, **layout: Any) -> go.Figure:
    f = go.Figure()
    layout = {"margin": MARGIN, **layout}
    f.update_layout(title=title, template=TEMPLATE, height=HEIGHT, width=WIDTH, autosize=False,
                    modebar=MODEBAR, legend={"orientation": "h", "y": -0.2}, **layout)
    return f


def _time(p: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(str(p["t"]).replace("Z", "+00:00"))


def attempts(pts: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The time series cut where the attempt changes: each run of points of one attempt."""
    return [list(g) for _k, g in itertools.groupby(pts, key=lambda p: p.get("attempt"))]


def _gapped(runs: list[list[Any]]) -> list[Any]:
    """Runs joined with a None between them: plotly draws no line across a None."""
    out: list[Any] = []
    for i, r in enumerate(runs):
        out += ([None] if i else []) + r
    return out


def _series(runs: list[list[dict[str, Any]]], y: Callable[[dict[str, Any]], float]) -> dict[str, list[Any]]:
    """x and y of a trace over the attempts, with no line between two of them."""
    return {"x": _gapped([[_time(p) for p in r] for r in runs]), "y": _gapped([[y(p) for p in r] for r in runs])}


def _mark_attempts(f: go.Figure, runs: list[list[dict[str, Any]]]) -> None:
    """A dotted line and a label where each attempt after the first starts; an idle time between
    two attempts longer than the attempts themselves is cut out of the axis (a break, not a line)."""
    if len(runs) < 2:
        return
    busy = sum((_time(r[-1]) - _time(r[0])).total_seconds() for r in runs)
    pad = max(busy / 50, 1.0)
    breaks = []
    for a, b in itertools.pairwise(runs):
        idle = (_time(b[0]) - _time(a[-1])).total_seconds()
        if idle > max(busy, 4 * pad):
            breaks.append({"bounds": [_time(a[-1]) + timedelta(seconds=pad), _time(b[0]) - timedelta(seconds=pad)]})
    if breaks:
        f.update_xaxes(rangebreaks=breaks)
    for n, r in enumerate(runs, start=1):
        x = _time(r[0])
        if n > 1:
            f.add_shape(type="line", x0=x, x1=x, xref="x", y0=0, y1=1, yref="paper",
                        line={"dash": "dot", "color": "#6b7280", "width": 1})
        f.add_annotation(x=x, y=1, xref="x", yref="paper", yanchor="bottom", showarrow=False,
                         text=f"attempt {n}", font={"size": 10, "color": "#6b7280"},
                         hovertext=str(r[0].get("attempt", "")))


def _usd(p: dict[str, Any], key: str) -> float:
    return float(p.get(key) or 0)


def spend_figure(d: ReportData) -> go.Figure | None:
    pts = d.series
    if not pts:
        return None
    runs = attempts(pts)
    f = _fig("spend over time against the budget", yaxis=USD_AXIS)
    f.add_scatter(**_series(runs, lambda p: _usd(p, "spentUSD")), name="spent", mode="lines+markers")
    f.add_scatter(**_series(runs, lambda p: _usd(p, "spentUSD") + _usd(p, "reservedUSD")),
                  name="spent + reserved (in flight)", mode="lines", line={"dash": "dot"})
    x = [_time(pts[0]), _time(pts[-1])]
    top = max(_usd(p, "spentUSD") + _usd(p, "reservedUSD") for p in pts)
    if d.budget is not None and top >= float(d.budget) * ON_SCALE:
        f.add_scatter(x=x, y=[float(d.budget)] * 2, name=f"budget {dollars(d.budget)}", mode="lines",
                      line={"color": "crimson"})
    elif d.budget:  # a line far above would flatten the spend into the axis
        f.update_layout(title=f"spend over time: {100 * float(d.spent / d.budget):.1f}% of the "
                              f"{dollars(d.budget)} budget")
    forecast = (d.progress or {}).get("forecastUSD")
    if any(p.get("forecastUSD") is not None for p in pts):  # the projection as it moved, from the canary on
        projected = [[p for p in r if p.get("forecastUSD") is not None] for r in runs]
        f.add_scatter(**_series([r for r in projected if r], lambda p: _usd(p, "forecastUSD")),
                      name=f"forecast (now {dollars(forecast)})" if forecast is not None else "forecast",
                      mode="lines", line={"dash": "dash", "color": "orange", "shape": "hv"})
    elif forecast is not None:  # a run from before the points kept it: its last projection only
        f.add_scatter(x=x, y=[float(forecast)] * 2, name=f"forecast {dollars(forecast)}", mode="lines",
                      line={"dash": "dash", "color": "orange"})
    _mark_attempts(f, runs)
    return f


def _per_minute(pts: list[dict[str, Any]], key: Any) -> tuple[list[datetime], list[float]]:
    """Rate per minute over the intervals of one attempt's points (a new attempt restarts its request
    counters; a counter that went down counts from zero). An interval shorter than half the usual
    one (the last point is written whenever the run ends, often a moment after the one before) joins
    the interval before it: a count over a fraction of a second is no rate, and read as one it spikes."""
    gaps = sorted(d for a, b in itertools.pairwise(pts) if (d := (_time(b) - _time(a)).total_seconds()) > 0)
    shortest = gaps[len(gaps) // 2] / 2 if gaps else 0.0
    xs: list[datetime] = []
    ys: list[float] = []
    ends: list[dict[str, Any]] = []  # the point each rate was measured from
    start = pts[0] if pts else None
    for b in pts[1:]:
        assert start is not None
        if (_time(b) - _time(start)).total_seconds() < shortest:
            continue
        xs.append(_time(b))
        ys.append(_rate(start, b, key))
        ends.append(start)
        start = b
    if pts and start is not pts[-1] and ends:  # a short last interval: the one before it stretched to the end
        xs[-1], ys[-1] = _time(pts[-1]), _rate(ends[-1], pts[-1], key)
    return xs, ys


def _rate(a: dict[str, Any], b: dict[str, Any], key: Any) -> float:
    dt = max((_time(b) - _time(a)).total_seconds(), 1e-9)
    va, vb = key(a), key(b)
    return 60 * (vb - va if vb >= va else vb) / dt


def _persisted(p: dict[str, Any]) -> int:
    return sum(p.get(k, 0) for k in ("done", "rejected", "discarded", "dropped", "failed"))


def throughput_figure(d: ReportData) -> go.Figure | None:
    runs = [r for r in attempts(d.series) if len(r) >= 2]
    if not runs:
        return None
    f = _fig("throughput and retries over time", yaxis_title="per minute")
    for name, key in (("answers persisted", _persisted), ("requests", lambda p: p.get("requests", 0)),
                      ("retries", lambda p: p.get("retries", 0)), ("errors", lambda p: p.get("errors", 0))):
        per = [_per_minute(r, key) for r in runs]
        f.add_scatter(x=_gapped([x for x, _ in per]), y=_gapped([y for _, y in per]), name=name, mode="lines+markers")
    _mark_attempts(f, attempts(d.series))
    return f


RATE_AXIS = {"title": "rate", "tickformat": ".0%", "range": [0, 1.02]}  # a rate's whole range, never auto-scaled


def _rates_figure(title: str, groups: dict[str, CallTally]) -> go.Figure | None:
    if not groups:
        return None
    names = sorted(groups)
    f = _fig(title, yaxis=RATE_AXIS, barmode="group")
    f.add_bar(x=names, y=[groups[n].call_rate for n in names], name="tool-call rate")
    f.add_bar(x=names, y=[groups[n].invalid_rate for n in names], name="invalid-call rate")
    f.add_bar(x=names, y=[groups[n].leak_rate for n in names], name="leak rate")
    return f


def count_step(top: float, ticks: int = 5) -> int:
    """A whole step for a count axis (1, 2, 5, 10, 20, 50, ...) giving at most `ticks` ticks up to
    `top`: plotly's own step can be 0.5, which a whole-number format prints as 0, 1, 1, 2."""
    steps = (m * 10**e for e in itertools.count() for m in (1, 2, 5))
    return next(step for step in steps if top / step <= ticks)


def tool_figure(d: ReportData) -> go.Figure | None:
    tools = d.answers.by_tool
    if not tools:
        return None
    names = sorted(tools)
    calls = [tools[n].calls for n in names]
    f = _fig("per tool", yaxis=RATE_AXIS, barmode="group", margin=RIGHT_AXIS_MARGIN,
             yaxis2={"title": "calls", "overlaying": "y", "side": "right", "showgrid": False,
                     "range": [0, max(calls, default=0) * 1.1 + 0.5], "tick0": 0,
                     "dtick": count_step(max(calls, default=1))})
    f.add_bar(x=names, y=[tools[n].call_rate or 0.0 for n in names], name="call rate where declared",
              offsetgroup=0)
    f.add_bar(x=names, y=[tools[n].invalid_rate for n in names], name="invalid-call rate", offsetgroup=1)
    f.add_scatter(x=names, y=calls, name="calls", mode="markers", yaxis="y2",
                  marker={"size": 10, "symbol": "diamond"})
    return f


def _bars(f: go.Figure, labels: list[str], estimates: list[dict[str, Any] | None], name: str) -> None:
    """Bars with their 95% intervals as error bars."""
    ys = [(e or {}).get("value") for e in estimates]
    hi = [(e["high"] - e["value"]) if e and e.get("value") is not None else 0 for e in estimates]
    lo = [(e["value"] - e["low"]) if e and e.get("value") is not None else 0 for e in estimates]
    f.add_bar(x=labels, y=ys, name=name, error_y={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo})


def audit_figures(d: ReportData) -> list[go.Figure]:
    figs = (d.audit or {}).get("figures")
    if not figs:
        return []
    modes = [m for m in ("text", "structured") if m in figs["modes"]]
    rates = _fig(f"audit: tools as text vs structured ({d.audit.get('samples')} prompts, 95% intervals)",
                 yaxis=RATE_AXIS, barmode="group")
    labels = {"callRate": "tool-call rate", "validRate": "valid-call rate", "hallucinatedRate": "hallucinated",
              "leakRate": "leak rate"}
    for mode in modes:
        _bars(rates, list(labels.values()), [figs["modes"][mode].get(k) for k in labels], mode)
    dollars = _fig("audit: dollars per answer (95% intervals)", yaxis=USD_AXIS)
    _bars(dollars, modes, [figs["modes"][m]["costPerAnswer"] for m in modes], "USD per answer")
    return [rates, dollars]


def token_figures(d: ReportData) -> list[go.Figure]:
    out = []
    for title, res in (("prompt tokens per answer (usage.prompt_tokens)", d.answers.prompt_tokens),
                       ("completion tokens per answer (usage.completion_tokens)", d.answers.completion_tokens)):
        if not res.values:
            continue
        note = f" - a uniform sample of {len(res.values)} of {res.seen}" if res.seen > len(res.values) else ""
        f = _fig(title + note, xaxis_title="tokens", yaxis_title="answers", showlegend=False)
        f.add_histogram(x=res.values, nbinsx=min(60, max(10, int(math.sqrt(len(res.values))) * 2)))
        out.append(f)
    return out


def gap_figures(d: ReportData) -> list[go.Figure]:
    s = (d.reconstruction or {}).get("samples") or {}
    out = []
    for key, title in (("completionTokenGap", "completion-token gap: reconstructed answer minus usage"),
                       ("promptTokenGap", "prompt-token gap: rendered prompt minus usage")):
        hist = (s.get(key) or {}).get("histogram")
        if not hist:
            continue
        xs = sorted(hist, key=int)
        f = _fig(title, xaxis_title="tokens (0 = exact)", yaxis_title="samples", showlegend=False, bargap=0.05)
        f.add_bar(x=[int(x) for x in xs], y=[hist[x] for x in xs],
                  marker_color=["seagreen" if x == "0" else "#636efa" for x in xs])
        out.append(f)
    return out


def fidelity_figures(d: ReportData) -> list[go.Figure]:
    if not d.fidelity:
        return []
    by_model = f" (scored by {scoring_model(d)})" if scoring_model(d) else ""
    out = []
    for col, title, axis in (("top1_agreement", "top-1 agreement per sample", {"range": [0, 1], "tickformat": ".0%"}),
                             ("mean_nll", "mean NLL per sample", {"rangemode": "tozero"})):
        res = (d.fidelity_scores or {}).get(col)
        if res is not None and res.values:
            f = _fig(f"fidelity: {title}", yaxis_title="samples", showlegend=False, xaxis=axis)
            if col == "top1_agreement":  # bins [0, 0.025) ... [0.975, 1]: the last one holds 1.0, the usual
                # value, inside the axis's [0, 1] (plotly's bins are half-open: 1.0 alone fell in [1, 1.025))
                top = [min(v, TOP_BIN) for v in res.values]
                f.add_histogram(x=top, xbins={"start": 0, "end": 1, "size": 0.025})
            else:
                f.add_histogram(x=res.values, nbinsx=40)
            out.append(f)
    by = {n: g for n, g in ((d.fidelity or {}).get("byProvider") or {}).items() if g.get("top1Agreement") is not None}
    if by:
        names = sorted(by)
        fig = make_subplots(rows=1, cols=2, subplot_titles=("top-1 agreement", "mean NLL"))
        fig.add_bar(x=names, y=[by[n].get("top1Agreement") for n in names], row=1, col=1, name="top-1")
        fig.add_bar(x=names, y=[by[n].get("meanNLL") for n in names], row=1, col=2, name="mean NLL")
        fig.update_yaxes(range=[0, 1], tickformat=".0%", row=1, col=1)
        fig.update_yaxes(rangemode="tozero", row=1, col=2)
        fig.update_layout(title=f"fidelity per provider{by_model}", template=TEMPLATE, height=HEIGHT, width=WIDTH,
                          autosize=False, showlegend=False, margin={**MARGIN, "t": 70}, modebar=MODEBAR)
        out.append(fig)
    return out


def acceptance_figure(d: ReportData) -> go.Figure | None:
    """`eyrie evaluate`: each drafter's accuracy at every draft position on the held-out answers, 95% bars."""
    e = d.evaluation
    if not e or not e.get("drafters"):
        return None
    f = _fig(f"acceptance by draft position ({e['heldout']['samples']:,} held-out answers)",
             xaxis_title="draft position k", yaxis_title="acc_k", yaxis_range=[0, 1])
    for r in e["drafters"]:
        est = r["acceptance"]["accByPosition"]
        ys = [x["value"] for x in est]
        f.add_trace(go.Scatter(
            x=list(range(len(est))), y=ys, mode="lines+markers",
            name=f"{r['name']}: {r['acceptance']['acceptedLength']['value']:.2f} per step",
            error_y={"type": "data", "symmetric": False, "array": [x["high"] - y for x, y in zip(est, ys, strict=True)],
                     "arrayminus": [y - x["low"] for x, y in zip(est, ys, strict=True)]}))
    return f


def figures(d: ReportData) -> list[Figure]:
    """Every plot the run's data supports, in page order."""
    out: list[Figure] = []

    def add(section: str, fig: go.Figure | None) -> None:
        if fig is not None:
            out.append((section, fig.layout.title.text or "", fig))

    add("Spend and throughput", spend_figure(d))
    add("Spend and throughput", throughput_figure(d))
    add("Tool semantics", _rates_figure("per source", d.answers.by_source))
    add("Tool semantics", _rates_figure("per provider", d.answers.by_provider))
    add("Tool semantics", tool_figure(d))
    for f in audit_figures(d):
        add("Audit: text vs structured", f)
    for f in token_figures(d):
        add("Tokens", f)
    for f in gap_figures(d):
        add("Token-count gaps", f)
    for f in fidelity_figures(d):
        add("Fidelity", f)
    return out


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;background:#fafafa;color:#222}
header{background:#1f2937;color:#fff;padding:16px 28px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;color:#cbd5e1;font-size:14px}main{padding:8px 28px 40px}
h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.grid{display:flex;flex-wrap:wrap;gap:14px}
.card{background:#fff;border:1px solid #e5e7eb;border-radius:6px;padding:4px;width:640px;height:340px}
p.verdict{background:#fff;border-left:4px solid #2563eb;padding:10px 14px;font-size:15px;line-height:1.45;
max-width:1100px}
dl.verdict{margin:0;max-width:1100px}dl.verdict div{background:#fff;border-left:6px solid #9ca3af;padding:8px 14px;
margin:6px 0;font-size:15px;line-height:1.45}dl.verdict dt{font-weight:600;font-size:13px;text-transform:uppercase;
letter-spacing:.04em;color:#374151}dl.verdict dd{margin:2px 0 0}
dl.verdict .ok{border-color:#16a34a}dl.verdict .warn{border-color:#d97706}dl.verdict .bad{border-color:#dc2626}
pre.tables{background:#fff;border:1px solid #e5e7eb;border-radius:6px;padding:12px;font-size:12px;overflow-x:auto}
pre.sample{background:#fff;border:1px solid #e5e7eb;border-radius:6px;padding:12px;font-size:13px;line-height:1.6;
white-space:pre-wrap;word-break:break-word;max-width:1300px}
.sample span,.legend span{border-radius:2px}.sample .p,.legend .p{color:#6b7280}
.sample .p.b,.legend .p.b{background:#f3f4f6}
.sample .t{color:#111}.sample .t.a,.legend .t.a{background:#bbf7d0}.sample .t.b{background:#86efac}
.sample .t.k.a,.legend .t.k.a{background:#bfdbfe}.sample .t.k.b{background:#93c5fd}
.sample .t.r.a,.legend .t.r.a{background:#fde68a}.sample .t.r.b{background:#fcd34d}
.sample .s{font-weight:700}.sample .gap{color:#9ca3af;font-style:italic}
table.acceptance{border-collapse:collapse;background:#fff;font-size:13px;margin:6px 0}
table.acceptance td,table.acceptance th{border:1px solid #e5e7eb;padding:3px 8px;text-align:right}
table.acceptance td:first-child{text-align:left}
p.legend{font-size:13px;color:#374151;margin:4px 0 8px}p.legend span{padding:1px 6px;border-radius:2px;margin-right:6px}
p.legend span.why{padding:0;color:#4b5563;font-style:italic}
.plot-note{color:#b91c1c;font-size:13px;padding:12px}
"""


Section = Callable[[ReportData], "str | None"]  # a part of the page: its HTML, or None when it has nothing


def terminal_html(d: ReportData, audit: bool = False) -> str:
    """The terminal tables, recorded and exported with inline styles (the same text as `eyrie report`);
    the audit's own tables only with `audit` (they have a section of their own). Wide enough that
    no table is squeezed: the page scrolls them."""
    console = Console(record=True, width=170 if audit else 200, file=io.StringIO(), color_system="truecolor")
    if audit:
        console.print(Group(*audit_renderables(d.audit or {})[1:]))
    else:
        print_report(d, console, audit=False)
    return console.export_html(inline_styles=True, code_format="<pre class='tables'>{code}</pre>")


def verdict_html(d: ReportData) -> str | None:
    """The first screen: one line per question, its figures kept in `data-figures` as printed."""
    lines = verdict(d)
    items = "".join(
        f"<div class='{v.status}' data-line='{v.key}' data-figures='{html.escape(json.dumps(v.figures))}'>"
        f"<dt>{html.escape(v.title)}</dt><dd>{html.escape(v.text)}</dd></div>" for v in lines)
    return f"<section id='verdict'><h2>Verdict</h2><dl class='verdict'>{items}</dl></section>"


def audit_verdict_html(d: ReportData) -> str | None:
    """The audit's verdict in words, on the first screen beside the run's (its tables come later)."""
    if not d.audit or not d.audit.get("figures"):
        return None
    return (f"<section id='audit-verdict'><h2>Audit: tools as text vs structured</h2>"
            f"<p class='verdict'>{html.escape(d.audit['verdict'])}</p></section>")


def audit_html(d: ReportData) -> str | None:
    """The audit's tables (its verdict is on the first screen)."""
    if not d.audit or not d.audit.get("figures"):
        return None
    return f"<section id='audit'><h2>Audit: the figures</h2>{terminal_html(d, audit=True)}</section>"


_SEGMENT_CLASS = {"reasoning": "r", "content": "c", "tool_calls": "k", "prompt": ""}


def sample_html(d: ReportData) -> str | None:
    """One sample as the drafter trains on it: the tokens its loss is on highlighted (by segment),
    the prompt grey; neighbouring tokens alternate in shade so their boundaries show."""
    s = d.sample
    if s is None:
        return None
    spans = []
    for i, p in enumerate(s.pieces):
        if s.hidden and i == s.gap_at:
            spans.append(f"<span class='gap'>[... {s.hidden:,} prompt tokens not shown ...]</span>")
        cls = " ".join(c for c in ("t" if p.trained else "p", "ab"[i % 2], _SEGMENT_CLASS[p.segment],
                                   "s" if p.special else "") if c)
        where = f"{p.segment}, {'in the loss' if p.trained else 'not trained'}, {p.tokens} token{'s' * (p.tokens > 1)}"
        spans.append(f"<span class='{cls}' title='{where}'>{html.escape(p.text)}</span>")
    turn = f", turn {s.turn}" if s.turn else ""
    shown = sum(p.tokens for p in s.pieces if p.trained)
    cut = f" (the first {shown:,} shown)" if shown < s.trained else ""
    return (
        "<section id='sample'><h2>One sample, as the drafter trains on it</h2>"
        f"<p class='legend'>sample {html.escape(s.sample_id)} ({html.escape(s.source)}{turn}, provider "
        f"{html.escape(s.provider or '(unknown)')}): {s.tokens:,} tokens, {s.trained:,} of them in the loss{cut}. "
        + (f"<span class='why'>Chosen: {html.escape(s.why)}.</span> " if s.why else "") +
        "<span class='p b'>prompt (masked)</span><span class='t a r'>reasoning</span>"
        "<span class='t a'>content</span><span class='t a k'>tool calls</span>"
        "<b>bold</b>: a template marker (one token)</p>"
        f"<pre class='sample' data-tokens='{s.tokens}' data-trained='{s.trained}'>{''.join(spans)}</pre></section>")


CONFIG = {"displaylogo": False, "responsive": False, "displayModeBar": "hover"}


def plot_div(div_id: str, fig: go.Figure) -> str:
    """A plot's place and its figure as JSON, drawn by `LOADER` once plotly.js is inflated."""
    spec = fig.to_json().replace("</", "<\\/")  # no "</script>" inside the script element
    # the div as plotly writes it (double quotes: what readers of the page look for)
    return (f'<div id="{div_id}" class="plotly-graph-div" style="width:{WIDTH}px;height:{HEIGHT}px"></div>'
            f"<script type='application/json' class='eyrie-plot' data-div='{div_id}'>{spec}</script>")


def plots_html(d: ReportData) -> str | None:
    sections: dict[str, list[str]] = {}
    for i, (section, _title, fig) in enumerate(figures(d)):
        sections.setdefault(section, []).append(f"<div class='card'>{plot_div(f'plot-{i}', fig)}</div>")
    return "".join(f"<h2>{html.escape(s)}</h2><div class='grid'>{''.join(divs)}</div>"
                   for s, divs in sections.items()) or None


def acceptance_html(d: ReportData) -> str | None:
    """What the data is worth: the drafters `eyrie evaluate` trained, their acceptance by position and
    accepted length per step (each with its 95% interval), the verdict, the plot."""
    e = d.evaluation
    fig = acceptance_figure(d)
    if not e or fig is None:
        return None
    k = len(e["drafters"][0]["acceptance"]["accByPosition"])
    diffs = {x["name"]: x["minusReference"] for x in e.get("differences") or []}

    def span(x: dict[str, Any], signed: bool = False) -> str:
        f = "{:+.3f}" if signed else "{:.3f}"
        return f"{f.format(x['value'])} {bracket(f.format(x['low']), f.format(x['high']))}"

    head = "".join(f"<th>acc_{j}</th>" for j in range(k))
    rows = "".join(
        f"<tr data-drafter='{html.escape(r['name'])}' data-length='{r['acceptance']['acceptedLength']['value']}'>"
        f"<td>{html.escape(r['name'])}</td><td>{r['training']['samples']:,}</td>"
        + "".join(f"<td>{x['value']:.3f}</td>" for x in r["acceptance"]["accByPosition"])
        + f"<td>{span(r['acceptance']['acceptedLength'])}</td>"
        + f"<td>{span(diffs[r['name']], True) if r['name'] in diffs else '-'}</td></tr>"
        for r in e["drafters"])
    div = plot_div("plot-acceptance", fig)
    return (
        "<section id='acceptance'><h2>What the data is worth: acceptance of drafters trained on it</h2>"
        f"<p class='verdict'>{html.escape(e['verdict'])}</p>"
        f"<table class='acceptance'><tr><th>drafter trained on</th><th>samples</th>{head}"
        f"<th>accepted per step [95%]</th><th>minus the first</th></tr>{rows}</table>"
        f"<p class='legend'>SpecForge {html.escape(str(e.get('specforgeVersion')))}'s EAGLE-3 draft, "
        f"{e['settings']['steps']:,} steps of {e['settings']['tokens_per_step']:,} "
        f"loss tokens each; held out: {e['heldout']['samples']:,} answers of {html.escape(e['heldout']['uri'])}, "
        "never trained on.</p>"
        f"<div class='grid'><div class='card'>{div}</div></div></section>")


def pilot_html(d: ReportData) -> str | None:
    """The pilot: each option's drafter (accepted tokens per step, the difference to the run's own with its
    interval, what the whole dataset would cost with it), the verdict in words and, when the run's own data did
    not pass, the command that switches it."""
    v = d.pilot
    if v is None:
        return None

    def span(s: Any, signed: bool = False) -> str:
        f = "{:+.2f}" if signed else "{:.2f}"
        return f"{f.format(s.value)} [{f.format(s.low)}, {f.format(s.high)}]"

    rows = "".join(
        f"<tr data-option='{o.option.value}' data-own='{str(o.own).lower()}'>"
        f"<td>{html.escape(o.option.describe())}{' (the run)' if o.own else ''}</td><td>{o.training_samples:,}</td>"
        f"<td>{span(o.accepted_length)}</td><td>{span(o.minus_own, True) if o.minus_own else '-'}</td>"
        f"<td>{'-' if o.separated is None else 'yes' if o.separated else f'no (~{o.heldout_to_separate:,} held out)'}"
        f"</td><td>{dollars(o.projected_usd) if o.projected_usd is not None else '?'}</td></tr>" for o in v.options)
    status = "ok" if v.passed else "warn" if v.proceed else "bad"
    patch = f"<p>To switch: <code class='patch'>{html.escape(v.patch)}</code></p>" if v.patch else ""
    return (
        f"<section id='pilot' class='{status}'><h2>The pilot: drafters trained on each option, before the run bought "
        f"the rest</h2><p class='verdict'>{html.escape(v.sentence)}</p>"
        "<table class='pilot'><tr><th>drafter trained on</th><th>samples</th><th>accepted per step [95%]</th>"
        "<th>minus the run's own</th><th>separated</th><th>whole dataset</th></tr>"
        f"{rows}</table>{patch}<p class='legend'>{v.prompts:,} tool-declaring prompts, {v.heldout:,} of them held "
        f"out (the target's own structured answers, never trained on); policy {v.policy}, margin {v.margin:g} "
        f"tokens per step; the pilot's answers cost {dollars(v.spent_usd)} (part of the spend); its "
        f"evaluation: {html.escape(v.evaluation)}.</p></section>")


def tables_html(d: ReportData) -> str | None:
    return f"<section id='tables'><h2>Every table</h2>{terminal_html(d)}</section>"


# The page, top to bottom; the first three are its first screen.
SECTIONS: tuple[Section, ...] = (verdict_html, audit_verdict_html, sample_html, pilot_html, acceptance_html,
                                 plots_html, audit_html, tables_html)


@functools.cache
def plotly_gz() -> str:
    """plotly.js, gzipped and in base64: 1.96 MB of a page instead of 4.8 (plotly 7.1.0's bundle is
    4.6 MB; no smaller one ships with the wheel), inflated by the browser's own DecompressionStream."""
    return base64.b64encode(gzip.compress(get_plotlyjs().encode(), 9, mtime=0)).decode()


# Inflates plotly.js, runs it, then draws every plot from its JSON; a browser without
# DecompressionStream (Chrome 80, Firefox 113, Safari 16.4 and later have it) says so in each plot's place.
LOADER = """(async () => {
  const plots = Array.from(document.querySelectorAll('script.eyrie-plot'));
  try {
    const raw = Uint8Array.from(atob(document.getElementById('plotly-gz').textContent), c => c.charCodeAt(0));
    const stream = new Blob([raw]).stream().pipeThrough(new DecompressionStream('gzip'));
    const code = document.createElement('script');
    code.text = await new Response(stream).text();
    document.head.appendChild(code);
  } catch (e) {
    for (const p of plots) {
      document.getElementById(p.dataset.div).innerHTML = "<p class='plot-note'>This browser cannot inflate the " +
        "plots' library (it needs DecompressionStream: Chrome 80, Firefox 113, Safari 16.4 or later).</p>";
    }
    return;
  }
  for (const p of plots) {
    const f = JSON.parse(p.textContent);
    Plotly.newPlot(p.dataset.div, f.data, f.layout, CONFIG);
  }
})();""".replace("CONFIG", json.dumps(CONFIG))


def render(d: ReportData, sections: tuple[Section, ...] = SECTIONS) -> str:
    """The page: one document, plotly.js inlined once (compressed: `plotly_gz`) when there is a plot,
    no request to any network."""
    body = "".join(part for section in sections if (part := section(d)))
    p = d.progress or {}
    subtitle = f"{d.uri} - outcome {p.get('outcome', '?')}, stage {p.get('stage', '?')}, spent {dollars(d.spent)}"
    plots = ("<script id='plotly-gz' type='application/octet-stream'>" + plotly_gz() + "</script>"
             f"<script>{LOADER}</script>") if "class='eyrie-plot'" in body else ""
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>eyrie report - {html.escape(d.uri)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>eyrie report</h1><p>{html.escape(subtitle)}</p></header><main>{body}</main>{plots}</body></html>"
    )
