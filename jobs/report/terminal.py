"""The report on a terminal: rich tables, one per question (what did the money buy, did tool
semantics hold, what did reconstruction exclude, what did extraction write, how faithful were the
answers). Sections without data are left out, so the same code reads a run at any stage.

Everything fits the terminal, or `WIDTH` columns off one (a file, a pipe, a CI log): cells wrap
rather than being cut, and `summary` is the few lines `eyrie run` ends with (the tables are
`eyrie report`'s and `eyrie run --verbose`'s)."""

from __future__ import annotations

from decimal import Decimal
from typing import IO, Any

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from eyrie.jobs.contract.calltally import CallTally
from eyrie.jobs.contract.money import dollars
from eyrie.jobs.contract.pilot import PilotVerdict, Span
from eyrie.jobs.generate.audit.stats import fmt_diff, fmt_num, fmt_rate, fmt_usd, reasons_phrase
from eyrie.jobs.report.data import ReportData
from eyrie.jobs.report.text import WIDTH, abandoned_spend, human_bytes, num, rate
from eyrie.jobs.report.verdict import scoring_model, verdict, written_agreement
from eyrie.jobs.status import SampleCounts

pct = rate  # every rate the report prints, in one format


def console_for(stderr: bool = False, file: IO[str] | None = None) -> Console:
    """The terminal's own width on a terminal; off one (a file, a pipe, a CI log) `WIDTH` columns,
    never the 80 rich assumes nor a table's natural width (one line per row however wide)."""
    console = Console(stderr=stderr, file=file)
    return console if console.is_terminal else Console(stderr=stderr, file=file, width=WIDTH)


_MARK = {"ok": "[green]ok[/]", "warn": "[yellow]check[/]", "bad": "[red]problem[/]", "info": "[dim]-[/]"}


def verdict_table(d: ReportData) -> Table:
    """The verdict (verdict.py) as the summary's first table: one answer per question, its mark
    first and its sentence under the question's name (no box: two lines a question at 100 columns)."""
    t = Table(title="verdict", show_header=False, title_justify="left", box=None, padding=(0, 1, 0, 0))
    t.add_column(no_wrap=True)
    t.add_column(overflow="fold")
    for v in verdict(d):
        t.add_row(_MARK[v.status], Text.assemble((v.title, "bold"), ": ", v.text))
    return t


def _kv(title: str, rows: list[tuple[str, Any]]) -> Table:
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column(overflow="fold")  # a path or URL longer than the cell is folded, not cut
    for k, v in rows:
        if v is not None:
            t.add_row(k, v if isinstance(v, Text) else str(v))
    return t


def _forecast(p: dict[str, Any]) -> str | None:
    """Projected total spend (progress.json `forecastUSD`/`forecast`, issue 15), with its p90 and what
    the canary projected."""
    if p.get("forecastUSD") is None:
        return None
    fc = p.get("forecast") or {}
    at = fc.get("atCanary") or {}
    p90 = f" (p90 {dollars(fc['p90USD'])})" if fc.get("p90USD") else ""
    canary = f"; at the canary ({at['answers']} answers) {dollars(at['meanUSD'])}" if at else ""
    return f"{dollars(p['forecastUSD'])}{p90}{canary}"


def _resumed(p: dict[str, Any]) -> str | None:
    r = p.get("resume") or {}
    if int(r.get("attempt") or 1) <= 1:
        return None
    return (f"attempt {r['attempt']}: reused {r.get('reusedAnswers', 0)} answers ({dollars(r.get('reusedUSD', 0))}); "
            f"this attempt paid {dollars(r.get('paidUSD', 0))} for {r.get('requests', 0)} requests")


def _hidden(p: dict[str, Any]) -> str | None:
    """The hidden states the whole dataset would store, projected beside the forecast dollars."""
    fc = p.get("forecast") or {}
    n, tokens = fc.get("hiddenStateBytes"), fc.get("tokens") or 0
    if n is None:
        return None
    at = (fc.get("atCanary") or {}).get("hiddenStateBytes")
    per = f" ({tokens:,} tokens x {human_bytes(n / tokens)} per token)" if tokens else ""
    canary = f"; at the canary {human_bytes(at)}" if at is not None else ""
    return f"{human_bytes(n)}{per}{canary}; or none stored: eyrie export specforge-online"


