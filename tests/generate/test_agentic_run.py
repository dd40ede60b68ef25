"""Agentic conversations end to end (generation.turns: all): the simulator over real HTTP, real
local Ray (the default path; the divergence policies run inline); turns regenerated in order with
the dataset's tool results spliced under the model's ids; divergence under both policies; kill -9
of the whole process tree and budget exhaustion mid-conversation, then resume."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess, planned_calls
from eyrie.jobs.simulator.text import TextBehaviour

sys.path.insert(0, str(Path(__file__).parents[1]))
from fault_helpers import kill_tree, run_to_end, start_run, wait_persisted

from tests.generate.test_generate import make_spec, persisted, progress, run_cli

ROOT = Path(__file__).resolve().parents[2]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Rome", "Lima"]},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"], "additionalProperties": False}}}]
PLAN = SimulatorConfig(tool_call_rate=1.0)  # every user turn calls: three calls per conversation


def conversation(i: int) -> dict:
    """System, then three user turns, each answered by a call (as the simulator plans it), its result
    and the dataset's own final answer: six assistant turns, three tool calls."""
    messages = [{"role": "system", "content": "You report the weather."}]
    for q in range(3):
        messages.append({"role": "user", "content": f"Conversation {i}, question {q}: what is the weather?"})
        calls = planned_calls(messages, TOOLS, PLAN)
        assert calls
        ids = [f"ds_{i}_{q}_{j}" for j in range(len(calls))]
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": n, "arguments": a}}
            for cid, (n, a) in zip(ids, calls, strict=True)]})
        messages += [{"role": "tool", "tool_call_id": cid, "content": f"result {i}.{q}.{j}"}
                     for j, cid in enumerate(ids)]
        messages.append({"role": "assistant", "content": f"The dataset's answer {i}.{q}."})
    return {"messages": messages, "tools": TOOLS}


def write(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps(conversation(i)) + "\n" for i in range(n)))
    return path


def agentic_spec(tmp_path: Path, prompts: Path, out: str, base_url: str, **kw) -> Path:
    extra = {"generation.turns": "all", **kw.pop("extra", {})}
    return make_spec(tmp_path, prompts, out, base_url=base_url, extra=extra, **kw)


def as_history(response: dict) -> dict:
    """An earlier answer as the next request must carry it: content, the model's calls, its reasoning."""
    msg = {"role": "assistant", "content": response["content"]}
    if response["tool_calls"]:
        msg["tool_calls"] = response["tool_calls"]
    elif msg["content"] is None:
        msg["content"] = ""
    if response.get("reasoning"):
        msg["reasoning"] = response["reasoning"]
    if response.get("reasoning_details"):
        msg["reasoning_details"] = response["reasoning_details"]
    return msg


