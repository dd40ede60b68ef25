"""The drift gate (canary then sliding window) and its metrics."""

from __future__ import annotations

from eyrie.jobs.spec import GateSpec
from eyrie.jobs.tools.checks import ResponseCheck
from eyrie.jobs.tools.gate import DriftStop, ToolGate
from eyrie.jobs.tools.validation import CallVerdict

GOOD = (True, True, 0, 1, False)  # declared, called, invalid_calls, calls, leaked
SILENT = (True, False, 0, 0, False)  # a tool prompt answered without a call
PLAIN = (False, False, 0, 0, False)  # no tools declared, none called
INVALID = (True, True, 1, 1, False)
LEAK = (True, False, 0, 0, True)


def gate(**kw) -> ToolGate:
    spec = {"canary_samples": 10, "min_tool_call_rate": 0.5, "max_invalid_call_rate": 0.1, "max_leak_rate": 0.0}
    return ToolGate(GateSpec(**{**spec, **kw}))


def feed(g: ToolGate, answers: list[tuple]) -> list[tuple[int, DriftStop]]:
    """(1-based answer number, stop) for every stop returned."""
    return [(i, s) for i, a in enumerate(answers, 1) if (s := g.observe(*a))]


def test_canary_with_a_low_call_rate_stops_exactly_at_the_end_of_the_canary():
    g = gate()
    stops = feed(g, [GOOD] * 4 + [SILENT] * 6 + [GOOD] * 5)
    assert stops == [(10, DriftStop("toolCallRate", 0.4, 0.5, "tool-call rate 0.40 below minToolCallRate 0.50 "
                                    "over the first 10 answers (4 of 10 answers to prompts that declare tools "
                                    "called one)"))]
    assert g.stopped == stops[0][1]
    assert g.metrics().dump()["answers"] == 15  # in-flight answers after the stop still count


def test_canary_with_invalid_calls_stops():
    stops = feed(gate(), [GOOD] * 8 + [INVALID] * 2)
    assert stops == [(10, DriftStop("invalidCallRate", 0.2, 0.1, "invalid-call rate 0.20 above "
                                    "maxInvalidCallRate 0.10 over the first 10 answers (2 of 10 tool calls "
                                    "invalid)"))]


def test_canary_with_a_leak_stops_when_no_leak_is_allowed():
    stops = feed(gate(), [GOOD] * 9 + [(True, True, 0, 1, True)])
    assert stops == [(10, DriftStop("leakRate", 0.1, 0.0, "leak rate 0.10 above maxLeakRate 0.00 over the "
                                    "first 10 answers (1 of 10 answers with leaked tool-call markers)"))]


def test_good_data_never_stops_and_limits_are_inclusive():
    g = gate()
    # exactly at the limits in every window: call rate 0.5, invalid rate 0.1, no leak
    block = [(True, True, 0, 2, False)] * 4 + [(True, True, 1, 2, False)] + [SILENT] * 5
    assert feed(g, block * 50) == []
    assert g.stopped is None
    m = g.metrics().dump()
    assert (m["answers"], m["declaredPrompts"], m["callRate"], m["invalidCalls"], m["leaks"], m["calls"]) == \
        (500, 500, 0.5, 50, 0, 500)


def test_sliding_window_catches_later_drift():
    g = gate()
    stops = feed(g, [GOOD] * 30 + [SILENT] * 10)
    # window of 10 ending at answer 36 holds 4 calls in 10: the first answer below 0.5
    assert stops == [(36, DriftStop("toolCallRate", 0.4, 0.5, "tool-call rate 0.40 below minToolCallRate 0.50 "
                                    "over the last 10 answers (27-36) (4 of 10 answers to prompts that declare "
                                    "tools called one)"))]


def test_disabled_gate_never_stops_but_counts():
    g = gate(enabled=False)
    assert feed(g, [SILENT] * 20 + [INVALID] * 20 + [LEAK] * 20) == []
    m = g.metrics().dump()
    assert (m["answers"], m["declaredPrompts"], m["invalidCalls"], m["leaks"]) == (60, 60, 20, 20)
    assert m["callRate"] == round(20 / 60, 6)


def test_call_rate_waits_for_enough_declaring_prompts():
    g = ToolGate(GateSpec(canary_samples=100, min_tool_call_rate=0.5, max_invalid_call_rate=1.0))
    # 100 answers, only 19 to tool prompts and none called: too few to judge (min_declared = 20)
    assert feed(g, [PLAIN] * 81 + [SILENT] * 19) == []
    # the 20th declaring prompt in the window makes it judgeable
    [(n, stop)] = feed(g, [SILENT])
    assert (n, stop.metric, stop.value) == (1, "toolCallRate", 0.0)
    assert "over the last 100 answers (2-101)" in stop.message


def test_invalid_rate_ignores_windows_without_calls_and_plain_prompts():
    g = gate(min_tool_call_rate=0.0)
    assert feed(g, [PLAIN] * 25) == []
    m = g.metrics().dump()
    assert (m["declaredPrompts"], m["callRate"], m["calls"]) == (0, 0.0, 0)


def test_observe_check_counts_per_tool():
    g = gate(enabled=False)
    v = CallVerdict
    g.observe_check(ResponseCheck(True, [v(0, "get_news", True, []), v(1, "get_news", False, [])], {}))
    g.observe_check(ResponseCheck(True, [v(0, "quote", True, []), v(1, None, False, [])], {"content": ["<tool_call>"]}))
    g.observe_check(ResponseCheck(False, [], {}))
    assert g.metrics().dump() == {"declaredPrompts": 2, "callRate": 1.0, "invalidCalls": 2, "leaks": 1, "answers": 3,
                           "calls": 4, "perTool": {"(other)": {"calls": 1, "invalid": 1},
                                                   "get_news": {"calls": 2, "invalid": 1},
                                                   "quote": {"calls": 1, "invalid": 0}}}


def test_gate_stops_once_and_observe_is_constant_time_per_answer():
    g = ToolGate(GateSpec(canary_samples=200, min_tool_call_rate=0.1))
    stops = feed(g, [SILENT] * 100_000)
    assert [n for n, _ in stops] == [200]
    assert len(g._recent) == 200 and g.window.answers == 200
