"""The audit's statistics against reference formulas, and its figures and verdict on answers whose
counts are known by construction (pure: no provider, no store)."""

from __future__ import annotations

import hashlib
import math
import random
import re
import sys
from pathlib import Path
from statistics import NormalDist

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from eyrie.jobs.generate.audit import stats as st
from eyrie.jobs.intervals import bootstrap_mean, bootstrap_ratio, paired_difference, wilson
from eyrie.jobs.sources import Prompt
from eyrie.jobs.tools.checks import check_response
from eyrie.jobs.tools.declarations import prepare_prompt

sys.path.insert(0, str(Path(__file__).parents[1]))
from fake_openrouter import CASES_IN_ORDER, TEXT_ANSWERS, TOOLS

Z = NormalDist().inv_cdf(0.975)  # computed here, not taken from the module under test


def wilson_reference(k: int, n: int) -> tuple[float, float]:
    """Wilson's interval as the two roots of |p_hat - p| = z sqrt(p (1 - p) / n), i.e. of
    (1 + z^2/n) p^2 - (2 p_hat + z^2/n) p + p_hat^2 = 0."""
    ph = k / n
    a, b, c = 1 + Z * Z / n, -(2 * ph + Z * Z / n), ph * ph
    disc = math.sqrt(b * b - 4 * a * c)
    return (-b - disc) / (2 * a), (-b + disc) / (2 * a)


@pytest.mark.parametrize("k,n", [(0, 1), (1, 1), (0, 20), (16, 20), (20, 20), (3, 7), (61, 100), (1, 5000)])
def test_wilson_equals_the_reference_formula(k, n):
    e = wilson(k, n)
    lo, hi = wilson_reference(k, n)
    assert e.value == k / n and e.n == n
    assert e.low == pytest.approx(max(0.0, lo), abs=1e-12) and e.high == pytest.approx(min(1.0, hi), abs=1e-12)
    assert 0.0 <= e.low <= e.value <= e.high <= 1.0


def test_wilson_known_values_and_empty():
    # Wilson (1927) / Newcombe (1998) table: 81 of 263 -> 0.2553 to 0.3662; 0 of 10 -> 0 to 0.2775
    assert (round(wilson(81, 263).low, 4), round(wilson(81, 263).high, 4)) == (0.2553, 0.3662)
    assert (wilson(0, 10).low, round(wilson(0, 10).high, 4)) == (0.0, 0.2775)
    assert wilson(0, 0).value is None and wilson(0, 0).n == 0


def test_bootstrap_is_deterministic_and_seeded():
    rng = random.Random(1)
    values = [rng.expovariate(1 / 300) for _ in range(80)]
    a, b = bootstrap_mean(values), bootstrap_mean(values)
    assert a == b and a.value == pytest.approx(sum(values) / 80)
    assert bootstrap_mean(values, seed=7) != a  # another seed draws other resamples
    assert a.low < a.value < a.high and a.n == 80


def test_bootstrap_covers_the_true_mean_about_95_percent_of_the_time():
    """400 samples of 60 from a skewed distribution of known mean: the percentile interval covers
    it at close to its nominal 95% (the bootstrap is a little liberal at this n)."""
    rng = np.random.default_rng(12345)
    hits = 0
    for i in range(400):
        sample = rng.exponential(2.0, size=60)
        e = bootstrap_mean(sample.tolist(), seed=i, resamples=1000)
        hits += e.low <= 2.0 <= e.high
    assert 0.90 <= hits / 400 <= 0.98, hits


def test_ratio_and_paired_difference():
    num, den = [1, 0, 2, 1], [1, 1, 2, 2]
    assert bootstrap_ratio(num, den).value == pytest.approx(4 / 6)
    a = [random.Random(3).random() for _ in range(50)]
    b = [x + 0.25 for x in a]
    d = paired_difference(a, None, b, None)
    # paired: a constant shift has no spread at all (an unpaired interval would be wide)
    assert d.value == pytest.approx(0.25) and d.low == pytest.approx(0.25) and d.high == pytest.approx(0.25)
    noisy = paired_difference(a, None, [x + 0.25 + (0.1 if i % 2 else -0.1) for i, x in enumerate(a)], None)
    assert noisy.low < 0.25 < noisy.high
    with pytest.raises(ValueError):
        paired_difference([1], None, [1, 2], None)


# ---------------------------------------------------------------------------------- the figures


def call(name: str, valid: bool = True, fmt: str = "hermes", args: dict | None = None,
         declared: tuple[str, ...] = ("get_weather", "calculate_bmi")) -> st.CallFact:
    return st.CallFact(name, valid, fmt, st.arguments_key(args if args is not None else {"city": "Paris"}),
                       name in declared)