def by_conversation(recs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in sorted(recs, key=lambda r: r["turn"]):
        out.setdefault(r["sample_id"], []).append(r)
    return out


@pytest.mark.integration
def test_three_tool_calls_regenerated_turn_by_turn_with_spliced_results_under_the_models_ids(tmp_path):
    prompts = write(tmp_path / "c.jsonl", 4)
    dataset = [json.loads(line) for line in prompts.read_text().splitlines()]
    out = f"file://{tmp_path}/out"
    with SimulatorProcess(SimulatorConfig(tool_call_rate=1.0, latency_ms=10)) as sim:
        r = run_cli(agentic_spec(tmp_path, prompts, out, sim.base_url, workers=2))  # real (local) Ray
        stats = sim.stats()
    assert r.returncode == 0, r.stderr
    convs = by_conversation(persisted(out))
    assert len(convs) == 4 and stats["completed"] == 24
    for recs in convs.values():
        assert [x["turn"] for x in recs] == [0, 1, 2, 3, 4, 5] and all(x["status"] == "ok" for x in recs)
        ds = dataset[recs[0]["row"]]["messages"]
        for k, rec in enumerate(recs):
            sent = rec["request"]["messages"]
            assert rec["agentic"]["diverged"] is None and rec["agentic"]["divergedFrom"] is None
            assert rec["agentic"]["spliced"] == (1 if k % 2 else 0) * len(recs[k - 1]["response"]["tool_calls"] or [])
            # every earlier assistant turn is the model's own answer, never the dataset's
            assert [m for m in sent if m["role"] == "assistant"] == [as_history(p["response"]) for p in recs[:k]]
            if k % 2:  # after a call: the dataset's results, answering the model's call ids
                model_ids = [c["id"] for c in recs[k - 1]["response"]["tool_calls"]]
                results = sent[-len(model_ids):]
                assert [m["tool_call_id"] for m in results] == model_ids
                row = recs[0]["row"]
                ds_results = [m["content"] for m in ds
                              if m["role"] == "tool" and m["content"].startswith(f"result {row}.{k // 2}.")]
                assert [m["content"] for m in results] == ds_results
                assert all(not m["tool_call_id"].startswith("ds_") for m in sent if m["role"] == "tool")
        assert recs[-1]["agentic"]["end"] == "done"
    prog = progress(out)
    assert prog["outcome"] == "Done"
    assert prog["agentic"]["conversations"] == 4 and prog["agentic"]["turnsRegenerated"] == 24
    assert prog["agentic"]["splicedToolResults"] == sum(
        x["agentic"]["spliced"] for recs in convs.values() for x in recs) >= 12
    assert prog["samples"] == {"total": 4, "done": 4, "rejected": 0, "discarded": 0, "failed": 0}  # conversations


@pytest.mark.integration
def test_divergence_stop_ends_the_conversation_and_keep_original_flags_the_rest(tmp_path):
    prompts = write(tmp_path / "c.jsonl", 3)
    dataset = [json.loads(line) for line in prompts.read_text().splitlines()]
    with SimulatorProcess(SimulatorConfig(tool_call_rate=1.0, divergence_rate=1.0)) as sim:
        stop = f"file://{tmp_path}/stop"
        r = run_cli(agentic_spec(tmp_path, prompts, stop, sim.base_url), env={"EYRIE_NO_RAY": "1"})
        assert r.returncode == 0, r.stderr
        keep = f"file://{tmp_path}/keep"
        r = run_cli(agentic_spec(tmp_path, prompts, keep, sim.base_url, extra={"generation.onDivergence":
                                                                               "keepOriginal"}),
                    env={"EYRIE_NO_RAY": "1"})
        assert r.returncode == 0, r.stderr
    stopped = persisted(stop)
    assert len(stopped) == 3 and all(x["turn"] == 0 for x in stopped)
    assert all(x["agentic"]["end"] == "diverged" and x["agentic"]["dropped"] == 5 for x in stopped)
    kinds = Counter(x["agentic"]["diverged"] for x in stopped)
    assert sum(kinds.values()) == 3 and set(kinds) <= {"otherArguments", "missingCall"}
    prog = progress(stop)
    assert prog["outcome"] == "Done" and prog["agentic"]["ended"] == {"diverged": 3}
    assert prog["agentic"]["droppedTurns"] == 15 and sum(prog["agentic"]["diverged"].values()) == 3

    convs = by_conversation(persisted(keep))
    assert len(convs) == 3
    for recs in convs.values():
        assert [x["turn"] for x in recs] == [0, 1, 2, 3, 4, 5]
        assert recs[0]["agentic"]["diverged"] and all(x["agentic"]["divergedFrom"] == 0 for x in recs)
        ds = dataset[recs[0]["row"]]["messages"]
        # the dataset's turn and results stand in the history, with the dataset's own ids
        n = len(ds[2]["tool_calls"])
        assert recs[1]["request"]["messages"][2:3 + n] == [{k: v for k, v in m.items() if v is not None}
                                                           for m in ds[2:3 + n]]
    assert progress(keep)["agentic"]["ended"] == {"done": 3}


def test_kill_minus_9_mid_conversation_then_rerun_pays_no_earlier_turn(tmp_path, ray_tmp):
    """`eyrie run` on local Ray (the default path), its whole process tree SIGKILLed while
    conversations are half done, then run again: no persisted turn is asked again, and only the
    turns in flight at the kill (one per conversation holding a slot) are paid twice."""
    prompts = write(tmp_path / "c.jsonl", 8)
    out = f"file://{tmp_path}/out"
    seen: set[int] = set()
    with SimulatorProcess(SimulatorConfig(tool_call_rate=1.0, latency_ms=250)) as sim:
        spec = agentic_spec(tmp_path, prompts, out, sim.base_url, concurrency=4)
        proc = start_run(spec, ray_tmp)
        try:
            # ten turns of at most four conversations under way: one of them is half done
            wait_persisted(out, 10, proc, seen)
        finally:
            kill_tree(proc, seen)
        before = by_conversation(persisted(out))
        assert any(0 < len(recs) < 6 for recs in before.values())  # killed mid-conversation
        rc, stderr = run_to_end(spec, ray_tmp)
        assert rc == 0, stderr[-3000:]
        stats = sim.stats()
    recs = persisted(out)
    keys = Counter((x["sample_id"], x["turn"]) for x in recs)
    assert len(keys) == 48 and max(keys.values()) == 1
    for sid, earlier in before.items():  # turns persisted before the kill were kept, not asked again
        assert [x["createdAt"] for x in earlier] == [x["createdAt"] for x in by_conversation(recs)[sid][:len(earlier)]]
    # paid twice: at most the turns in flight when killed (one per conversation holding a slot)
    assert 48 <= stats["completed"] <= 48 + 4
    assert progress(out)["agentic"]["turnsRegenerated"] == 48


def test_budget_exhaustion_mid_conversation_then_resume(tmp_path, ray_tmp):
    """On local Ray: the budget runs out with conversations half done (exit 3, spend within the cap
    and equal to the bill); a resume with more budget finishes every conversation from its first
    missing turn, paying for no turn twice."""
    prompts = write(tmp_path / "c.jsonl", 6)
    out = f"file://{tmp_path}/out"
    with SimulatorProcess(SimulatorConfig(tool_call_rate=1.0, latency_ms=5)) as sim:
        rc, stderr = run_to_end(agentic_spec(tmp_path, prompts, out, sim.base_url, max_usd="0.004", concurrency=3),
                                ray_tmp)
        assert rc == 3, stderr[-3000:]
        first = progress(out)
        assert first["outcome"] == "BudgetExhausted" and Decimal(first["spentUSD"]) <= Decimal("0.004")
        partial = by_conversation(persisted(out))
        assert any(0 < len(recs) < 6 for recs in partial.values())
        n1 = sum(len(v) for v in partial.values())
        assert Decimal(sim.stats()["billedUSD"]) == Decimal(first["spentUSD"])
        rc, stderr = run_to_end(agentic_spec(tmp_path, prompts, out, sim.base_url, max_usd="1.00"), ray_tmp)
        assert rc == 0, stderr[-3000:]
        stats = sim.stats()
    recs = persisted(out)
    assert len({(x["sample_id"], x["turn"]) for x in recs}) == len(recs) == 36 > n1
    assert stats["completed"] == 36  # no turn paid twice
    final = progress(out)
    assert final["outcome"] == "Done" and Decimal(final["spentUSD"]) == Decimal(stats["billedUSD"])
    assert final["agentic"]["turnsRegenerated"] == 36


@pytest.mark.integration
def test_a_turn_that_failed_on_transient_errors_is_asked_again_on_resume(tmp_path):
    """maxRetries 0 against 503s: a conversation whose turn failed on a transient error ends there,
    recorded failed (`error.transient`); the resume (the provider answers now) goes on from that
    turn, keeps every turn persisted before it, and pays for no answered turn twice."""
    prompts = write(tmp_path / "c.jsonl", 4)
    out = f"file://{tmp_path}/out"
    faulty = SimulatorConfig(tool_call_rate=1.0, fault_rate=0.3, faults=["503"])  # seed 0: the dataset's answers
    with SimulatorProcess(faulty) as sim:
        rc, stderr = run_to_end(agentic_spec(tmp_path, prompts, out, sim.base_url, extra={"api.maxRetries": 0}), None)
        first = sim.stats()
    assert rc == 0, stderr[-3000:]
    before = by_conversation(persisted(out))
    failed = [r for recs in before.values() for r in recs if r["status"] == "failed"]
    assert failed and len(failed) == first["faults"]["503"]
    assert all(r["error"]["transient"] and r["agentic"]["end"] == "failed" for r in failed)
    assert progress(out)["resendOnResume"] == len(failed)
    with SimulatorProcess(SimulatorConfig(tool_call_rate=1.0)) as sim:
        spec = agentic_spec(tmp_path, prompts, out, sim.base_url, extra={"api.maxRetries": 0})
        rc, stderr = run_to_end(spec, None)
        second = sim.stats()
    assert rc == 0, stderr[-3000:]
    convs = by_conversation(persisted(out))
    assert len(convs) == 4
    for sid, recs in convs.items():
        assert [x["turn"] for x in recs] == [0, 1, 2, 3, 4, 5] and all(x["status"] == "ok" for x in recs)
        kept = [x for x in before[sid] if x["status"] == "ok"]
        assert [x["createdAt"] for x in kept] == [x["createdAt"] for x in recs[:len(kept)]]
    assert first["completed"] + second["completed"] == 24  # each answered turn bought once
    final = progress(out)
    assert final["resendOnResume"] == 0 and final["samples"]["done"] == 4 and final["samples"]["failed"] == 0


def test_the_agentic_example_is_current():
    spec = importlib.util.spec_from_file_location("agentic_example", ROOT / "hack" / "agentic_example.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (ROOT / "examples" / "prompts" / "agentic.jsonl").read_text() == mod.render(), \
        "run: python hack/agentic_example.py"


@pytest.mark.integration
def test_text_mode_conversations_read_the_calls_written_as_text_and_splice_results_as_text(tmp_path):
    """tools.mode: text: the functions are described in the system prompt, the simulated model writes
    its calls into the content (Hermes, Kimi, JSON: formats that keep parallel calls); they are
    judged against the dataset's as structured calls are, and the dataset's results follow as a user
    turn of <tool_response> blocks. No request carries a structured call or a tool message."""
    prompts = write(tmp_path / "c.jsonl", 4)
    out = f"file://{tmp_path}/out"
    text = TextBehaviour(1.0, {"hermes": 1.0, "kimi": 1.0, "json": 1.0}, 0.0, 0.0)
    with SimulatorProcess(SimulatorConfig(tool_call_rate=1.0, latency_ms=10, text_calls=text)) as sim:
        r = run_cli(agentic_spec(tmp_path, prompts, out, sim.base_url, workers=2, extra={"tools.mode": "text"}))
    assert r.returncode == 0, r.stderr
    convs = by_conversation(persisted(out))
    assert len(convs) == 4
    formats = Counter()
    for recs in convs.values():
        assert [x["turn"] for x in recs] == [0, 1, 2, 3, 4, 5] and recs[-1]["agentic"]["end"] == "done"
        for k, rec in enumerate(recs):
            sent = rec["request"]["messages"]
            assert "tools" not in rec["request"] and rec["agentic"]["diverged"] is None
            assert not any(m.get("tool_calls") or m["role"] == "tool" for m in sent)
            # the model's earlier answers as it wrote them
            assert [m["content"] for m in sent if m["role"] == "assistant"] == \
                [p["response"]["content"] for p in recs[:k]]
            if k % 2:  # after its calls: the dataset's results for them, one user turn
                calls = recs[k - 1]["checks"]["calls"]
                formats.update(c["format"] for c in calls)
                assert calls and all(c["valid"] for c in calls)
                row, q = recs[0]["row"], k // 2
                assert sent[-1] == {"role": "user", "content": "\n".join(
                    f"<tool_response>\nresult {row}.{q}.{j}\n</tool_response>" for j in range(len(calls)))}
                assert rec["agentic"]["spliced"] == len(calls)
    assert set(formats) <= {"hermes", "kimi", "json"} and len(formats) >= 2
    prog = progress(out)
    assert prog["outcome"] == "Done" and prog["agentic"]["splicedToolResults"] >= 12
    assert prog["agentic"]["ended"] == {"done": 4}
