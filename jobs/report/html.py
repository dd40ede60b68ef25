"""The report as one self-contained HTML page: the terminal tables, then plots.

Plotting library: plotly. Its wheel ships plotly.js, so the page inlines the script once and works
offline, from disk or from an S3 console download, with hover, zoom and per-trace toggles; it is
pure Python (no compiled dependency, nothing for the operator image to build). Vega-Altair, the
other candidate, needs vl-convert's native wheel to inline its three JS bundles.

Every figure comes from `figures(data)`, which leaves out a plot whose data the run has not
produced (no audit, no extraction, no fidelity yet): the page of a run at any stage is complete.
"""

from __future__ import annotations

import html
import io
import itertools
import math
from datetime import datetime
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots
from rich.console import Console, Group

from eyrie.jobs.contract.money import dollars
from eyrie.jobs.report.data import ReportData
from eyrie.jobs.report.terminal import audit_renderables, print_report
from eyrie.jobs.tools.gate import Tally

TEMPLATE = "plotly_white"
HEIGHT = 340
ON_SCALE = 0.2  # the budget line is drawn once spend reaches this share of it
WIDTH = 640  # fixed: a responsive plot re-lays itself out on every resize (and mid-screenshot)

Figure = tuple[str, str, go.Figure]  # (section, title, figure)


def _fig(title: str, **layout: Any) -> go.Figure:
    f = go.Figure()
    f.update_layout(title=title, template=TEMPLATE, height=HEIGHT, width=WIDTH, autosize=False,
                    margin={"l": 50, "r": 20, "t": 50, "b": 40}, legend={"orientation": "h", "y": -0.2}, **layout)
    return f


