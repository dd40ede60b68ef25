"""The report on a terminal: rich tables, one per question (what did the money buy, did tool
semantics hold, what did reconstruction exclude, what did extraction write, how faithful were the
answers). Sections without data are left out, so the same code reads a run at any stage."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from rich.console import Console, Group
from rich.table import Table

from eyrie.jobs.report.data import ReportData
from eyrie.jobs.tools.gate import Tally


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - the loop always returns


def _kv(title: str, rows: list[tuple[str, Any]]) -> Table:
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    for k, v in rows:
        if v is not None:
            t.add_row(k, str(v))
    return t


def _forecast(p: dict[str, Any]) -> str | None:
    """Projected total spend (progress.json `forecastUSD`/`forecast`, issue 15), with its p90 and what
    the canary projected."""
    if p.get("forecastUSD") is None:
        return None
    fc = p.get("forecast") or {}
    at = fc.get("atCanary") or {}
    p90 = f" (p90 ${fc['p90USD']})" if fc.get("p90USD") else ""
    canary = f"; at the canary ({at['answers']} answers) ${at['meanUSD']}" if at else ""
    return f"${p['forecastUSD']}{p90}{canary}"


def run_table(d: ReportData) -> Table:
    p = d.progress or {}
    budget = d.budget
    spent = d.spent
    share = f" ({pct(float(spent / budget))} of ${budget})" if budget else ""
    tokens = p.get("tokens") or (d.manifest or {}).get("tokens") or {}
    rows: list[tuple[str, Any]] = [
        ("output", d.uri), ("outcome", p.get("outcome")), ("stage", p.get("stage")), ("attempt", p.get("attempt")),
        ("spent", f"${spent}{share}"),
        ("audit spend", f"${p['auditUSD']}" if Decimal(str(p.get("auditUSD") or 0)) else None),
        ("forecast", _forecast(p)),
        ("requests (this attempt)", p.get("requests")), ("retries", p.get("retries")),
        ("errors", ", ".join(f"{k} {v}" for k, v in (p.get("errors") or {}).items()) or None),
        ("tokens in / out", f"{tokens.get('input', 0):,} / {tokens.get('output', 0):,}" if tokens else None),
        ("paid per provider", ", ".join(f"{k} ${v.usd}" for k, v in sorted(d.answers.cost_by_provider.items()))
         or None),
    ]
    if p.get("message"):
        rows.append(("why", p["message"]))
    return _kv("run", rows)


def samples_table(d: ReportData) -> Table:
    s = (d.progress or {}).get("samples") or (d.manifest or {}).get("samples") or {}
    failures = (d.progress or {}).get("failures") or (d.manifest or {}).get("failures") or {}
    why = ", ".join(f"{k} {v}" for k, v in sorted(failures.items()) if v)
    t = Table(title="samples by outcome", title_justify="left", caption=f"failed: {why}" if why else None,
              caption_justify="left")
    for col in ("total", "done", "dropped", "failed", "not yet sent"):
        t.add_column(col, justify="right")
    total = s.get("total", 0)
    finished = s.get("done", 0) + s.get("dropped", 0) + s.get("failed", 0)
    t.add_row(*(str(s.get(k, 0)) for k in ("total", "done", "dropped", "failed")), str(max(0, total - finished)))
    return t


def _tally_row(t: Tally) -> list[str]:
    return [str(t.answers), str(t.declared), pct(t.call_rate if t.declared else None), str(t.calls),
            pct(t.invalid_rate if t.calls else None), pct(t.leak_rate if t.answers else None)]


def tools_table(d: ReportData) -> Table | None:
    a = d.answers
    if not a.by_source:
        return None
    t = Table(title="tool semantics of the persisted answers", title_justify="left",
              caption="call rate: answers that called a tool, of those whose prompt declared tools; invalid: "
                      "of the calls; leaks: answers with leaked tool-call markers", caption_justify="left")
    t.add_column("source / provider", no_wrap=True, max_width=28, overflow="ellipsis")
    for col in ("answers", "declared", "call rate", "calls", "invalid", "leaks"):
        t.add_column(col, justify="right", no_wrap=True)
    total = Tally()
    for name, tally in sorted(a.by_source.items()):
        t.add_row(name, *_tally_row(tally))
        for k in ("answers", "declared", "called", "calls", "invalid", "leaked"):
            setattr(total, k, getattr(total, k) + getattr(tally, k))
    t.add_section()
    for name, tally in sorted(a.by_provider.items()):
        t.add_row(f"@{name}", *_tally_row(tally))
    t.add_section()
    t.add_row("all", *_tally_row(total), style="bold")
    return t


def per_tool_table(d: ReportData) -> Table | None:
    if not d.answers.by_tool:
        return None
    t = Table(title="per tool", title_justify="left")
    t.add_column("tool")
    for col in ("declared in", "call rate", "calls", "invalid", "invalid rate"):
        t.add_column(col, justify="right")
    for name, c in sorted(d.answers.by_tool.items()):
        t.add_row(name, str(c.declared), pct(c.call_rate), str(c.calls), str(c.invalid), pct(c.invalid_rate))
    return t


def audit_table(doc: dict[str, Any]) -> Table:
    """`eyrie audit`'s table: the same prompts with tools as text and as structured `tools`."""
    m = doc["modes"]
    table = Table(title=f"tools as text vs structured: {doc['samples']} prompts, model {doc['model']}",
                  title_justify="left")
    table.add_column("metric")
    for col in ("text", "structured", "difference"):
        table.add_column(col, justify="right")
    for key, label in (("callRate", "tool-call rate"), ("invalidRate", "invalid-call rate"),
                       ("leakRate", "leak rate"), ("meanOutputTokens", "mean output tokens")):
        table.add_row(label, str(m["text"][key]), str(m["structured"][key]), f"{m['difference'][key]:+}")
    table.add_row("cost (USD)", m["text"]["costUSD"], m["structured"]["costUSD"], "")
    table.add_row("failed requests", str(m["text"]["failed"]), str(m["structured"]["failed"]), "")
    return table


