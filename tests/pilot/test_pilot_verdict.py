"""The pilot's decision (jobs/pilot/verdict.py), pure: a require policy never lets a worse option through,
the best alternative is the one the run's own data falls shortest of, an unseparated difference says how
many more prompts would separate it, a failing run is told the command that switches it."""

from __future__ import annotations

import json
import random
from decimal import Decimal

import pytest

from eyrie.jobs.contract.pilot import Option
from eyrie.jobs.intervals import Estimate
from eyrie.jobs.pilot.verdict import Measured, decide, more_prompts, patch_command, switch_patch

pytestmark = pytest.mark.unit


def est(value: float, half: float = 0.1, n: int = 20) -> Estimate:
    return Estimate(value, value - half, value + half, n)


def verdict(own_len: float, alts: dict[Option, float], *, policy: str = "require", margin: float = 0.0,
            half: float = 0.1, own: Option = Option.TEXT):
    measured = [Measured(own, est(own_len), 40, Decimal("1.5"))]
    measured += [Measured(o, est(v), 40, Decimal(0) if o == Option.DATASET else Decimal("1.4"))
                 for o, v in alts.items()]
    diffs = {o: est(v - own_len, half) for o, v in alts.items()}
    return decide(key="k", own=own, measured=measured, minus_own=diffs, policy=policy, margin=margin, prompts=100,
                  heldout=20, spent_usd=Decimal("0.01"), adopted=80, evaluation="pilot/structured/evaluation.json",
                  name="demo", namespace="ns")


def test_require_suspends_a_run_whose_own_data_is_worse():
    v = verdict(2.0, {Option.STRUCTURED: 4.75})
    assert not v.passed and not v.proceed and v.best_alternative == Option.STRUCTURED
    assert v.patch == ("kubectl patch dsg demo -n ns --type merge -p "
                       "'{\"spec\":{\"suspend\":false,\"tools\":{\"mode\":\"structured\"}}}'")
    assert "policy require: the run is suspended" in v.sentence and v.patch in v.sentence
    assert "set tools.mode: structured and run again" in v.sentence
    assert "2.75 [2.65, 2.85] more than the run's own" in v.sentence
    assert v.adopted == 0  # nothing of the run's own mode is kept by a run that does not go on


def test_the_margin_lets_a_small_shortfall_through_and_no_more():
    assert verdict(2.0, {Option.STRUCTURED: 2.2}, margin=0.25).passed
    assert not verdict(2.0, {Option.STRUCTURED: 2.3}, margin=0.25).passed
    assert verdict(2.0, {Option.STRUCTURED: 2.0}).passed  # no fewer: equal passes at margin 0
    v = verdict(3.0, {Option.STRUCTURED: 2.0})
    assert v.passed and v.proceed and v.patch is None and v.adopted == 80 and "Passed" in v.sentence


def test_report_goes_on_with_the_verdict_recorded():
    v = verdict(2.0, {Option.STRUCTURED: 4.0}, policy="report")
    assert not v.passed and v.proceed and v.patch is not None
    assert "policy report: the run goes on" in v.sentence


def test_the_best_alternative_decides_not_the_first_compared():
    """A worse option must not pass because another alternative is worse still: dataset answers here beat the
    run's own although the other mode does not."""
    v = verdict(3.0, {Option.STRUCTURED: 2.5, Option.DATASET: 3.5}, own=Option.TEXT)
    assert v.best_alternative == Option.DATASET and not v.passed and not v.proceed
    assert '"generation":{"answers":"dataset"},"pilot":null' in (v.patch or "")
    assert [o.option for o in v.options] == [Option.TEXT, Option.STRUCTURED, Option.DATASET]
    assert [o.own for o in v.options] == [True, False, False]


def test_require_never_lets_a_worse_option_through():
    """Over random accepted lengths, margins and alternatives: a run that proceeds under require accepts no
    fewer tokens per step than every alternative, less the margin; one that does not has an alternative that
    beats it by more than the margin."""
    rnd = random.Random(41)
    for _ in range(500):
        own = rnd.uniform(1, 8)
        alts = {o: rnd.uniform(1, 8) for o in rnd.sample([Option.STRUCTURED, Option.DATASET], rnd.randint(1, 2))}
        margin = rnd.choice([0.0, rnd.uniform(0, 2)])
        v = verdict(own, alts, margin=margin, own=Option.TEXT)
        worse = [o for o, x in alts.items() if x - own > margin]
        assert v.proceed == v.passed == (not worse), (own, alts, margin)
        if worse:
            assert v.best_alternative in worse and alts[v.best_alternative] == max(alts.values())


def test_an_unseparated_difference_says_how_many_more_prompts_would_separate_it():
    v = verdict(2.0, {Option.STRUCTURED: 2.25}, half=0.5)
    diff = v.options[1]
    assert diff.separated is False and diff.heldout_to_separate is not None
    more = more_prompts(est(0.25, 0.5), prompts=100, heldout=20)
    # the interval's half width falls as 1/sqrt(n): 20 x (0.5/0.25)^2 = 80 held out, 400 prompts at a fifth
    assert diff.heldout_to_separate == 80 and more == 300
    assert "+0.25 [-0.25, +0.75] against the run's own, not separated: about 300 more pilot prompts would " \
           "separate a difference this size" in v.sentence
    assert more_prompts(est(0.5, 0.1), 100, 20) is None  # separated already


def test_each_option_says_its_projected_cost_and_how_to_switch_to_it():
    v = verdict(3.0, {Option.STRUCTURED: 2.0, Option.DATASET: 1.0})
    by = {o.option: o for o in v.options}
    assert by[Option.DATASET].projected_usd == "0" and by[Option.TEXT].projected_usd == "1.5"
    assert by[Option.TEXT].switch is None
    assert json.loads(by[Option.STRUCTURED].switch) == switch_patch(Option.STRUCTURED)
    assert patch_command(Option.TEXT, "x", None) == \
        "kubectl patch dsg x --type merge -p '{\"spec\":{\"suspend\":false,\"tools\":{\"mode\":\"text\"}}}'"


def test_a_verdict_needs_every_difference():
    with pytest.raises(ValueError):
        decide(key="k", own=Option.TEXT, measured=[Measured(Option.TEXT, est(2), 1, None),
                                                   Measured(Option.STRUCTURED, est(3), 1, None)],
               minus_own={}, policy="require", margin=0, prompts=10, heldout=2, spent_usd=Decimal(0), adopted=0,
               evaluation="e", name="n")