def run_table(d: ReportData) -> Table:
    p = d.progress or {}
    budget = d.budget
    spent = d.spent
    share = f" ({pct(float(spent / budget))} of {dollars(budget)})" if budget else ""
    tokens = p.get("tokens") or (d.manifest or {}).get("tokens") or {}
    unrecorded = Decimal(str(p.get("unrecordedUSD") or 0))
    rows: list[tuple[str, Any]] = [
        ("output", d.uri), ("outcome", p.get("outcome")), ("stage", p.get("stage")), ("attempt", p.get("attempt")),
        ("spent", f"{dollars(spent)}{share}"),
        ("paid (records)", f"{dollars(p['paidUSD'])}; {dollars(unrecorded)} of the spend booked for requests "
         "abandoned in flight at a stop or kill" if unrecorded else None),
        ("abandoned in flight", abandoned_spend(p.get("paidUSD"), p.get("abandoned"))),
        ("audit spend", dollars(d.audit_spent) if d.audit_spent else None),
        ("forecast", _forecast(p)),
        ("hidden states (projected)", _hidden(p)),
        ("resumed", _resumed(p)),
        ("requests (this attempt)", p.get("requests")), ("retries", p.get("retries")),
        ("errors", ", ".join(f"{k} {v}" for k, v in (p.get("errors") or {}).items()) or None),
        ("tokens in / out", f"{tokens.get('input', 0):,} / {tokens.get('output', 0):,}" if tokens else None),
        ("paid per provider", ", ".join(f"{k} {dollars(v.usd)}" for k, v in sorted(d.answers.cost_by_provider.items()))
         or None),
    ]
    if p.get("message"):
        rows.append(("why", p["message"]))
    return _kv("run", rows)


def samples_table(d: ReportData) -> Table:
    p = d.progress or {}
    s = d.samples or SampleCounts()
    failures = p.get("failures") or (d.manifest or {}).get("failures") or {}
    why = ", ".join(f"{k} {v}" for k, v in sorted(failures.items()) if v)
    resend = (d.progress or {}).get("resendOnResume") or (d.manifest or {}).get("resendOnResume")
    if why and resend:
        why += f" ({resend} of them only on transient errors: a resume sends them again)"
    discarded_usd = p.get("discardedUSD") or (d.manifest or {}).get("discardedUSD")
    notes = [f"failed: {why}" if why else "",
             "rejected: never sent, not paid (bad rows)" if s.rejected else "",
             f"discarded: paid {dollars(discarded_usd or 0)}, then excluded by the tool policy" if s.discarded
             else ""]
    caption = "; ".join(n for n in notes if n) or None
    t = Table(title="samples by outcome", title_justify="left", caption=caption, caption_justify="left")
    cols = ("total", "done", "rejected", "discarded", "failed")
    for col in (*cols, "not yet sent"):
        t.add_column(col, justify="right")
    t.add_row(*(str(getattr(s, k)) for k in cols), str(s.missing))
    return t


def _tally_row(t: CallTally) -> list[str]:
    return [str(t.answers), str(t.declared), pct(t.call_rate if t.declared else None), str(t.calls),
            pct(t.invalid_rate if t.calls else None), pct(t.leak_rate if t.answers else None)]


def tools_table(d: ReportData) -> Table | None:
    a = d.answers
    if not a.by_source:
        return None
    t = Table(title="tool semantics of the persisted answers", title_justify="left",
              caption="call rate: answers that called a tool, of those whose prompt declared tools; invalid: "
                      "of the calls; leaks: answers with leaked tool-call markers", caption_justify="left")
    t.add_column("source / provider", overflow="fold")  # a long name folds; the figures stay whole
    for col in ("answers", "declared", "call rate", "calls", "invalid", "leaks"):
        t.add_column(col, justify="right", no_wrap=True)
    for name, tally in sorted(a.by_source.items()):
        t.add_row(name, *_tally_row(tally))
    t.add_section()
    for name, tally in sorted(a.by_provider.items()):
        t.add_row(f"@{name}", *_tally_row(tally))
    t.add_section()
    t.add_row("all", *_tally_row(a.total), style="bold")
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


