"""The figures a run reports both in the resource's status (`jobs/spec.py`) and in progress.json
(`contract/progress.py`): one definition each, below both, so the spec never imports the contract.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from eyrie.jobs.model import Model

__all__ = ["EndpointVerdict", "SampleCounts", "TokenCounts"]


# The one definition of the sample counts: the coordinator's tally, progress.json, the operator's status, the
# CLI and the report all hold this.
class SampleCounts(Model):
    """Prompts by what became of them."""

    total: int = 0
    """Prompts (conversations with generation.turns: all) in the sources."""
    done: int = 0
    """Answered and kept."""
    rejected: int = 0
    """Never sent: a row that does not parse or whose tools do not (unpaid); listed in samples/bad_rows.jsonl."""
    discarded: int = 0
    """Answered and paid, then excluded by tools.onInvalidCall: drop (their cost: progress.json discardedUSD)."""
    failed: int = 0
    """Sent, and failed after retries (by error type in progress.json failures)."""

    @property
    def finished(self) -> int:
        """Prompts with a record: every outcome."""
        return self.done + self.rejected + self.discarded + self.failed

    @property
    def missing(self) -> int:
        """Prompts of `total` without a record (a run that ended with some: workers lost)."""
        return max(0, self.total - self.finished)


class TokenCounts(Model):
    input: int = 0
    output: int = 0


class EndpointVerdict(Model):
    """One endpoint as the provider probe judged it (spec.api.providerProbe)."""

    model_config = ConfigDict(extra="ignore")
    tag: str = Field(strict=True)
    """The endpoint tag (OpenRouter provider slug)."""
    name: str | None = None
    """The provider's name."""
    passed: bool = Field(strict=True)
    """Whether generation is routed to it."""
    reason: str = ""
    """The measures it failed, with their values and limits; empty when it passed."""
    cost_per_answer_usd: str | None = Field(default=None, alias="costPerAnswerUSD")
    """Mean cost of its probe answers."""
