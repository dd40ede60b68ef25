"""Native tool-call markers leaked into content or reasoning: a provider that did not parse the call."""

from __future__ import annotations

import re

from eyrie.jobs.tools.textcalls import NATIVE_MARKERS

# ---------------------------------------------------------------------------------------- leaks

# Native tool-call markers a provider should have parsed into `tool_calls` (and stripped); the
# formats' own module owns them.
LEAK_MARKERS: dict[str, tuple[str, ...]] = NATIVE_MARKERS
_LEAK_RE = re.compile("|".join(re.escape(m) for ms in LEAK_MARKERS.values()
                               for m in sorted(ms, key=len, reverse=True)))


def scan_leaks(text: str | None) -> list[str]:
    """The distinct native tool-call markers in `text`, in order of first appearance."""
    if not text or "tool" not in text:
        return []
    return list(dict.fromkeys(_LEAK_RE.findall(text)))