def _cell(e: dict[str, Any] | None, kind: str = "rate") -> str:
    """A figure, its interval and its n, as the verdict prints it."""
    if not e or e.get("value") is None:
        return "n/a" if not e else f"n/a (n={e.get('n', 0)})"
    text = {"rate": fmt_rate, "usd": fmt_usd, "num": fmt_num}.get(kind)
    shown = text(e) if text else fmt_diff(e, kind.removeprefix("diff-"))
    return f"{shown} n={e['n']}"


_AUDIT_ROWS = (  # (label, key in a mode's figures, kind, key in the paired difference)
    ("tool-call rate", "callRate", "rate", "callRate"),
    ("  where the dataset's answer calls one", "neededCallRate", "rate", None),
    ("  where it does not", "unneededCallRate", "rate", None),
    ("calls per answer", "callsPerAnswer", "num", "callsPerAnswer"),
    ("valid-call rate", "validRate", "rate", "validRate"),
    ("  calls that would not validate", "invalidRate", "rate", None),
    ("hallucinated-function rate", "hallucinatedRate", "rate", None),
    ("wrong-function rate", "wrongFunctionRate", "rate", None),
    ("leak rate", "leakRate", "rate", None),
    ("output tokens per answer", "outputTokens", "num", "outputTokens"),
    ("USD per answer", "costPerAnswer", "usd", "costPerAnswer"),
)
_DIFF_KIND = {"callRate": "diff-rate", "validRate": "diff-rate", "callsPerAnswer": "diff-calls",
              "outputTokens": "diff-tokens", "costPerAnswer": "diff-usd"}


def audit_verdict(doc: dict[str, Any] | None) -> Panel | None:
    if not doc or not doc.get("verdict"):
        return None
    return Panel(Text(doc["verdict"]), title="audit verdict: tools as text vs structured", title_align="left")


def _audit_main(doc: dict[str, Any]) -> Table:
    figs = doc["figures"]
    modes = [m for m in ("text", "structured") if m in figs["modes"]]
    paired = figs.get("paired")
    where = f"recorded in {escape(doc['from']['file'])}" if doc.get("kind") == "from" else f"seed {doc.get('seed')}"
    prompts = doc.get("samples") or (doc.get("population") or {}).get("declaredPrompts")  # --from: rows judged
    t = Table(title=f"tools as text vs structured: {prompts} prompts ({where}), model {doc.get('model')}; "
                    f"sent {doc.get('sent', 0)} requests, reused {doc.get('reused', 0)} answers, "
                    f"spent {dollars(doc.get('spentUSD'))}",
              title_justify="left", caption="95% intervals: Wilson for rates, seeded bootstrap for means and "
              "differences (over prompts answered in both modes); n: answers, calls or prompts counted",
              caption_justify="left")
    t.add_column("figure")
    for m in modes:
        t.add_column(m, justify="right")
    if paired:
        # the modes' rates are over their own answers, the difference over the prompts answered both ways
        t.add_column(f"structured - text\non the {paired['prompts']} prompts\nanswered both ways", justify="right")
    t.add_row("answers", *(str(figs["modes"][m]["answers"]) for m in modes),
              *([f"{paired['prompts']} prompts in both"] if paired else []))
    for label, key, kind, dkey in _AUDIT_ROWS:
        cells = [figs["modes"][m].get(key) for m in modes]
        if key in ("neededCallRate", "unneededCallRate", "wrongFunctionRate") and not any(c and c["n"] for c in cells):
            continue
        diff = [_cell(paired["difference"].get(dkey), _DIFF_KIND[dkey]) if dkey else ""] if paired else []
        t.add_row(label, *(_cell(c, kind) for c in cells), *diff)
    if any(figs["modes"][m].get("invalidReasons") for m in modes):
        t.add_row("  why", *(reasons_phrase(figs["modes"][m]) or "-" for m in modes), *([""] if paired else []))
    t.add_row("USD, these answers", *(dollars(figs["modes"][m]["costUSD"]) for m in modes), *([""] if paired else []))
    t.add_row("failed requests", *(str(figs["modes"][m]["failed"]) for m in modes), *([""] if paired else []))
    if any(figs["modes"][m]["unparsable"] for m in modes):
        t.add_row("functions not parsable", *(str(figs["modes"][m]["unparsable"]) for m in modes),
                  *([""] if paired else []))
    if paired:
        t.add_section()
        blank = [""] * len(modes)
        t.add_row("same calls, same arguments", *blank, _cell(paired["argumentAgreement"]))
        t.add_row("same functions called", *blank, _cell(paired["functionAgreement"]))
    proj = figs.get("projection")
    if proj and proj.get("declaredPrompts"):
        t.add_section()
        label = f"USD at {proj['prompts']:,} prompts ({proj['declaredPrompts']:,} declare tools)"
        t.add_row(label, *(_cell(proj.get(f"{m}USD"), "usd") for m in modes),
                  *([_cell(proj.get("differenceUSD"), "diff-usd")] if paired else []))
    return t


