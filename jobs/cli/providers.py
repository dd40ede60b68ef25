"""`eyrie providers SPEC`: arguments in, the endpoint listing, the probe's table and the routing block out."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson
from rich.console import Console

from eyrie.jobs.context import RunContext
from eyrie.jobs.contract.money import dollars
from eyrie.jobs.contract.progress import Outcome
from eyrie.jobs.errors import InputError
from eyrie.jobs.spec import PROVIDER_TAG_PATTERN, load_spec


def _tags(text: str) -> list[str]:
    import re

    tags = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in tags if not re.fullmatch(PROVIDER_TAG_PATTERN, t)]
    if not tags or bad:
        raise argparse.ArgumentTypeError(f"not endpoint tags: {', '.join(bad) or repr(text)} (e.g. moonshotai,"
                                         "deepinfra/turbo)")
    return tags


def providers_main(argv: list[str]) -> int:
    from eyrie.jobs.cli.run import EXIT_CODES

    ap = argparse.ArgumentParser(
        prog="eyrie providers",
        description="Compare every provider of the target model on the same prompts before a run: the endpoint "
        "listing, then the first N prompts sent to each endpoint (provider.only, no fallbacks), measured and "
        "judged; prints the api.provider block that pins the passing ones, cheapest first. Paid from "
        "budget.maxUSD; stored in the output, so `eyrie run` with the same api.providerProbe pays nothing again.")
    ap.add_argument("spec", help="YAML file with a DatasetGeneration (or just its spec)")
    ap.add_argument("--providers", type=_tags, metavar="A,B,...", help="endpoint tags to probe (default: "
                    "api.providerProbe.providers, else every endpoint listed)")
    ap.add_argument("--samples", type=int, metavar="N", help="prompts per endpoint (default: "
                    "api.providerProbe.samples, else 20)")
    ap.add_argument("--reference", metavar="TAG", help="the endpoint trigger agreement is measured against "
                    "(default: api.providerProbe.reference, else the model author's own endpoint when listed)")
    ap.add_argument("--json", metavar="FILE", help="also write the measures and verdict as JSON")
    args = ap.parse_args(argv)
    if args.samples is not None and args.samples < 1:
        raise InputError("--samples must be at least 1")
    dg = load_spec(args.spec)
    from eyrie.jobs.generate.preflight import preflight
    from eyrie.jobs.generate.probe.run import ProbeSettings, run_probe
    from eyrie.jobs.pipeline import provider
    from eyrie.jobs.report.providers import listing_table, routing_yaml, tables
    from eyrie.jobs.report.terminal import console_for
    from eyrie.jobs.store import open_output

    settings = ProbeSettings.from_spec(dg.spec, samples=args.samples, providers=args.providers,
                                       reference=args.reference)
    err = Console(stderr=True)
    ctx = RunContext.from_env()
    store = open_output(dg.spec)
    with provider(dg.spec) as base_url:
        import asyncio

        asyncio.run(preflight(dg.spec, base_url, store, ctx.api_key))
        out = run_probe(dg.spec, store, ctx, base_url, settings,
                        notify=lambda m: err.print(f"eyrie: {m}", markup=False))
    if out.doc is None:  # stopped by the budget, credits or the key before every answer was in
        assert out.stop is not None
        print(f"eyrie providers: {out.stop[1]}", file=sys.stderr)
        return EXIT_CODES.get(out.stop[0], 1)
    console = console_for()
    console.print(listing_table(out.doc))
    for table in tables(out.doc):
        console.print(table)
    block = routing_yaml(out.doc)
    if block:
        print("# pins the passing endpoints, cheapest first:")
        print(block)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(out.doc, option=orjson.OPT_INDENT_2))
    print(f"spent {dollars(out.spent_now)} on {out.sent_now} requests{' (stored probe reused)' if out.reused else ''}",
          file=sys.stderr)
    print(f"stored in {store.url('providers.json')}", file=sys.stderr)  # its own line: a path is copied whole
    if out.stop is not None:
        print(f"why: {out.stop[1]}", file=sys.stderr)
        return EXIT_CODES[Outcome.NO_PROVIDER_PASSES]
    return 0
