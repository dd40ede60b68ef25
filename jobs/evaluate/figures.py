"""What a drafter's held-out counts say: acceptance by draft position, the accepted length per step,
their 95% intervals and the differences between drafters, and the verdict in one sentence. Pure
(numpy only): the training side hands over counts, this module never sees a tensor.

The counts are SpecForge's own: for held-out sample i and draft position k (test-time-training step
k), `correct[i, k]` tokens where the draft's argmax is the target's argmax and `denom[i, k]` tokens
in the loss at that position (`acc_corrects` / `acc_denoms` of its EAGLE-3 step). Accuracy at k is
the ratio of sums over the held-out set, as SpecForge's `Evaluator` sums before it divides.

The accepted length of chain decoding (one draft token per position, all checked by the target in
one step) is `1 + sum_k prod_{j<=k} acc_j`: the target's own token always counts, the k-th draft
token only when every one before it was accepted. SpecForge's `eval/simulated_acc_len` is the same
sum without the 1 (draft tokens only): `accepted_length` is it plus one.

Intervals resample held-out *samples* (a sample's tokens stay together: they are not independent),
with the seeded bootstrap of `jobs/intervals.py`; a difference resamples the same samples for both
drafters (paired: every drafter was evaluated on the same held-out set).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from eyrie.jobs.intervals import RESAMPLES, SEED, Estimate, bracket, resampled_sums


def accepted_length(acc: Sequence[float]) -> float:
    """1 + sum over k of acc_0 x ... x acc_k (chain decoding: the target's token plus the drafts accepted)."""
    total, run = 1.0, 1.0
    for a in acc:
        run *= a
        total += run
    return total


def _lengths(acc: np.ndarray) -> np.ndarray:
    """accepted_length of every row of acc (resamples x positions)."""
    return 1.0 + np.cumprod(acc, axis=1).sum(axis=1)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)


def _interval(stats: np.ndarray) -> tuple[float, float]:
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return float(lo), float(hi)


def _check(correct: np.ndarray, denom: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c, d = np.asarray(correct, dtype=np.float64), np.asarray(denom, dtype=np.float64)
    if c.ndim != 2 or c.shape != d.shape:
        raise ValueError(f"counts must be samples x positions of one shape, got {c.shape} and {d.shape}")
    if c.shape[0] == 0 or d.sum() == 0:
        raise ValueError("no held-out token to measure acceptance on")
    if (c > d).any() or (c < 0).any():
        raise ValueError("a count of correct tokens is negative or above its denominator")
    return c, d


@dataclass(frozen=True)
class Acceptance:
    """One drafter on the held-out set: accuracy per draft position and the accepted length, each
    with its 95% interval; `samples` held-out samples, `tokens` in the loss at position 0."""

    by_position: tuple[Estimate, ...]
    length: Estimate
    samples: int
    tokens: int

    @property
    def specforge_simulated_acc_len(self) -> float:
        """SpecForge's `eval/simulated_acc_len` for the same accuracies (draft tokens only)."""
        assert self.length.value is not None
        return self.length.value - 1.0

    def to_dict(self) -> dict[str, object]:
        return {"accByPosition": [e.to_dict() for e in self.by_position], "acceptedLength": self.length.to_dict(),
                "specforgeSimulatedAccLen": round(self.specforge_simulated_acc_len, 6),
                "heldoutSamples": self.samples, "heldoutTokens": self.tokens}


def acceptance(correct: np.ndarray, denom: np.ndarray, *, seed: int = SEED, resamples: int = RESAMPLES) -> Acceptance:
    """Acceptance by position and accepted length, intervals over the held-out samples (rows)."""
    c, d = _check(correct, denom)
    n, k = c.shape
    acc = c.sum(0) / np.where(d.sum(0) > 0, d.sum(0), 1)
    sums = resampled_sums(np.hstack([c, d]), resamples, seed)
    boot = _ratio(sums[:, :k], sums[:, k:])
    by_position = tuple(Estimate(float(acc[j]), *_interval(boot[:, j]), n) for j in range(k))
    length = Estimate(accepted_length(acc.tolist()), *_interval(_lengths(boot)), n)
    return Acceptance(by_position, length, n, int(d[:, 0].sum()))


def length_difference(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], *, seed: int = SEED,
                      resamples: int = RESAMPLES) -> Estimate:
    """Accepted length of drafter b minus drafter a on the same held-out samples (paired bootstrap)."""
    ca, da = _check(*a)
    cb, db = _check(*b)
    if ca.shape != cb.shape:
        raise ValueError("a difference needs both drafters' counts on the same held-out samples")
    k = ca.shape[1]
    value = accepted_length((cb.sum(0) / np.maximum(db.sum(0), 1)).tolist()) - \
        accepted_length((ca.sum(0) / np.maximum(da.sum(0), 1)).tolist())
    sums = resampled_sums(np.hstack([ca, da, cb, db]), resamples, seed)
    stats = _lengths(_ratio(sums[:, 2 * k:3 * k], sums[:, 3 * k:])) - _lengths(_ratio(sums[:, :k], sums[:, k:2 * k]))
    return Estimate(value, *_interval(stats), ca.shape[0])


def separates(e: Estimate) -> bool:
    """Whether the 95% interval of a difference excludes zero."""
    return e.low is not None and e.high is not None and (e.low > 0 or e.high < 0)


def samples_to_separate(e: Estimate) -> int | None:
    """About how many held-out samples would make this difference's interval exclude zero, if the
    difference stayed what it is (an interval's width falls as one over the root of the samples);
    None for a difference of exactly zero (no number of samples separates it)."""
    if e.value is None or e.low is None or e.high is None or e.value == 0:
        return None
    half = (e.high - e.low) / 2
    return max(e.n, math.ceil(e.n * (half / abs(e.value)) ** 2))


def _n(x: float) -> str:
    return f"{x:.2f}"


def verdict_sentence(reference: str, other: str, ref_length: Estimate, other_length: Estimate,
                     diff: Estimate) -> str:
    """One sentence: how many tokens per step a drafter trained on `other` accepts more or fewer than
    one trained on `reference`, with the interval, and whether the held-out set tells them apart."""
    assert diff.value is not None and diff.low is not None and diff.high is not None
    assert ref_length.value is not None and other_length.value is not None
    both = f"({_n(other_length.value)} vs {_n(ref_length.value)} per step, 95% intervals over {diff.n:,} " \
           "held-out samples)"
    near, far = (-diff.high, -diff.low) if diff.value < 0 else (diff.low, diff.high)
    span = bracket(_n(near), _n(far))
    if separates(diff):
        word = "fewer" if diff.value < 0 else "more"
        return f"a drafter trained on {other} accepts {_n(abs(diff.value))} {span} {word} tokens per step than one " \
               f"trained on {reference} {both}."
    need = samples_to_separate(diff)
    more = f"; about {need:,} held-out samples would separate a difference this size" if need else ""
    return (f"a drafter trained on {other} and one trained on {reference} accept the same within what "
            f"{diff.n:,} held-out samples can tell: difference {diff.value:+.2f} "
            f"{bracket(format(diff.low, '+.2f'), format(diff.high, '+.2f'))} tokens per step {both}{more}.")