def fact(sid: str, mode: str, calls: list[st.CallFact] = (), prose: bool = False, cost: float = 0.001,
         tokens: int = 100, source: str = "a", reference: frozenset | None = None, status: str = "ok") -> st.AnswerFact:
    return st.AnswerFact(sid, source, mode, status, frozenset({"get_weather", "calculate_bmi"}), tuple(calls),
                         prose, False, tokens, cost, reference)


def scenario() -> list[st.AnswerFact]:
    """10 prompts. Text: 2 hermes, 1 glaive, 1 kimi, 1 json, 1 mixed (hermes + json), 1 invalid hermes, 1
    hallucinated hermes, 1 prose only, 1 no call. Structured: a valid get_weather call on 9, none on one."""
    w = {"city": "Paris"}
    text = [
        [call("get_weather")], [call("get_weather", args={"city": "Lyon"})], [call("get_weather", fmt="glaive")],
        [call("get_weather", fmt="kimi")], [call("get_weather", fmt="json")],
        [call("get_weather"), call("calculate_bmi", fmt="json", args={"weight": 70, "height": 1.75})],
        [call("get_weather", valid=False, args={"unit": "kelvin"})], [call("book_hotel", valid=False)], [], [],
    ]
    out = []
    for i, calls in enumerate(text):
        out.append(fact(f"s{i}", "text", calls, prose=(i == 8), cost=0.004, tokens=200,
                        source="a" if i < 5 else "b", reference=frozenset({"get_weather"}) if i < 6 else None))
        out.append(fact(f"s{i}", "structured", [] if i == 9 else [call("get_weather", fmt="structured", args=w)],
                        cost=0.003, tokens=150, source="a" if i < 5 else "b",
                        reference=frozenset({"get_weather"}) if i < 6 else None))
    out.append(fact("s10", "text", status="failed", cost=None))
    out.append(fact("s11", "structured", status="unparsable", cost=None))
    return out


def test_figures_count_exactly_what_the_answers_did():
    figs = st.summarize(scenario(), {"prompts": 5000, "declaredPrompts": 4000})
    t, s = figs["modes"]["text"], figs["modes"]["structured"]
    assert (t["answers"], t["failed"], t["unparsable"], t["calls"]) == (10, 1, 0, 9)
    assert (s["answers"], s["failed"], s["unparsable"], s["calls"]) == (10, 0, 1, 9)
    counts = {c: f["count"] for c, f in t["formats"].items()}
    assert counts == {"hermes": 4, "glaive": 1, "kimi": 1, "json": 1, "mixed": 1, "prose only": 1, "no call": 1}
    assert t["callsByFormat"] == {"glaive": 1, "hermes": 5, "json": 2, "kimi": 1}
    assert {c: f["count"] for c, f in s["formats"].items()} == {"structured": 9, "no call": 1}
    assert t["callRate"] == wilson(8, 10).to_dict() and s["callRate"] == wilson(9, 10).to_dict()
    assert t["validRate"] == wilson(7, 9).to_dict() and t["invalidRate"] == wilson(2, 9).to_dict()
    assert t["hallucinatedRate"] == wilson(1, 9).to_dict()
    # the dataset's answer calls get_weather on s0..s5: 7 text calls there, one to calculate_bmi
    assert t["wrongFunctionRate"] == wilson(1, 7).to_dict() and t["neededCallRate"] == wilson(6, 6).to_dict()
    assert t["costPerAnswer"]["value"] == pytest.approx(0.004) and t["costUSD"] == "0.04"
    p = figs["paired"]
    assert p["prompts"] == 10 and p["bothCalled"] == 8
    # same calls as structured (get_weather Paris): s0, s2, s3, s4 -- s1 other city, s5 an extra call,
    # s6 other arguments, s7 another function
    assert p["argumentAgreement"] == wilson(4, 8).to_dict()
    assert p["functionAgreement"] == wilson(6, 8).to_dict()  # s0-s4 and s6 call just get_weather
    assert p["difference"]["callRate"]["value"] == pytest.approx(0.1)
    assert p["difference"]["costPerAnswer"]["value"] == pytest.approx(-0.001)
    proj = figs["projection"]
    assert proj["differenceUSD"]["value"] == pytest.approx(-4.0)  # $0.001 less on each of 4,000 prompts
    assert proj["differenceUSD"]["low"] == pytest.approx(-4.0) and proj["textUSD"]["value"] == pytest.approx(16.0)
    assert set(figs["bySource"]) == {"a", "b"} and figs["bySource"]["a"]["text"]["answers"] == 5
    tools = figs["byTool"]
    assert tools["get_weather"]["text"]["declaredIn"] == 10 and tools["get_weather"]["text"]["calls"] == 7
    assert tools[st.UNDECLARED]["text"]["calls"] == 1 and tools[st.UNDECLARED]["text"]["validRate"]["value"] == 0


def test_integral_floats_are_the_same_arguments():
    assert st.arguments_key({"weight": 70.0, "h": [1.0, 2.5]}) == st.arguments_key({"h": [1, 2.5], "weight": 70})
    assert st.arguments_key({"city": "Paris"}) != st.arguments_key({"city": "Lyon"})
    assert st.arguments_key(None) is None


