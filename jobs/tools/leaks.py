"""Native tool-call markers leaked into content or reasoning: a provider that did not parse the call."""

from __future__ import annotations

import re

# ---------------------------------------------------------------------------------------- leaks

# Native tool-call markers a provider should have parsed into `tool_calls` (and stripped).
LEAK_MARKERS: dict[str, tuple[str, ...]] = {
    "kimi": ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_section_begin|>",
             "<|tool_call_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
             "<|tool_call_end|>"),
    "deepseek": ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
                 "<｜tool▁calls▁end｜>"),
    "hermes": ("<tool_call>", "</tool_call>"),
}
_LEAK_RE = re.compile("|".join(re.escape(m) for ms in LEAK_MARKERS.values()
                               for m in sorted(ms, key=len, reverse=True)))


def scan_leaks(text: str | None) -> list[str]:
    """The distinct native tool-call markers in `text`, in order of first appearance."""
    if not text or "tool" not in text:
        return []
    return list(dict.fromkeys(_LEAK_RE.findall(text)))


