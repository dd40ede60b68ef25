"""`eyrie extract SPEC [--index I --count N]`: one extraction pod's share of the hidden states."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys


def _index_default() -> int:
    """An Indexed batch/v1 Job gives each pod JOB_COMPLETION_INDEX."""
    v = os.environ.get("JOB_COMPLETION_INDEX", "0")
    return int(v) if v.isdigit() else 0


def extract_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="eyrie extract",
                                description="Write hidden states for the run's samples (this pod's share).")
    p.add_argument("spec", help="DatasetGeneration YAML (or its spec)")
    p.add_argument("--index", type=int, default=None,
                   help="this pod's index, 0..count-1 (default: $JOB_COMPLETION_INDEX or 0)")
    p.add_argument("--count", type=int, default=None, help="number of pods (default: extraction.pods)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)

    from eyrie.jobs.contract import layout
    from eyrie.jobs.extract.run import run_extraction
    from eyrie.jobs.spec import SpecError, load_spec
    from eyrie.jobs.store import open_output

    try:
        dg = load_spec(args.spec)
    except SpecError as e:
        print(e, file=sys.stderr)
        return 2
    spec = dg.spec
    index = _index_default() if args.index is None else args.index
    count = spec.extraction.pods if args.count is None else args.count
    store = open_output(spec)
    try:
        summary = run_extraction(spec, store, index=index, count=count)
    except (RuntimeError, ValueError, OSError) as e:  # extraction, shard, store, layer, model errors
        print(f"eyrie extract: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary.to_manifest(), indent=1))
    from eyrie.jobs.pipeline import finish_extraction

    try:
        if finish_extraction(spec, store, count):
            print(f"eyrie extract: every pod's share is done: wrote {store.url(layout.MANIFEST)} and "
                  f"{store.url(layout.REPORT)}", file=sys.stderr)
    except Exception as e:  # the hidden states are written: a failed manifest or page must not fail the pod (the
        # operator merges the manifest itself when every summary exists; `eyrie report` redoes the page)
        print(f"eyrie extract: hidden states written, but not the manifest and report: {type(e).__name__}: {e}",
              file=sys.stderr)
    return 0
