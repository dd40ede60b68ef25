"""`eyrie evaluate`: does the data matter for the drafter? One drafter per output, the same budget,
the same held-out serving traffic (the reference output's own answers), SpecForge's acceptance.

The steps, each in its module: read the outputs (`data.py`: refuses outputs without hidden states and
outputs of different targets), choose the held-out samples and every drafter's training set and
steps (`plan.py`: seeded, prompt-disjoint, the same loss tokens per step), train and evaluate each
drafter with SpecForge's code (`drafter.py`), turn the counts into figures and a verdict
(`figures.py`), and keep them in `evaluation.json` under the reference output, keyed by everything
that decides them (the inputs' fingerprints, the sizes, the seeds, SpecForge's version): the same
evaluation asked again is read back, not retrained.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson

from eyrie.jobs.contract import layout
from eyrie.jobs.contract.progress import ProgressError, load_progress
from eyrie.jobs.evaluate import figures
from eyrie.jobs.evaluate.data import Corpus, check_same_target, open_corpus
from eyrie.jobs.evaluate.plan import (
    SPECFORGE_VERSION,
    EvaluationError,
    Heldout,
    check_disjoint,
    choose_heldout,
    passes,
    steps_plan,
    training_set,
)
from eyrie.jobs.intervals import bracket
from eyrie.jobs.spec import MIN_TRAIN, default_heldout  # samples a drafter needs besides the held-out set

FORMAT = "eyrie-evaluation/1"
CODE_VERSION = 2  # bump when what an evaluation computes changes: a stored one is then recomputed
CONTROL = "control: shuffled tokens"
MAX_CURVE = 1000  # loss-curve points kept per drafter (evenly spaced when there are more steps)
MAX_HISTORY = 50  # earlier evaluations evaluation.json keeps beside the latest


@dataclass(frozen=True)
class Request:
    output: str
    against: tuple[str, ...] = ()
    heldout: int | None = None  # None: a fifth of the reference's samples, at most 500
    settings: Any = None  # drafter.TrainSettings (None: its defaults)
    control: bool = False  # also train the shuffled-token control on the reference's training samples
    endpoint: str | None = None
    device: str = "cpu"


@dataclass
class Result:
    doc: dict[str, Any]
    reused: bool
    key: str = field(default="")


def _name(uri: str, taken: set[str]) -> str:
    base = uri.rstrip("/").rsplit("/", 1)[-1] or uri
    return base if base not in taken else uri


def evaluation_key(inputs: Sequence[dict[str, Any]], heldout: int, settings: dict[str, Any], control: bool,
                   target: dict[str, Any], specforge: str) -> str:
    doc = {"format": FORMAT, "code": CODE_VERSION, "inputs": [(i["uri"], i["fingerprint"]) for i in inputs],
           "heldout": heldout, "settings": settings, "control": control, "target": target, "specforge": specforge}
    return hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def read_evaluation(corpus: Corpus) -> dict[str, Any] | None:
    if not corpus.store.exists(layout.EVALUATION):
        return None
    try:
        doc = orjson.loads(corpus.store.get(layout.EVALUATION))
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == FORMAT else None


def _curve(losses: list[float]) -> list[list[float]]:
    """[step, loss] pairs, at most MAX_CURVE of them (the last step always kept)."""
    n = len(losses)
    every = max(1, -(-n // MAX_CURVE))
    picks = sorted({*range(0, n, every), n - 1}) if n else []
    return [[i + 1, round(losses[i], 5)] for i in picks]


@dataclass(frozen=True)
class Trained:
    """One drafter as the evaluation records it: what it trained on, its loss at every step, and
    SpecForge's counts on each held-out sample (samples x draft positions)."""

    name: str
    kind: str  # reference | against | control
    uri: str
    training: dict[str, Any]
    losses: list[float]
    correct: np.ndarray
    denom: np.ndarray
    specforge: dict[str, Any]  # its Evaluator's eval/* figures


