"""Intervals are written one way everywhere a person reads them (issue 45 item 8): `value [low, high]`,
the form `eyrie evaluate`'s table and the report page use, never `[low-high]` (a minus sign reads as
the dash) nor `[low to high]`. Each writer is asked directly, with the figures it gets."""

from __future__ import annotations

import re

import numpy as np

from eyrie.jobs.evaluate import figures
from eyrie.jobs.generate.audit import stats as st
from eyrie.jobs.intervals import Estimate, wilson

OTHER_FORMS = re.compile(r"\[[^\]]*\d-[+-]?\$?\d[^\]]*\]|\[[^\]]* to [^\]]*\]")
ONE_FORM = re.compile(r"\[[+-]?\$?[\d.,]+%?, [+-]?\$?[\d.,]+%?\]")


def written(text: str) -> None:
    assert not OTHER_FORMS.search(text), text
    assert ONE_FORM.search(text), text


def test_the_audit_writes_intervals_in_the_one_form():
    e = {"value": 0.5, "low": 0.2, "high": 0.8, "n": 10}
    for text in (st.fmt_rate(wilson(6, 10).to_dict()), st.fmt_num(e), st.fmt_usd(e), st.fmt_diff(e, "rate"),
                 st.fmt_diff({**e, "low": -0.2}, "usd"), st.fmt_diff({**e, "low": -3.0, "high": 2.0}, "calls")):
        written(text)


def test_eyrie_evaluate_writes_intervals_in_the_one_form():
    rng = np.random.default_rng(0)
    d = np.full((40, 3), 30.0)
    a = np.stack([rng.binomial(30, p, size=40) for p in (0.8, 0.6, 0.5)], axis=1).astype(float)
    b = np.stack([rng.binomial(30, p, size=40) for p in (0.5, 0.3, 0.2)], axis=1).astype(float)
    la, lb = figures.acceptance(a, d).length, figures.acceptance(b, d).length
    apart = figures.length_difference((a, d), (b, d))
    written(figures.verdict_sentence("ref", "other", la, lb, apart))
    same = figures.length_difference((a, d), (a + rng.integers(-1, 2, size=a.shape).clip(0, 30), d))
    written(figures.verdict_sentence("ref", "other", la, la, same))

    from rich.console import Console

    from eyrie.jobs.cli.evaluate import tables

    e = Estimate(2.5, 2.1, 2.9, 40).to_dict()
    acc = {"accByPosition": [e, e], "acceptedLength": e}
    doc = {"heldout": {"samples": 40, "uri": "u", "tokens": 100}, "specforgeVersion": "0.2.0",
           "drafters": [{"name": "ref", "training": {"samples": 1, "passes": 1.0}, "loss": [], "acceptance": acc},
                        {"name": "other", "training": {"samples": 1, "passes": 1.0}, "loss": [], "acceptance": acc}],
           "differences": [{"name": "other", "minusReference": Estimate(-0.3, -0.6, 0.1, 40).to_dict()}]}
    console = Console(width=200, record=True)
    for t in tables(doc):
        console.print(t)
    written(console.export_text())
