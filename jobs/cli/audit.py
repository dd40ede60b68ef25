"""`eyrie audit SPEC` / `eyrie audit SPEC --from FILE`: tools as text vs structured, side by side."""

from __future__ import annotations

import argparse
import sys

from eyrie.jobs.cli.screen import fitted, print_audit
from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import layout
from eyrie.jobs.contract.money import dollars
from eyrie.jobs.contract.progress import Outcome
from eyrie.jobs.pipeline import provider
from eyrie.jobs.spec import load_spec
from eyrie.jobs.store import open_output

AUDIT_EPILOG = """
examples:
  eyrie audit SPEC                      50 tool-declaring prompts, a seeded random sample, both ways
  eyrie audit SPEC --samples 200        the same 50 again (reused: not paid twice) and 150 more
  eyrie audit SPEC --from answers.jsonl answers you already have: checked and counted, nothing sent
  eyrie audit SPEC --from answers.jsonl --rerun 40
                                        and the other tools mode bought for 40 of their prompts
                                        (from the spec's model; --rerun-model MODEL when the file's
                                        rows name another)

Answers are kept under the output (audit/answers/); an audit with the same prompts and the same model,
sampling and provider settings reuses them. Results: <output>/audit.json (the history of every audit)
and <output>/audit/rows.jsonl (each row or answer: its calls, valid or why not). An audit --from FILE
has its own output, never the dataset's: --output, default <file name>-audit/ next to FILE.
"""


def audit_main(argv: list[str]) -> int:
    from eyrie.jobs.generate.audit.from_recorded import FromOptions, run_audit_from
    from eyrie.jobs.generate.audit.run import DEFAULT_SAMPLES, DEFAULT_SEED, AuditError, run_audit

    ap = argparse.ArgumentParser(
        prog="eyrie audit", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=AUDIT_EPILOG,
        description="The same tool-declaring prompts sent with tools as text (in the system prompt) and as "
                    "the API's `tools`, side by side: call rates, validity, formats, agreement and cost, each "
                    "with its 95% interval, and a verdict in words.")
    ap.add_argument("spec", nargs="?", help="the DatasetGeneration spec (optional with --from: without it "
                    "nothing is written and answers without usage.cost are not priced)")
    ap.add_argument("--samples", type=int, default=DEFAULT_SAMPLES,
                    help="tool-declaring prompts to send both ways: a random sample of them, seeded "
                         "(default: %(default)s)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED,
                    help="seed of the random sample (default: %(default)s); the same seed keeps the same prompts")
    ap.add_argument("--from", dest="from_file", metavar="FILE",
                    help="analyse answers already bought: JSONL(.gz) of request/response rows, or dataset rows "
                         "with the provider's content, reasoning and usage (docs/operating.md); sends nothing")
    ap.add_argument("--rerun", type=int, default=0, metavar="N",
                    help="with --from: buy the other tools mode for N of the file's prompts (a seeded sample), "
                         "under the spec's budget")
    ap.add_argument("--rerun-model", metavar="MODEL",
                    help="with --rerun: the model to buy the other mode from (default: the spec's target.model; "
                         "needed when the file's rows say another model answered)")
    ap.add_argument("--accept-other-model", action="store_true",
                    help="with --rerun: compare with the spec's model although the file's rows name another")
    ap.add_argument("--output", metavar="URI",
                    help="with --from: where the audit is written (default: <file name>-audit/ next to FILE); "
                         "never the dataset's output")
    args = ap.parse_args(argv)
    if args.samples < 1 or args.rerun < 0:
        print("eyrie audit: --samples must be at least 1 and --rerun at least 0", file=sys.stderr)
        return 2
    if args.spec is None and args.from_file is None:
        ap.error("a SPEC is needed (or --from FILE)")
    if args.rerun and args.from_file is None:
        ap.error("--rerun goes with --from")
    if args.rerun and args.spec is None:
        ap.error("--rerun needs a SPEC: its model, provider and budget pay for the comparison")
    if (args.rerun_model or args.accept_other_model) and not args.rerun:
        ap.error("--rerun-model and --accept-other-model go with --rerun")
    if args.output and args.from_file is None:
        ap.error("--output goes with --from (an audit of the spec's prompts is written to its output)")
    dg = load_spec(args.spec) if args.spec else None
    try:
        if args.from_file is not None:
            opts = FromOptions(args.rerun, args.seed, args.output, args.rerun_model, args.accept_other_model)
            if args.rerun:
                with provider(dg.spec) as base_url:
                    doc = run_audit_from(args.from_file, dg, RunContext.from_env(), base_url, opts)
            else:  # nothing is sent: no provider is started or called
                doc = run_audit_from(args.from_file, dg, RunContext.from_env(), None, opts)
        else:
            with provider(dg.spec) as base_url:
                doc = run_audit(dg, args.samples, RunContext.from_env(), base_url, args.seed)
    except AuditError as e:
        print(f"eyrie audit: {e}", file=sys.stderr)
        return 2
    print_audit(doc)
    if doc.get("changedSince"):
        print(fitted(f"settings changed since the last audit ({'; '.join(doc['changedSince'])}): its answers are "
                     "kept, not reused"), file=sys.stderr)
    print(f"spent {dollars(doc['spentUSD'])} ({doc['sent']} requests sent, {doc['reused']} answers reused)",
          file=sys.stderr)
    out = doc["from"]["output"] if args.from_file is not None else open_output(dg.spec).uri
    # its own line: a path is copied whole
    # a path on a line of its own with a short label: copied whole, never wrapped
    print(f"written to {out.rstrip('/')}/{layout.AUDIT}", file=sys.stderr)
    print(f"each row's answers: {out.rstrip('/')}/{layout.AUDIT_ROWS}", file=sys.stderr)
    if doc["outcome"] != Outcome.DONE:
        print(fitted(f"stopped early: {doc['message']}"), file=sys.stderr)
        return 3
    return 0
