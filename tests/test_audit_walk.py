"""Issue 45's walk through `eyrie audit --from`: a text-mode dataset with Kimi K2.5's call markers in
the content (tests/audit_walk.py), counted as the engineer who paid for it needs: a cut call counts
for the function it names, why the calls are invalid, what regenerating would cost and what to do,
the shapes training data is kept in, and a paired difference said as such."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from audit_walk import EXPECT, write

from eyrie.jobs.context import RunContext
from eyrie.jobs.generate.audit.from_recorded import FromOptions, run_audit_from


def audit(path: Path, dg=None) -> dict:
    return run_audit_from(path, dg, RunContext("t"), None, FromOptions(output=str(path.parent / "audit-out")))


def test_a_cut_off_call_counts_for_its_function_as_never_closed(tmp_path):
    doc = audit(write(tmp_path))
    t = doc["figures"]["modes"]["text"]
    assert (t["answers"], t["calls"]) == (EXPECT["answers"], EXPECT["calls"])
    assert round(t["hallucinatedRate"]["value"] * t["calls"]) == EXPECT["undeclared"] == 1
    weather = doc["figures"]["byTool"]["get_weather"]["text"]
    assert weather["declaredIn"] == EXPECT["declaredIn"]["get_weather"]
    assert round(weather["callRate"]["value"] * weather["declaredIn"]) == EXPECT["called"]["get_weather"]
    assert doc["figures"]["byTool"]["(not declared)"]["text"]["calls"] == EXPECT["undeclared"]
