"""Run-level tool semantics: the drift gate and the progress metrics. Pure (the audit's: `generate/audit/stats.py`).

The gate exists so a run with the wrong tool semantics (a model that stops calling tools, calls them
badly, or a provider that leaks raw markers) stops after `canarySamples` answers, not after the
budget: it judges the first `canarySamples` answers, then keeps judging a sliding window of the
same size. Each observe is O(1): a deque of per-answer tuples and running sums.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from eyrie.jobs.contract.calltally import CallTally
from eyrie.jobs.contract.progress import PerTool, ToolFigures
from eyrie.jobs.spec import GateSpec
from eyrie.jobs.tools.checks import ResponseCheck

MAX_PER_TOOL_NAMES = 1000  # a model inventing names must not grow the metrics without bound
OTHER_TOOLS = "(other)"


@dataclass(frozen=True)
class DriftStop:
    """Why the gate stopped the run; `message` is what the user reads (metric, value, limit, window)."""

    metric: str  # "toolCallRate" | "invalidCallRate" | "leakRate"
    value: float
    limit: float
    message: str


def _fmt(x: float) -> str:
    """0.1 -> "0.10", 0.021 -> "0.021": at least two decimals, no float noise."""
    s = f"{x:.4f}".rstrip("0")
    return s + "0" * max(0, 2 - len(s.partition(".")[2]))


class ToolGate:
    """Watches answers and says when tool semantics drifted outside the spec's limits.

    The tool-call rate is judged only once the window holds `min_declared` answers to prompts that
    declare tools (default: min(canarySamples, 20)), so a dataset with few tool prompts is not
    stopped on noise; the invalid-call rate only when the window holds a call. `observe` returns a
    DriftStop once (the first time a limit is crossed); it stays in `stopped`. Answers observed
    after the stop (in-flight requests) still count in `metrics()`.
    """

    def __init__(self, gate: GateSpec, min_declared: int | None = None):
        self.spec = gate
        self.size = gate.canary_samples
        self.min_declared = min(self.size, 20) if min_declared is None else min_declared
        self.total = CallTally()
        self.window = CallTally()
        self._recent: deque[tuple[bool, bool, int, int, bool]] = deque()
        self.per_tool: dict[str, dict[str, int]] = {}
        self.stopped: DriftStop | None = None

    def observe(self, declared: bool, called: bool, invalid_calls: int, calls: int,
                leaked: bool) -> DriftStop | None:
        """Count one answer; return a DriftStop the first time a limit is crossed, else None."""
        entry = (declared, called, calls, invalid_calls, leaked)
        self.total.add(*entry)
        self.window.add(*entry)
        self._recent.append(entry)
        if len(self._recent) > self.size:
            self.window.add(*self._recent.popleft(), sign=-1)
        if not self.spec.enabled or self.stopped or len(self._recent) < self.size:
            return None  # judged once this attempt's window is full: a resumed run re-runs the canary
        self.stopped = self._judge()
        return self.stopped

    def canary_left(self) -> int:
        """Answers this attempt still needs before the gate first judges (0 once it has)."""
        return max(0, self.size - len(self._recent))

    def observe_check(self, check: ResponseCheck) -> DriftStop | None:
        """`observe` from a ResponseCheck, also counting calls per tool name."""
        self._count_tools(check)
        return self.observe(check.declared, check.called, check.invalid_calls, len(check.calls), check.leaked)

    def absorb(self, check: ResponseCheck) -> None:
        """Count an answer of an earlier attempt in the cumulative metrics, without judging it."""
        self._count_tools(check)
        self.total.add(check.declared, check.called, len(check.calls), check.invalid_calls, check.leaked)

    def _count_tools(self, check: ResponseCheck) -> None:
        for v in check.calls:
            name = v.name if v.name is not None else OTHER_TOOLS
            if name not in self.per_tool and len(self.per_tool) >= MAX_PER_TOOL_NAMES:
                name = OTHER_TOOLS
            counts = self.per_tool.setdefault(name, {"calls": 0, "invalid": 0})
            counts["calls"] += 1
            counts["invalid"] += not v.valid

    def _where(self) -> str:
        n = self.total.answers
        if n == self.size:
            return f"over the first {self.size} answers"
        return f"over the last {self.size} answers ({n - self.size + 1}-{n})"

    def _judge(self) -> DriftStop | None:
        w, g = self.window, self.spec
        if w.declared >= self.min_declared and w.call_rate < g.min_tool_call_rate:
            return DriftStop("toolCallRate", w.call_rate, g.min_tool_call_rate,
                             f"tool-call rate {_fmt(w.call_rate)} below minToolCallRate "
                             f"{_fmt(g.min_tool_call_rate)} {self._where()} ({w.called} of {w.declared} "
                             f"answers to prompts that declare tools called one)")
        if w.calls and w.invalid_rate > g.max_invalid_call_rate:
            return DriftStop("invalidCallRate", w.invalid_rate, g.max_invalid_call_rate,
                             f"invalid-call rate {_fmt(w.invalid_rate)} above maxInvalidCallRate "
                             f"{_fmt(g.max_invalid_call_rate)} {self._where()} ({w.invalid} of {w.calls} "
                             f"tool calls invalid)")
        if w.leak_rate > g.max_leak_rate:
            return DriftStop("leakRate", w.leak_rate, g.max_leak_rate,
                             f"leak rate {_fmt(w.leak_rate)} above maxLeakRate {_fmt(g.max_leak_rate)} "
                             f"{self._where()} ({w.leaked} of {w.answers} answers with leaked tool-call markers)")
        return None

    def metrics(self) -> ToolFigures:
        """Cumulative counts for progress.json `tools` (the operator shows the first four) and the manifest."""
        t = self.total
        return ToolFigures(declared_prompts=t.declared, call_rate=round(t.call_rate, 6), invalid_calls=t.invalid,
                           leaks=t.leaked, answers=t.answers, calls=t.calls,
                           per_tool={k: PerTool(**v) for k, v in sorted(self.per_tool.items())})

