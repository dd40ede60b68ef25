"""What a person reads of eyrie's output, measured: lines too wide for 100 columns, amounts with too
many decimals, the progress log's lines. Shared by the tests that run `eyrie` as a process."""

from __future__ import annotations

import re

WIDTH = 100  # eyrie's width off a terminal (report/text.py WIDTH)
AMOUNT = re.compile(r"\$[\d,]*\.(\d+)")
PER_MILLION = re.compile(r"\$[\d,]*\.(\d+) per million")
LONG_DECIMAL = re.compile(r"\d\.\d{7,}")  # a raw float or Decimal: a $ column's cells carry no $ of their own
PROGRESS = re.compile(r"^eyrie: (\d+):(\d\d):(\d\d) (generating|probing providers) (\d+)/(\d+|\?) done, spent "
                      r"(\$[\d,.]+) of (\$[\d,.]+), ([\d.]+) req/s(, .*)?$")


def too_precise(text: str) -> list[str]:
    """The amounts in `text` printed with more than 6 decimals (prices per million: more than 4), and
    any number with more than 6 decimals at all."""
    amounts = [m.group(0) for m in AMOUNT.finditer(text) if len(m.group(1)) > 6]
    prices = [m.group(0) for m in PER_MILLION.finditer(text) if len(m.group(1)) > 4]
    return amounts + prices + LONG_DECIMAL.findall(text)


def too_wide(text: str, width: int = WIDTH) -> list[str]:
    """Lines wider than `width`, except one that is a short label and a word that cannot be broken
    (a URL or a path: wrapped, it could no longer be copied)."""
    return [line for line in text.splitlines() if len(line.rstrip()) > width
            and not (len(line.split()) <= 4 and any("/" in w and len(w) > width // 2 for w in line.split()))]


def progress_lines(text: str) -> list[re.Match]:
    """The progress log's lines (`eyrie run` off a terminal), parsed."""
    return [m for line in text.splitlines() if (m := PROGRESS.match(line))]


def elapsed_s(m: re.Match) -> int:
    return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3))
