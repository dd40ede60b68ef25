"""What a test needs from outside the repository (the public reference files: official chat templates,
KubeRay's CRD; the pinned sglang wheel), and what happens when it is not there.

Reference files are never committed: tests read them from `$EYRIE_REFERENCE_DIR` when it is set
(only there: an explicit folder that lacks a file is not papered over by another), else from the
shared folder beside the checkout. A missing file fails the test under `CI=true` (CI must run every
check; `.ci/run` passes the folder explicitly) and skips it elsewhere, counted and named at the end
of the pytest summary (tests/conftest.py), so a green run that skipped them says so.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[1]
# The prefix every such skip's reason starts with; the summary hook groups skips by it.
UNAVAILABLE = "unavailable here:"


def in_ci() -> bool:
    """CI=true (GitHub Actions, GitLab and most CI systems set it; `.ci/run` runs under it in CI)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def unavailable(what: str, detail: str) -> None:
    """Fail under CI=true, else skip with a reason the summary counts under `what`."""
    message = f"{UNAVAILABLE} {what}: {detail}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: a check that cannot run fails)", pytrace=False)
    pytest.skip(message)


def reference_places() -> list[Path]:
    explicit = os.environ.get("EYRIE_REFERENCE_DIR")
    if explicit:
        return [Path(explicit)]
    return [_ROOT.parent / "shared" / "reference", _ROOT.parents[1] / "shared" / "reference"]


def reference(relative: str) -> Path:
    """The reference file `relative` (e.g. `kimi-k2.5/chat_template.jinja`); fails under CI=true
    when it is missing, skips (counted in the summary) elsewhere."""
    places = reference_places()
    for place in places:
        if (place / relative).is_file():
            return place / relative
    unavailable("reference files", f"{relative} is in none of {', '.join(map(str, places))} "
                                   "(set EYRIE_REFERENCE_DIR)")
    raise AssertionError("unreachable")
