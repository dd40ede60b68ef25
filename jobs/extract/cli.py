"""`eyrie extract SPEC [--index I --count N]` and `eyrie export specforge OUTPUT_URI DIR`."""

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
    try:
        summary = run_extraction(spec, open_output(spec), index=index, count=count)
    except (RuntimeError, ValueError, OSError) as e:  # extraction, shard, store, layer, model errors
        print(f"eyrie extract: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary.to_manifest(), indent=1))
    return 0


def export_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="eyrie export", description="Export extracted hidden states.")
    p.add_argument("format", choices=["specforge"], help="target layout")
    p.add_argument("output_uri", help="the run's output (file://, path or s3://; S3 via EYRIE_S3_* env)")
    p.add_argument("dir", help="local folder to write into")
    args = p.parse_args(argv)

    from eyrie.jobs.extract.shards import ShardError
    from eyrie.jobs.extract.specforge import export_specforge
    from eyrie.jobs.store import StoreError, open_store

    try:
        n = export_specforge(open_store(args.output_uri), args.dir)
    except (ShardError, StoreError, OSError) as e:
        print(f"eyrie export: {e}", file=sys.stderr)
        return 1
    print(f"wrote {n} samples to {args.dir}")
    return 0