def test_the_verdict_says_what_the_table_says():
    from rich.console import Console

    from eyrie.jobs.report.terminal import audit_renderables

    figs = st.summarize(scenario(), {"prompts": 5000, "declaredPrompts": 4000})
    text = st.verdict(figs)
    t, s, p = figs["modes"]["text"], figs["modes"]["structured"], figs["paired"]
    for e in (t["callRate"], s["callRate"], t["invalidRate"], s["invalidRate"], p["argumentAgreement"]):
        assert st.fmt_rate(e) in text, (st.fmt_rate(e), text)
    assert "At your 5,000 prompts (4,000 declare tools) the structured run costs $4.00 [4.00, 4.00] less" in text
    assert "hermes 40% [17, 69]" in text and "1 answer (10% [2, 40]) only described a call in prose" in text
    doc = {"kind": "prompts", "samples": 10, "seed": 0, "model": "m", "figures": figs, "verdict": text,
           "sent": 20, "reused": 0, "spentUSD": "0.07"}
    console = Console(record=True, width=200)
    for r in audit_renderables(doc):
        console.print(r)
    table = console.export_text()
    for e in (t["callRate"], s["callRate"], p["argumentAgreement"]):
        assert f"{st.fmt_rate(e)} n={e['n']}" in table
    assert st.fmt_rate(wilson(7, 9).to_dict()) in table  # the valid-call rate whose complement the verdict gives
    numbers = set(re.findall(r"\d+% \[\d+, \d+\]", text))
    assert numbers and numbers <= set(re.findall(r"\d+% \[\d+, \d+\]", table)), numbers - set(
        re.findall(r"\d+% \[\d+, \d+\]", table))


def test_a_difference_that_includes_zero_is_said_to_be_about_the_same():
    fs = [fact(f"s{i}", m, [call("get_weather")], cost=0.001 + (0.0005 if (i + (m == "text")) % 2 else 0))
          for i in range(20) for m in ("text", "structured")]
    text = st.verdict(st.summarize(fs, {"prompts": 100, "declaredPrompts": 100}))
    assert "cost about the same" in text and "includes zero" in text


def test_one_mode_only_as_from_a_recorded_file():
    fs = [fact(f"s{i}", "text", [call("get_weather")] if i % 2 else []) for i in range(10)]
    figs = st.summarize(fs, {"prompts": 10, "declaredPrompts": 10})
    assert "paired" not in figs and list(figs["modes"]) == ["text"]
    text = st.verdict(figs, recorded="answers.jsonl")
    assert "In the 10 answers recorded in answers.jsonl (text mode)" in text and "--rerun" in text
    assert st.fmt_rate(wilson(5, 10).to_dict()) in text


@given(hs.recursive(hs.one_of(hs.none(), hs.booleans(), hs.integers(-10**20, 10**20), hs.floats(allow_nan=False),
                              hs.text(max_size=5), hs.sampled_from(["70.0", "1e5", "x1.0"])),
                    lambda inner: hs.one_of(hs.lists(inner, max_size=3), hs.dictionaries(hs.text(max_size=3), inner,
                                                                                          max_size=3)), max_leaves=8))
@settings(max_examples=400, deadline=None)
def test_the_arguments_key_is_the_hash_of_the_canonical_json(value):
    if value is None:  # arguments that did not decode
        assert st.arguments_key(value) is None
        return
    try:
        canonical = orjson.dumps(st._canonical(value), option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):  # not JSON values (an integral float past 64 bits, say)
        assert st.arguments_key(value) is None
        return
    assert st.arguments_key(value) == int.from_bytes(hashlib.blake2b(canonical, digest_size=8).digest(), "big")


@pytest.mark.parametrize("case", [*CASES_IN_ORDER, "failed"])
def test_a_fact_made_from_checks_is_the_fact_read_from_their_record(case):
    prepared = prepare_prompt(Prompt("s", 0, [{"role": "user", "content": "weather?"}], TOOLS, "openai"), "text")
    names = frozenset(t["function"]["name"] for t in TOOLS)
    response = None if case == "failed" else {"content": TEXT_ANSWERS[case], "tool_calls": None}
    usage = {"prompt_tokens": 9, "completion_tokens": 7}
    check = None if response is None else check_response(prepared, response)
    record = {"sample_id": "id", "source": "s", "toolsMode": "text", "usage": usage, "response": response,
              "costUSD": "0.0001", "status": "failed" if check is None else "ok"}
    if check is not None:
        record["checks"] = check.to_record()
    made = st.fact_from_check("id", "s", "text", check, names, usage, 0.0001)
    assert made == st.fact_from_record(record, names, cost=0.0001)
    assert made.status == record["status"] and (case == "none" or case == "failed" or made.called or made.prose)
