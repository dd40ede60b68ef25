"""The pilot's decision, pure: what each option's drafter accepts per step, the run's own against the best
alternative, the policy and the margin in; the verdict document (contract/pilot.py) out.

What it promises (tests/pilot/test_pilot_verdict.py):
- `passed` exactly when the run's own drafter accepts no fewer tokens per step than EVERY alternative's less
  `margin` (the best alternative is the one the own falls shortest of; ties go to the first compared);
- `proceed` = passed, or policy report: a require policy never lets a worse option through;
- an unseparated difference (its 95% interval holds zero) says about how many more pilot prompts would
  separate a difference that size, at the pilot's held-out share;
- a run that does not pass is told the one command that switches it to the best alternative and resumes it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from eyrie.jobs.contract.money import dollars
from eyrie.jobs.contract.pilot import Option, OptionResult, PilotVerdict, Span
from eyrie.jobs.evaluate.figures import samples_to_separate, separates
from eyrie.jobs.intervals import Estimate, bracket


@dataclass(frozen=True)
class Measured:
    """One option's drafter: its accepted length per step (with interval) and what it trained on, and what the
    whole dataset would cost with this option (None: not known)."""

    option: Option
    accepted: Estimate
    training_samples: int
    projected_usd: Decimal | None


def switch_patch(option: Option) -> dict:
    """The spec change (a JSON merge patch) that makes `option` the run's own data and resumes the run. The
    sources' own answers need no pilot (a spec with generation.answers: dataset refuses one)."""
    if option == Option.DATASET:
        return {"spec": {"suspend": False, "generation": {"answers": "dataset"}, "pilot": None}}
    return {"spec": {"suspend": False, "tools": {"mode": option.value}}}


def switch_words(option: Option) -> str:
    """The same change as a person makes it in a spec file."""
    if option == Option.DATASET:
        return "generation.answers: dataset (and remove pilot)"
    return f"tools.mode: {option.value}"


def patch_command(option: Option, name: str, namespace: str | None) -> str:
    """`kubectl patch dsg NAME --type merge -p '...'`: switch to `option` and resume."""
    ns = f" -n {namespace}" if namespace else ""
    body = json.dumps(switch_patch(option), separators=(",", ":"))
    return f"kubectl patch dsg {name}{ns} --type merge -p '{body}'"


def _span(e: Estimate) -> Span:
    assert e.value is not None and e.low is not None and e.high is not None
    return Span(value=round(e.value, 6), low=round(e.low, 6), high=round(e.high, 6))


def _n(x: float) -> str:
    return f"{x:.2f}"


def more_prompts(diff: Estimate, prompts: int, heldout: int) -> int | None:
    """About how many more pilot prompts would separate a difference of `diff`'s size (None: separated, or
    exactly zero): the held-out samples `samples_to_separate` asks for, at the pilot's held-out share."""
    if separates(diff):
        return None
    need = samples_to_separate(diff)
    if need is None:
        return None
    return max(1, math.ceil(need * prompts / max(1, heldout)) - prompts)


