"""Agentic conversations reconstructed turn by turn, token-exact: DeepSeek-V4's real tokenizer
(perTurn and packed, tool results in the prefix) and the Kimi K2.5 format (the model's own
`functions.NAME:IDX` ids, counted across the conversation, in prefix and completion; packing refused)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from eyrie.jobs.contract import layout, records
from eyrie.jobs.generate.sending.conversation import NextTurn, next_turn
from eyrie.jobs.reconstruct.formats import PackingRefused, resolve_format
from eyrie.jobs.reconstruct.reconstructor import Reconstructor, Sample
from eyrie.jobs.reconstruct.samples import build_samples, pack
from eyrie.jobs.reconstruct.tokenizers import LoadedTokenizer, clear_cache, load_tokenizer
from eyrie.jobs.spec import DatasetGenerationSpec, TargetSpec
from eyrie.jobs.store import FileStore

KIMI = Path(__file__).parents[1] / "data" / "kimi_synthetic"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get weather",
    "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}


def call(cid: str, city: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'}}


# the dataset: three calls over two user turns (the second one parallel)
CONV = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [call("d1", "Paris")]},
    {"role": "tool", "tool_call_id": "d1", "content": "Sunny"},
    {"role": "assistant", "content": "Paris is sunny."},
    {"role": "user", "content": "Oslo and Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [call("d2", "Oslo"), call("d3", "Rome")]},
    {"role": "tool", "tool_call_id": "d2", "content": "Snow"},
    {"role": "tool", "tool_call_id": "d3", "content": "Rain"},
    {"role": "assistant", "content": "Oslo snow, Rome rain."},
]
# the model's answers: Kimi numbers its call ids across the whole conversation
ANSWERS = [
    {"reasoning": "Look it up.", "content": "", "tool_calls": [call("functions.get_weather:0", "Paris")]},
    {"reasoning": "Sunny it is.", "content": "Paris is sunny.", "tool_calls": []},
    {"reasoning": "Two calls.", "content": "", "tool_calls": [call("functions.get_weather:2", "Rome"),
                                                              call("functions.get_weather:1", "Oslo")]},
    {"reasoning": "Report.", "content": "Snow in Oslo, rain in Rome.", "tool_calls": []},
]


def turn_records(sid: str = "c1") -> list[dict[str, Any]]:
    """What the worker persists: one record per turn, request k built by next_turn from answers < k."""
    out = []
    for k, answer in enumerate(ANSWERS):
        nt = next_turn(CONV, ANSWERS[:k], "stop", 32)
        assert isinstance(nt, NextTurn) and nt.turn == k
        out.append({"sample_id": sid, "turn": k, "source": "agentic", "row": 0, "status": "ok", "policy": "keep",
                    "request": {"model": "m", "messages": nt.messages, "tools": [WEATHER],
                                "reasoning": {"effort": "high"}},
                    "response": {**answer, "finish_reason": "tool_calls" if answer["tool_calls"] else "stop"},
                    "usage": None, "agentic": {"spliced": nt.spliced, "divergedFrom": None}})
    return out


@pytest.fixture(scope="module")
def ds_tok() -> LoadedTokenizer:
    return load_tokenizer(TargetSpec(model="m", tokenizer="bundled:deepseek-v4"))


@pytest.fixture(scope="module")
def kimi_tok() -> LoadedTokenizer:
    return load_tokenizer(TargetSpec(model="m", tokenizer=str(KIMI)))


def test_deepseek_v4_per_turn_prefixes_carry_the_models_turns_and_the_tool_results(ds_tok):
    rc = Reconstructor(resolve_format("deepseek-v4", ds_tok), ds_tok)
    samples = [rc(r) for r in turn_records()]
    assert all(isinstance(s, Sample) for s in samples), samples
    s0, s1, s2, s3 = samples
    assert [s.turn for s in samples] == [0, 1, 2, 3]
    dsml = ('\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
            '<｜DSML｜parameter name="city" string="true">{}</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
            '</｜DSML｜tool_calls>')
    assert ds_tok.decode(s0.input_ids[s0.n_prompt:]) == "Look it up.</think>" + dsml.format("Paris") + \
        "<｜end▁of▁sentence｜>"
    # turn 1's prompt is turn 0 as the model wrote it, then the spliced result, then a fresh assistant turn
    tail1 = "<｜User｜><tool_result>Sunny</tool_result><｜Assistant｜><think>"
    assert s1.input_ids[:s1.n_prompt] == s0.input_ids + ds_tok.encode(tail1)
    assert s1.input_ids[s1.n_prompt:] == [*ds_tok.encode("Sunny it is."), 128822, *ds_tok.encode("Paris is sunny."), 1]
    assert s2.input_ids[:s2.n_prompt] == s1.input_ids + ds_tok.encode("<｜User｜>Oslo and Rome?<｜Assistant｜><think>")
    # results in the order of the model's calls (Rome first), whatever the dataset's order
    tail3 = "<｜User｜><tool_result>Rain</tool_result>\n\n<tool_result>Snow</tool_result><｜Assistant｜><think>"
    assert s3.input_ids[:s3.n_prompt] == s2.input_ids + ds_tok.encode(tail3)
    for s in samples:
        assert s.loss_mask == [0] * s.n_prompt + [1] * (s.n_tokens - s.n_prompt)

    packed = pack(samples)
    assert isinstance(packed, Sample) and packed.input_ids == s3.input_ids and packed.turn == 3
    mask = packed.loss_mask
    spans = [(s.n_prompt, s.n_tokens) for s in samples]
    assert packed.spans == tuple(spans) and sum(mask) == sum(e - b for b, e in spans)
    assert [i for i, m in enumerate(mask) if m] == [i for b, e in spans for i in range(b, e)]
    # the tool results sit in the prefix, out of the loss
    rain = s3.input_ids.index(ds_tok.encode("<tool_result>")[0], s2.n_tokens)
    assert mask[rain] == 0


def test_packing_proves_the_history_token_by_token(ds_tok):
    rc = Reconstructor(resolve_format("deepseek-v4", ds_tok), ds_tok)
    recs = turn_records()
    for r in recs:  # no tools declared: DeepSeek-V4 drops the reasoning of earlier turns
        r["request"].pop("tools")
    got = pack([rc(r) for r in recs])
    assert got.reason == "history_not_verbatim" and "turn 1's prompt does not start with turn 0's" in got.message


def test_kimi_uses_the_models_own_ids_across_the_conversation(kimi_tok):
    fmt = resolve_format("kimi-k2.5", kimi_tok)
    rc = Reconstructor(fmt, kimi_tok)
    samples = [rc(r) for r in turn_records()]
    assert all(isinstance(s, Sample) for s in samples), samples
    s2, s3 = samples[2], samples[3]
    completion2 = kimi_tok.decode(s2.input_ids[s2.n_prompt:])
    assert completion2 == ("Two calls.</think><|tool_calls_section_begin|>"
                           '<|tool_call_begin|>functions.get_weather:2<|tool_call_argument_begin|>{"city": "Rome"}'
                           '<|tool_call_end|><|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>'
                           '{"city": "Oslo"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>')
    prompt3 = kimi_tok.decode(s3.input_ids[:s3.n_prompt])
    assert prompt3.endswith(
        "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:1\nSnow<|im_end|>"
        "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:2\nRain<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>")
    assert "## Return of functions.get_weather:0\nSunny" in prompt3
    # the reasoning of the tool loop before the last plain answer is gone: what packing cannot express
    assert "Look it up." not in prompt3 and "Two calls." in prompt3
    assert fmt.history_rewritten and "drops the reasoning" in fmt.history_rewritten


def spec_for(tmp_path: Path, tokenizer: str, fmt: str, multi_turn: str) -> DatasetGenerationSpec:
    clear_cache()
    return DatasetGenerationSpec.model_validate({
        "sources": [{"name": "agentic", "uri": "prompts.jsonl"}],
        "target": {"model": "m", "tokenizer": tokenizer, "chatFormat": fmt},
        "api": {"baseUrl": "simulated"}, "budget": {"maxUSD": "1"}, "output": {"uri": str(tmp_path / "out")},
        "generation": {"turns": "all"}, "samples": {"multiTurn": multi_turn}})


def test_build_samples_per_turn_and_packed_with_the_turn_column(tmp_path, ds_tok):
    store = FileStore(tmp_path / "out")
    recs = turn_records()
    # turns in two parts, out of order, one written twice
    store.put(layout.part_key(0, 0), records.encode_part([recs[2], recs[0]]))
    store.put(layout.part_key(0, 1), records.encode_part([recs[1], recs[3], recs[0]]))
    per = build_samples(spec_for(tmp_path, "bundled:deepseek-v4", "deepseek-v4", "perTurn"), store, ds_tok)
    table = pq.read_table(io.BytesIO(store.get(layout.samples_key(0))))
    assert sorted(table.column("turn").to_pylist()) == [0, 1, 2, 3] and per.samples == 4
    assert per.excluded == {"duplicate": 1}
    packed = build_samples(spec_for(tmp_path, "bundled:deepseek-v4", "deepseek-v4", "packed"), store, ds_tok)
    table = pq.read_table(io.BytesIO(store.get(layout.samples_key(0))))
    assert table.column("turn").to_pylist() == [3] and packed.samples == 1
    row = table.to_pylist()[0]
    assert row["n_tokens"] == len(row["input_ids"]) and 0 < sum(row["loss_mask"]) < row["n_tokens"]
    assert packed.response_tokens == per.response_tokens


def test_packed_is_refused_for_kimi_with_the_reason(tmp_path, kimi_tok):
    store = FileStore(tmp_path / "out")
    store.put(layout.part_key(0, 0), records.encode_part(turn_records()))
    with pytest.raises(PackingRefused, match=r"samples.multiTurn: packed is refused for kimi-k2.5: .*drops the "
                                             r"reasoning of earlier assistant turns.*; use perTurn"):
        build_samples(spec_for(tmp_path, str(KIMI), "kimi-k2.5", "packed"), store, kimi_tok)
