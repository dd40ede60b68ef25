"""Agentic turn splicing (pure): request k's messages, call matching as a multiset, divergence kinds,
both divergence policies, maxTurns, resume from persisted answers."""

from __future__ import annotations

import json

import pytest

from eyrie.jobs.generate.sending.conversation import (
    AgenticSummary,
    Divergence,
    End,
    Finished,
    NextTurn,
    annotate,
    judge,
    next_turn,
    tool_result_too_large,
    turn_positions,
)


def call(cid: str, name: str, args: dict | str) -> dict:
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}


def answer(*calls: dict, content: str | None = None, reasoning: str | None = None) -> dict:
    return {"content": content, "tool_calls": list(calls), "reasoning": reasoning, "finish_reason": "stop"}


SYSTEM = {"role": "system", "content": "You book trips."}
CONV = [
    SYSTEM,
    {"role": "user", "content": "Weather in Oslo and Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [
        call("d1", "weather", {"city": "Oslo"}), call("d2", "weather", {"city": "Rome"})]},
    {"role": "tool", "tool_call_id": "d1", "content": "rain"},
    {"role": "tool", "tool_call_id": "d2", "content": "sun"},
    {"role": "assistant", "content": "Oslo rain, Rome sun."},
    {"role": "user", "content": "Book Rome."},
    {"role": "assistant", "content": None, "tool_calls": [call("d3", "book", {"city": "Rome", "n": 1})]},
    {"role": "tool", "tool_call_id": "d3", "content": "booked #7"},
    {"role": "assistant", "content": "Done: #7."},
]


def test_turns_are_the_assistant_messages_plus_a_trailing_question():
    assert turn_positions(CONV) == [2, 5, 7, 9]
    assert turn_positions(CONV[:-1]) == [2, 5, 7, 9]  # ends in a tool result: answer it
    assert turn_positions(CONV[:7]) == [2, 5, 7]


def test_matching_calls_splice_results_with_the_models_ids_turn_by_turn():
    first = next_turn(CONV, [], "stop", 32)
    assert first == NextTurn(0, CONV[:2], 0, None)
    # parallel calls in another order, arguments with other key order and 1.0 for 1: a match
    a0 = {**answer(call("m-b", "weather", '{"city":"Rome"}'), call("m-a", "weather", {"city": "Oslo"}),
                   reasoning="two cities"), "reasoning_details": [{"type": "reasoning.text", "text": "two cities"}]}
    t1 = next_turn(CONV, [a0], "stop", 32)
    assert isinstance(t1, NextTurn) and t1.turn == 1 and t1.spliced == 2 and t1.diverged_from is None
    assert t1.messages[2] == {"role": "assistant", "content": None, "reasoning": "two cities",
                              "reasoning_details": a0["reasoning_details"], "tool_calls": a0["tool_calls"]}
    assert [(m["tool_call_id"], m["content"]) for m in t1.messages[3:]] == [("m-a", "rain"), ("m-b", "sun")]
    a1 = answer(content="Rainy Oslo, sunny Rome.")
    a2 = answer(call("functions.book:2", "book", '{"n": 1.0, "city": "Rome"}'))
    t3 = next_turn(CONV, [a0, a1, a2], "stop", 32)
    assert isinstance(t3, NextTurn) and t3.turn == 3 and t3.spliced == 1
    assert t3.messages[5] == {"role": "assistant", "content": "Rainy Oslo, sunny Rome."}  # never the dataset's
    assert t3.messages[6] == CONV[6]
    assert t3.messages[-1] == {"role": "tool", "tool_call_id": "functions.book:2", "content": "booked #7"}
    assert next_turn(CONV, [a0, a1, a2, answer(content="ok")], "stop", 32) == Finished(End.DONE, 0)


@pytest.mark.parametrize(("calls", "kind"), [
    ([call("x", "weather", {"city": "Oslo"})], Divergence.MISSING_CALL),
    ([], Divergence.MISSING_CALL),
    ([call("x", "weather", {"city": "Oslo"}), call("y", "weather", {"city": "Paris"})], Divergence.OTHER_ARGUMENTS),
    ([call("x", "weather", {"city": "Oslo"}), call("y", "book", {"city": "Rome"})], Divergence.OTHER_TOOL),
    ([call("x", "weather", {"city": "Oslo"}), call("y", "weather", {"city": "Rome"}),
      call("z", "weather", {"city": "Rome"})], Divergence.EXTRA_CALL),
    ([call("x", "weather", '{"city": "Oslo"'), call("y", "weather", {"city": "Rome"})], Divergence.OTHER_ARGUMENTS),
])
def test_divergence_kinds(calls, kind):
    assert judge(CONV[2], answer(*calls), 0).divergence is kind


