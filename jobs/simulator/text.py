"""How the simulated model answers when its functions are only described in the prompt (text mode).

Part of the demo/test provider (`simulator/`): per source (a simulator config file's `textCallsBySource`,
else `textCalls`), a share of such prompts is answered with calls written as text in a mix of formats, a
share of those calls do not validate, and some answers without a call name a function in prose.
The writers here produce each format as the model family writes it (its official chat template's
rendering of a call); eyrie reads answers with `tools/textcalls.py`, which never writes them, so a
test comparing what the simulator planned with what eyrie measured compares two codings of a format.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from eyrie.jobs.reconstruct import kimi_facts as kimi
from eyrie.jobs.reconstruct.deepseek import DS_CALL_BEGIN, DS_CALL_END, DS_CALLS_BEGIN, DS_CALLS_END, DS_SEP
from eyrie.jobs.tools.textcalls import TEXT_FORMATS, CallFormat

FORMATS = tuple(f.value for f in TEXT_FORMATS)  # tools/textcalls.py's registry: each needs a writer below
MAX_INDEXED_ROWS = 1_000_000  # rows per source the simulator recognises by their prompt


@dataclass(frozen=True)
class TextBehaviour:
    """A simulator config file's `textCalls` (config.text_behaviour reads it) as the answers use it."""

    call_rate: float
    formats: dict[str, float]
    invalid_share: float
    prose_share: float

    def __post_init__(self) -> None:
        for name in ("call_rate", "invalid_share", "prose_share"):
            v = getattr(self, name)
            if not 0 <= v <= 1:
                raise ValueError(f"simulator text calls {name}: {v} is not a probability in [0, 1]")
        unknown = sorted(set(self.formats) - set(FORMATS))
        if unknown or not self.formats or any(w < 0 for w in self.formats.values()) \
                or not sum(self.formats.values()):
            raise ValueError(f"simulator text calls formats: {self.formats} must weigh some of {list(FORMATS)}"
                             + (f" (unknown: {unknown})" if unknown else ""))

    @classmethod
    def of(cls, value: TextBehaviour | dict[str, Any]) -> TextBehaviour:
        return value if isinstance(value, TextBehaviour) else cls(**value)

    def pick_format(self, rng: random.Random) -> str:
        names = sorted(self.formats)
        return rng.choices(names, weights=[self.formats[n] for n in names])[0]


@dataclass(frozen=True)
class PlannedCall:
    name: str
    arguments: str  # the JSON text written (broken when not `valid`)
    valid: bool


@dataclass(frozen=True)
class TextPlan:
    """What the simulated model did with a text-declared prompt (kept for tests, never sent)."""

    source: str | None
    format: str | None  # None: no call
    calls: tuple[PlannedCall, ...] = ()
    prose: bool = False  # named a declared function without calling it


# ------------------------------------------------------------------------------------- writers


def _object(name: str, args: str, valid: bool) -> str:
    """`{"name": ..., "arguments": ...}` with the arguments as an object, or, broken, as the text
    the model got wrong (a JSON string: the object around it still reads)."""
    value = args if valid else json.dumps(args)
    return f'{{"name": {json.dumps(name)}, "arguments": {value}}}'


def _glaive(calls: Sequence[PlannedCall]) -> str:  # one call per turn, arguments as a single-quoted string
    return "\n".join(f"<functioncall> {{\"name\": {json.dumps(c.name)}, \"arguments\": '{c.arguments}'}}"
                     for c in calls)


def _hermes(calls: Sequence[PlannedCall]) -> str:
    return "\n".join(f"<tool_call>\n{_object(c.name, c.arguments, c.valid)}\n</tool_call>" for c in calls)


def _kimi(calls: Sequence[PlannedCall]) -> str:
    body = "".join(f"{kimi.CALL_BEGIN}functions.{c.name}:{i}{kimi.CALL_ARG_BEGIN}{c.arguments}{kimi.CALL_END}"
                   for i, c in enumerate(calls))
    return f"{kimi.SECTION_BEGIN}{body}{kimi.SECTION_END}"


def _deepseek(calls: Sequence[PlannedCall]) -> str:
    body = "".join(f"{DS_CALL_BEGIN}{c.name}{DS_SEP}{c.arguments}{DS_CALL_END}" for c in calls)
    return f"{DS_CALLS_BEGIN}{body}{DS_CALLS_END}"


