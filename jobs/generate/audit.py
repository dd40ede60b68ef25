"""`eyrie audit`: the same tool-declaring prompts sent with tools as text and as the API's `tools`.

This is the measurement the project exists for: does the model call tools as often, as validly and
as cleanly when they are only described in the system prompt as when they are declared natively?
It costs a few dollars, is paid from the spec's budget, and is recorded in `<output>/audit.json`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from eyrie.jobs import sources
from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import layout, records
from eyrie.jobs.errors import EyrieError
from eyrie.jobs.generate.budget import usd
from eyrie.jobs.generate.checkpoint import BudgetCommitter, previous_audit_spend, read_checkpoint
from eyrie.jobs.generate.coordinator import Counts, Outcome, RunCoordinator
from eyrie.jobs.generate.preflight import preflight
from eyrie.jobs.generate.worker import ShardWorker, WorkerConfig
from eyrie.jobs.spec import DatasetGeneration
from eyrie.jobs.store import open_output
from eyrie.jobs.tools import checks, declarations
from eyrie.jobs.tools.gate import summarize_mode

MODES = ("text", "structured")


class AuditError(EyrieError, RuntimeError):
    """The audit could not run (no tool-declaring prompts, budget already spent)."""


def pick_prompts(dg: DatasetGeneration, n: int) -> list[tuple[str, sources.Prompt]]:
    """The first n prompts, in source order, that declare tools in either form."""
    picked: list[tuple[str, sources.Prompt]] = []
    for src in dg.spec.sources:
        for item in sources.iter_source(src, dg.spec.output.endpoint):
            if isinstance(item, sources.BadRow):
                continue
            prepared = declarations.prepare_prompt(item, "structured")
            if isinstance(prepared, declarations.Prepared) and prepared.declared:
                picked.append((item.sample_id(), item))
                if len(picked) == n:
                    return picked
    return picked


async def _send_all(dg: DatasetGeneration, base_url: str, api_key: str | None,
                    prompts: list[tuple[str, sources.Prompt]],
                    coord: RunCoordinator) -> dict[str, list[records.Record]]:
    out: dict[str, list[records.Record]] = {}
    for mode in MODES:
        spec = dg.spec.model_copy(deep=True)
        spec.tools.mode = mode
        config = WorkerConfig(spec.model_dump_json(by_alias=True), f"audit-{mode}", "audit", base_url,
                              spec.api.max_concurrency, spec.api.requests_per_minute, spec.api.tokens_per_minute)
        worker = ShardWorker(config, coord, None, api_key=api_key)
        async with worker.open_client():
            recs = await asyncio.gather(*(worker.process(sid, p) for sid, p in prompts))
        await worker.budget.give_back()
        out[mode] = [r for r in recs if r is not None]
    await coord.settle_commit()
    return out


def summarize(recs: dict[str, list[records.Record]]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for mode, rs in recs.items():
        ok = [r for r in rs if r["status"] == "ok"]
        table[mode] = summarize_mode(
            [checks.ResponseCheck.from_record(r["checks"]) for r in ok],
            [r["costUSD"] for r in ok],
            [(r.get("usage") or {}).get("completion_tokens") for r in ok])
        table[mode]["failed"] = len(rs) - len(ok)
    t, s = table["text"], table["structured"]
    table["difference"] = {k: round(s[k] - t[k], 6) for k in ("callRate", "invalidRate", "leakRate",
                                                               "meanOutputTokens")}
    return table


def run_audit(dg: DatasetGeneration, samples: int, ctx: RunContext, base_url: str) -> dict[str, Any]:
    """Send `samples` tool-declaring prompts both ways, paid from the run's budget; write audit.json."""
    spec = dg.spec
    store = open_output(spec)
    asyncio.run(preflight(spec, base_url, store, ctx.api_key))
    prompts = pick_prompts(dg, samples)
    if not prompts:
        raise AuditError("no prompt in the sources declares tools: nothing to compare")
    ckpt = read_checkpoint(store)
    # crash-safe like the run: the bound of what may have been paid is persisted before it is
    # granted, so a kill -9 mid-audit cannot let the next run spend past maxUSD
    committer = BudgetCommitter(store.uri, spec.output.endpoint, spec.output.region, ctx.attempt)
    coord = RunCoordinator(spec.budget.max_usd, ckpt.spent, Counts(), 2 * len(prompts), [],
                           commit=committer, workers=len(MODES))
    recs = asyncio.run(_send_all(dg, base_url, ctx.api_key, prompts, coord))
    spent = coord.book.spent - ckpt.spent
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
    store.put(layout.AUDIT, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return doc