def _time(p: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(str(p["t"]).replace("Z", "+00:00"))


def spend_figure(d: ReportData) -> go.Figure | None:
    pts = d.series
    if not pts:
        return None
    f = _fig("spend over time against the budget", yaxis_title="USD")
    x = [_time(p) for p in pts]
    f.add_scatter(x=x, y=[float(p.get("spentUSD", 0)) for p in pts], name="spent", mode="lines+markers")
    f.add_scatter(x=x, y=[float(p.get("spentUSD", 0)) + float(p.get("reservedUSD", 0)) for p in pts],
                  name="spent + reserved (in flight)", mode="lines", line={"dash": "dot"})
    top = max(float(p.get("spentUSD", 0)) + float(p.get("reservedUSD", 0)) for p in pts)
    if d.budget is not None and top >= float(d.budget) * ON_SCALE:
        f.add_scatter(x=[x[0], x[-1]], y=[float(d.budget)] * 2, name=f"budget {dollars(d.budget)}", mode="lines",
                      line={"color": "crimson"})
    elif d.budget:  # a line far above would flatten the spend into the axis
        f.update_layout(
            title=f"spend over time: {100 * float(d.spent / d.budget):.1f}% of the {dollars(d.budget)} budget")
    forecast = (d.progress or {}).get("forecastUSD")
    if forecast is not None:
        f.add_scatter(x=[x[0], x[-1]], y=[float(forecast)] * 2, name=f"forecast {dollars(forecast)}", mode="lines",
                      line={"dash": "dash", "color": "orange"})
    return f


def _per_minute(pts: list[dict[str, Any]], key: Any) -> tuple[list[datetime], list[float]]:
    """Rate per minute between consecutive points; a counter that went down (a new attempt
    restarts its request counters) counts from zero."""
    xs, ys = [], []
    for a, b in itertools.pairwise(pts):
        dt = (_time(b) - _time(a)).total_seconds()
        if dt <= 0:
            continue
        va, vb = key(a), key(b)
        xs.append(_time(b))
        ys.append(60 * (vb - va if vb >= va else vb) / dt)
    return xs, ys


def _persisted(p: dict) -> int:
    return sum(p.get(k, 0) for k in ("done", "rejected", "discarded", "failed"))


def throughput_figure(d: ReportData) -> go.Figure | None:
    pts = d.series
    if len(pts) < 2:
        return None
    f = _fig("throughput and retries over time", yaxis_title="per minute")
    for name, key in (("answers persisted", _persisted),
                      ("requests", lambda p: p.get("requests", 0)),
                      ("retries", lambda p: p.get("retries", 0)), ("errors", lambda p: p.get("errors", 0))):
        x, y = _per_minute(pts, key)
        f.add_scatter(x=x, y=y, name=name, mode="lines+markers")
    return f


def _rates_figure(title: str, groups: dict[str, Tally]) -> go.Figure | None:
    if not groups:
        return None
    names = sorted(groups)
    f = _fig(title, yaxis={"title": "rate", "tickformat": ".0%", "rangemode": "tozero"}, barmode="group")
    f.add_bar(x=names, y=[groups[n].call_rate for n in names], name="tool-call rate")
    f.add_bar(x=names, y=[groups[n].invalid_rate for n in names], name="invalid-call rate")
    f.add_bar(x=names, y=[groups[n].leak_rate for n in names], name="leak rate")
    return f


def tool_figure(d: ReportData) -> go.Figure | None:
    tools = d.answers.by_tool
    if not tools:
        return None
    names = sorted(tools)
    f = _fig("per tool", yaxis={"title": "rate", "tickformat": ".0%"}, barmode="group",
             yaxis2={"title": "calls", "overlaying": "y", "side": "right", "showgrid": False,
                     "rangemode": "tozero", "tickformat": ",d"})
    f.add_bar(x=names, y=[tools[n].call_rate or 0.0 for n in names], name="call rate where declared",
              offsetgroup=0)
    f.add_bar(x=names, y=[tools[n].invalid_rate for n in names], name="invalid-call rate", offsetgroup=1)
    f.add_scatter(x=names, y=[tools[n].calls for n in names], name="calls", mode="markers", yaxis="y2",
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
                 yaxis={"title": "rate", "tickformat": ".0%"}, barmode="group")
    labels = {"callRate": "tool-call rate", "validRate": "valid-call rate", "hallucinatedRate": "hallucinated",
              "leakRate": "leak rate"}
    for mode in modes:
        _bars(rates, list(labels.values()), [figs["modes"][mode].get(k) for k in labels], mode)
    dollars = _fig("audit: dollars per answer (95% intervals)", yaxis_title="USD")
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
    out = []
    for col, title in (("top1_agreement", "top-1 agreement per sample"), ("mean_nll", "mean NLL per sample")):
        res = (d.fidelity_scores or {}).get(col)
        if res is not None and res.values:
            f = _fig(f"fidelity: {title}", yaxis_title="samples", showlegend=False)
            f.add_histogram(x=res.values, nbinsx=40)
            out.append(f)
    by = (d.fidelity or {}).get("byProvider") or {}
    if by:
        names = sorted(by)
        fig = make_subplots(rows=1, cols=2, subplot_titles=("top-1 agreement", "mean NLL"))
        fig.add_bar(x=names, y=[by[n].get("top1Agreement") for n in names], row=1, col=1, name="top-1")
        fig.add_bar(x=names, y=[by[n].get("meanNLL") for n in names], row=1, col=2, name="mean NLL")
        fig.update_layout(title="fidelity per provider", template=TEMPLATE, height=HEIGHT, width=WIDTH,
                          autosize=False, showlegend=False,
                          margin={"l": 50, "r": 20, "t": 70, "b": 40})
        out.append(fig)
    return out


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
pre.tables{background:#fff;border:1px solid #e5e7eb;border-radius:6px;padding:12px;font-size:12px;overflow-x:auto}
"""


def terminal_html(d: ReportData, audit: bool = False) -> str:
    """The terminal tables, recorded and exported with inline styles (the same text as `eyrie report`);
    the audit's own tables only with `audit` (they have a section of their own)."""
    # the audit's tables are wide (a figure, its interval and its n per cell): the page scrolls them
    console = Console(record=True, width=170 if audit else 120, file=io.StringIO(), color_system="truecolor")
    if audit:
        console.print(Group(*audit_renderables(d.audit or {})[1:]))
    else:
        print_report(d, console, audit=False)
    return console.export_html(inline_styles=True, code_format="<pre class='tables'>{code}</pre>")


def audit_html(d: ReportData) -> str:
    """The audit on the page's first screen: its verdict in words, then its tables."""
    if not d.audit or not d.audit.get("figures"):
        return ""
    return (f"<h2>Audit: tools as text vs structured</h2><p class='verdict'>{html.escape(d.audit['verdict'])}</p>"
            f"{terminal_html(d, audit=True)}")


def render(d: ReportData) -> str:
    """The page: one document, plotly.js inlined once, no request to any network."""
    sections: dict[str, list[str]] = {}
    for i, (section, _title, fig) in enumerate(figures(d)):
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"plot-{i}",
                          config={"displaylogo": False, "responsive": False, "displayModeBar": "hover"})
        sections.setdefault(section, []).append(f"<div class='card'>{div}</div>")
    body = "".join(f"<h2>{html.escape(s)}</h2><div class='grid'>{''.join(divs)}</div>"
                   for s, divs in sections.items())
    p = d.progress or {}
    subtitle = f"{d.uri} - outcome {p.get('outcome', '?')}, stage {p.get('stage', '?')}, spent {dollars(d.spent)}"
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>eyrie report - {html.escape(d.uri)}</title><style>{CSS}</style>"
        f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
        f"<header><h1>eyrie report</h1><p>{html.escape(subtitle)}</p></header><main>"
        f"{audit_html(d)}<h2>Summary</h2>{terminal_html(d)}{body}</main></body></html>"
    )
