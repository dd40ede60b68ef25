"""What the gate, the probe, the samples summary and the report count over a set of answers: tool calls by
prompt, invalid calls, leaks (`CallTally`). Pure, below every stage that counts them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CallTally"]


@dataclass
class CallTally:
    """Counts over a set of answers; rates are 0.0 when their denominator is empty."""

    answers: int = 0
    declared: int = 0  # answers to prompts that declared tools
    called: int = 0  # of those, answers with at least one tool call
    calls: int = 0  # tool calls in all answers
    invalid: int = 0  # invalid tool calls
    leaked: int = 0  # answers with leaked tool-call markers

    def add(self, declared: bool, called: bool, calls: int, invalid: int, leaked: bool,
            sign: int = 1) -> None:
        self.answers += sign
        self.declared += sign * declared
        self.called += sign * (declared and called)
        self.calls += sign * calls
        self.invalid += sign * invalid
        self.leaked += sign * leaked

    @property
    def call_rate(self) -> float:
        return self.called / self.declared if self.declared else 0.0

    @property
    def invalid_rate(self) -> float:
        return self.invalid / self.calls if self.calls else 0.0

    @property
    def leak_rate(self) -> float:
        return self.leaked / self.answers if self.answers else 0.0
