"""The provider probe as tables (`eyrie providers`, `eyrie run`'s report): the endpoint listing, one
row per endpoint with pass/fail and why, and the `api.provider` block that pins the passing ones.
Pure: from `providers.json` (generate/probe/run.py writes it) to rich renderables and text."""

from __future__ import annotations

from typing import Any

import yaml
from rich.table import Table

from eyrie.jobs.contract.money import PRICE_PLACES
from eyrie.jobs.report.text import dollars
from eyrie.jobs.report.text import rate as _pct

NOTABLE = ("tools", "reasoning", "temperature", "top_p", "seed")  # what a drafter run sends


def _num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def listing_table(doc: dict[str, Any]) -> Table:
    """What the endpoint listing says about each candidate."""
    t = Table(title=f"endpoints of {doc.get('model')}" + ("" if doc.get("listed") else " (no listing: one endpoint)"),
              title_justify="left")
    for col, just in (("provider", "left"), ("tag", "left"), ("quant.", "left"), ("context", "right"),
                      ("max out", "right"), ("in /M tok", "right"), ("out /M tok", "right"), ("parameters", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for e in doc.get("listing") or []:
        price = e.get("pricing") or {}
        params = e.get("supportedParameters")
        shown = "-" if params is None else f"{len(params)}: " + ", ".join(p for p in params if p in NOTABLE)
        t.add_row(e.get("providerName") or "", e["tag"], e.get("quantization") or "-",
                  f"{e['contextLength']:,}" if e.get("contextLength") else "-",
                  f"{e['maxCompletionTokens']:,}" if e.get("maxCompletionTokens") else "-",
                  _price(price.get("promptPerMillion")), _price(price.get("completionPerMillion")),
                  shown)
    return t


def _price(per_million: str | None) -> str:
    """A listed price per million tokens, at 2-4 decimals."""
    return "-" if per_million is None else dollars(per_million, PRICE_PLACES)


def _template(c: dict[str, Any]) -> str:
    tpl = c.get("template")
    if not tpl:
        return "-"
    how = tpl.get("how")
    return f"{tpl.get('variant')}" if how in ("detected", "pinned") and tpl.get("fits") else str(how)


def _reasoning(c: dict[str, Any]) -> str:
    r = c.get("reasoning") or {}
    return ", ".join(f"{k} {n}" for k, n in r.items() if n) or "-"


def _endpoint(c: dict[str, Any]) -> str:
    return c["tag"] + (" (ref)" if c.get("reference") else "")


def probe_table(doc: dict[str, Any]) -> Table:
    """One row per endpoint, its measures: passing first, cheapest first, then the ones dropped
    (what it served and cost: `served_table`; two tables so that each fits 100 columns)."""
    settings = doc.get("settings") or {}
    ref = doc.get("reference")
    t = Table(title=f"provider probe: {settings.get('samples')} prompts per endpoint, reference "
              f"{ref or 'none (trigger agreement not judged)'}, spent {dollars(doc.get('spentUSD'))}",
              title_justify="left")
    cols = (("endpoint", "left"), ("verdict", "left"), ("answers", "right"), ("cut", "right"),
            ("p50/p95 s", "right"), ("calls", "right"), ("trigger F1", "right"), ("schema", "right"),
            ("leaks", "right"))
    for col, just in cols:
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for c in doc.get("candidates") or []:
        lat = c.get("latencySeconds") or {}
        errors = sum((c.get("errors") or {}).values())
        t.add_row(_endpoint(c), "[green]pass[/]" if c["passed"] else "[red]fail[/]",
                  f"{c['answers']}/{c['sent']}" + (f" ({errors} err)" if errors else ""),
                  str((c.get("finishReasons") or {}).get("length", 0)),
                  f"{_num(lat.get('p50'))}/{_num(lat.get('p95'))}", _pct(c.get("toolCallRate")),
                  _num(c.get("triggerF1")), _pct(c.get("schemaAccuracy")), str(c.get("leaks", 0)))
    return t


def served_table(doc: dict[str, Any]) -> Table:
    """What each endpoint served (the template variant its prompt counts fit, its reasoning) and
    what an answer cost, in the probe table's order."""
    t = Table(title="provider probe: template, reasoning and cost per endpoint", title_justify="left")
    for col, just in (("endpoint", "left"), ("template", "left"), ("reasoning", "left"), ("$/answer", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for c in doc.get("candidates") or []:
        t.add_row(_endpoint(c), _template(c), _reasoning(c),
                  dollars(c["costPerAnswerUSD"]) if c.get("costPerAnswerUSD") else "-")
    return t


def dropped_table(doc: dict[str, Any]) -> Table | None:
    """Why each dropped endpoint failed: every measure outside its threshold."""
    failed = [c for c in doc.get("candidates") or [] if not c["passed"]]
    if not failed:
        return None
    t = Table(title="dropped endpoints", title_justify="left")
    t.add_column("endpoint")
    t.add_column("why (spec.api.providerProbe.thresholds)")
    for c in failed:
        t.add_row(c["tag"], "\n".join(f["message"] for f in c.get("failures") or []))
    return t


def tables(doc: dict[str, Any]) -> list[Table]:
    """The probe's report section: the verdict table, what each endpoint served, and why each
    dropped endpoint failed."""
    return [t for t in (probe_table(doc), served_table(doc), dropped_table(doc)) if t is not None]


def routing_yaml(doc: dict[str, Any]) -> str | None:
    """The `api.provider` block that pins the passing endpoints, cheapest first (None: none pass,
    or an API without a listing, where nothing is routed)."""
    block = doc.get("provider")
    if not block:
        return None
    return yaml.safe_dump({"api": {"provider": block}}, sort_keys=False, default_flow_style=None).rstrip()