SPECFORGE_FIGURES = ("eval/avg_loss", "eval/avg_acc", "eval/per_position_acc", "eval/simulated_acc_len")


def document(key: str, target: dict[str, Any], inputs: list[dict[str, Any]], heldout: dict[str, Any],
             settings: dict[str, Any], control: bool, device: str, trained: Sequence[Trained]) -> dict[str, Any]:
    """evaluation.json's document: each drafter's figures, every difference to the first (the
    reference), every pair's difference and the verdict. Pure: the counts in, the figures out."""
    seed = int(settings.get("seed", 0))
    rows = []
    for t in trained:
        rows.append({"name": t.name, "kind": t.kind, "uri": t.uri, "training": t.training, "loss": _curve(t.losses),
                     "acceptance": figures.acceptance(t.correct, t.denom, seed=seed).to_dict(),
                     "specforge": {k: v for k, v in t.specforge.items() if k in SPECFORGE_FIGURES}})
    ref = trained[0]
    ref_len = figures.acceptance(ref.correct, ref.denom, seed=seed).length
    diffs = []
    for t in trained[1:]:
        diff = figures.length_difference((ref.correct, ref.denom), (t.correct, t.denom), seed=seed)
        other_len = figures.acceptance(t.correct, t.denom, seed=seed).length
        diffs.append({"name": t.name, "kind": t.kind, "minusReference": diff.to_dict(),
                      "separates": figures.separates(diff), "samplesToSeparate": figures.samples_to_separate(diff),
                      "verdict": figures.verdict_sentence(ref.name, t.name, ref_len, other_len, diff)})
    # every pair (the pilot compares the run's own data with each alternative, whichever is the reference)
    pairs = [{"a": a.name, "b": b.name,
              "bMinusA": figures.length_difference((a.correct, a.denom), (b.correct, b.denom), seed=seed).to_dict()}
             for i, a in enumerate(trained) for b in trained[i + 1:]]
    first = next((d for d in diffs if d["kind"] == "against"), None) or (diffs[0] if diffs else None)
    if first is not None and not first["separates"] and first["samplesToSeparate"]:
        ref_input = inputs[0] if inputs else {}
        first["verdict"] += " " + to_separate(first["samplesToSeparate"], heldout["samples"], ref_input)
    verdict = first["verdict"] if first else (
        f"a drafter trained on {ref.name} accepts {ref_len.value:.2f} "
        f"{bracket(format(ref_len.low, '.2f'), format(ref_len.high, '.2f'))} "
        f"tokens per step on {heldout['samples']:,} of its held-out answers (nothing to compare it with: pass "
        "--against)")
    return {
        "format": FORMAT, "key": key, "specforgeVersion": SPECFORGE_VERSION, "code": CODE_VERSION,
        "target": target, "inputs": inputs, "heldout": heldout, "settings": settings, "control": control,
        "device": device, "drafters": rows, "differences": diffs, "pairs": pairs, "verdict": verdict,
        "createdAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def to_separate(need: int, held: int, ref: dict[str, Any]) -> str:
    """What to do about a difference `need` held-out samples would separate: the reference output's
    samples that many held out at its present share would take, as prompts to generate (at its prompts
    per kept sample), or a larger --heldout of the samples it has."""
    samples = int(ref.get("samples") or 0)
    if not samples or not held:
        return ""
    wanted = math.ceil(need * samples / held)  # the same share held out
    per = (int(ref["prompts"]) / samples) if ref.get("prompts") else 1.0
    more = math.ceil((wanted - samples) * per - 1e-9)
    grow = (f"To tell them apart, generate about {more:,} more prompts for {ref['uri']} (about {wanted:,} samples, "
            f"{need:,} of them held out), extract them and evaluate again")
    if need < samples - MIN_TRAIN:
        grow += f", or hold out more of its {samples:,} samples (--heldout {need:,})"
    return grow + "."


def _prompts(corpus: Corpus) -> int | None:
    """The prompts the output was asked (progress.json's samples.total), for prompts per kept sample."""
    try:
        progress = load_progress(corpus.store)
    except (ProgressError, orjson.JSONDecodeError):
        return None
    total = progress.samples.total if progress else 0
    return total if total > 0 else None


def drafter_key(corpus: Corpus, kind: str, held_ids: str, settings: dict[str, Any], target: dict[str, Any],
                device: str) -> str:
    """What decides one drafter's result: the output it trained on (and its fingerprint), whether it is
    the shuffled control, the held-out set it is measured on, the settings, the target, SpecForge's
    version and this code's. Another evaluation asking for the same drafter reads it back."""
    doc = {"format": FORMAT, "code": CODE_VERSION, "input": (corpus.uri, corpus.fingerprint),
           "control": kind == "control", "heldout": held_ids, "settings": settings, "target": target,
           "specforge": SPECFORGE_VERSION, "device": device}
    return hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def _drafter_doc(key: str, t: Trained) -> bytes:
    return orjson.dumps({"format": FORMAT, "key": key, "name": t.name, "kind": t.kind, "uri": t.uri,
                         "training": t.training, "losses": t.losses, "correct": t.correct.tolist(),
                         "denom": t.denom.tolist(), "specforge": t.specforge}, option=orjson.OPT_SERIALIZE_NUMPY)


def read_drafter(corpus: Corpus, key: str, name: str, kind: str) -> Trained | None:
    """A drafter's result stored under `key` (`drafter_key`), named as this evaluation names it."""
    path = layout.evaluation_drafter(key)
    if not corpus.store.exists(path):
        return None
    try:
        d = orjson.loads(corpus.store.get(path))
        return Trained(name, kind, str(d["uri"]), dict(d["training"]), [float(x) for x in d["losses"]],
                       np.asarray(d["correct"], dtype=np.float64), np.asarray(d["denom"], dtype=np.float64),
                       dict(d["specforge"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None  # unreadable: trained again, and written over


def _with_history(stored: dict[str, Any] | None, doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` as evaluation.json's latest, every earlier evaluation kept in `history` (latest first, one
    per key, at most MAX_HISTORY)."""
    earlier = [] if stored is None else [{k: v for k, v in stored.items() if k != "history"},
                                         *stored.get("history", [])]
    kept = [e for e in earlier if e.get("key") != doc["key"]][:MAX_HISTORY]
    return {**doc, "history": kept}


def run_evaluation(req: Request, notify: Callable[[str], None] = lambda _m: None) -> Result:
    """Evaluate (or read back) the drafters of `req`; the document is stored under the reference output."""
    import torch

    from eyrie.jobs.evaluate import drafter

    settings = req.settings or drafter.TrainSettings()
    ref = open_corpus(req.output, req.endpoint)
    others = [open_corpus(u, req.endpoint) for u in req.against]
    check_same_target(ref, others)
    n_held = req.heldout if req.heldout is not None else default_heldout(len(ref.samples))
    held = choose_heldout(ref.samples, n_held, settings.seed, MIN_TRAIN)
    heldout = Heldout.of(ref.samples[i] for i in held)

    taken: set[str] = set()
    drafters: list[tuple[str, str, Corpus, Any]] = []  # (name, kind, corpus, transform)
    for kind, corpus in [("reference", ref), *(("against", o) for o in others)]:
        name = _name(corpus.uri, taken)
        taken.add(name)
        drafters.append((name, kind, corpus, None))
    if req.control:
        drafters.append((CONTROL, "control", ref, drafter.shuffled))
    inputs = [{"uri": c.uri, "fingerprint": c.fingerprint, "samples": len(c.samples),
               **({"prompts": n} if (n := _prompts(c)) else {})} for c in [ref, *others]]
    key = evaluation_key(inputs, n_held, settings.to_dict(), req.control, ref.target.to_dict(),
                         SPECFORGE_VERSION)
    stored = read_evaluation(ref)
    if stored is not None and stored.get("key") == key:
        notify(f"evaluation {key} of these inputs is stored in {ref.store.url(layout.EVALUATION)}: reused")
        return Result({k: v for k, v in stored.items() if k != "history"}, True, key)
    earlier = next((h for h in (stored or {}).get("history", []) if h.get("key") == key), None)
    if earlier is not None:  # asked again for an earlier evaluation: it becomes the latest, nothing trained
        notify(f"evaluation {key} of these inputs is kept in {ref.store.url(layout.EVALUATION)}'s history: reused")
        ref.store.put(layout.EVALUATION, orjson.dumps(_with_history(stored, earlier), option=orjson.OPT_INDENT_2))
        return Result(earlier, True, key)

    model_path = drafter.target_folder(ref.target.name, ref.target.model)
    device = torch.device(req.device)
    held_ids = hashlib.sha256("\n".join(ref.samples[i].sample_id for i in held).encode()).hexdigest()
    trained: list[Trained] = []
    for name, kind, corpus, transform in drafters:
        dkey = drafter_key(corpus, kind, f"{ref.fingerprint}:{held_ids}", settings.to_dict(), ref.target.to_dict(),
                           str(device))
        kept = read_drafter(ref, dkey, name, kind)
        if kept is not None:
            acc = figures.acceptance(kept.correct, kept.denom, seed=settings.seed)
            notify(f"{name}: its drafter was trained on these inputs before (drafter {dkey}): reused, accepted length "
                   f"{acc.length.value:.3f} {bracket(format(acc.length.low, '.3f'), format(acc.length.high, '.3f'))} "
                   "per step")
            trained.append(kept)
            continue
        train, left_out = training_set(corpus.samples, heldout)
        check_disjoint((corpus.samples[i] for i in train), heldout, name)
        loss = [s.loss_tokens for s in corpus.samples]
        plan = steps_plan(loss, train, settings.steps, settings.tokens_per_step, settings.seed,
                          lengths=[s.tokens for s in corpus.samples])
        notify(f"training the drafter of {name}: {len(train):,} samples, {settings.steps:,} steps of "
               f"{settings.tokens_per_step:,} loss tokens ({passes(plan, loss, train):.1f} passes)")
        d = drafter.train(corpus, plan, train, model_path, settings, device, transform)
        got = drafter.evaluate(d, ref, held, settings)
        acc = figures.acceptance(got.correct, got.denom, seed=settings.seed)
        notify(f"{name}: accepted length {acc.length.value:.3f} "
               f"{bracket(format(acc.length.low, '.3f'), format(acc.length.high, '.3f'))} "
               f"per step on {acc.samples:,} held-out samples ({d.seconds:.0f} s of training)")
        trained.append(Trained(
            name, kind, corpus.uri,
            {"samples": len(train), "heldoutPromptsLeftOut": left_out, "lossTokens": sum(loss[i] for i in train),
             "passes": round(passes(plan, loss, train), 3), "steps": len(plan),
             "tokensPerStep": settings.tokens_per_step, "seconds": round(d.seconds, 2)},
            d.losses, got.correct, got.denom, got.specforge))
        ref.store.put(layout.evaluation_drafter(dkey), _drafter_doc(dkey, trained[-1]))  # kept before the next
    held_doc = {"uri": ref.uri, "samples": len(held), "seed": settings.seed,
                "tokens": int(trained[0].denom[:, 0].sum()), "idsSha256": held_ids}
    doc = document(key, ref.target.to_dict(), inputs, held_doc, settings.to_dict(), req.control, str(device),
                   trained)
    ref.store.put(layout.EVALUATION, orjson.dumps(_with_history(stored, doc), option=orjson.OPT_INDENT_2))
    return Result(doc, False, key)


__all__ = ["CONTROL", "EvaluationError", "Request", "Result", "Trained", "default_heldout", "document",
           "read_evaluation", "run_evaluation"]
