"""Tool semantics of one answer: the verdict of every call, leaked markers, and the policy decision.

Pure: no I/O. The generation job calls `check_response` on each answer (the verdicts go into the
record's `checks`) and `policy` to decide whether the sample is kept. The run-level gate is `gate.py`.

The mode decides how the answer's text is read. Structured (tools sent as the API's `tools`): the
provider parses the model's calls into `tool_calls`; native call markers left in the content or the
reasoning are leaks (the provider failed to parse them). Text (tools described in the prompt): the
model writes its calls into the content, so the content is read for calls in every format
`textcalls` knows and each is validated like a structured one; nothing is a leak, and the
reasoning (where a model thinks about the format) is not read for calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from eyrie.jobs.tools.declarations import Prepared
from eyrie.jobs.tools.leaks import scan_leaks
from eyrie.jobs.tools.textcalls import find_calls, mentions
from eyrie.jobs.tools.validation import CallVerdict, ToolValidator

Mode = Literal["structured", "text"]
Policy = Literal["keep", "drop", "flag"]
# ------------------------------------------------------------------------------ response checks


@dataclass
class ResponseCheck:
    """Everything the tool checks found in one answer; `to_record()` goes into `Record["checks"]`.

    `prose`: a declared function is named in the content but no call was made (described, not
    called)."""

    declared: bool
    calls: list[CallVerdict] = field(default_factory=list)
    leaks: dict[str, list[str]] = field(default_factory=dict)  # field ("content"/"reasoning") -> markers
    prose: bool = False

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
                "leaked": self.leaked, "calls": [v.to_dict() for v in self.calls], "leaks": self.leaks,
                "prose": self.prose}

    @classmethod
    def from_record(cls, checks: dict[str, Any]) -> ResponseCheck:
        """Read back what `to_record` wrote (audits and resumed metrics read persisted records)."""
        return cls(bool(checks["declared"]),
                   [CallVerdict(c["index"], c["name"], c["valid"], c["errors"], c["format"], c["arguments"])
                    for c in checks["calls"]],
                   dict(checks["leaks"]), bool(checks["prose"]))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def check_response(prepared: Prepared, response: dict[str, Any],
                   validator: ToolValidator | None = None) -> ResponseCheck:
    """Validate an answer's tool calls against what was declared: the provider's `tool_calls`, and
    in text mode the calls written in the content; in structured mode, scan the text for leaks.
    `validator`: the declared tools' (`ToolValidator.for_tools`), for a caller that keeps it."""
    validator = validator or ToolValidator.for_tools(prepared.declared_tools)
    calls = validator.check_calls(response.get("tool_calls"))
    content = _text(response.get("content"))
    check = ResponseCheck(prepared.declared, calls)
    if prepared.mode == "text":
        calls.extend(validator.check_text_calls(find_calls(content, validator.names), len(calls)))
    else:
        for key in ("content", "reasoning"):
            found = scan_leaks(_text(response.get(key)))
            if found:
                check.leaks[key] = found
    check.prose = not calls and mentions(content, validator.names)
    return check


def policy(check: ResponseCheck, on_invalid_call: Policy) -> Policy:
    """`tools.onInvalidCall` applied to one answer: clean answers are kept; invalid calls and leaks
    get the configured treatment (drop: kept in generations, excluded from samples; flag: kept, marked).
    A valid call written as text is a clean answer: text mode keeps it."""
    if check.invalid_calls == 0 and not check.leaked:
        return "keep"
    return on_invalid_call
