"""`eyrie validate SPEC`: check a spec and its sources (every row read, nothing sent); name what is wrong."""

from __future__ import annotations

import argparse

from eyrie.jobs.contract import layout
from eyrie.jobs.contract.money import dollars
from eyrie.jobs.spec import load_spec


def validate_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="eyrie validate", description="Check a spec; name what is wrong.")
    ap.add_argument("spec")
    ap.add_argument("--show", type=int, default=20, metavar="N", help="bad rows listed per source (default 20)")
    args = ap.parse_args(argv)
    dg = load_spec(args.spec)
    from eyrie.jobs.generate.preflight import inspect_sources

    checks = inspect_sources(dg.spec, shown=args.show)  # every row read, nothing sent
    print(f"{args.spec}: valid DatasetGeneration {dg.metadata.name!r} "
          f"({len(dg.spec.sources)} sources, budget {dollars(dg.spec.budget.max_usd)}, output {dg.spec.output.uri})")
    for c in checks:
        print(f"  sources[{c.index}] {c.name}: {c.uri}: {c.rows} rows, {c.bad} bad")
        for row, kind, reason in c.first_bad:
            print(f"    row {row} ({kind}): {reason}")
        if c.bad > len(c.first_bad):
            print(f"    ... and {c.bad - len(c.first_bad)} more (--show N lists more)")
    bad = sum(c.bad for c in checks)
    if bad:
        print(f"{bad} bad rows: a run records them as rejected (never sent, not paid) and lists them in "
              f"{dg.spec.output.uri.rstrip('/')}/{layout.BAD_ROWS}")
    return 0
