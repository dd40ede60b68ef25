"""What several commands print the same way: a summary line fitted to the terminal, the audit's tables."""

from __future__ import annotations

import textwrap
from typing import Any

from rich.console import Console


def fitted(line: str, width: int | None = None) -> str:
    """A summary line wrapped to the terminal (or `WIDTH` columns off one), its continuation lines
    indented. A line that is a label and a long word (a URL, a path) stays whole: wrapped, it could
    not be copied, nor found by its label."""
    from eyrie.jobs.report.text import WIDTH  # light: a Ctrl-C now must not land in a slow import

    width = width or WIDTH
    words = line.split()
    if len(line) <= width or (len(words) <= 4 and any(len(w) > width // 2 for w in words)):
        return line
    return textwrap.fill(line, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)


def print_audit(doc: dict[str, Any], console: Console | None = None) -> None:
    """The audit's verdict and tables, as wide as the terminal or `WIDTH` columns off one."""
    from eyrie.jobs.report.terminal import audit_renderables, console_for

    console = console_for(file=console.file if console is not None else None)
    for r in audit_renderables(doc):
        console.print(r)
