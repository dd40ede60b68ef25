"""`eyrie evaluate OUTPUT [--against OTHER ...]`: arguments in, the drafters' acceptance table and the
verdict out (the work is jobs/evaluate/)."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

from eyrie.jobs.errors import InputError
from eyrie.jobs.report.terminal import console_for
from eyrie.jobs.report.text import bracket


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _span(e: dict) -> str:
    return f"{e['value']:.3f} {bracket(format(e['low'], '.3f'), format(e['high'], '.3f'))}"


def tables(doc: dict) -> list[Table]:
    """The drafters' acceptance in two tables that fit 100 columns, names never cut: the accepted length
    per step and its difference to the first drafter, then the accuracy at each draft position."""
    k = len(doc["drafters"][0]["acceptance"]["accByPosition"])
    diffs = {d["name"]: d["minusReference"] for d in doc["differences"]}
    main = Table(title=f"acceptance on {doc['heldout']['samples']:,} held-out answers of {doc['heldout']['uri']} "
                       f"({doc['heldout']['tokens']:,} tokens), SpecForge {doc['specforgeVersion']}",
                 title_justify="left")
    main.add_column("drafter trained on", overflow="fold")
    main.add_column("samples", justify="right")
    main.add_column("loss", justify="right")
    main.add_column("accepted per step [95%]", justify="right", no_wrap=True)
    main.add_column("minus first [95%]", justify="right", no_wrap=True)
    by_position = Table(title="accuracy at each draft position (acc_k), and training passes over the samples",
                        title_justify="left")
    by_position.add_column("drafter trained on", overflow="fold")
    by_position.add_column("passes", justify="right")
    for j in range(k):
        by_position.add_column(f"acc_{j}", justify="right")
    for r in doc["drafters"]:
        a = r["acceptance"]
        d = diffs.get(r["name"])
        main.add_row(r["name"], f"{r['training']['samples']:,}", f"{r['loss'][-1][1]:.3f}" if r["loss"] else "-",
                     _span(a["acceptedLength"]),
                     f"{d['value']:+.3f} {bracket(format(d['low'], '+.3f'), format(d['high'], '+.3f'))}" if d else "-")
        by_position.add_row(r["name"], f"{r['training']['passes']:.1f}",
                            *(f"{e['value']:.3f}" for e in a["accByPosition"]))
    return [main, by_position]


# Notices SpecForge and torch print while a drafter trains that a user cannot act on: SpecForge's (no
# flash_attn on a CPU: it falls back to flex_attention, as intended) and torch's scheduler note
# SpecForge's step triggers. Filtered in this command's process only, by their module or message.
QUIET = ((r"specforge(\.|$)", ""), ("", r"To get the last learning rate computed by the scheduler"))


def quiet_library_warnings() -> None:
    """Where `eyrie evaluate` starts: SpecForge's and torch's notices (`QUIET`) stay out of its output."""
    for module, message in QUIET:
        warnings.filterwarnings("ignore", message=message, category=UserWarning, module=module)


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
    quiet_library_warnings()
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
    console = console_for()
    for t in tables(doc):
        console.print(t)
    print(f"verdict: {doc['verdict']}")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return 0
