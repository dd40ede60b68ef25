"""`eyrie evaluate OUTPUT [--against OTHER ...]`: arguments in, the drafters' acceptance table and the
verdict out (the work is jobs/evaluate/)."""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

from eyrie.jobs.errors import InputError


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _span(e: dict) -> str:
    return f"{e['value']:.3f} [{e['low']:.3f}, {e['high']:.3f}]"


def table(doc: dict) -> Table:
    t = Table(title=f"acceptance on {doc['heldout']['samples']:,} held-out answers of {doc['heldout']['uri']} "
                    f"({doc['heldout']['tokens']:,} tokens), SpecForge {doc['specforgeVersion']}")
    k = len(doc["drafters"][0]["acceptance"]["accByPosition"])
    t.add_column("drafter trained on")
    t.add_column("samples", justify="right")
    t.add_column("passes", justify="right")
    t.add_column("final loss", justify="right")
    for j in range(k):
        t.add_column(f"acc_{j}", justify="right")
    t.add_column("accepted per step [95%]", justify="right")
    t.add_column("minus first", justify="right")
    diffs = {d["name"]: d["minusReference"] for d in doc["differences"]}
    for r in doc["drafters"]:
        a = r["acceptance"]
        d = diffs.get(r["name"])
        t.add_row(r["name"], f"{r['training']['samples']:,}", f"{r['training']['passes']:.1f}",
                  f"{r['loss'][-1][1]:.3f}" if r["loss"] else "-",
                  *(f"{e['value']:.3f}" for e in a["accByPosition"]), _span(a["acceptedLength"]),
                  f"{d['value']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]" if d else "-")
    return t


def evaluate_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="eyrie evaluate",
        description="Does the data matter for the drafter? Trains a small EAGLE-3 drafter with SpecForge 0.2.0's "
        "own code on OUTPUT's samples and hidden states (and one per --against output, on the same budget), and "
        "measures each on the same held-out answers of OUTPUT: accuracy by draft position and the accepted "
        "length per step of chain decoding, with 95%% intervals. Stored in OUTPUT/evaluation.json (reused when "
        "asked again with the same inputs) and shown by `eyrie report`.")
    ap.add_argument("output", help="the reference output (file://, a path or s3://): its held-out answers are the "
                    "serving traffic every drafter is measured on")
    ap.add_argument("--against", nargs="+", default=[], metavar="OTHER", help="other outputs of the same target: "
                    "one drafter each")
    ap.add_argument("--heldout", type=_positive, metavar="N", help="held-out samples of OUTPUT (seeded; never "
                    "trained on by any drafter; default a fifth of its samples, at most 500)")
    ap.add_argument("--steps", type=_positive, metavar="S", help="training steps per drafter (default 300)")
    ap.add_argument("--tokens-per-step", type=_positive, metavar="T", help="loss tokens per step, exact "
                    "(default 256)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the held-out choice, the order and the weights")
    ap.add_argument("--control", action="store_true", help="also train a control on OUTPUT's samples with their "
                    "token ids shuffled (it should rank last: a check that the evaluation tells drafters apart)")
    ap.add_argument("--threads", type=_positive, metavar="N", help="torch threads while training on a CPU "
                    "(default 1: a small target's drafter gains nothing from more)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (SpecForge's Triton loss and torch.compile)")
    ap.add_argument("--json", metavar="FILE", help="also write evaluation.json's document to FILE")
    ap.add_argument("--endpoint", help="S3 endpoint (default: $EYRIE_S3_ENDPOINT)")
    args = ap.parse_args(argv)
    if args.output in args.against:
        raise InputError("--against names OUTPUT itself: give other outputs")
    from eyrie.jobs.evaluate.drafter import TrainSettings, require_specforge

    require_specforge()  # before anything is read: one line, the install
    from eyrie.jobs.evaluate.run import Request, run_evaluation

    defaults = TrainSettings()
    settings = TrainSettings(steps=args.steps or defaults.steps,
                             tokens_per_step=args.tokens_per_step or defaults.tokens_per_step, seed=args.seed,
                             dtype="bfloat16" if args.device.startswith("cuda") else defaults.dtype,
                             threads=args.threads or defaults.threads)
    err = Console(stderr=True)
    result = run_evaluation(Request(args.output, tuple(args.against), args.heldout, settings, args.control,
                                    args.endpoint, args.device),
                            notify=lambda m: err.print(f"eyrie: {m}", markup=False))
    doc = result.doc
    Console(width=max(140, Console().width)).print(table(doc))
    print(f"verdict: {doc['verdict']}")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return 0
