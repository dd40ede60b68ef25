"""95% intervals for the audit's figures and `eyrie evaluate`'s. Pure and deterministic; below both
(`generate/audit/stats.py`, `evaluate/figures.py`), so neither reaches into the other for them.

Rates get Wilson's score interval (right at 0% and 100% and for small n, where the normal
approximation gives intervals outside [0, 1] or of width zero). Means, ratios of sums and paired
differences get a percentile bootstrap with a fixed seed, so the same answers give the same interval
on every report. Differences between the two tools modes resample *prompts*: both modes' answers to
a prompt stay together (the comparison is paired), and so do the several calls of one answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054  # the 97.5% quantile of the standard normal
SEED = 0
RESAMPLES = 2000
_CHUNK_CELLS = 4_000_000  # indices drawn at once (resamples x n): bounds memory for large n


@dataclass(frozen=True)
class Estimate:
    """A figure, its 95% interval and the sample size it rests on; None where n is 0."""

    value: float | None
    low: float | None
    high: float | None
    n: int

    def to_dict(self) -> dict[str, float | int | None]:
        return {"value": _round(self.value), "low": _round(self.low), "high": _round(self.high), "n": self.n}

    def scaled(self, factor: float) -> Estimate:
        """The same estimate times a constant (a per-answer figure projected to a dataset)."""
        lo, hi = (None, None) if self.low is None else sorted((self.low * factor, self.high * factor))
        return Estimate(None if self.value is None else self.value * factor, lo, hi, self.n)


EMPTY = Estimate(None, None, None, 0)


def bracket(low: str, high: str) -> str:
    """An interval as people read it, everywhere (the report, `eyrie audit`, `eyrie evaluate`): "[low, high]",
    its ends already written (a minus sign never reads as a dash between them)."""
    return f"[{low}, {high}]"


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def wilson(k: int, n: int, z: float = Z95) -> Estimate:
    """k successes in n trials: the share and Wilson's score interval."""
    if n <= 0:
        return EMPTY
    p = k / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), n)


def resampled_sums(columns: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """Column sums of `resamples` bootstrap resamples of the rows of `columns` (units x values):
    shape (resamples, values). Resampling units with replacement is the same as drawing how often
    each distinct unit is taken from a multinomial; when units repeat (counts, 0/1 outcomes) that is
    far less work than drawing n indices per resample, and it is exact either way."""
    rng = np.random.default_rng(seed)
    n = columns.shape[0]
    distinct, inverse = np.unique(columns, axis=0, return_inverse=True)
    if len(distinct) * 4 <= n:
        weights = np.bincount(inverse.ravel(), minlength=len(distinct)) / n
        counts = rng.multinomial(n, weights, size=resamples)
        return counts @ distinct
    out = np.empty((resamples, columns.shape[1]))
    step = max(1, _CHUNK_CELLS // n)
    for start in range(0, resamples, step):
        idx = rng.integers(0, n, size=(min(step, resamples - start), n), dtype=np.intp)
        for j in range(columns.shape[1]):
            out[start:start + len(idx), j] = columns[:, j][idx].sum(axis=1)
    return out


def _percentile(stats: np.ndarray) -> tuple[float | None, float | None]:
    finite = stats[np.isfinite(stats)]
    if finite.size == 0:
        return None, None
    lo, hi = np.percentile(finite, [2.5, 97.5])
    return float(lo), float(hi)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return num / den


def _columns(*cols: Sequence[float] | None) -> tuple[np.ndarray, list[int | None]]:
    """The given columns side by side (None: a column of ones, not stored), and where each is."""
    arrays, where = [], []
    for c in cols:
        if c is None:
            where.append(None)
        else:
            where.append(len(arrays))
            arrays.append(np.asarray(c, dtype=np.float64))
    return np.column_stack(arrays), where


def _pick(sums: np.ndarray, where: int | None, n: int) -> np.ndarray:
    return np.full(sums.shape[0], float(n)) if where is None else sums[:, where]


def bootstrap_ratio(num: Sequence[float], den: Sequence[float] | None = None, *, seed: int = SEED,
                    resamples: int = RESAMPLES) -> Estimate:
    """sum(num) / sum(den) over units (den omitted: the mean of num), with a bootstrap interval over
    the units. n is the number of units with den > 0."""
    a = np.asarray(num, dtype=np.float64)
    d = np.ones_like(a) if den is None else np.asarray(den, dtype=np.float64)
    n_units = int(np.count_nonzero(d))
    if a.size == 0 or d.sum() == 0:
        return Estimate(None, None, None, n_units)
    value = float(a.sum() / d.sum())
    cols, (ia, id_) = _columns(a, den)
    sums = resampled_sums(cols, resamples, seed)
    lo, hi = _percentile(_ratio(_pick(sums, ia, a.size), _pick(sums, id_, a.size)))
    return Estimate(value, lo, hi, n_units)


def bootstrap_mean(values: Sequence[float], *, seed: int = SEED, resamples: int = RESAMPLES) -> Estimate:
    return bootstrap_ratio(values, None, seed=seed, resamples=resamples)


def paired_difference(num_a: Sequence[float], den_a: Sequence[float] | None, num_b: Sequence[float],
                      den_b: Sequence[float] | None, *, seed: int = SEED, resamples: int = RESAMPLES) -> Estimate:
    """(sum num_b / sum den_b) - (sum num_a / sum den_a) over the same units (prompts), resampled
    together; den None: a mean. n is the number of units."""
    na, nb = np.asarray(num_a, dtype=np.float64), np.asarray(num_b, dtype=np.float64)
    da = np.ones_like(na) if den_a is None else np.asarray(den_a, dtype=np.float64)
    db = np.ones_like(nb) if den_b is None else np.asarray(den_b, dtype=np.float64)
    if not (na.size == nb.size == da.size == db.size):
        raise ValueError("paired figures need one value per unit in both modes")
    if na.size == 0 or da.sum() == 0 or db.sum() == 0:
        return Estimate(None, None, None, int(na.size))
    value = float(nb.sum() / db.sum() - na.sum() / da.sum())
    cols, (ia, ida, ib, idb) = _columns(na, den_a, nb, den_b)
    sums = resampled_sums(cols, resamples, seed)
    n = na.size
    stats = _ratio(_pick(sums, ib, n), _pick(sums, idb, n)) - _ratio(_pick(sums, ia, n), _pick(sums, ida, n))
    lo, hi = _percentile(stats)
    return Estimate(value, lo, hi, int(na.size))
