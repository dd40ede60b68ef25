"""Run stores of samples for the SpecForge export tests: records rebuilt by eyrie's own
reconstruction into `samples/shard-00000.parquet` and its summary, as the samples stage leaves them."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from eyrie.jobs.contract import layout
from eyrie.jobs.reconstruct.formats import resolve_format
from eyrie.jobs.reconstruct.reconstructor import Reconstructor, Sample
from eyrie.jobs.reconstruct.samples import SamplesSummary, samples_table
from eyrie.jobs.reconstruct.tokenizers import LoadedTokenizer
from eyrie.jobs.store import FileStore
from tests.reference_helpers import unavailable

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather for a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "City name"}, "unit": {"type": "string", "enum": ["c", "f"]}}}}}


def need_specforge() -> None:
    """SpecForge's own data code, or a skip (a failure under CI=true) saying why it is missing."""
    from eyrie.jobs.extract.specforge_online import specforge_importable

    why = specforge_importable()
    if why is not None:
        unavailable("specforge", f"SpecForge's data code does not import ({why}); install it with "
                                 "`pip install --no-deps specforge==0.2.0` (README's test command does)")


def call(name: str, args: str, cid: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def record(sid: str, messages: list[dict[str, Any]], *, reasoning: str = "", content: str = "",
           calls: list[dict[str, Any]] | None = None, tools: list[dict[str, Any]] | None = None,
           thinking: bool = True, turn: int | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {"model": "m", "messages": messages,
                               "reasoning": {"effort": "high"} if thinking else {"enabled": False}}
    if tools:
        request["tools"] = tools
    r = {"sample_id": sid, "source": "src", "row": 0, "status": "ok", "policy": "keep", "request": request,
         "response": {"reasoning": reasoning, "content": content, "tool_calls": calls or [],
                      "finish_reason": "tool_calls" if calls else "stop"},
         "usage": {}}
    if turn is not None:
        r["turn"] = turn
    return r


def conversations(thinking: bool = True, call_id: str = "functions.get_weather:0") -> list[dict[str, Any]]:
    """Single-turn answers, a tool call, and a multi-turn conversation with a tool call and its result
    in the history, then the answer after it and a follow-up question."""
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    first = {"role": "assistant", "content": "", "reasoning_content": "I should call the tool." if thinking else None,
             "tool_calls": [call("get_weather", '{"city": "Paris"}', call_id)]}
    result = {"role": "tool", "tool_call_id": call_id, "content": '{"sky": "sunny", "c": 21}'}
    r = (lambda text: text) if thinking else (lambda _text: "")
    return [
        record("plain", [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there!"}],
               reasoning=r("The user greets me."), content="Hello! How can I help?", thinking=thinking),
        record("unicode", [{"role": "user", "content": "Say café in 東京 style ✓"}],
               reasoning=r("Accents: café; 東京."), content="café ✓ 東京", thinking=thinking),
        record("call", ask, reasoning=r("I should call the tool."), tools=[WEATHER], thinking=thinking,
               calls=[call("get_weather", '{"city": "Paris"}', call_id)]),
        record("after-tool", [*ask, first, result], reasoning=r("It is sunny."), content="Sunny, 21 °C.",
               tools=[WEATHER], thinking=thinking, turn=1),
        record("follow-up", [*ask, first, result, {"role": "assistant", "content": "Sunny, 21 °C."},
                             {"role": "user", "content": "And tomorrow?"}],
               reasoning=r("No forecast tool."), content="I can only tell today's weather.", tools=[WEATHER],
               thinking=thinking, turn=2),
    ]


def samples_store(folder: Path, tok: LoadedTokenizer, chat_format: str, records: list[dict[str, Any]],
                  variant: str | None = None) -> tuple[FileStore, list[Sample]]:
    """A run's output holding these records' samples (each must rebuild) and the samples summary."""
    fmt = resolve_format(chat_format, tok, variant)
    rebuild = Reconstructor(fmt, tok)
    samples = []
    for r in records:
        s = rebuild(r)
        assert isinstance(s, Sample), s
        samples.append(s)
    store = FileStore(folder)
    buf = io.BytesIO()
    pq.write_table(samples_table(samples), buf)
    store.put(layout.samples_key(0), buf.getvalue())
    summary = SamplesSummary(tokenizer=tok.name, tokenizer_sha256=tok.sha256, tokenizer_files=dict(tok.files),
                             chat_format=fmt.name, template_sha256=fmt.sha256, variant=fmt.variant,
                             samples=len(samples))
    store.put(layout.SAMPLES_SUMMARY, json.dumps(summary.to_manifest()).encode())
    return store, samples