def _audit_formats(doc: dict[str, Any]) -> Table:
    from eyrie.jobs.generate.audit.stats import CATEGORIES

    figs = doc["figures"]["modes"]
    modes = [m for m in ("text", "structured") if m in figs]
    t = Table(title="how the answers called: the format of their calls (share of answers)", title_justify="left")
    t.add_column("format")
    for m in modes:
        t.add_column(f"{m} answers", justify="right")
        t.add_column(f"{m} calls", justify="right")
    for cat in CATEGORIES:
        cells = []
        for m in modes:
            f = figs[m]["formats"].get(cat)
            cells += [f"{f['count']} ({fmt_rate(f)})" if f else "0", str(figs[m]["callsByFormat"].get(cat, ""))]
        if any(c not in ("0", "") for c in cells):
            t.add_row(cat, *cells)
    return t


def _audit_by_source(doc: dict[str, Any]) -> Table | None:
    by = doc["figures"].get("bySource")
    if not by:
        return None
    t = Table(title="per prompt set (source)", title_justify="left")
    cols = ("source", "text call rate", "structured call rate", "text valid", "structured valid", "same calls",
            "USD/answer difference")
    for c in cols:  # an interval's end is one word: folded when a column is narrower, never cut
        t.add_column(c, justify="left" if c == "source" else "right", overflow="fold")
    for name, g in by.items():
        p = g.get("paired") or {}
        rates = [_cell((g.get(m) or {}).get(k)) for k in ("callRate", "validRate") for m in ("text", "structured")]
        t.add_row(name, *rates, _cell(p.get("argumentAgreement")),
                  _cell((p.get("difference") or {}).get("costPerAnswer"), "diff-usd"))
    return t


def _audit_by_tool(doc: dict[str, Any]) -> Table | None:
    by = doc["figures"].get("byTool")
    if not by:
        return None
    left = doc["figures"].get("toolsLeftOut")
    t = Table(title="per tool", title_justify="left",
              caption=f"{left} more tools not shown" if left else None, caption_justify="left")
    for c in ("tool", "declared in (text / structured)", "text call rate", "structured call rate", "text calls valid",
              "structured calls valid"):
        t.add_column(c, justify="left" if c == "tool" else "right", overflow="fold")
    for name, g in by.items():
        tx, st = g.get("text") or {}, g.get("structured") or {}
        t.add_row(name, f"{tx.get('declaredIn', 0)} / {st.get('declaredIn', 0)}", _cell(tx.get("callRate")),
                  _cell(st.get("callRate")), _cell(tx.get("validRate")), _cell(st.get("validRate")))
    return t


def _audit_examples(doc: dict[str, Any]) -> Table | None:
    ex = doc.get("examples")
    if not ex:
        return None
    t = Table(title="side by side: the same prompt in both modes", title_justify="left", show_lines=True)
    t.add_column("prompt", ratio=1, overflow="fold")  # a call's JSON is one long word: folded, never cut
    t.add_column("text", ratio=2, overflow="fold")
    t.add_column("structured", ratio=2, overflow="fold")

    def side(s: dict[str, Any] | None) -> str:
        if not s:
            return "(not answered)"
        calls = "\n".join(s["calls"]) or ("(prose only)" if s.get("prose") else "(no call)")
        return f"{calls}\n{s['content'][:300]}".strip()

    for e in ex:  # what a model or a dataset wrote is text, never rich markup
        t.add_row(Text(f"[{e['source']}] {e['user'][:200]}"), Text(side(e.get("text"))),
                  Text(side(e.get("structured"))))
    return t


