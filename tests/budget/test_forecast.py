"""The cost forecast's projection (issue 15, part 4): pure, against hand-computed figures."""

from __future__ import annotations

import sys
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eyrie.jobs.generate.budget.forecast import MAX_KEPT, CostStats, Forecaster, over_message, project

sys.path.insert(0, str(Path(__file__).parents[1]))
from tests.generate.test_generate import make_spec, persisted, progress, run_cli, write_prompts


def stats(costs: list[str]) -> CostStats:
    s = CostStats()
    for c in costs:
        s.add(Decimal(c))
    return s


def test_projection_is_spent_plus_prompts_left_times_mean_and_p90():
    s = stats(["0.01"] * 8 + ["0.10"] * 2)  # mean 0.028; p90 (rank 8 of 0..9) 0.10
    f = project(Decimal("0.19"), s, prompts_left=90)
    assert f.per_answer_mean == Decimal("0.028") and f.per_answer_p90 == Decimal("0.1")
    assert f.mean_usd == Decimal("0.19") + 90 * Decimal("0.028") == Decimal("2.71")
    assert f.p90_usd == Decimal("0.19") + 90 * Decimal("0.1")
    assert (f.answers, f.prompts_left) == (10, 90)
    assert f.over(Decimal("2.70")) and not f.over(Decimal("2.71"))
    assert f.to_progress().dump() == {"meanUSD": "2.71", "p90USD": "9.19", "perAnswerMeanUSD": "0.028",
                               "perAnswerP90USD": "0.1", "answers": 10, "promptsLeft": 90, "tokens": 0}


def test_turns_per_prompt_multiply_the_answers_left():
    f = project(Decimal(0), stats(["0.5"]), prompts_left=4, turns_per_prompt=2.5)
    assert f.mean_usd == Decimal(5) and f.p90_usd == Decimal(5)


def test_nothing_left_projects_the_spend_and_no_answers_project_nothing_more():
    assert project(Decimal("3"), stats(["1"]), prompts_left=0).mean_usd == Decimal(3)
    assert project(Decimal("3"), CostStats(), prompts_left=10).mean_usd == Decimal(3)


def test_the_message_says_what_to_change():
    f = project(Decimal("1"), stats(["0.2", "0.4"]), prompts_left=100)
    msg = over_message(f, Decimal("10"))
    assert msg.startswith("forecast: the run would spend $31.00 (p90 $41.00) of the $10.00 budget (spec.budget.maxUSD)")
    assert "$0.30 per answer on average over 2 answers, 100 prompts left" in msg
    assert "spec.budget.onForecastOver: warn" in msg


@given(st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=3 * MAX_KEPT))
def test_thinned_costs_keep_the_exact_mean_and_every_stride_th_cost(cents):
    s = stats([str(Decimal(c) / 100) for c in cents])
    assert s.count == len(cents) and s.mean == sum(Decimal(c) for c in cents) / 100 / len(cents)
    assert len(s.kept) <= MAX_KEPT
    assert s.kept == [Decimal(c) / 100 for c in cents[::s.stride]]  # evenly thinned, in arrival order
    if len(cents) <= MAX_KEPT:
        assert s.stride == 1 and s.percentile(0.9) * 100 == sorted(cents)[round(0.9 * (len(cents) - 1))]


def test_the_forecaster_judges_once_when_the_canary_is_measured():
    f = Forecaster(canary=3, suspend=True)
    for c in ("0.1", "0.1"):
        f.add(Decimal(c))
        assert f.judge(Decimal("0.2"), 100, Decimal("5")) is None and f.to_progress(Decimal("0.2"), 100) is None
    f.add(Decimal("0.1"))
    msg = f.judge(Decimal("0.3"), 97, Decimal("5"))  # 0.3 + 97 x 0.1 = 10 > 5
    assert msg is not None and msg.startswith("forecast: the run would spend $10.00 ")
    assert f.judge(Decimal("0.3"), 97, Decimal("5")) is None  # judged once
    f.add(Decimal("0.3"))
    doc = f.to_progress(Decimal("0.6"), 96)  # keeps following the answers
    assert doc is not None and doc.mean == Decimal(15)  # progress.json's forecastUSD
    assert doc.dump()["atCanary"] == {"meanUSD": "10", "p90USD": "10", "answers": 3}