def _json(calls: Sequence[PlannedCall]) -> str:
    if len(calls) == 1:
        return f"```json\n{_object(calls[0].name, calls[0].arguments, calls[0].valid)}\n```"
    return "[" + ", ".join(_object(c.name, c.arguments, c.valid) for c in calls) + "]"


# One writer per format of the registry (tools/textcalls.FORMATS), written here and not there: the simulator's
# coding of a format and eyrie's reading of it stay two, so a test comparing them compares two.
WRITERS: dict[str, Callable[[Sequence[PlannedCall]], str]] = {
    CallFormat.GLAIVE: _glaive, CallFormat.HERMES: _hermes, CallFormat.KIMI: _kimi, CallFormat.DEEPSEEK: _deepseek,
    CallFormat.JSON: _json}


def write_calls(fmt: str, calls: Sequence[PlannedCall]) -> str:
    """The calls as the family writes them (Kimi K2.5's, DeepSeek-V3.1's, Qwen3's templates; glaive's rows)."""
    if fmt not in WRITERS:
        raise ValueError(f"unknown text call format {fmt!r}")
    return WRITERS[fmt](calls)


def break_arguments(args: str, schema: Any) -> str:
    """Arguments that do not validate: the first required property left out, or (none required)
    the JSON cut in half; arguments that are not JSON already do not, and stay as they are. Used
    for text calls and for a simulated endpoint's `schemaErrorRate` alike."""
    try:
        value = orjson.loads(args)
    except orjson.JSONDecodeError:
        return args
    required = [r for r in (schema or {}).get("required") or []
                if isinstance(value, dict) and isinstance(r, str) and r in value]
    if required:
        del value[required[0]]
        return orjson.dumps(value).decode()
    return args[: max(1, len(args) // 2)]


def text_answer(rng: random.Random, fns: Sequence[dict[str, Any]], behaviour: TextBehaviour, source: str | None,
                same: Sequence[tuple[str, str]], filler: str) -> tuple[str, TextPlan]:
    """(content, plan) for a prompt whose functions `fns` are described as text: when it calls, the
    calls `same` (those the model makes with the tools declared structurally, so the two modes can
    agree), glaive's format keeping one; `filler` is prose."""
    if not same or rng.random() >= behaviour.call_rate:  # nothing to call (after a tool result): it answers
        if rng.random() < behaviour.prose_share:
            name = rng.choice(fns)["name"]
            return f"I could use {name} for this, but here is what I know. {filler}", TextPlan(source, None, (), True)
        return filler, TextPlan(source, None)
    fmt = behaviour.pick_format(rng)
    params = {f["name"]: f.get("parameters") for f in fns}
    calls = []
    for name, args in same[:1] if fmt == "glaive" else same:
        valid = rng.random() >= behaviour.invalid_share
        calls.append(PlannedCall(name, args if valid else break_arguments(args, params.get(name)), valid))
    lead = "" if fmt in ("glaive", "kimi", "deepseek") else "Let me look that up.\n"
    return lead + write_calls(fmt, calls), TextPlan(source, fmt, tuple(calls))


# ------------------------------------------------------------------------- which source a prompt is


def prompt_key(messages: Sequence[Any]) -> bytes | None:
    """What recognises a row's prompt in a request: its last user message."""
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            return hashlib.sha256(orjson.dumps(m.get("content"))).digest()[:16]
    return None


@lru_cache(maxsize=8)
def source_index(sources_json: str, endpoint: str | None) -> dict[bytes, str]:
    """Last-user-message key -> source name, over the sources given (JSON list of SourceSpec dumps),
    read once; the first source wins a prompt that two hold."""
    from eyrie.jobs.sources import Prompt, iter_source
    from eyrie.jobs.spec import SourceSpec

    out: dict[bytes, str] = {}
    for raw in json.loads(sources_json):
        src = SourceSpec.model_validate(raw)
        for i, item in enumerate(iter_source(src, endpoint)):
            if i >= MAX_INDEXED_ROWS:
                break
            if isinstance(item, Prompt) and (key := prompt_key(item.messages)) is not None:
                out.setdefault(key, src.name)
    return out