def _audit_recorded(doc: dict[str, Any]) -> Table | None:
    f = doc.get("from")
    if not f:
        return None
    shown = "; ".join(f"row {p['row']}: {p['error']}" for p in f["problems"][:5])
    more = f" (and {f['badRows'] - 5} more in audit.json)" if f["badRows"] > 5 else ""
    unp = "; ".join(f"row {p['row']}: {p['error']}" for p in f["unparsable"][:3])
    rows: list[tuple[str, Any]] = [
        ("file", f["file"]), ("rows read", f"{f['rows']:,}"),
        ("by tools mode", ", ".join(f"{k} {v:,}" for k, v in f["modes"].items())),
        ("malformed rows", f"{f['badRows']:,}" + (f": {shown}{more}" if shown else "")),
        ("rows without declared functions", f"{f['noTools']:,}"),
        ("rows whose functions do not parse", f"{f['unparsableRows']:,}" + (f": {unp}" if unp else "")),
        ("what these answers cost", f"{dollars(f['costUSD'])} (from usage.cost {f['priced']['usage']:,}, at the "
                                     f"spec's prices {f['priced']['pricing']:,}, "
                                     f"unpriced {f['priced']['unpriced']:,})"),
        ("regenerating them", _regenerating(f.get("regenerate"))),
    ]
    if f.get("notRerun"):
        nr = f["notRerun"]
        shown = "; ".join(f"row {r['row']}: {r['why']}" for r in nr["rows"][:3])
        rows.append(("not bought structured", f"{nr['count']:,} picked rows whose earlier calls cannot be sent as "
                                             f"tool_calls with tool results: {shown}"))
    return _kv("recorded answers (--from)", [(k, Text(str(v))) for k, v in rows])  # rows' text is not markup


def _regenerating(r: dict[str, Any] | None) -> str | None:
    """What buying the judged rows again would cost: their own token counts at the spec's prices."""
    if not r or not r.get("rows"):
        return None
    tokens = (f"{r['rows']:,} rows, {r['promptTokens']:,} prompt and {r['completionTokens']:,} completion tokens"
              + (f" in the {r['rowsWithUsage']:,} that give usage" if r["rowsWithUsage"] < r["rows"] else ""))
    if r.get("usd") is not None:
        return f"about {dollars(r['usd'])} at the spec's prices ({tokens})"
    if not r["rowsWithUsage"]:
        return f"not estimated: no row gives its usage ({r['rows']:,} rows)"
    return f"not estimated: a SPEC's budget.pricing is needed to price {tokens}"


def audit_renderables(doc: dict[str, Any]) -> list[Any]:
    """The audit: the verdict, then its tables, the headline one first."""
    if not doc.get("figures"):
        return []
    out: list[Any] = [audit_verdict(doc), _audit_main(doc), _audit_recorded(doc), _audit_formats(doc),
                      _audit_by_source(doc), _audit_by_tool(doc), _audit_examples(doc)]
    return [r for r in out if r is not None]


def _gap(g: dict[str, Any] | None) -> str | None:
    if not g or not g.get("count"):
        return None
    return (f"exact {g['exact']}/{g['count']}, p50 {g['p50']:+}, p90 {g['p90']:+}, p99 {g['p99']:+}, "
            f"range {g['min']:+}..{g['max']:+}")


def _variants(d: ReportData) -> str | None:
    """The template variant (and thinking reading) each provider's counts fit over the canary."""
    by = ((d.progress or {}).get("templateVariants") or (d.manifest or {}).get("templateVariants") or {}).get(
        "byProvider") or {}
    return ", ".join(f"{p} {c.get('variant')} ({c.get('how')}"
                     + (f", thinking {'on' if c['thinking'] else 'off'} unasked" if isinstance(c.get("thinking"), bool)
                        else "") + ")" for p, c in by.items()) or None


def _mismatch(tpl: dict[str, Any]) -> str | None:
    """Providers whose prompt counts fit no variant, and what their samples got."""
    if not tpl.get("mismatched"):
        return None
    done = "excluded" if tpl.get("onMismatch") == "exclude" else "flagged template_mismatch"
    return f"{', '.join(tpl['mismatched'])}: samples {done} (target.onTemplateMismatch: {tpl.get('onMismatch')})"


