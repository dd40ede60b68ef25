"""Prompt sources: formats, containers (JSONL, gzip, Parquet), file:// and s3://, limits, bad rows."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eyrie.jobs.contract import layout
from eyrie.jobs.sources import BadRow, Prompt, SourceError, check_source, iter_source
from eyrie.jobs.spec import SourceSpec
from eyrie.jobs.store import open_store

CORPUS = Path(__file__).parents[1] / "data" / "tools"
FORMATS = {"glaive": "glaive", "hermes": "sharegpt", "xlam": "openai"}


def src(uri: str | Path, fmt: str = "openai", limit: int | None = None, name: str = "s") -> SourceSpec:
    return SourceSpec(name=name, uri=str(uri), format=fmt, limit=limit)


def jsonl(path: Path, rows: list) -> Path:
    path.write_bytes(b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows))
    return path


def summary(items: list[Prompt | BadRow]) -> list[tuple]:
    """(row, roles or reason) per item: enough to compare readers exactly."""
    return [(i.row, [m["role"] for m in i.messages], bool(i.tools)) if isinstance(i, Prompt)
            else (i.row, i.reason) for i in items]


def test_the_packages_public_face():
    """Callers import from `eyrie.jobs.sources`; its rooms (reading, formats, calls, errors) are behind it."""
    from eyrie.jobs import sources

    assert sorted(sources.__all__) == [
        "BadRow", "MARK_ROWS", "Mark", "Prompt", "SourceError", "SourceIndex", "check_source", "decode_line",
        "glaive_first_user", "iter_source", "original_answer", "outside_calls", "prompt_from_row", "scan_source",
        "whole_conversation"]
    assert all(hasattr(sources, name) for name in sources.__all__)


def test_openai_prompt_ends_at_the_last_user_turn(tmp_path):
    row = {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "name": None},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function",
                                                                "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "1", "content": "{}"},
        {"role": "assistant", "content": "Sunny."}],
        "tools": json.dumps([{"type": "function", "function": {"name": "w"}}])}
    [p] = list(iter_source(src(jsonl(tmp_path / "a.jsonl", [row]))))
    assert p == Prompt("s", 0, [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Weather in Oslo?"}],
        [{"type": "function", "function": {"name": "w"}}], "openai")
    assert p.sample_id() == layout.sample_id(p.source, p.row, {"messages": p.messages, "tools": p.tools})


def test_sharegpt_roles_system_and_tools_fields(tmp_path):
    row = {"system": "You are terse.", "tools": [{"name": "f"}], "conversations": [
        {"from": "human", "value": "a"}, {"from": "function_call", "value": "{\"name\": \"f\"}"},
        {"from": "observation", "value": "42"}, {"from": "gpt", "value": "It is 42."},
        {"from": "user", "value": "thanks"}, {"from": "assistant", "value": "bye"}]}
    [p] = list(iter_source(src(jsonl(tmp_path / "s.jsonl", [row]), "sharegpt")))
    assert p.messages == [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "a"},
                          {"role": "assistant", "content": "{\"name\": \"f\"}"}, {"role": "tool", "content": "42"},
                          {"role": "assistant", "content": "It is 42."}, {"role": "user", "content": "thanks"}]
    assert p.tools == [{"name": "f"}] and p.fmt == "sharegpt"


def test_glaive_system_text_intact_and_first_user_turn():
    items = list(iter_source(src(CORPUS / "glaive.jsonl", "glaive")))
    first = items[0]
    assert isinstance(first, Prompt)
    raw = json.loads((CORPUS / "glaive.jsonl").read_text().splitlines()[0])
    assert first.messages == [
        {"role": "system", "content": raw["system"].removeprefix("SYSTEM: ").strip()},
        {"role": "user", "content": "Can you tell me the latest news headlines for the United States?"}]
    assert first.tools is None
    assert items[2].messages[0] == {"role": "system",
                                    "content": "You are a helpful assistant, with no access to external functions."}
    assert items[10] == BadRow("s", 10, "no USER turn in 'chat'")
    assert items[11].messages[1] == {"role": "user", "content": "Give me a quote please"}


def test_corpus_rows_exactly():
    got = {name: summary(list(iter_source(src(CORPUS / f"{name}.jsonl", fmt)))) for name, fmt in FORMATS.items()}
    assert got["glaive"] == [(i, ["system", "user"], False) for i in range(10)] + [
        (10, "no USER turn in 'chat'"), (11, ["system", "user"], False)]
    assert got["hermes"] == [(0, ["system", "user"], False),
                             (1, ["system", "user", "assistant", "tool", "assistant", "user"], False),
                             (2, ["user"], False), (3, ["system", "user"], False)]
    assert got["xlam"] == [(0, ["user"], True), (1, ["system", "user", "assistant", "user"], True),
                           (2, ["user"], True), (3, ["user"], True), (4, ["user"], True), (5, ["user"], False)]


def test_bad_rows_carry_row_numbers_and_never_stop_the_source(tmp_path):
    good = {"messages": [{"role": "user", "content": "ok"}]}
    path = jsonl(tmp_path / "bad.jsonl", [
        good,                                                   # 0
        b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',  # 1 invalid UTF-8
        [good],                                                 # 2 an array, not an object
        {"prompt": "hi"},                                       # 3 missing field
        b'{"messages": [',                                      # 4 invalid JSON
        b"",                                                    # 5 blank: no row, keeps its number
        {"messages": [{"role": "system", "content": "x"}]},     # 6 no user turn
        {"messages": [{"role": "wizard", "content": "x"}]},     # 7 unknown role
        {"messages": "hello"},                                  # 8 a string that is not JSON
        {"messages": [{"role": "user", "content": "x"}], "tools": {"name": "f"}},  # 9 tools not a list
        good,                                                   # 10
    ])
    items = list(iter_source(src(path)))
    assert summary(items) == [
        (0, ["user"], False),
        (1, "invalid UTF-8 at byte 43"),
        (2, "row is a JSON array, not an object"),
        (3, "missing field 'messages'"),
        (4, "invalid JSON: unexpected end of data: line 1 column 15 (char 14)"),
        (6, "no user turn"),
        (7, "message 0 has unknown role 'wizard'"),
        (8, "'messages' is a string but not JSON: unexpected character, expected a JSON value: line 1 column 1 "
            "(char 0)"),
        (9, "'tools' must be a list of objects"),
        (10, ["user"], False),
    ]
    # limit counts rows taken, bad ones included
    assert [i.row for i in iter_source(src(path, limit=3))] == [0, 1, 2]
    assert [i.row for i in iter_source(src(path, limit=6))] == [0, 1, 2, 3, 4, 6]


def test_sharegpt_and_glaive_bad_rows(tmp_path):
    sg = jsonl(tmp_path / "sg.jsonl", [{"conversations": [{"from": "alien", "value": "x"}]},
                                       {"conversations": [{"from": "human", "value": 3}]},
                                       {"conversations": [{"from": "gpt", "value": "only me"}]}])
    assert summary(list(iter_source(src(sg, "sharegpt")))) == [
        (0, "turn 0 has unknown 'from' 'alien'"), (1, "turn 0 has no string 'value'"), (2, "no user turn")]
    gl = jsonl(tmp_path / "gl.jsonl", [{"chat": "USER: hi"}, {"system": "SYSTEM: x", "chat": 5},
                                       {"system": "", "chat": "USER:   \n\n\nASSISTANT: hm"}])
    assert summary(list(iter_source(src(gl, "glaive")))) == [
        (0, "missing field 'system'"), (1, "'system' and 'chat' must be strings"),
        (2, "the first USER turn in 'chat' is empty")]


def test_gzip_and_parquet_read_the_same_prompts(tmp_path):
    plain = CORPUS / "xlam.jsonl"
    gz = tmp_path / "xlam.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    rows = [json.loads(line) for line in plain.read_text().splitlines()]
    # Parquet dumps keep nested fields as JSON text (tools) or as nested columns (messages)
    table = pa.table({"messages": [r["messages"] for r in rows],
                      "tools": [t if isinstance(t := r.get("tools"), str) or t is None else json.dumps(t)
                                for r in rows]})
    pq.write_table(table, tmp_path / "xlam.parquet", row_group_size=2)
    expected = list(iter_source(src(plain)))
    assert list(iter_source(src(gz))) == expected
    assert list(iter_source(src(f"file://{tmp_path}/xlam.parquet"))) == expected
    assert [i.row for i in iter_source(src(tmp_path / "xlam.parquet", limit=3))] == [0, 1, 2]


def test_truncated_gzip_keeps_earlier_rows_and_reports_the_rest(tmp_path):
    data = gzip.compress(b"".join(json.dumps({"messages": [{"role": "user", "content": f"q{i} " * 50}]}).encode()
                                  + b"\n" for i in range(200)))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    items = list(iter_source(src(path)))
    *prompts, last = items
    assert all(isinstance(p, Prompt) for p in prompts) and len(prompts) > 0
    assert last == BadRow("s", len(prompts), "the file is corrupt from here on (EOFError: Compressed file ended "
                                             "before the end-of-stream marker was reached)")


def test_missing_files_raise_source_error_naming_source_and_uri(tmp_path):
    missing = src(tmp_path / "nope.jsonl", name="prompts")
    with pytest.raises(SourceError, match=rf"^source 'prompts': {tmp_path}/nope.jsonl does not exist or is not a"):
        check_source(missing)
    with pytest.raises(SourceError, match=r"^source 'prompts': "):
        list(iter_source(missing))
    bad_parquet = tmp_path / "x.parquet"
    bad_parquet.write_bytes(b"not parquet")
    with pytest.raises(SourceError, match=r"x\.parquet is not a readable Parquet file"):
        list(iter_source(src(bad_parquet)))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_format_from_s3(s3_bucket, name):
    store = open_store(s3_bucket + "/prompts")
    body = (CORPUS / f"{name}.jsonl").read_bytes()
    store.put(f"{name}.jsonl", body)
    store.put(f"{name}.jsonl.gz", gzip.compress(body))
    local = list(iter_source(src(CORPUS / f"{name}.jsonl", FORMATS[name])))
    for key in (f"{name}.jsonl", f"{name}.jsonl.gz"):
        spec = src(f"{s3_bucket}/prompts/{key}", FORMATS[name])
        check_source(spec)
        assert list(iter_source(spec)) == local
    assert len(list(iter_source(src(f"{s3_bucket}/prompts/{name}.jsonl", FORMATS[name], limit=2)))) == 2


def test_parquet_from_s3_and_missing_s3_object(s3_bucket, tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}]} for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    open_store(s3_bucket).put("p.parquet", (tmp_path / "p.parquet").read_bytes())
    got = list(iter_source(src(f"{s3_bucket}/p.parquet")))
    assert [(p.row, p.messages) for p in got] == [(i, r["messages"]) for i, r in enumerate(rows)]
    with pytest.raises(SourceError, match=rf"^source 's': {s3_bucket}/missing.jsonl does not exist or is not a file$"):
        check_source(src(f"{s3_bucket}/missing.jsonl"))


# ----------------------------------------------------------------------- whole conversations


def whole(tmp_path: Path, rows: list, fmt: str) -> list[Prompt | BadRow]:
    return list(iter_source(src(jsonl(tmp_path / f"w-{fmt}.jsonl", rows), fmt), whole=True))


def fn_call(cid: str, name: str, args: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def test_whole_openai_keeps_every_turn_and_normalizes_older_function_calling(tmp_path):
    row = {"messages": [
        {"role": "user", "content": "Oslo?"},
        {"role": "assistant", "content": None, "function_call": {"name": "w", "arguments": "{\"c\":\"Oslo\"}"}},
        {"role": "function", "name": "w", "content": "rain"},
        {"role": "assistant", "content": "Rain.", "tool_calls": []},
        {"role": "user", "content": "Rome and Paris?"},
        {"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "w", "arguments": {"c": "Rome"}}},
            fn_call("p", "w", "{\"c\":\"Paris\"}")]},
        {"role": "tool", "tool_call_id": "p", "content": "sun"},
        {"role": "tool", "content": "clouds"}]}
    [p] = whole(tmp_path, [row], "openai")
    assert p.messages == [
        {"role": "user", "content": "Oslo?"},
        {"role": "assistant", "tool_calls": [fn_call("call_1_0", "w", "{\"c\":\"Oslo\"}")]},
        {"role": "tool", "name": "w", "content": "rain", "tool_call_id": "call_1_0"},
        {"role": "assistant", "content": "Rain."},
        {"role": "user", "content": "Rome and Paris?"},
        {"role": "assistant", "tool_calls": [fn_call("call_5_0", "w", "{\"c\":\"Rome\"}"),
                                             fn_call("p", "w", "{\"c\":\"Paris\"}")]},
        {"role": "tool", "tool_call_id": "p", "content": "sun"},
        {"role": "tool", "tool_call_id": "call_5_0", "content": "clouds"}]
    # the `last` reading of the same row is today's: up to the last user turn
    [q] = list(iter_source(src(tmp_path / "w-openai.jsonl")))
    assert [m["role"] for m in q.messages] == ["user", "assistant", "function", "assistant", "user"]
    assert p.sample_id() != q.sample_id()


def test_whole_sharegpt_function_call_observation_and_hermes_text(tmp_path):
    rows = [
        {"tools": "[{\"name\": \"f\"}]", "conversations": [
            {"from": "human", "value": "a"}, {"from": "gpt", "value": "Checking."},
            {"from": "function_call", "value": "[{\"name\": \"f\", \"arguments\": {\"x\": 1}}, "
                                               "{\"name\": \"f\", \"arguments\": {\"x\": 2}}]"},
            {"from": "observation", "value": "1"}, {"from": "observation", "value": "4"},
            {"from": "gpt", "value": "1 and 4."}]},
        {"conversations": [
            {"from": "system", "value": "<tools>[]</tools>"}, {"from": "human", "value": "cam?"},
            {"from": "gpt", "value": "<tool_call>\n{'arguments': {'id': 'c-42'}, 'name': 'feed'}\n</tool_call>\n"
                                     "<tool_call>{\"name\": \"feed\", \"arguments\": {\"id\": \"c-7\"}}</tool_call>"},
            {"from": "tool", "value": "<tool_response>\nok 42\n</tool_response><tool_response>ok 7</tool_response>"},
            {"from": "gpt", "value": "Both feeds are live."}]},
    ]
    a, b = whole(tmp_path, rows, "sharegpt")
    assert a.messages == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            fn_call("call_2_0", "f", "{\"x\":1}"), fn_call("call_2_1", "f", "{\"x\":2}")]},
        {"role": "tool", "content": "1", "tool_call_id": "call_2_0"},
        {"role": "tool", "content": "4", "tool_call_id": "call_2_1"},
        {"role": "assistant", "content": "1 and 4."}]
    assert a.tools == [{"name": "f"}]
    assert b.messages[2] == {"role": "assistant", "content": None, "tool_calls": [
        fn_call("call_2_0", "feed", "{\"id\":\"c-42\"}"), fn_call("call_2_1", "feed", "{\"id\":\"c-7\"}")]}
    assert b.messages[3:5] == [{"role": "tool", "content": "ok 42", "tool_call_id": "call_2_0"},
                               {"role": "tool", "content": "ok 7", "tool_call_id": "call_2_1"}]


def test_whole_glaive_function_response_and_corpus():
    items = list(iter_source(src(CORPUS / "glaive.jsonl", "glaive"), whole=True))
    first = items[0]
    assert isinstance(first, Prompt)
    assert first.messages[1:] == [
        {"role": "user", "content": "Can you tell me the latest news headlines for the United States?"},
        {"role": "assistant", "content": None, "tool_calls": [
            fn_call("call_1_0", "get_news_headlines", "{\"country\": \"United States\"}")]},
        {"role": "tool", "content": "{\"headlines\": [\"Biden announces new vaccine mandates\"]}",
         "tool_call_id": "call_1_0"},
        {"role": "assistant", "content": "Here are the latest news headlines for the United States: ..."},
        {"role": "user", "content": "That's interesting. What about the news in France?"},
        {"role": "assistant", "content": None, "tool_calls": [
            fn_call("call_5_0", "get_news_headlines", "{\"country\": \"France\"}")]}]
    hermes = list(iter_source(src(CORPUS / "hermes.jsonl", "sharegpt"), whole=True))
    assert [h.reason if isinstance(h, BadRow) else len(h.messages) for h in hermes] == [
        3, "turn 2 <tool_call> 0 has no function name", 2, 2]  # the corpus elides that call


def test_malformed_conversations_are_bad_rows_with_their_reason(tmp_path):
    u = {"role": "user", "content": "q"}
    rows = [
        {"messages": [u, {"role": "tool", "tool_call_id": "x", "content": "r"}]},
        {"messages": [u, {"role": "assistant", "tool_calls": [fn_call("a", "f", "{}")]}, u]},
        {"messages": [u, {"role": "assistant", "tool_calls": [fn_call("a", "f", "{}")]}]},
        {"messages": [u, {"role": "assistant", "tool_calls": [fn_call("a", "f", "{}")]},
                      {"role": "tool", "tool_call_id": "b", "content": "r"}]},
        {"messages": [{"role": "assistant", "content": "hi"}, u]},
        {"messages": [u, {"role": "assistant", "content": "<tool_call>{\"name\": \"f\"}"}]},
    ]
    got = [(i.row, i.reason) if isinstance(i, BadRow) else (i.row, "ok") for i in whole(tmp_path, rows, "openai")]
    assert got == [
        (0, "message 1: a tool result answers call id 'x', which no open call has"),
        (1, "message 2: tool call 'a' (f) is never answered"),
        (2, "ok"),  # the last turn's call may stay open: nothing after it needs the result
        (3, "message 2: a tool result answers call id 'b', which no open call has"),
        (4, "message 0: an assistant turn before any user turn"),
        (5, "message 1: <tool_call> is never closed"),
    ]
    bad = whole(tmp_path, [{"chat": "USER: hi ASSISTANT: <functioncall> nonsense", "system": ""},
                           {"chat": "USER: hi FUNCTION RESPONSE: 1", "system": ""}], "glaive")
    assert [i.reason for i in bad] == [
        "ASSISTANT turn 1 <functioncall> is neither JSON nor a literal: 'nonsense'",
        "speaker turn 1: a tool result answers no call"]


def test_a_bad_rows_sample_id_does_not_depend_on_the_wording_of_its_error(tmp_path):
    """Resume skips a bad row by its id: rewording a message in a later release must not make it
    a new sample (recorded twice)."""
    a, b = BadRow("p", 3, "invalid JSON: unexpected end"), BadRow("p", 3, "row 3: not JSON at all")
    assert a.sample_id() == b.sample_id()
    assert a.sample_id() != BadRow("p", 4, a.reason).sample_id() != BadRow("q", 3, a.reason).sample_id()
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"broken": \n')
    (row,) = iter_source(SourceSpec(name="p", uri=str(path)))
    assert isinstance(row, BadRow) and row.sample_id() == BadRow("p", 0, "anything").sample_id()


def test_rows_and_answers_read_calls_written_as_text_one_way(tmp_path):
    """A dataset row's `<functioncall>` / `<tool_call>` turn and a model's answer holding the same text
    are read by the same parser (jobs/tools/textcalls.py): the same names and arguments."""
    from eyrie.jobs.tools.textcalls import find_calls

    glaive_turn = ("<functioncall> [{\"name\": \"w\", \"arguments\": '{\"c\": \"Oslo\"}'}, "
                   "{\"name\": \"w\", \"arguments\": {\"c\": \"Rome\"}}]")
    hermes_turn = ("Checking.\n<tool_call>\n{'name': 'w', 'arguments': {'c': 'Paris'}}\n</tool_call>\n"
                   '<tool_call>[{"name": "t", "arguments": {}}, {"name": "w", "parameters": {"c": "Bonn"}}]'
                   "</tool_call>")
    rows = [{"system": "", "chat": f"USER: weather? ASSISTANT: {glaive_turn} <|endoftext|> FUNCTION RESPONSE: 1 "
                                   "FUNCTION RESPONSE: 2 ASSISTANT: Done."},
            {"conversations": [{"from": "human", "value": "weather?"}, {"from": "gpt", "value": hermes_turn}]}]
    g = whole(tmp_path, rows[:1], "glaive")[0]
    h = whole(tmp_path, rows[1:], "sharegpt")[0]
    for row_msg, text in ((g.messages[1], glaive_turn), (h.messages[1], hermes_turn)):
        answer = [(c.name, c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments,
                                                                                       separators=(",", ":")))
                  for c in find_calls(text, {"w", "t"})]
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in row_msg["tool_calls"]] == answer
    assert [c["id"] for c in h.messages[1]["tool_calls"]] == ["call_1_0", "call_1_1", "call_1_2"]
    assert h.messages[1]["content"] == "Checking."
    [bad] = whole(tmp_path, [{"system": "", "chat": "USER: hi ASSISTANT: <functioncall> {\"name\": \"w\"} and more"}],
                  "glaive")
    assert bad.reason == "ASSISTANT turn 1 <functioncall>: text after the call, 'and more', would be lost"
    [bad] = whole(tmp_path, [{"conversations": [
        {"from": "human", "value": "q"},
        {"from": "gpt", "value": "<tool_call>{'name': 'w', 'arguments': {'c': {1, 2}}}</tool_call>"}]}], "sharegpt")
    assert bad.reason == "turn 1 <tool_call> 0: arguments are not JSON values"


def test_a_rows_own_answer_is_read_as_its_whole_conversation_reads_it(tmp_path):
    """`generation.answers: dataset`: the answer to a prompt is the assistant turn right after the
    prompt's user turn (the last one; glaive's first), calls written as text read into OpenAI calls."""
    chat = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                         {"role": "user", "content": "Weather in Oslo?"},
                         {"role": "assistant", "content": "<tool_call>\n{\"name\": \"w\", \"arguments\": "
                                                          "{\"city\": \"Oslo\"}}\n</tool_call>",
                          "reasoning_content": "Oslo: call w."}]}
    open_end = {"messages": [{"role": "user", "content": "Hi"}]}
    share = {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"},
                               {"from": "human", "value": "c"}, {"from": "gpt", "value": "d"}]}
    path = jsonl(tmp_path / "a.jsonl", [chat, open_end])
    got = list(iter_source(src(path), answers=True))
    assert got[0].answer == {"role": "assistant", "content": None, "reasoning_content": "Oslo: call w.",
                             "tool_calls": [{"id": "call_3_0", "type": "function",
                                             "function": {"name": "w", "arguments": "{\"city\":\"Oslo\"}"}}]}
    assert got[1].answer is None  # nothing after the last user turn
    assert [p.answer for p in iter_source(src(path))] == [None, None]  # read only when asked
    assert got[0].sample_id() == next(iter(iter_source(src(path)))).sample_id()  # the same sample either way
    [s] = list(iter_source(src(jsonl(tmp_path / "s.jsonl", [share]), "sharegpt"), answers=True))
    assert s.answer == {"role": "assistant", "content": "d", "reasoning_content": None}
    first = next(iter(iter_source(src(CORPUS / "glaive.jsonl", "glaive"), answers=True)))
    assert first.answer["content"] is None and [c["function"] for c in first.answer["tool_calls"]] == [
        {"name": "get_news_headlines", "arguments": "{\"country\": \"United States\"}"}]
