"""Tool semantics of one answer: the verdict of every call, leaked markers, and the policy decision.

Pure: no I/O. The generation job calls `check_response` on each answer (the verdicts go into the
record's `checks`) and `policy` to decide whether the sample is kept. The run-level gate is `gate.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from eyrie.jobs.tools.declarations import Prepared
from eyrie.jobs.tools.leaks import scan_leaks
from eyrie.jobs.tools.validation import CallVerdict, ToolValidator

Mode = Literal["structured", "text"]
Policy = Literal["keep", "drop", "flag"]
# ------------------------------------------------------------------------------ response checks


@dataclass
class ResponseCheck:
    """Everything the tool checks found in one answer; `to_record()` goes into `Record["checks"]`."""

    declared: bool
    calls: list[CallVerdict] = field(default_factory=list)
    leaks: dict[str, list[str]] = field(default_factory=dict)  # field ("content"/"reasoning") -> markers

    @property
    def called(self) -> bool:
        return bool(self.calls)

    @property
    def invalid_calls(self) -> int:
        return sum(not v.valid for v in self.calls)

    @property
    def leaked(self) -> bool:
        return bool(self.leaks)

    def to_record(self) -> dict[str, Any]:
        return {"declared": self.declared, "called": self.called, "invalidCalls": self.invalid_calls,
                "leaked": self.leaked, "calls": [v.to_dict() for v in self.calls], "leaks": self.leaks}

    @classmethod
    def from_record(cls, checks: dict[str, Any]) -> ResponseCheck:
        """Read back what `to_record` wrote (audits and resumed metrics read persisted records)."""
        return cls(bool(checks["declared"]),
                   [CallVerdict(c["index"], c["name"], c["valid"], c["errors"]) for c in checks["calls"]],
                   dict(checks["leaks"]))


def check_response(prepared: Prepared, response: dict[str, Any]) -> ResponseCheck:
    """Validate an answer's tool calls against what was declared and scan its text for leaks."""
    validator = ToolValidator.for_tools(prepared.declared_tools)
    check = ResponseCheck(prepared.declared, validator.check_calls(response.get("tool_calls")))
    for key in ("content", "reasoning"):
        value = response.get(key)
        found = scan_leaks(value if isinstance(value, str) else None)
        if found:
            check.leaks[key] = found
    return check


def policy(check: ResponseCheck, on_invalid_call: Policy) -> Policy:
    """`tools.onInvalidCall` applied to one answer: clean answers are kept; invalid calls and leaks
    get the configured treatment (drop: kept in generations, excluded from samples; flag: kept, marked)."""
    if check.invalid_calls == 0 and not check.leaked:
        return "keep"
    return on_invalid_call