def test_extra_call_and_true_is_not_one():
    assert judge(CONV[5], answer(call("x", "weather", {"city": "Oslo"})), 1).divergence is Divergence.EXTRA_CALL
    flag = {"role": "assistant", "tool_calls": [call("d", "f", {"v": True})]}
    assert judge(flag, answer(call("m", "f", {"v": 1})), 0).divergence is Divergence.OTHER_ARGUMENTS
    assert judge(None, answer(call("m", "f", {})), 0).divergence is None  # nothing to diverge from


def test_stop_ends_at_the_diverged_turn_and_counts_what_is_dropped():
    bad = answer(call("m", "weather", {"city": "Paris"}))
    assert next_turn(CONV, [bad], "stop", 32) == Finished(End.DIVERGED, 3)


def test_keep_original_keeps_the_datasets_turn_and_marks_later_turns():
    bad = answer(content="I won't look it up.")
    t1 = next_turn(CONV, [bad], "keepOriginal", 32)
    assert isinstance(t1, NextTurn) and t1.diverged_from == 0 and t1.spliced == 2
    assert t1.messages == CONV[:5]  # the dataset's calls and results, with the dataset's ids
    a1 = answer(content="fine")
    t2 = next_turn(CONV, [bad, a1], "keepOriginal", 32)
    assert isinstance(t2, NextTurn) and t2.diverged_from == 0 and t2.messages[5] == {"role": "assistant",
                                                                                     "content": "fine"}


def test_max_turns_failed_turns_and_oversized_results():
    a0 = answer(call("a", "weather", {"city": "Oslo"}), call("b", "weather", {"city": "Rome"}))
    assert next_turn(CONV, [a0], "stop", 1) == Finished(End.MAX_TURNS, 3)
    assert next_turn(CONV, [a0, None], "stop", 32) == Finished(End.FAILED, 2)
    assert tool_result_too_large(CONV, 4) == "message 8: the tool result is 9 characters, over the 4 limit"
    assert tool_result_too_large(CONV, 9) is None


def test_annotations_and_the_summary_count_turns_divergence_and_ends():
    a0 = answer(call("a", "weather", {"city": "Oslo"}), call("b", "weather", {"city": "Rome"}))
    a1 = answer(content="ok")
    a2 = answer(call("c", "book", {"city": "Oslo", "n": 1}))  # other arguments
    recs = []
    for k, a in enumerate([a0, a1, a2]):
        nt = next_turn(CONV, [a0, a1, a2][:k], "stop", 32)
        assert isinstance(nt, NextTurn)
        recs.append({"sample_id": "c", "turn": k, "status": "ok",
                     "agentic": annotate(CONV, [a0, a1, a2][:k], nt, a, "stop", 32)})
    assert [r["agentic"]["diverged"] for r in recs] == [None, None, "otherArguments"]
    assert recs[2]["agentic"] == {"turns": 4, "spliced": 0, "diverged": "otherArguments", "divergedFrom": None,
                                  "end": "diverged", "dropped": 1}
    nt = next_turn(CONV, [a0, a1, a2], "keepOriginal", 32)
    assert isinstance(nt, NextTurn) and nt.diverged_from == 2
    keep = annotate(CONV, [a0, a1], next_turn(CONV, [a0, a1], "keepOriginal", 32), a2, "keepOriginal", 32)
    assert keep["divergedFrom"] == 2 and keep["end"] is None
    failed = {"sample_id": "d", "turn": 0, "status": "failed",
              "agentic": annotate(CONV, [], next_turn(CONV, [], "stop", 32), None, "stop", 32)}
    assert failed["agentic"]["end"] == "failed" and failed["agentic"]["dropped"] == 3
    summary = AgenticSummary()
    for r in [*recs, failed, {"sample_id": "plain", "status": "ok"}, {"sample_id": "bad", "status": "rejected"}]:
        summary.add(r)
    assert summary.samples(5).dump() == {"total": 5, "done": 1, "rejected": 1, "discarded": 0, "failed": 1}
    assert summary.figures().dump() == {
        "conversations": 2, "turnsRegenerated": 3, "turnsFailed": 1, "splicedToolResults": 2,
        "diverged": {"otherTool": 0, "otherArguments": 1, "missingCall": 0, "extraCall": 0},
        "ended": {"diverged": 1, "failed": 1}, "droppedTurns": 4}


