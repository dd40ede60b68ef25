"""The public reference files (official chat templates) tests compare eyrie's formats with.

They are never committed: tests read them from `$EYRIE_REFERENCE_DIR` or the shared folder beside the
checkouts when present, and skip (saying which file) when not.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[1]
_PLACES = [Path(p) for p in (os.environ.get("EYRIE_REFERENCE_DIR"),) if p] + [
    _ROOT.parent / "shared" / "reference", _ROOT.parents[1] / "shared" / "reference"]


def reference(relative: str) -> Path:
    """The reference file `relative` (e.g. `kimi-k2.5/chat_template.jinja`), or skip the test."""
    for place in _PLACES:
        if (place / relative).is_file():
            return place / relative
    pytest.skip(f"reference file {relative} is not here (set EYRIE_REFERENCE_DIR)")