def decide(*, key: str, own: Option, measured: Sequence[Measured], minus_own: Mapping[Option, Estimate],
           policy: str, margin: float, prompts: int, heldout: int, spent_usd: Decimal, adopted: int,
           evaluation: str, name: str, namespace: str | None = None, created_at: str = "") -> PilotVerdict:
    """The verdict. `measured` holds the own option and every alternative (in the order compared);
    `minus_own[alt]` is alt's accepted length minus the own's (paired, over the same held-out answers)."""
    by = {m.option: m for m in measured}
    if own not in by:
        raise ValueError(f"the run's own option {own} was not measured")
    alternatives = [m.option for m in measured if m.option != own]
    if not alternatives or any(a not in minus_own for a in alternatives):
        raise ValueError("every alternative needs its difference to the run's own")
    best = max(alternatives, key=lambda a: (minus_own[a].value, -alternatives.index(a)))
    gap = minus_own[best]
    assert gap.value is not None
    passed = all((minus_own[a].value or 0.0) <= margin for a in alternatives)
    proceed = passed or policy == "report"
    options = []
    for m in measured:
        diff = minus_own.get(m.option) if m.option != own else None
        options.append(OptionResult(
            option=m.option, own=m.option == own, accepted_length=_span(m.accepted),
            minus_own=_span(diff) if diff is not None else None,
            separated=separates(diff) if diff is not None else None,
            heldout_to_separate=(samples_to_separate(diff) if diff is not None and not separates(diff) else None),
            projected_usd=str(m.projected_usd) if m.projected_usd is not None else None,
            training_samples=m.training_samples,
            switch=json.dumps(switch_patch(m.option), separators=(",", ":")) if m.option != own else None))
    patch = patch_command(best, name, namespace) if not passed else None
    sentence = _sentence(own, best, by, gap, margin, policy, passed, prompts, heldout, spent_usd, patch)
    return PilotVerdict(key=key, policy=policy, margin=margin, passed=passed, proceed=proceed, sentence=sentence,
                        own=own, best_alternative=best, options=options, prompts=prompts, heldout=heldout,
                        spent_usd=str(spent_usd), adopted=adopted if proceed else 0, evaluation=evaluation,
                        patch=patch, created_at=created_at)


def _cost(m: Measured) -> str:
    return dollars(m.projected_usd) if m.projected_usd is not None else "unknown"


def _sentence(own: Option, best: Option, by: Mapping[Option, Measured], gap: Estimate, margin: float, policy: str,
              passed: bool, prompts: int, heldout: int, spent: Decimal, patch: str | None) -> str:
    o, b = by[own], by[best]
    assert o.accepted.value is not None and b.accepted.value is not None
    assert gap.value is not None and gap.low is not None and gap.high is not None
    acc = f"{_n(o.accepted.value)} {bracket(_n(o.accepted.low or 0), _n(o.accepted.high or 0))}"
    acc_b = f"{_n(b.accepted.value)} {bracket(_n(b.accepted.low or 0), _n(b.accepted.high or 0))}"
    if separates(gap):
        word = "more" if gap.value > 0 else "fewer"
        near, far = (gap.low, gap.high) if gap.value > 0 else (-gap.high, -gap.low)
        diff = f"{_n(abs(gap.value))} {bracket(_n(near), _n(far))} {word} than the run's own"
    else:
        more = more_prompts(gap, prompts, heldout)
        span = bracket(f"{gap.low:+.2f}", f"{gap.high:+.2f}")
        diff = (f"{gap.value:+.2f} {span} against the run's own, not separated"
                + (f": about {more:,} more pilot prompts would separate a difference this size" if more else ""))
    head = (f"pilot of {prompts:,} tool-declaring prompts ({heldout:,} held out: the target's own structured "
            f"answers): a drafter trained on the run's own data ({own.describe()}) accepts {acc} tokens per step; "
            f"on {best.describe()}, {acc_b}, {diff}. Whole dataset: {_cost(o)} as the run is, {_cost(b)} with "
            f"{best.describe()}; the pilot's answers cost {dollars(spent)}.")
    if passed:
        tail = (f" Passed: the run's own data is no worse than the best alternative beyond the margin "
                f"({margin:g} tokens per step).")
    elif policy == "report":
        tail = (f" Not passed (worse beyond the margin of {margin:g} tokens per step); policy report: the run goes "
                f"on. To switch: set {switch_words(best)} and run again; a DatasetGeneration: {patch}")
    else:
        tail = (f" Failed: worse beyond the margin of {margin:g} tokens per step; policy require: the run is "
                f"suspended before it buys more. To switch and resume: set {switch_words(best)} and run again; "
                f"a DatasetGeneration: {patch}")
    return head + tail