def test_the_whole_runs_hidden_states_are_projected_beside_the_dollars():
    """Tokens so far and as many per answer for the answers left, x what extraction stores per token
    (Kimi K2.5 in bf16: (3 + 1) x 7168 x 2 = 57,344 bytes)."""
    f = project(Decimal(0), stats(["0.1"] * 4), prompts_left=6, tokens=400, bytes_per_token=57_344)
    assert (f.tokens, f.hidden_bytes) == (1000, 1000 * 57_344)
    assert f.to_progress().dump()["hiddenStateBytes"] == 57_344_000 and f.to_progress().dump()["tokens"] == 1000
    fc = Forecaster(canary=2, suspend=False, bytes_per_token=512)
    fc.add(Decimal("0.1"), 100)
    fc.add(Decimal("0.1"), 300)
    assert fc.judge(Decimal("0.2"), 8, Decimal(10)) is None
    doc = fc.to_progress(Decimal("0.2"), 8).dump()
    assert (doc["tokens"], doc["hiddenStateBytes"]) == (2000, 2000 * 512)
    assert doc["atCanary"]["hiddenStateBytes"] == 2000 * 512
    unknown = Forecaster(canary=1, suspend=False)
    unknown.add(Decimal("0.1"), 100)
    assert "hiddenStateBytes" not in unknown.to_progress(Decimal("0.1"), 1).dump()  # left out, not 0


def test_stored_bytes_per_token_comes_from_the_models_config(tmp_path):
    from eyrie.jobs.extract.codec import Layout
    from eyrie.jobs.extract.hf_backend import build_tiny_model
    from eyrie.jobs.extract.projection import stored_bytes_per_token
    from eyrie.jobs.spec import parse_spec

    model = build_tiny_model(tmp_path / "m", 256, hidden_size=96, layers=8, context=64)

    def spec(**ex):
        return parse_spec({"sources": [{"name": "p", "uri": "p.jsonl"}],
                           "target": {"model": "m", "tokenizer": "bundled:deepseek-v4", "chatFormat": "deepseek-v4"},
                           "api": {"baseUrl": "simulated"},
                           "budget": {"maxUSD": "1", "pricing": {"inputPerMillion": "1", "outputPerMillion": "1"}},
                           "extraction": {"enabled": True, "model": str(model), **ex}, "output": {"uri": "file:///x"}}).spec

    assert stored_bytes_per_token(spec()) == Layout(3, 96, "bfloat16").bytes_per_token == 4 * 96 * 2
    assert stored_bytes_per_token(spec(dtype="float8")) == Layout(3, 96, "float8").bytes_per_token
    assert stored_bytes_per_token(spec(layers=[1, 2, 3, 4, 5])) == 6 * 96 * 2
    assert stored_bytes_per_token(spec(enabled=False)) is None
    assert stored_bytes_per_token(spec(model=str(tmp_path / "missing"))) is None  # unknown: no projection


@pytest.mark.integration
def test_eyrie_run_projects_the_hidden_state_bytes_at_the_canary(tmp_path):
    """The figure a user reads before extraction starts: progress.json's forecast and `eyrie run`'s
    summary (builtin:tiny-llama: hidden 64, 4 layers: 4 x 64 x 2 = 512 bytes per token)."""
    _out, run = _sim_run(tmp_path, 60, 20, **{"extraction.enabled": True, "extraction.model": "builtin:tiny-llama",
                                              "extraction.engine": "transformers",
                                              "target.tokenizer": "bundled:deepseek-v4",
                                              "target.chatFormat": "deepseek-v4"})
    r, prog = run()
    assert r.returncode == 0, r.stderr[-2000:]
    fc = prog["forecast"]
    tokens = prog["tokens"]["input"] + prog["tokens"]["output"]
    assert fc["tokens"] == tokens and fc["hiddenStateBytes"] == tokens * 512  # nothing left: what was bought
    assert fc["atCanary"]["hiddenStateBytes"] > 0
    said = r.stdout + r.stderr
    assert "hidden states (projected)" in said and "eyrie export specforge-online" in said


