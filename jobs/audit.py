"""`eyrie audit`: the same tool-declaring prompts sent with tools as text and as the API's `tools`.

This is the measurement the project exists for: does the model call tools as often, as validly and
as cleanly when they are only described in the system prompt as when they are declared natively?
It costs a few dollars, is paid from the spec's budget, and is recorded in `<output>/audit.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from contextlib import ExitStack
from decimal import Decimal
from typing import Any

import orjson

from eyrie.jobs import records, sources, tools
from eyrie.jobs.budget import usd
from eyrie.jobs.coordinator import Counts, Outcome, RunCoordinator
from eyrie.jobs.gate import summarize_mode
from eyrie.jobs.spec import SIMULATED, DatasetGeneration, load_spec
from eyrie.jobs.store import NotFound, Store, open_output

MODES = ("text", "structured")


class AuditError(RuntimeError):
    """The audit could not run (no tool-declaring prompts, budget already spent)."""


def pick_prompts(dg: DatasetGeneration, n: int) -> list[tuple[str, sources.Prompt]]:
    """The first n prompts, in source order, that declare tools in either form."""
    picked: list[tuple[str, sources.Prompt]] = []
    for src in dg.spec.sources:
        for item in sources.iter_source(src, dg.spec.output.endpoint):
            if isinstance(item, sources.BadRow):
                continue
            prepared = tools.prepare_prompt(item, "structured")
            if isinstance(prepared, tools.Prepared) and prepared.declared:
                sid = records.sample_id(src.name, item.row, {"messages": item.messages, "tools": item.tools})
                picked.append((sid, item))
                if len(picked) == n:
                    return picked
    return picked


def previous_audit_spend(store: Store) -> Decimal:
    try:
        return Decimal(orjson.loads(store.get(records.AUDIT)).get("cumulativeSpentUSD", "0"))
    except NotFound:
        return Decimal(0)


async def _send_all(dg: DatasetGeneration, base_url: str, prompts: list[tuple[str, sources.Prompt]],
                    coord: RunCoordinator) -> dict[str, list[records.Record]]:
    from eyrie.jobs.generate import api_key
    from eyrie.jobs.worker import ShardWorker

    out: dict[str, list[records.Record]] = {}
    for mode in MODES:
        spec = dg.spec.model_copy(deep=True)
        spec.tools.mode = mode
        worker = ShardWorker(spec.model_dump_json(by_alias=True), f"audit-{mode}", "audit", base_url, api_key(),
                             spec.api.max_concurrency, spec.api.requests_per_minute, spec.api.tokens_per_minute,
                             coord, {})
        async with worker.open_client():
            recs = await asyncio.gather(*(worker.process(sid, p) for sid, p in prompts))
        out[mode] = [r for r in recs if r is not None]
    return out


def summarize(recs: dict[str, list[records.Record]]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for mode, rs in recs.items():
        ok = [r for r in rs if r["status"] == "ok"]
        table[mode] = summarize_mode(
            [tools.ResponseCheck.from_record(r["checks"]) for r in ok],
            [r["costUSD"] for r in ok],
            [(r.get("usage") or {}).get("completion_tokens") for r in ok])
        table[mode]["failed"] = len(rs) - len(ok)
    t, s = table["text"], table["structured"]
    table["difference"] = {k: round(s[k] - t[k], 6) for k in ("callRate", "invalidRate", "leakRate",
                                                               "meanOutputTokens")}
    return table


def run_audit(dg: DatasetGeneration, samples: int) -> dict[str, Any]:
    from eyrie.jobs.generate import _simulator, preflight, read_checkpoint

    spec = dg.spec
    store = open_output(spec)
    with ExitStack() as stack:
        base_url = _simulator(spec, stack) if spec.api.base_url == SIMULATED else spec.api.base_url
        asyncio.run(preflight(spec, base_url, store))
        prompts = pick_prompts(dg, samples)
        if not prompts:
            raise AuditError("no prompt in the sources declares tools: nothing to compare")
        ckpt = read_checkpoint(store)
        coord = RunCoordinator(spec.budget.max_usd, ckpt.spent, Counts(), 2 * len(prompts), [])
        recs = asyncio.run(_send_all(dg, base_url, prompts, coord))
    spent = coord.ledger.spent - ckpt.spent
    doc = {
        "samples": len(prompts),
        "model": spec.target.model,
        "outcome": coord.outcome if coord.outcome != Outcome.RUNNING else Outcome.DONE,
        "message": coord.message,
        "spentUSD": usd(spent),
        "cumulativeSpentUSD": usd(previous_audit_spend(store) + spent),
        "modes": summarize(recs),
        "sampleIds": [sid for sid, _ in prompts],
    }
    store.put(records.AUDIT, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return doc


def print_table(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    m = doc["modes"]
    table = Table(title=f"tools as text vs structured: {doc['samples']} prompts, model {doc['model']}")
    table.add_column("metric")
    for col in ("text", "structured", "difference"):
        table.add_column(col, justify="right")
    for key, label in (("callRate", "tool-call rate"), ("invalidRate", "invalid-call rate"),
                       ("leakRate", "leak rate"), ("meanOutputTokens", "mean output tokens")):
        table.add_row(label, str(m["text"][key]), str(m["structured"][key]), f"{m['difference'][key]:+}")
    table.add_row("cost (USD)", m["text"]["costUSD"], m["structured"]["costUSD"], "")
    table.add_row("failed requests", str(m["text"]["failed"]), str(m["structured"]["failed"]), "")
    Console().print(table)


def audit_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="eyrie audit", description=__doc__.split("\n")[0])
    ap.add_argument("spec")
    ap.add_argument("--samples", type=int, default=50, help="tool-declaring prompts to send both ways")
    args = ap.parse_args(argv)
    if args.samples < 1:
        print("eyrie audit: --samples must be at least 1", file=sys.stderr)
        return 2
    dg = load_spec(args.spec)
    from eyrie.jobs.generate import PreflightError

    try:
        doc = run_audit(dg, args.samples)
    except (PreflightError, AuditError) as e:
        print(f"eyrie audit: {e}", file=sys.stderr)
        return 2
    print_table(doc)
    print(f"spent ${doc['spentUSD']}; written to {open_output(dg.spec).url(records.AUDIT)}", file=sys.stderr)
    if doc["outcome"] != Outcome.DONE:
        print(f"stopped early: {doc['message']}", file=sys.stderr)
        return 3
    return 0