def _gap(g: dict[str, Any] | None) -> str | None:
    if not g or not g.get("count"):
        return None
    return (f"exact {g['exact']}/{g['count']}, p50 {g['p50']:+}, p90 {g['p90']:+}, p99 {g['p99']:+}, "
            f"range {g['min']:+}..{g['max']:+}")


def reconstruction_table(d: ReportData) -> Table | None:
    s = (d.reconstruction or {}).get("samples")
    if not s:
        return None
    fmt = (d.reconstruction or {}).get("chatTemplate", {}).get("format")
    rows: list[tuple[str, Any]] = [
        ("chat format", fmt), ("records", s.get("records")), ("samples kept", s.get("kept")),
        ("tokens (answer)", f"{s.get('tokens', 0):,} ({s.get('responseTokens', 0):,})"),
        ("excluded", ", ".join(f"{k} {v}" for k, v in s.get("excluded", {}).items()) or "none"),
        ("flags", ", ".join(f"{k} {v}" for k, v in s.get("flags", {}).items()) or "none"),
        ("completion-token gap", _gap(s.get("completionTokenGap"))),
        ("prompt-token gap", _gap(s.get("promptTokenGap"))),
    ]
    return _kv("reconstruction", rows)


def extraction_table(d: ReportData) -> Table | None:
    e = d.extraction
    if not e:
        return None
    rows: list[tuple[str, Any]] = [
        ("engine / dtype", f"{e.get('engine')} / {e.get('dtype')}"),
        ("aux layers", ", ".join(map(str, e.get("auxLayers", [])))),
        ("samples / tokens", f"{e.get('samples', 0):,} / {e.get('tokens', 0):,}"),
        ("bytes", f"{human_bytes(e.get('bytes', 0))} ({human_bytes(e.get('bytesPerToken', 0))} per token)"),
        ("shards", e.get("shardsDone")),
        ("skipped", ", ".join(f"{k} {v}" for k, v in (e.get("skipped") or {}).items()) or "none"),
    ]
    return _kv("extraction", rows)


def _num(x: Any, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def fidelity_table(d: ReportData) -> Table | None:
    """The manifest's fidelity per provider and source: target-model scores beside the tool and gap
    figures of the same answers."""
    fid = d.fidelity
    if not fid:
        return None
    floor = fid.get("minTop1Agreement")
    t = Table(title="fidelity: the answers scored by the target model"
                    + (f" (floor {floor}, on low: {fid.get('onLow')})" if floor is not None else ""),
              title_justify="left")
    for col in ("answers of", "samples", "top-1", "mean NLL", "low", "tool calls", "invalid", "leaks",
                "prompt gap", "completion gap"):
        t.add_column(col, justify="left" if col == "answers of" else "right")

    def row(label: str, g: dict[str, Any]) -> None:
        t.add_row(label, str(g.get("samples", 0)), _num(g.get("top1Agreement")), _num(g.get("meanNLL")),
                  str(g.get("lowSamples", 0)), _num(g.get("toolCallRate")), _num(g.get("invalidCallRate")),
                  _num(g.get("leakRate")), _num((g.get("promptTokenGap") or {}).get("mean"), 1),
                  _num((g.get("completionTokenGap") or {}).get("mean"), 1))

    row("all", fid.get("overall") or {})
    for name, g in sorted((fid.get("byProvider") or {}).items()):
        row(f"provider {name}" + (" (below floor)" if name in fid.get("belowFloor", ()) else ""), g)
    for name, g in sorted((fid.get("bySource") or {}).items()):
        row(f"source {name}", g)
    return t


def agentic_table(d: ReportData) -> Table | None:
    a = d.agentic
    if not a:
        return None
    return _kv("agentic", [(k, v) for k, v in a.items() if not isinstance(v, dict | list)])


def tables(d: ReportData, full: bool = True) -> list[Table]:
    """Every table with data; `full=False` is the one-screen summary `eyrie run` ends with."""
    out: list[Table | None] = [run_table(d), samples_table(d), tools_table(d)]
    if full:
        out += [per_tool_table(d), audit_table(d.audit) if d.audit else None]
    out += [reconstruction_table(d), extraction_table(d), fidelity_table(d), agentic_table(d)]
    return [t for t in out if t is not None]


def print_report(d: ReportData, console: Console, full: bool = True) -> None:
    console.print(Group(*tables(d, full)))