def test_warn_never_stops_and_a_budget_over_the_forecast_goes_on():
    for suspend, budget in ((False, "5"), (True, "10")):
        f = Forecaster(canary=1, suspend=suspend)
        f.add(Decimal("0.1"))
        assert f.judge(Decimal("0.1"), 99, Decimal(budget)) is None and f.judged


# ---------------------------------------------------------------- a run against the simulator


def _sim_run(tmp_path, n: int, canary: int, **extra):
    prompts = write_prompts(tmp_path / "p.jsonl", n, tools_every=0)
    out = f"file://{tmp_path}/out"

    def run(**more):
        spec = make_spec(tmp_path, prompts, out, extra={"tools.gate.canarySamples": canary, **extra, **more})
        r = run_cli(spec, "--inline", "--verbose")  # every table: the run table's forecast row
        return r, progress(out)

    return out, run


@pytest.mark.integration
def test_the_canary_forecast_lands_within_10_percent_of_the_final_spend(tmp_path):
    """The simulator's answer lengths are drawn from one distribution: what the first 100 of 400
    answers cost, times the prompts left, is what the run ends up spending."""
    _out, run = _sim_run(tmp_path, 400, 100)
    r, prog = run()
    assert r.returncode == 0, r.stderr[-2000:]
    final = Decimal(prog["spentUSD"])
    at = prog["forecast"]["atCanary"]
    assert at["answers"] >= 100  # judged once a report brings the 100th answer (reports come in batches)
    assert abs(Decimal(at["meanUSD"]) - final) <= final * Decimal("0.10"), (at, final)
    assert Decimal(at["p90USD"]) >= final  # the pessimistic figure is an upper bound here
    assert abs(Decimal(prog["forecastUSD"]) - final) <= Decimal("0.000001")  # nothing left: the spend
    assert f"${prog['forecastUSD']} (p90 ${prog['forecast']['p90USD']}); at the canary" in r.stderr


@pytest.mark.integration
def test_suspend_stops_at_the_canary_and_warn_or_a_raised_budget_goes_on(tmp_path):
    out, run = _sim_run(tmp_path, 200, 20, **{"budget.onForecastOver": "suspend", "api.maxConcurrency": 4})
    r, prog = run(**{"budget.maxUSD": "0.05"})
    assert r.returncode == 8, r.stderr[-2000:]
    assert prog["outcome"] == "ForecastOverBudget"
    assert Decimal(prog["forecast"]["atCanary"]["meanUSD"]) > Decimal("0.05")
    assert "raise spec.budget.maxUSD or set spec.budget.onForecastOver: warn" in prog["message"]
    paid = len(persisted(out))
    assert 20 <= paid <= 20 + 4  # the canary and what was in flight, nothing past it
    spent = Decimal(prog["spentUSD"])

    # the same budget again: judged from the answers already paid, before spending anything
    r, prog = run(**{"budget.maxUSD": "0.05"})
    assert r.returncode == 8 and len(persisted(out)) == paid and Decimal(prog["spentUSD"]) == spent

    # warn: the same budget, and the run goes on (to the hard cap, which still holds)
    r, prog = run(**{"budget.maxUSD": "0.05", "budget.onForecastOver": "warn"})
    assert r.returncode == 3 and prog["outcome"] == "BudgetExhausted", r.stderr[-2000:]
    assert len(persisted(out)) > paid and Decimal(prog["spentUSD"]) <= Decimal("0.05")

    # a budget over the forecast: the run goes on to the end
    r, prog = run(**{"budget.maxUSD": "1.00"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert prog["outcome"] == "Done" and len(persisted(out)) == 200