def reconstruction_table(d: ReportData) -> Table | None:
    s = (d.reconstruction or {}).get("samples")
    if not s:
        return None
    tpl = (d.reconstruction or {}).get("chatTemplate", {})
    rows: list[tuple[str, Any]] = [
        ("chat format", tpl.get("format")), ("template per provider", _variants(d)),
        ("template mismatch", _mismatch(tpl)), ("records", s.get("records")), ("samples kept", s.get("kept")),
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


def specforge_online_table(d: ReportData) -> Table | None:
    """`eyrie export specforge-online`'s verdict: how many rows SpecForge's parser rebuilds exactly."""
    s = d.specforge_online
    if not s:
        return None
    exact = (f"{s['exact']:,} of {s['samples']:,} rows exactly as eyrie rebuilt them" if s.get("verified")
             else "not verified (SpecForge's parser was not run)")
    rows: list[tuple[str, Any]] = [
        ("chat template", f"{s.get('chatTemplate')} ({s.get('chosenBy')}); max_length {s.get('maxLength')}"),
        (f"SpecForge {s.get('specforgeVersion')} trains on", exact),
        ("written", f"{s.get('written', 0):,} rows to data.jsonl, all {s.get('samples', 0):,} to tokens.jsonl"),
        ("differ", ", ".join(f"{k} {v}" for k, v in (s.get("mismatched") or {}).items()) or "none"),
        ("exported to", s.get("dir")),
    ]
    return _kv("SpecForge online hand-off (eyrie export specforge-online)", rows)


def fidelity_table(d: ReportData) -> Table | None:
    """The manifest's fidelity per provider and source: the answers scored by the model that scored
    them, beside the tool and gap figures of the same answers."""
    fid = d.fidelity
    if not fid:
        return None
    floor = fid.get("minTop1Agreement")
    t = Table(title=f"fidelity: the answers scored by {scoring_model(d) or 'the target model'}"
                    + (f" (floor {rate(float(floor))}, on low: {fid.get('onLow')})" if floor is not None
                       else " (no floor set)"),
              title_justify="left",
              caption="n: samples; top-1: answer tokens that are the scoring model's own argmax; text: the same "
                      "over the reasoning and content the model wrote (what the floor judges); NLL: mean per answer "
                      "token; < floor: samples under extraction.fidelity.minTop1Agreement (- without one); calls: "
                      "answers that called a tool, of those whose prompt declared tools; invalid: of the calls; "
                      "gaps: prompt / completion tokens, mean of ours - the provider's usage", caption_justify="left")
    # short headers: nine columns in 100 with nothing cut (the first folds)
    t.add_column("answers of", overflow="fold", min_width=16)
    for col in ("n", "top-1", "text", "NLL", "< floor", "calls", "invalid", "leaks", "gaps"):
        t.add_column(col, justify="right", no_wrap=True)

    def row(label: str, g: dict[str, Any]) -> None:
        gaps = [num((g.get(k) or {}).get("mean"), 1) for k in ("promptTokenGap", "completionTokenGap")]
        t.add_row(label, str(g.get("samples", 0)), rate(g.get("top1Agreement")), rate(written_agreement(g)),
                  num(g.get("meanNLL")),
                  "-" if floor is None else str(g.get("lowSamples", 0)), rate(g.get("toolCallRate")),
                  rate(g.get("invalidCallRate")), rate(g.get("leakRate")), " / ".join(gaps))

    row("all", fid.get("overall") or {})
    for name, g in sorted((fid.get("byProvider") or {}).items()):
        row(f"provider {name}" + (" (below floor)" if name in fid.get("belowFloor", ()) else ""), g)
    for name, g in sorted((fid.get("bySource") or {}).items()):
        row(f"source {name}", g)
    return t


_AGENTIC_ROWS = (("conversations", "conversations"), ("turnsRegenerated", "turns regenerated"),
                 ("turnsFailed", "turns failed"), ("splicedToolResults", "dataset tool results spliced"),
                 ("droppedTurns", "dataset turns not regenerated"))


def agentic_table(d: ReportData) -> Table | None:
    """generation.turns: all: the conversations, their divergences by kind and how each ended."""
    a = d.agentic
    if not a:
        return None
    rows: list[tuple[str, Any]] = [(label, f"{a[k]:,}") for k, label in _AGENTIC_ROWS if k in a]
    diverged = a.get("diverged") or {}
    kinds = ", ".join(f"{k} {v}" for k, v in diverged.items())
    rows.append(("divergences by kind", f"{kinds} ({sum(diverged.values())} in all)" if diverged else "none"))
    ended = a.get("ended") or {}
    rows.append(("how conversations ended", ", ".join(f"{k} {v}" for k, v in sorted(ended.items())) or "none yet"))
    known = {k for k, _ in _AGENTIC_ROWS} | {"diverged", "ended"}
    rows += [(k, v) for k, v in a.items() if k not in known and not isinstance(v, dict | list)]
    return _kv("agentic conversations", rows)


def providers_tables(d: ReportData) -> list[Table]:
    """The provider probe's section (spec.api.providerProbe, `eyrie providers`)."""
    from eyrie.jobs.report.providers import tables as probe_tables

    return probe_tables(d.providers) if d.providers else []


def tables(d: ReportData, audit: bool = True) -> list[Any]:
    """Every table with data; `audit=False` leaves the audit out (the page shows it in a section of
    its own)."""
    shown = audit_renderables(d.audit) if d.audit and audit else []
    out: list[Any] = [verdict_table(d), run_table(d), *shown[:1], samples_table(d), *providers_tables(d),
                      tools_table(d), per_tool_table(d), *shown[1:], reconstruction_table(d), extraction_table(d),
                      specforge_online_table(d), fidelity_table(d), agentic_table(d)]
    return [t for t in out if t is not None]


def print_report(d: ReportData, console: Console, audit: bool = True) -> None:
    console.print(Group(*tables(d, audit)))


def probe_line(d: ReportData) -> str | None:
    """The provider probe in one sentence: which endpoints passed, what it cost."""
    doc = d.providers
    if not doc or not doc.get("candidates"):
        return None
    cands = doc["candidates"]
    passed = [c["tag"] for c in cands if c.get("passed")]
    return (f"provider probe: {len(passed)} of {len(cands)} endpoints pass"
            + (f" ({', '.join(passed)})" if passed else "") + f"; spent {dollars(doc.get('spentUSD'))}")


def summary(d: ReportData) -> list[Any]:
    """What `eyrie run` ends with (at most a screen): the verdict, the audit's verdict and the
    provider probe in a line; every table is `eyrie report`'s (and `eyrie run --verbose`'s)."""
    probe = probe_line(d)
    out: list[Any] = [verdict_table(d), audit_verdict(d.audit), Text(probe) if probe else None]
    return [x for x in out if x is not None]


# ------------------------------------------------------------------------------ the pilot


def _pilot_span(s: Span, signed: bool = False) -> str:
    f = "+.2f" if signed else ".2f"
    return f"{s.value:{f}} [{s.low:{f}}, {s.high:{f}}]"


def pilot_table(v: PilotVerdict) -> Table:
    """Each option's drafter: accepted tokens per step, the difference to the run's own, the whole dataset's cost."""
    t = Table(title=f"pilot: {v.prompts:,} prompts, {v.heldout:,} held-out structured answers; policy {v.policy}, "
                    f"margin {v.margin:g}")
    for name, right in (("drafter trained on", False), ("samples", True), ("accepted per step [95%]", True),
                        ("minus the run's own", True), ("whole dataset", True)):
        t.add_column(name, justify="right" if right else "left")
    for o in v.options:
        t.add_row(f"{o.option.describe()}{' (the run)' if o.own else ''}", f"{o.training_samples:,}",
                  _pilot_span(o.accepted_length), _pilot_span(o.minus_own, signed=True) if o.minus_own else "-",
                  dollars(o.projected_usd) if o.projected_usd is not None else "?")
    return t


def print_verdict(v: PilotVerdict, console: Console) -> None:
    """The pilot's table and its verdict sentence (a plain line: it ends with a command to copy)."""
    console.print(pilot_table(v))
    print(f"pilot verdict: {v.sentence}", file=console.file, flush=True)
