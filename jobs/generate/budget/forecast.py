"""The cost forecast: what the whole run will have spent, projected from what answers cost so far.

Pure. Once the canary (`tools.gate.canarySamples` answers) is measured, the projection is
`spent + prompts left x turns per prompt x cost per answer`, with the mean cost per answer (the
expected total) and its 90th percentile (a pessimistic total: every remaining answer as dear as
the dearest tenth so far). Costs are kept in a bounded, evenly thinned sample so a long run's
percentile costs O(1) memory.

Beside the dollars, the bytes the hidden states of the whole dataset will take when stored: tokens
per answer so far (prompt + completion, what a sample holds) x the answers of the whole run x the
bytes per token the spec's extraction stores (`contract.layers.stored_bytes_per_token`), so "14 TB"
shows at the canary, before any extraction starts (the alternative: `eyrie export specforge-online`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from decimal import Decimal

from eyrie.jobs.contract.money import dollars
from eyrie.jobs.contract.progress import CanaryForecast, ForecastFigures
from eyrie.jobs.spec import DatasetGenerationSpec

MAX_KEPT = 4096  # costs kept for the percentile; beyond it every other one is dropped, evenly


@dataclass
class CostStats:
    """Running count and sum of per-answer costs, and an evenly thinned sample for percentiles."""

    count: int = 0
    total: Decimal = Decimal(0)
    kept: list[Decimal] = field(default_factory=list)
    stride: int = 1  # every stride-th cost is kept

    def add(self, cost: Decimal) -> None:
        if self.count % self.stride == 0:
            self.kept.append(cost)
            if len(self.kept) > MAX_KEPT:
                self.kept = self.kept[::2]
                self.stride *= 2
        self.count += 1
        self.total += cost

    @property
    def mean(self) -> Decimal:
        return self.total / self.count if self.count else Decimal(0)

    def percentile(self, q: float) -> Decimal:
        if not self.kept:
            return Decimal(0)
        s = sorted(self.kept)
        return s[min(len(s) - 1, round(q * (len(s) - 1)))]


@dataclass(frozen=True)
class Forecast:
    mean_usd: Decimal  # projected total spend at the mean cost per answer
    p90_usd: Decimal  # ... at the 90th-percentile cost per answer
    per_answer_mean: Decimal
    per_answer_p90: Decimal
    answers: int  # answers the costs were measured on
    prompts_left: int
    tokens: int = 0  # projected tokens of the whole run's samples (prompt + completion per answer)
    hidden_bytes: int | None = None  # ... x the bytes per token extraction stores (None: not known)

    def over(self, max_usd: Decimal) -> bool:
        """The expected total exceeds the budget (the p90 figure is shown, not judged)."""
        return self.mean_usd > max_usd

    def to_progress(self) -> ForecastFigures:
        return ForecastFigures(mean=self.mean_usd, p90=self.p90_usd, per_answer_mean=self.per_answer_mean,
                               per_answer_p90=self.per_answer_p90, answers=self.answers,
                               prompts_left=self.prompts_left, tokens=self.tokens,
                               hidden_state_bytes=self.hidden_bytes)


CENT = Decimal("0.000001")


def project(spent: Decimal, stats: CostStats, prompts_left: int, turns_per_prompt: float = 1.0, tokens: int = 0,
            bytes_per_token: int | None = None) -> Forecast:
    """Projected total spend: what is spent plus the prompts left, each costing the mean (and the p90);
    projected tokens: the `tokens` of the `stats.count` answers so far, and as many per answer left."""
    answers_left = Decimal(max(0, prompts_left)) * Decimal(str(turns_per_prompt))
    mean, p90 = stats.mean, stats.percentile(0.9)
    total = round(tokens + float(answers_left) * tokens / stats.count) if stats.count else 0
    return Forecast((spent + answers_left * mean).quantize(CENT), (spent + answers_left * p90).quantize(CENT),
                    mean.quantize(CENT), p90.quantize(CENT), stats.count, max(0, prompts_left), total,
                    None if bytes_per_token is None else total * bytes_per_token)


def over_message(f: Forecast, max_usd: Decimal) -> str:
    """Why a run stopped on its forecast, and how to go on."""
    return (f"forecast: the run would spend {dollars(f.mean_usd)} (p90 {dollars(f.p90_usd)}) of the "
            f"{dollars(max_usd)} budget (spec.budget.maxUSD): {dollars(f.per_answer_mean)} per answer on average over "
            f"{f.answers} answers, "
            f"{f.prompts_left} prompts left; raise spec.budget.maxUSD or set spec.budget.onForecastOver: warn, "
            "then resume (spec.suspend: false)")


@dataclass
class Forecaster:
    """The coordinator's forecast: costs of paid answers (earlier attempts' seeded first), the
    projection once `canary` answers are measured, and one judgment per attempt at that point.

    A resumed attempt whose seeded answers already cover the canary is judged before it spends
    anything, so raising the budget (or `warn`) is what lets it go on.
    """

    canary: int
    suspend: bool  # budget.onForecastOver: suspend
    turns_per_prompt: float = 1.0
    costs: CostStats = field(default_factory=CostStats)
    judged: bool = False
    at_canary: Forecast | None = None  # the projection when the canary was first measured
    bytes_per_token: int | None = None  # what extraction stores per token (None: not known here)
    tokens: int = 0  # prompt + completion tokens of the answers the costs were measured on

    def add(self, cost: Decimal, tokens: int = 0) -> None:
        self.costs.add(cost)
        self.tokens += tokens

    def know_bytes_per_token(self, n: int) -> None:
        """What extraction stores per token, once read (beside the first requests): later projections carry the
        hidden-state bytes, and so does the canary's, if it was taken before (its projected tokens times `n`)."""
        self.bytes_per_token = n
        if self.at_canary is not None and self.at_canary.hidden_bytes is None:
            self.at_canary = replace(self.at_canary, hidden_bytes=self.at_canary.tokens * n)

    def current(self, spent: Decimal, prompts_left: int) -> Forecast | None:
        if self.costs.count < self.canary:
            return None
        return project(spent, self.costs, prompts_left, self.turns_per_prompt, self.tokens, self.bytes_per_token)

    def judge(self, spent: Decimal, prompts_left: int, max_usd: Decimal) -> str | None:
        """Once, when the canary is measured: the stop message when suspending on a forecast over
        `max_usd`; None to go on (and on every later call)."""
        if self.judged or (f := self.current(spent, prompts_left)) is None:
            return None
        self.judged, self.at_canary = True, f
        return over_message(f, max_usd) if self.suspend and f.over(max_usd) else None

    def to_progress(self, spent: Decimal, prompts_left: int) -> ForecastFigures | None:
        """progress.json's `forecast` (its `mean` is `forecastUSD`); None before the canary is measured."""
        f = self.current(spent, prompts_left)
        if f is None:
            return None
        at = self.at_canary
        canary = None if at is None else CanaryForecast(mean=at.mean_usd, p90=at.p90_usd, answers=at.answers,
                                                        hidden_state_bytes=at.hidden_bytes)
        return f.to_progress().model_copy(update={"at_canary": canary})


def forecaster(spec: DatasetGenerationSpec, seed: Iterable[Decimal], seed_tokens: int = 0,
               bytes_per_token: int | None = None) -> Forecaster:
    """The run's forecaster: the canary is `tools.gate.canarySamples` prompts (gate on or off), seeded
    with what earlier attempts' prompts cost (and their tokens, `seed_tokens`). Turns per prompt stay 1:
    each prompt is one answer until the worker regenerates conversations turn by turn."""
    f = Forecaster(canary=spec.tools.gate.canary_samples, suspend=spec.budget.on_forecast_over == "suspend",
                   bytes_per_token=bytes_per_token, tokens=seed_tokens)
    for cost in seed:
        f.costs.add(cost)
    return f
