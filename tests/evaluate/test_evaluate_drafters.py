"""`eyrie evaluate` end to end on the built-in target: the target's own answers (builtin:tiny-chat's,
tools structured) against an impostor's (builtin:tiny-chat-seed1's answers under the same name), both
made by `eyrie run` from the same 300 distinct tool-declaring prompts of the target's training
distribution (tests/acceptance_fixture.py: the four-dataset experiment's (a) and (d)) and extracted
with builtin:tiny-chat, and the shuffled control; drafters trained with SpecForge's code at a small
budget and measured on the target's held-out answers.

The budget is the smallest tried at which the ranking held on every seed tried (docs/operating.md,
"Does it matter for the drafter?"): a fifth held out (the default), STEPS steps of 256 loss tokens.
On recipe version 2 the quickstart's 38 samples (7 held out) no longer rank the two: the impostor's
drafter ranked first at 100 steps (seed 0: +0.35), and at 200 and 300 steps the difference stayed
inside intervals 1.3 to 2.4 tokens wide (seed 0: +0.04, -0.11).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from tests import acceptance_fixture
from tests.example_runs import copy_output

pytestmark = pytest.mark.integration

STEPS = 100
PROMPTS = 300


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory) -> dict:
    """`eyrie evaluate STRUCTURED --against IMPOSTOR --control --steps STEPS --json FILE`, in this process."""
    from eyrie.jobs.cli import main

    base = tmp_path_factory.mktemp("evaluate")
    acceptance_fixture.write_prompts(base, PROMPTS, unique=True)
    ref, imp = (acceptance_fixture.make(base, name) for name in ("structured", "impostor"))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as done:
        main(["evaluate", str(ref), "--against", str(imp), "--control", "--steps", str(STEPS),
              "--json", str(base / "evaluation.json")])
    assert done.value.code == 0, err.getvalue()[-3000:]
    stored = json.loads((ref / "evaluation.json").read_text())
    return {"ref": ref, "impostor": imp, "stdout": out.getvalue(), "stderr": err.getvalue(), "stored": stored,
            "doc": {k: v for k, v in stored.items() if k != "history"},
            "json": json.loads((base / "evaluation.json").read_text())}


def _chain(acc: list[float]) -> float:
    """The expected accepted length of chain decoding, written out: 1 + a0 + a0 a1 + a0 a1 a2 + ..."""
    return 1.0 + float(np.cumprod(acc).sum())


def test_evaluation_json_holds_every_drafters_acceptance_consistent_by_the_chain_formula(evaluated):
    doc = evaluated["doc"]
    kept = json.loads((evaluated["ref"] / "progress.json").read_text())["samples"]["done"]
    heldout = kept // 5  # the default: a fifth of the reference's samples
    assert evaluated["json"] == doc  # --json writes the stored document's latest evaluation
    assert evaluated["stored"]["history"] == []  # the first evaluation of this output: nothing earlier kept
    assert doc["target"]["model"] == "builtin:tiny-chat" and doc["specforgeVersion"] == "0.2.0"
    assert [d["kind"] for d in doc["drafters"]] == ["reference", "against", "control"]
    assert [d["name"] for d in doc["drafters"][:2]] == ["structured", "impostor"]
    assert heldout >= 5 and doc["heldout"]["samples"] == heldout and doc["heldout"]["uri"].endswith("/structured")
    corpora = [i["samples"] for i in doc["inputs"]]  # the reference's, then each --against output's
    assert corpora[0] == kept
    for n, d in enumerate(doc["drafters"]):
        a = d["acceptance"]
        acc = [e["value"] for e in a["accByPosition"]]
        assert len(acc) == doc["settings"]["ttt_length"] == 7
        assert a["acceptedLength"]["value"] == pytest.approx(_chain(acc), abs=1e-5)  # stored to 6 decimals
        assert a["acceptedLength"]["low"] <= a["acceptedLength"]["value"] <= a["acceptedLength"]["high"]
        assert all(e["low"] <= e["value"] <= e["high"] for e in a["accByPosition"])
        # SpecForge's own Evaluator summed the same counts: its accuracies, and its simulated length plus the
        # target's token, are the document's
        sf = d["specforge"]
        assert sf["eval/per_position_acc"] == pytest.approx(acc, abs=1e-6)
        assert sf["eval/simulated_acc_len"] + 1 == pytest.approx(a["acceptedLength"]["value"], abs=1e-6)
        assert a["specforgeSimulatedAccLen"] == pytest.approx(sf["eval/simulated_acc_len"], abs=1e-5)
        # every drafter: the same held-out set, the same budget, nothing of the held-out set trained on
        assert (a["heldoutSamples"], a["heldoutTokens"]) == (heldout, doc["heldout"]["tokens"])
        t = d["training"]
        assert (t["steps"], t["tokensPerStep"]) == (STEPS, 256)
        # trained on its output's samples less those of a held-out prompt (and any without loss tokens); the
        # reference's and the control's held-out ones are exactly the held-out set
        corpus = corpora[n] if d["kind"] != "control" else kept
        assert t["heldoutPromptsLeftOut"] > 0 and t["samples"] + t["heldoutPromptsLeftOut"] <= corpus
        assert t["samples"] >= corpus - heldout - 2, t
        if d["kind"] != "against":
            assert t["heldoutPromptsLeftOut"] == heldout
        assert len(d["loss"]) == STEPS
    assert evaluated["stdout"].count("impostor") >= 1 and "verdict: " + doc["verdict"] in \
        evaluated["stdout"].replace("\n", " ")


def test_the_drafter_of_the_targets_own_answers_ranks_above_the_impostors_and_the_control_last(evaluated):
    doc = evaluated["doc"]
    length = {d["kind"]: d["acceptance"]["acceptedLength"]["value"] for d in doc["drafters"]}
    assert length["reference"] > length["against"] > length["control"], length
    diffs = {d["kind"]: d for d in doc["differences"]}
    # the impostor's drafter accepts fewer of the target's tokens (at this budget its interval excluded zero on
    # every seed tried: docs/operating.md), and the verdict is about it
    assert diffs["against"]["minusReference"]["value"] < 0, diffs["against"]
    assert diffs["against"]["separates"], diffs["against"]
    assert doc["verdict"] == diffs["against"]["verdict"] and "impostor" in doc["verdict"]
    # the control is far below both: it learned next to nothing about the target's next token
    spans = {d["kind"]: d["acceptance"]["acceptedLength"] for d in doc["drafters"]}
    assert spans["control"]["high"] < spans["against"]["low"] and diffs["control"]["separates"], spans
    acc0 = {d["kind"]: d["acceptance"]["accByPosition"][0]["value"] for d in doc["drafters"]}
    assert acc0["control"] < acc0["against"] / 2, acc0


def test_asked_again_the_evaluation_is_read_back_not_retrained(evaluated):
    from eyrie.jobs.evaluate.drafter import TrainSettings
    from eyrie.jobs.evaluate.run import Request, run_evaluation

    said: list[str] = []
    got = run_evaluation(Request(str(evaluated["ref"]), (str(evaluated["impostor"]),), None,
                                 TrainSettings(steps=STEPS), control=True), notify=said.append)
    assert got.reused and got.doc == evaluated["doc"]
    assert not any("training" in m for m in said) and "reused" in said[-1]


def test_a_drafter_about_to_train_on_a_heldout_sample_is_refused(example_run, tmp_path, monkeypatch, capsys):
    """The guard right before training (`check_disjoint`), reached by a split that lets the held-out
    samples through: the evaluation stops naming the drafter before any training."""
    from eyrie.jobs.cli import main
    from eyrie.jobs.evaluate import run

    ref = copy_output(example_run("quickstart")[1], tmp_path / "quickstart")
    trained: list[str] = []
    monkeypatch.setattr(run, "training_set", lambda samples, heldout: (list(range(len(samples))), 0))
    monkeypatch.setattr("eyrie.jobs.evaluate.drafter.train", lambda *a, **k: trained.append("trained"))
    with pytest.raises(SystemExit) as done:
        main(["evaluate", str(ref), "--steps", "1"])
    assert done.value.code == 1 and not trained
    kept = json.loads((ref / "progress.json").read_text())["samples"]["done"]
    assert f"quickstart: {kept // 5} training samples are held-out prompts" in capsys.readouterr().err


def test_an_output_of_another_extraction_model_is_refused(example_run, tmp_path):
    """Hidden states of another model cannot be compared: a copy of the impostor's output whose
    shard indexes say another model extracted them."""
    from eyrie.jobs.evaluate.data import DifferentTargets
    from eyrie.jobs.evaluate.run import Request, run_evaluation

    other = copy_output(example_run("quickstart-impostor")[1], tmp_path / "other")
    for index in Path(other, "hidden").glob("*.index.json"):
        doc = json.loads(index.read_text())
        doc["modelConfigSha256"] = "0" * 64
        index.write_text(json.dumps(doc))
    with pytest.raises(DifferentTargets, match="cannot be compared"):
        run_evaluation(Request(str(example_run("quickstart")[1]), (str(other),)))


def test_adding_against_reuses_the_reference_drafter_and_every_evaluation_is_kept(example_run, tmp_path,
                                                                                  monkeypatch):
    """Each drafter's result is kept by what decides it (its output, the held-out set, the settings):
    adding --against trains only the new output's drafter, evaluation.json keeps the earlier
    evaluation beside the latest, and asking for the earlier one again trains nothing."""
    from eyrie.jobs.evaluate import drafter
    from eyrie.jobs.evaluate.drafter import TrainSettings
    from eyrie.jobs.evaluate.run import Request, run_evaluation

    ref = copy_output(example_run("quickstart")[1], tmp_path / "quickstart")
    imp = example_run("quickstart-impostor")[1]
    trained: list[str] = []
    real = drafter.train

    def counting(corpus, *a, **k):
        trained.append(corpus.uri)
        return real(corpus, *a, **k)

    monkeypatch.setattr(drafter, "train", counting)
    settings = TrainSettings(steps=2, tokens_per_step=64)
    first = run_evaluation(Request(str(ref), (), None, settings))
    assert len(trained) == 1 and not first.reused
    said: list[str] = []
    second = run_evaluation(Request(str(ref), (str(imp),), None, settings), notify=said.append)
    assert len(trained) == 2 and trained[1].rstrip("/").endswith("quickstart-impostor")  # only the new one
    assert second.doc["drafters"][0]["acceptance"] == first.doc["drafters"][0]["acceptance"]
    assert second.doc["drafters"][0]["loss"] == first.doc["drafters"][0]["loss"]
    assert any("reused" in m and "quickstart" in m for m in said), said
    stored = json.loads((ref / "evaluation.json").read_text())
    assert stored["key"] == second.key and [h["key"] for h in stored["history"]] == [first.key]
    again = run_evaluation(Request(str(ref), (), None, settings))
    assert again.reused and len(trained) == 2 and again.doc["drafters"] == first.doc["drafters"]