# ------------------------------------------------------------------------- tools.mode: text

NAMES = ["weather", "book"]


def written(content: str, reasoning: str | None = None) -> dict:
    """An answer of a text-mode request: no structured calls, whatever the model wrote."""
    return {"content": content, "tool_calls": None, "reasoning": reasoning, "finish_reason": "stop"}


def test_text_mode_reads_the_calls_in_the_content_and_splices_results_as_text():
    """The model writes its two parallel calls as Hermes blocks (other order, 1.0 for 1 elsewhere): a
    match; the next request carries its answer as written and the dataset's two results as one user
    turn of <tool_response> blocks, and no structured call or tool message anywhere."""
    a0 = written('<tool_call>\n{"name": "weather", "arguments": {"city": "Rome"}}\n</tool_call>\n'
                 '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>', reasoning="two")
    t1 = next_turn(CONV, [a0], "stop", 32, NAMES)
    assert isinstance(t1, NextTurn) and (t1.turn, t1.spliced, t1.diverged_from) == (1, 2, None)
    assert t1.messages[:2] == CONV[:2]
    assert t1.messages[2] == {"role": "assistant", "content": a0["content"], "reasoning": "two"}
    assert t1.messages[3:] == [{"role": "user", "content": "<tool_response>\nrain\n</tool_response>\n"
                                                            "<tool_response>\nsun\n</tool_response>"}]
    a1 = written("Rainy Oslo, sunny Rome.")
    a2 = written("<functioncall> {\"name\": \"book\", \"arguments\": '{\"n\": 1.0, \"city\": \"Rome\"}'}")  # glaive's
    t3 = next_turn(CONV, [a0, a1, a2], "stop", 32, NAMES)
    assert isinstance(t3, NextTurn) and t3.turn == 3 and t3.spliced == 1
    assert t3.messages[-2:] == [{"role": "assistant", "content": a2["content"]},
                                {"role": "user", "content": "<tool_response>\nbooked #7\n</tool_response>"}]
    assert not any(m.get("tool_calls") or m.get("role") == "tool" for m in t3.messages)
    assert next_turn(CONV, [a0, a1, a2, written("ok")], "stop", 32, NAMES) == Finished(End.DONE, 0)
    # the record's annotation judges the same way: turn 0 matched, its two results spliced into turn 1
    info = annotate(CONV, [a0], t1, a1, "stop", 32, NAMES)
    assert (info["spliced"], info["diverged"], info["end"]) == (2, None, None)
    # structured mode does not read the content: the same answer is a missing call
    assert judge(CONV[2], a0, 0).divergence == Divergence.MISSING_CALL
    assert next_turn(CONV, [a0], "stop", 32) == Finished(End.DIVERGED, 3)


def test_text_mode_divergence_and_keep_original_write_the_datasets_calls_as_text():
    other = written('<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>'
                    '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>')
    assert judge(CONV[2], other, 0, NAMES).divergence == Divergence.OTHER_ARGUMENTS
    assert judge(CONV[2], written("No call, just prose about weather."), 0, NAMES).divergence == \
        Divergence.MISSING_CALL
    broken = written('<tool_call>{"name": "weather", "arguments": {"city": "Oslo"</tool_call>'
                     '<tool_call>{"name": "weather", "arguments": {"city": "Rome"}}</tool_call>')
    assert judge(CONV[2], broken, 0, NAMES).divergence == Divergence.OTHER_ARGUMENTS  # unreadable matches nothing
    assert next_turn(CONV, [other], "stop", 32, NAMES) == Finished(End.DIVERGED, 3)
    t1 = next_turn(CONV, [other], "keepOriginal", 32, NAMES)
    assert isinstance(t1, NextTurn) and t1.diverged_from == 0
    kept = t1.messages[2]
    assert kept["role"] == "assistant" and "tool_calls" not in kept
    assert kept["content"] == ('<tool_call>\n{"name":"weather","arguments":{"city":"Oslo"}}\n</tool_call>\n'
                               '<tool_call>\n{"name":"weather","arguments":{"city":"Rome"}}\n</tool_call>')
    assert t1.messages[3]["role"] == "user" and t1.messages[3]["content"].count("<tool_response>") == 2
