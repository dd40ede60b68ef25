"""A local OpenAI-compatible chat-completions provider for demos and tests. Not a real model.

It answers like OpenRouter does (reasoning, content, structured tool calls, `usage.cost`, SSE with
comment lines), deterministically per prompt, and injects the failures a real provider produces
(429, 5xx, 402 out of credits or in-flight budget full, 403 moderation, hangs, cut streams, errors
inside HTTP 200, malformed JSON, leaked tool-call markers, BYOK billing) so the client, the budget
and the tool checks can be exercised over real HTTP on loopback. It bills only the responses it
completed, so a test can compare eyrie's spend with the provider's (BYOK: fee plus upstream cost).

`api.baseUrl: simulated` starts it as a child process (`SimulatorProcess`); `eyrie simulate` runs it
in the foreground. It binds 127.0.0.1 unless told otherwise and must never stand in for a real API.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import random
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from decimal import Decimal
from typing import Any, get_args

import orjson
from aiohttp import web

from eyrie.jobs.simulated_text import (
    TextBehaviour,
    TextPlan,
    break_arguments,
    prompt_key,
    source_index,
    text_answer,
)
from eyrie.jobs.spec import SIMULATOR_PRICING, SimulatedProvider, SimulatorSpec, SourceSpec, TargetSpec
from eyrie.jobs.tools.declarations import DeclarationError, normalize_tools, parse_text_declarations

# One source of truth for the fault names: the spec's Literal.
FAULTS: tuple[str, ...] = get_args(get_args(SimulatorSpec.model_fields["faults"].annotation)[0])
# Drawn when fault_rate > 0 but no fault is named: every transient failure a client must survive
# quickly ("timeout" hangs until the client gives up, so it is only used when asked for).
DEFAULT_FAULTS: tuple[str, ...] = (
    "429", "500", "502", "503", "stream-cut", "200-error", "malformed-json", "empty-choices",
)
PROVIDER = "eyrie-simulator"
MODEL_ID = "eyrie/simulated"
_MILLION = Decimal(1_000_000)
BYOK_FEE = 0.05  # OpenRouter's BYOK fee: a share of what the request would cost on its credits
_COMMENT = b": OPENROUTER PROCESSING\n\n"
_DONE = b"data: [DONE]\n\n"

_WORDS = (
    "the", "model", "weighs", "each", "option", "before", "it", "answers", "and", "checks", "the",
    "result", "against", "the", "question", "data", "flows", "through", "shards", "workers", "retry",
    "politely", "under", "a", "hard", "budget", "every", "token", "counts", "drafter", "training",
    "needs", "faithful", "hidden", "states", "speculative", "decoding", "accepts", "longer", "drafts",
    "a", "small", "careful", "plan", "beats", "a", "large", "hurried", "one", "tools", "are",
    "declared", "once", "and", "called", "with", "valid", "arguments", "results", "are", "verified",
    "twice"
)
_NON_ASCII = ("café", "naïve", "Grüße", "東京", "数据", "résumé", "Ωmega", "🦅")


@dataclass
class SimulatorConfig:
    """Behaviour of the simulated provider; prices are USD per million tokens."""

    latency_ms: float = 0
    fault_rate: float = 0
    faults: list[str] = field(default_factory=list)
    seed: int = 0
    input_per_million: Decimal = SIMULATOR_PRICING.input_per_million
    output_per_million: Decimal = SIMULATOR_PRICING.output_per_million
    tool_call_rate: float = 0.8
    divergence_rate: float = 0.0  # tool-calling turns answered with another call, other arguments or none
    completion_token_drift: float = 0.0  # a fault: usage.completion_tokens off by up to this share of the count
    answer_model: str | None = None  # a builtin chat model whose decoded answers are served (model_answer)
    answer_model_calls: str = "simulator"  # who decides its calls: "simulator" (tool_call_rate) or "model"
    # text mode (functions described in the prompt): what the model does, per source (simulated_text.py)
    text_calls: TextBehaviour = field(default_factory=TextBehaviour.from_spec)
    text_calls_by_source: dict[str, TextBehaviour] = field(default_factory=dict)
    text_sources: list[dict[str, Any]] = field(default_factory=list)  # SourceSpec dumps, to recognise their prompts
    sources_endpoint: str | None = None
    max_completion_tokens: int = 512
    retry_after_s: int = 1  # the Retry-After header of the "429" fault
    hang_s: float = 3600.0  # how long the "timeout" fault holds a request (until the client leaves)
    api_key: str | None = None  # when set, requests must carry `Authorization: Bearer <api_key>`
    # With a tokenizer, usage.prompt_tokens is the length of the prompt `chat_format` renders with
    # `template_variant` (None: the format's default; "unknown": one eyrie does not know), as a real
    # provider counts it, and usage.completion_tokens the length of the answer as that format renders
    # it (the tokens a model wrote to give this answer); without one, a quarter of the characters.
    tokenizer: str | None = None
    chat_format: str = "auto"
    template_variant: str | None = None
    # Thinking when the request does not say: None the template's default (no reasoning returned),
    # False off (counted so), True on (reasoning returned).
    default_thinking: bool | None = None
    # Several endpoints of the model (SimulatedProvider fields, snake_case), routed on provider.only/
    # order and listed at /models/{author}/{slug}/endpoints; empty: one endpoint that ignores routing.
    providers: list[dict[str, Any]] = field(default_factory=list)
    model: str | None = None  # the model the listing knows (None: any)

    def __post_init__(self) -> None:
        self.input_per_million = Decimal(str(self.input_per_million))
        self.output_per_million = Decimal(str(self.output_per_million))
        unknown = [f for f in self.faults if f not in FAULTS]
        if unknown:
            raise ValueError(f"simulator faults: unknown {unknown}; known: {list(FAULTS)}")
        self.text_calls = TextBehaviour.of(self.text_calls)
        self.text_calls_by_source = {k: TextBehaviour.of(v) for k, v in self.text_calls_by_source.items()}
        for name in ("fault_rate", "tool_call_rate", "divergence_rate", "completion_token_drift"):
            v = getattr(self, name)
            if not 0 <= v <= 1:
                raise ValueError(f"simulator {name}: {v} is not a probability in [0, 1]")
        if self.latency_ms < 0 or self.max_completion_tokens < 1 or self.retry_after_s < 0:
            raise ValueError("simulator latency_ms, retry_after_s must be >= 0, max_completion_tokens >= 1")
        if self.answer_model_calls not in ("simulator", "model"):
            raise ValueError(f"simulator answer_model_calls: {self.answer_model_calls!r} is not simulator or model")
        check_providers(self.providers)

    @classmethod
    def from_spec(cls, sim: SimulatorSpec | None, target: TargetSpec | None = None,
                  sources: Sequence[SourceSpec] = (), endpoint: str | None = None) -> SimulatorConfig:
        counts = {} if target is None or not target.tokenizer else {
            "tokenizer": target.tokenizer, "chat_format": target.chat_format,
            "template_variant": sim.template_variant if sim is not None else None}
        if target is not None:
            counts["model"] = target.model
        if sim is None:
            return cls(**counts)
        by_source = {k: TextBehaviour.from_spec(v) for k, v in sim.text_calls_by_source.items()}
        text = {"text_calls": TextBehaviour.from_spec(sim.text_calls), "text_calls_by_source": by_source,
                "text_sources": [s.dump() for s in sources if s.name in by_source], "sources_endpoint": endpoint}
        return cls(latency_ms=sim.latency_ms, fault_rate=sim.fault_rate, faults=list(sim.faults),
                   seed=sim.seed, divergence_rate=sim.divergence_rate, default_thinking=sim.default_thinking,
                   completion_token_drift=sim.completion_token_drift, answer_model=sim.answer_model,
                   answer_model_calls=sim.answer_model_calls,
                   providers=[p.wire() for p in sim.providers], **text, **counts)

    def text_behaviour(self, messages: list[Any]) -> tuple[TextBehaviour, str | None]:
        """The text-mode behaviour for this prompt, and the source it was recognised as (None: none
        named in text_calls_by_source holds it)."""
        if not self.text_sources:
            return self.text_calls, None
        index = source_index(json.dumps(self.text_sources, sort_keys=True), self.sources_endpoint)
        source = index.get(prompt_key(messages) or b"")
        return self.text_calls_by_source.get(source, self.text_calls) if source else self.text_calls, source

    def to_json(self) -> str:
        d = asdict(self)
        d["input_per_million"] = str(self.input_per_million)
        d["output_per_million"] = str(self.output_per_million)
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> SimulatorConfig:
        d = json.loads(text)
        if not isinstance(d, dict):
            raise ValueError("simulator config JSON must be an object")
        known = set(cls.__dataclass_fields__)
        extra = sorted(set(d) - known)
        if extra:
            raise ValueError(f"simulator config JSON: unknown fields {extra}; known: {sorted(known)}")
        return cls(**d)


# ------------------------------------------------------------------------------ deterministic answers


def _schema_value(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A value that validates against a (practical subset of) JSON Schema."""
    if not isinstance(schema, dict):
        return rng.choice(_WORDS)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return _schema_value(schema[key][0], rng, depth)
    if schema.get("allOf"):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            if isinstance(part, dict):
                for k, v in part.items():
                    if k in ("properties",) and k in merged:
                        merged[k] = {**merged[k], **v}
                    elif k == "required" and k in merged:
                        merged[k] = [*merged[k], *v]
                    else:
                        merged[k] = v
        return _schema_value({**{k: v for k, v in schema.items() if k != "allOf"}, **merged}, rng, depth)
    typ = schema.get("type")
    if isinstance(typ, list):
        typ = next((t for t in typ if t != "null"), "null")
    if typ is None:
        typ = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if typ == "object":
        props = schema.get("properties") or {}
        required = [r for r in schema.get("required") or [] if isinstance(r, str)]
        out: dict[str, Any] = {}
        for name, sub in props.items():
            if name in required or (depth < 3 and rng.random() < 0.5):
                out[name] = _schema_value(sub, rng, depth + 1)
        for name in required:  # required but not described: any string will do
            if name not in out:
                out[name] = rng.choice(_WORDS)
        return out
    if typ == "array":
        lo = int(schema.get("minItems", 1 if depth < 3 else 0))
        hi = max(lo, min(int(schema.get("maxItems", lo + 2)), lo + 2))
        items = schema.get("items", {"type": "string"})
        n = rng.randint(lo, hi)
        if schema.get("uniqueItems"):
            vals: list[Any] = []
            for _ in range(n * 4):
                v = _schema_value(items, rng, depth + 1)
                if v not in vals:
                    vals.append(v)
                if len(vals) == n:
                    break
            return vals
        return [_schema_value(items, rng, depth + 1) for _ in range(n)]
    if typ in ("integer", "number"):
        return _number(schema, typ, rng)
    if typ == "boolean":
        return rng.random() < 0.5
    if typ == "null":
        return None
    # string
    fmt = schema.get("format")
    if fmt == "date":
        return f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if fmt == "date-time":
        return f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z"
    if fmt == "email":
        return f"{rng.choice(_WORDS)}@example.com"
    if fmt in ("uri", "url"):
        return f"https://example.com/{rng.choice(_WORDS)}"
    s = " ".join(rng.choices(_WORDS, k=rng.randint(1, 3)))
    lo_s, hi_s = int(schema.get("minLength", 0)), schema.get("maxLength")
    while len(s) < lo_s:
        s += " " + rng.choice(_WORDS)
    return s[: int(hi_s)] if hi_s is not None else s


def _number(schema: dict[str, Any], typ: str, rng: random.Random) -> int | float:
    """An integer inside the schema's bounds (draft-4 boolean or numeric exclusive bounds)."""
    lo, hi = schema.get("minimum"), schema.get("maximum")
    xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    lo_i = math.ceil(lo) if isinstance(lo, (int, float)) else None
    hi_i = math.floor(hi) if isinstance(hi, (int, float)) else None
    if xlo is True and lo_i is not None and lo_i == lo:
        lo_i += 1
    elif isinstance(xlo, (int, float)) and not isinstance(xlo, bool):
        lo_i = max(lo_i if lo_i is not None else -(10**9), math.floor(xlo) + 1)
    if xhi is True and hi_i is not None and hi_i == hi:
        hi_i -= 1
    elif isinstance(xhi, (int, float)) and not isinstance(xhi, bool):
        hi_i = min(hi_i if hi_i is not None else 10**9, math.ceil(xhi) - 1)
    if lo_i is None:
        lo_i = 0 if hi_i is None or hi_i >= 0 else hi_i - 100
    if hi_i is None or hi_i < lo_i:
        hi_i = lo_i + 100
    mult = schema.get("multipleOf")
    if isinstance(mult, int) and not isinstance(mult, bool) and mult > 0:
        k_lo, k_hi = -(-lo_i // mult), hi_i // mult
        v = mult * rng.randint(k_lo, max(k_lo, k_hi))
    else:
        v = rng.randint(lo_i, hi_i)
    return v if typ == "integer" else float(v)


def _corpus(n: int = 8192) -> list[str]:
    """A fixed pseudo-text, built once: sentences of 6-12 words, now and then a non-ASCII word."""
    rng = random.Random(20240501)
    out: list[str] = []
    while len(out) < n:
        sent = [rng.choice(_NON_ASCII) if rng.random() < 0.012 else rng.choice(_WORDS)
                for _ in range(rng.randint(6, 12))]
        out += [sent[0].capitalize(), *sent[1:-1], sent[-1] + "."]
    return out


_CORPUS = _corpus()


def _text(rng: random.Random, words: int) -> str:
    """`words` words of the corpus from a random place: one random draw per text (the simulator
    must stay cheap next to the client it is measured against)."""
    start = rng.randrange(len(_CORPUS) - words)
    s = " ".join(_CORPUS[start:start + words])
    return s[:1].upper() + s[1:]


def declared_text_functions(messages: list[Any]) -> list[dict[str, Any]]:
    """Functions declared as text in a system message, read with eyrie's own declaration parser."""
    for m in messages:
        if not (isinstance(m, dict) and m.get("role") == "system" and isinstance(m.get("content"), str)):
            continue
        try:
            decls, _rest = parse_text_declarations(m["content"])
        except DeclarationError:
            continue
        fns = [d.get("function", d) if isinstance(d, dict) else d for d in decls]
        found = [f for f in fns if isinstance(f, dict) and isinstance(f.get("name"), str)]
        if found:
            return found
    return []


def kimi_markers(calls: list[tuple[str, str]]) -> str:
    """Raw Kimi tool-call markers, as a provider that failed to parse them passes them on."""
    inner = "".join(
        f"<|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>{args}<|tool_call_end|>"
        for i, (name, args) in enumerate(calls)
    )
    return f"<|tool_calls_section_begin|>{inner}<|tool_calls_section_end|>"


@dataclass
class Answer:
    """One deterministic answer; `text_len` counts what is billed as completion tokens."""

    gen_id: str
    reasoning: str | None
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    text: TextPlan | None = None  # what the model did with functions described as text (never sent)
    reasoning_details: list[dict[str, Any]] | None = None  # OpenRouter's reasoning_details, when returned


def _prompt_chars(messages: list[Any], tools: Any) -> int:
    n = 0
    for m in messages:
        if not isinstance(m, dict):
            continue
        c = m.get("content")
        if isinstance(c, str):
            n += len(c)
        elif isinstance(c, list):
            n += sum(len(p.get("text", "")) for p in c if isinstance(p, dict))
        if m.get("tool_calls"):
            n += len(orjson.dumps(m["tool_calls"]))
    if tools:
        n += len(orjson.dumps(tools))
    return n


def kimi_call_ids(body: dict[str, Any], calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ids Moonshot's API returns: the model's own `functions.NAME:IDX`, IDX counting the calls
    of the whole conversation."""
    earlier = sum(len(m.get("tool_calls") or ()) for m in body.get("messages") or ()
                  if isinstance(m, dict) and m.get("role") == "assistant")
    return [{**c, "id": f"functions.{c['function']['name']}:{earlier + j}"} for j, c in enumerate(calls)]


UNKNOWN_VARIANT = "unknown"
UNKNOWN_EXTRA_TOKENS = 5  # what the unknown variant adds to every prompt (a line no known variant writes)


class PromptCounter:
    """usage.prompt_tokens as a provider rendering one template variant counts it. The variant is
    checked at start; the tokenizer loads on the first request (loading a large vocabulary must not
    hold up the simulator's start)."""

    def __init__(self, cfg: SimulatorConfig):
        from eyrie.jobs.reconstruct.formats import variant_names

        self.cfg = cfg
        self.unknown = cfg.template_variant == UNKNOWN_VARIANT
        known = variant_names(cfg.chat_format)
        if cfg.template_variant is not None and not self.unknown and cfg.template_variant not in known:
            raise ValueError(f"simulator template_variant {cfg.template_variant!r}: {cfg.chat_format} has "
                             f"{', '.join(known)} (or {UNKNOWN_VARIANT!r} for one eyrie does not know)")
        self.extra = UNKNOWN_EXTRA_TOKENS if self.unknown else 0
        self._lock = threading.Lock()
        self._loaded: tuple[Any, Any] | None = None
        self._rebuild: Any = None  # a Reconstructor over the same format: how the answer's tokens are cut

    _loading = threading.Lock()  # one tokenizer load at a time: several endpoints' counters share it

    def _format(self) -> tuple[Any, Any]:
        with self._lock, PromptCounter._loading:
            if self._loaded is None:
                from eyrie.jobs.reconstruct.formats import resolve_format
                from eyrie.jobs.reconstruct.tokenizers import load_tokenizer

                cfg = self.cfg
                from eyrie.jobs.reconstruct.reconstructor import Reconstructor

                tok = load_tokenizer(TargetSpec(model=MODEL_ID, tokenizer=cfg.tokenizer, chat_format=cfg.chat_format))
                self._loaded = tok, resolve_format(cfg.chat_format, tok, None if self.unknown else cfg.template_variant)
                self._rebuild = Reconstructor(self._loaded[1], tok)
            return self._loaded

    def _served_thinking(self, fmt: Any) -> bool:
        return fmt.default_thinking if self.cfg.default_thinking is None else self.cfg.default_thinking

    def __call__(self, body: dict[str, Any], ans: Answer) -> int | None:
        from eyrie.jobs.reconstruct.reconstructor import thinking_readings, turn_of
        from eyrie.jobs.reconstruct.variants import prompt_lengths

        tok, fmt = self._format()
        response = {"reasoning": ans.reasoning, "content": ans.content, "tool_calls": ans.tool_calls,
                    "finish_reason": ans.finish_reason}
        usage = {"completion_tokens_details": {"reasoning_tokens": ans.reasoning_tokens}}
        by_reading = prompt_lengths({"served": fmt}, tok, body, response, usage).get("served") or {}
        # the reading the request or answer says, else the one this provider serves when nothing does
        n = by_reading.get(thinking_readings(body, usage, turn_of(response), self._served_thinking(fmt))[0])
        return None if n is None else n + self.extra

    def completion(self, body: dict[str, Any], ans: Answer) -> tuple[int, int] | None:
        """(completion tokens, reasoning tokens) of `ans` as the model wrote it: the answer's tokens
        in the format's rendering (through its end-of-turn marker; none when cut by length), under the
        thinking reading the prompt was counted with. None when the format cannot render it."""
        from eyrie.jobs.reconstruct.base import FormatError
        from eyrie.jobs.reconstruct.reconstructor import thinking_readings, turn_of

        tok, fmt = self._format()
        response = {"reasoning": ans.reasoning, "content": ans.content, "tool_calls": ans.tool_calls,
                    "finish_reason": ans.finish_reason}
        try:
            turn = turn_of(response)
            usage = {"completion_tokens_details": {"reasoning_tokens": 1 if ans.reasoning else 0}}
            thinking = thinking_readings(body, usage, turn, self._served_thinking(fmt))[0]
            ids = self._rebuild.response_ids(fmt.render(body.get("messages") or [], body.get("tools") or None,
                                                        turn, thinking))
        except FormatError:
            return None
        if ids is None:
            return None
        return len(ids), len(tok.encode(ans.reasoning)) if ans.reasoning else 0


def count_completion(counter: PromptCounter | None, body: dict[str, Any], ans: Answer,
                     cfg: SimulatorConfig) -> Answer:
    """usage.completion_tokens as a provider counts what its model generated: with the target's
    tokenizer, the answer's own tokens, the answer cut until they fit the request's limit
    (finish_reason `length`); then `completion_token_drift`, the fault that makes the count wrong."""
    if counter is not None and (counted := counter.completion(body, ans)) is not None:
        limit = completion_limit(body, cfg)
        for _ in range(8):  # each cut keeps a share of the text: a few rounds reach the limit
            if counted is None or counted[0] <= limit:
                break
            ans = _cut(ans, 0.9 * limit / counted[0])
            counted = counter.completion(body, ans)
        if counted is not None:
            ans = replace(ans, completion_tokens=counted[0], reasoning_tokens=counted[1])
    if cfg.completion_token_drift and ans.completion_tokens:
        rng = random.Random(hashlib.sha256(f"{ans.gen_id}/drift/{cfg.seed}".encode()).digest())
        off = round(ans.completion_tokens * cfg.completion_token_drift * rng.uniform(-1, 1))
        ans = replace(ans, completion_tokens=max(0, ans.completion_tokens + off))
    return ans


THINK, THINK_END = "<think>", "</think>"
STRAYS = ("<tool_call>", "</tool_call>", "<tool_response>", "<|im_start|>")  # where a model's text leaves its part
_ANSWERED: dict[tuple[str, ...], Answer] = {}  # decoded answers by request: retries do not decode again
_ANSWERED_MAX = 4096
_ANSWERING = threading.Lock()


def _stray(text: str) -> int:
    """Where the text first writes a marker that is not reasoning or content (its end if none)."""
    return min((i for m in STRAYS if (i := text.find(m)) >= 0), default=len(text))


def _own_calls(text: str, tools: Any, ans: Answer) -> list[dict[str, Any]]:
    """The `<tool_call>` blocks the model wrote, as a Hermes tool parser returns them (arguments
    re-serialized), if every one is a valid call of a declared tool; else none."""
    from eyrie.jobs.tools.textcalls import parse_hermes
    from eyrie.jobs.tools.validation import ToolValidator

    found = parse_hermes(text)
    if not found or not tools or not all(v.valid for v in ToolValidator.for_tools(tools).check_text_calls(found)):
        return []
    return [{"id": f"call_{hashlib.sha256(f'{ans.gen_id}/{i}'.encode()).hexdigest()[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for i, c in enumerate(found)]


def _parsed_calls(text: str, ans: Answer) -> list[dict[str, Any]] | None:
    """The `<tool_call>` blocks of `text` as a provider's Hermes parser returns them: every block's
    JSON read into a name and arguments (not checked against any schema), or None when there is no
    block or one does not parse (the provider then serves the whole text as content)."""
    from eyrie.jobs.tools.textcalls import parse_hermes

    found = parse_hermes(text)
    if not found or any(c.problem is not None or not c.name for c in found):
        return None
    return [{"id": f"call_{hashlib.sha256(f'{ans.gen_id}/{i}'.encode()).hexdigest()[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": c.arguments if isinstance(c.arguments, str)
                          else json.dumps(c.arguments)}} for i, c in enumerate(found)]


def model_answer(counter: PromptCounter, body: dict[str, Any], ans: Answer, cfg: SimulatorConfig) -> Answer:
    """`api.simulator.answerModel`: the text of the answer is what that model writes, decoded on the
    prompt as the target's format renders it (greedy at temperature 0, else sampled, seeded by the
    prompt). With `answer_model_calls` "simulator", whether it calls a tool stays the simulator's
    (`ans`), so tool semantics behave as configured whatever the model knows, and the call is the
    model's own when it writes valid calls of declared tools (else the simulator's); its content runs
    to its own end of turn (cut where it starts a call the plan does not make), and prompts whose
    functions are described only as text keep the scripted text answer. With "model", the model
    decides: its `<tool_call>` blocks are the calls when the request sends `tools` (`_parsed_calls`),
    and its text as written when the functions are described in the prompt. Either way its reasoning
    runs up to its own `</think>` (the simulator closes it where the model strays into a call or
    runs past the limit)."""
    from eyrie.jobs.extract import tiny
    from eyrie.jobs.reconstruct.base import FormatError, Turn

    own = cfg.answer_model_calls == "model"
    if ans.text is not None and not own:
        return ans
    messages, tools = body.get("messages") or [], body.get("tools") or None
    limit = completion_limit(body, cfg)
    temperature = body.get("temperature")
    temperature = float(temperature) if isinstance(temperature, int | float) and not isinstance(temperature, bool) \
        else 1.0  # the API's default
    thinking = wants_reasoning(body, cfg)
    key = (str(cfg.answer_model), cfg.answer_model_calls, ans.gen_id, str(limit), str(temperature), str(thinking),
           orjson.dumps(ans.tool_calls).decode())
    with _ANSWERING:  # one decode per answer: a retry of a request still decoding waits for it
        if (done := _ANSWERED.get(key)) is not None:
            return done
        tok, fmt = counter._format()
        try:
            prompt = fmt.render(messages, tools, Turn(content=""), thinking).prompt
        except FormatError:
            return ans  # a conversation the format cannot render: the scripted answer
        folder = tiny.model_folder(str(cfg.answer_model))
        seed = int.from_bytes(hashlib.sha256(ans.gen_id.encode()).digest()[:8], "big")
        eos = tok.eos_token or ""

        def write(prefix: str, budget: int) -> tuple[str, bool]:
            """The model's text after `prompt + prefix`, and whether it ended its turn."""
            out = tiny.decode(folder, tok.encode(prompt + prefix), max(1, budget), temperature, seed)
            text = tok.decode(out)
            return text.removesuffix(eos), text.endswith(eos) if eos else False

        text, ended = write("", limit)
        reasoning, content, finish = None, None, "stop"
        if thinking and text.startswith(THINK):
            body_start = len(THINK) + 1 if text[len(THINK):].startswith("\n") else len(THINK)
            close = text.find(THINK_END)
            stray = _stray(text)
            if 0 <= close < stray:
                reasoning, after = text[body_start:close].strip("\n"), text[close + len(THINK_END):]
            else:  # it never closed its thinking by itself: the simulator does, where it strayed
                reasoning = text[body_start:stray].strip("\n")
                after, ended = write(f"{THINK}\n{reasoning}\n{THINK_END}\n\n", limit // 2)
            text = after.lstrip("\n")
        calls = ans.tool_calls
        if own:  # the model's answer as a provider serves it: its calls parsed where tools were sent
            parsed = _parsed_calls(text, ans) if tools else None
            calls = parsed or []
            if parsed:
                content = text[:text.find("<tool_call>")].strip("\n")
            else:
                content = text
                finish = "stop" if ended else "length"
        elif calls:  # the plan calls: the model's own calls when they are valid calls of declared tools
            calls = _own_calls(text, tools, ans) or calls
        else:
            cut = _stray(text)
            content = text[:cut].rstrip("\n") if cut < len(text) else text
            finish = "stop" if ended or cut < len(text) else "length"
        served = replace(ans, reasoning=reasoning or None, content=content or None, tool_calls=calls, text=None,
                         finish_reason="tool_calls" if calls else finish)
        if len(_ANSWERED) >= _ANSWERED_MAX:
            _ANSWERED.clear()
        _ANSWERED[key] = served
        return served


def _cut(ans: Answer, share: float) -> Answer:
    """The answer stopped early by the length limit: the first `share` of what it wrote (reasoning,
    then content), no tool call (a call cut short is not returned)."""
    reasoning, content = ans.reasoning or "", "" if ans.tool_calls else ans.content or ""
    keep = int((len(reasoning) + len(content)) * share)
    return replace(ans, reasoning=reasoning[:keep] or None, content=content[:max(0, keep - len(reasoning))] or None,
                   tool_calls=[], finish_reason="length")


def _tool_call(rng: random.Random, fn: dict[str, Any]) -> dict[str, Any]:
    args = _schema_value(fn.get("parameters") or {"type": "object", "properties": {}}, rng)
    return {"id": f"call_{rng.getrandbits(96):024x}", "type": "function",
            "function": {"name": str(fn.get("name", "tool")), "arguments": orjson.dumps(args).decode()}}


def _as_tools(fns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Functions read from a prompt's text as the `tools` the same prompt sends in structured mode."""
    try:
        return normalize_tools(fns)
    except DeclarationError:
        return [{"type": "function", "function": f} for f in fns]


def _functions(tools: Any) -> list[dict[str, Any]]:
    return [t["function"] for t in tools or [] if isinstance(t, dict) and isinstance(t.get("function"), dict)]


def planned_calls(messages: list[Any], tools: Any, cfg: SimulatorConfig,
                  rate: float | None = None) -> list[tuple[str, str]]:
    """The (name, arguments) the simulated model calls when it does not diverge: none after a tool
    result (it answers), else a pure function of the declared tools and the last user message, so
    a conversation's tool calls can be written down beforehand (an agentic example, a test).
    `rate` stands in for cfg.tool_call_rate (1.0: the calls it makes when it calls)."""
    fns = _functions(tools)
    if not fns or not messages or not isinstance(messages[-1], dict) or _after_tool_result(messages):
        return []
    user = next((m.get("content") for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"), "")
    rng = random.Random(hashlib.sha256(orjson.dumps([user, tools, cfg.seed], option=orjson.OPT_SORT_KEYS)).digest())
    if rng.random() >= (cfg.tool_call_rate if rate is None else rate):
        return []
    n = 2 if rng.random() < 0.25 else 1
    calls = [_tool_call(rng, rng.choice(fns))["function"] for _ in range(n)]
    return [(c["name"], c["arguments"]) for c in calls]


def _after_tool_result(messages: list[Any]) -> bool:
    """Does the request end in tool results: a `tool` message, or (functions described as text) a
    user turn of `<tool_response>` blocks, as eyrie's text-mode conversations send them?"""
    last = messages[-1]
    content = last.get("content")
    return last.get("role") == "tool" or (last.get("role") == "user" and isinstance(content, str)
                                          and content.startswith("<tool_response>"))


def _diverge(calls: list[tuple[str, str]], fns: list[dict[str, Any]], rng: random.Random) -> list[tuple[str, str]]:
    """Another tool, other arguments, or no call at all: the ways a model leaves a dataset's path."""
    kinds = ["otherArguments", "missingCall"] + (["otherTool"] if len(fns) > 1 else [])
    kind = rng.choice(kinds)
    if kind == "missingCall":
        return []
    name, args = calls[0]
    if kind == "otherTool":
        fn = rng.choice([f for f in fns if f.get("name") != name])
    else:
        fn = next(f for f in fns if f.get("name") == name)
    for _ in range(8):  # a schema with few values can draw the same arguments again
        new = _tool_call(rng, fn)["function"]
        if (new["name"], new["arguments"]) != (name, args):
            return [(new["name"], new["arguments"]), *calls[1:]]
    return []


def completion_limit(body: dict[str, Any], cfg: SimulatorConfig) -> int:
    """The request's max_completion_tokens/max_tokens, capped by the simulator's own limit."""
    for key in ("max_completion_tokens", "max_tokens"):
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return min(cfg.max_completion_tokens, v)
    return cfg.max_completion_tokens


def wants_reasoning(body: dict[str, Any], cfg: SimulatorConfig) -> bool:
    """Does the simulated model think (and return its reasoning) for this request?"""
    r_cfg = body.get("reasoning")
    if not (isinstance(r_cfg, dict) and r_cfg) and not body.get("reasoning_effort"):
        return cfg.default_thinking is True  # the request does not say: the provider's default
    return (isinstance(r_cfg, dict) and r_cfg.get("enabled", True) is not False
            and r_cfg.get("effort") != "none" and not r_cfg.get("exclude")) or bool(body.get("reasoning_effort"))


def make_answer(body: dict[str, Any], cfg: SimulatorConfig) -> Answer:
    """The answer to `body`: a pure function of (messages, tools, seed) and the length cap."""
    messages, tools = body.get("messages") or [], body.get("tools") or None
    digest = hashlib.sha256(orjson.dumps([messages, tools, cfg.seed], option=orjson.OPT_SORT_KEYS)).digest()
    rng = random.Random(digest)
    limit = completion_limit(body, cfg)
    reasoning = _text(rng, rng.randint(12, 90)) if wants_reasoning(body, cfg) else None
    content: str | None = None
    calls: list[dict[str, Any]] = []
    text_plan: TextPlan | None = None
    fns = _functions(tools)
    planned = planned_calls(messages, tools, cfg)
    if planned and rng.random() < cfg.divergence_rate:
        planned = _diverge(planned, fns, rng)
    if planned:
        calls = [{"id": f"call_{rng.getrandbits(96):024x}", "type": "function",
                  "function": {"name": name, "arguments": args}} for name, args in planned]
    elif fns and messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "tool":
        content = "Given the result: " + _text(rng, rng.randint(5, 60))
    elif not fns and (declared := declared_text_functions(messages)):
        behaviour, source = cfg.text_behaviour(messages)
        # when it calls as text, it makes the calls it makes with the tools declared structurally
        same = planned_calls(messages, _as_tools(declared), cfg, rate=1.0)
        content, text_plan = text_answer(rng, declared, behaviour, source, same, _text(rng, rng.randint(5, 60)))
    else:
        content = _text(rng, rng.randint(5, 120))
    finish = "tool_calls" if calls else "stop"
    budget = limit * 4  # characters; the simulator's tokens are 4 characters
    if reasoning and len(reasoning) > budget:
        reasoning, content, calls, finish = reasoning[:budget], None, [], "length"
    left = budget - len(reasoning or "")
    if calls and sum(len(c["function"]["arguments"]) for c in calls) > left:
        content, calls, finish = None, [], "length"
    elif content and len(content) > left:
        content, finish = content[:left] or None, "length"
    args_chars = sum(len(c["function"]["arguments"]) for c in calls)
    out_chars = len(reasoning or "") + len(content or "") + args_chars
    return Answer(
        gen_id=f"gen-{digest[:12].hex()}",
        reasoning=reasoning,
        content=content,
        tool_calls=calls,
        finish_reason=finish,
        prompt_tokens=math.ceil(_prompt_chars(messages, tools) / 4),
        completion_tokens=math.ceil(out_chars / 4),
        reasoning_tokens=math.ceil(len(reasoning or "") / 4),
        text=text_plan,
    )


def apply_content_fault(ans: Answer, fault: str, body: dict[str, Any], limit: int) -> Answer:
    """The faults that still complete (and bill): leaked markers, `length` with nothing returned."""
    if fault == "length-empty":
        return Answer(ans.gen_id, None, "", [], "length", ans.prompt_tokens, limit, 0)
    # leak: the calls the model made come back as raw markers in the content
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in ans.tool_calls]
    if not calls:
        calls = [("lookup", orjson.dumps({"query": body.get("model", "")}).decode())]
    content = (ans.content or "") + kimi_markers(calls)
    chars = len(ans.reasoning or "") + len(content)
    return Answer(ans.gen_id, ans.reasoning, content, [], "stop", ans.prompt_tokens,
                  math.ceil(chars / 4), ans.reasoning_tokens)


# -------------------------------------------------------------------- several providers of one model


# What the simulator honours or accepts; an endpoint's listing names these unless told otherwise.
SUPPORTED_PARAMETERS = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "tools",
                        "tool_choice", "reasoning", "include_reasoning", "reasoning_effort", "stop")
NO_ENDPOINT = "No allowed providers are available for the selected model."
_ENDPOINT = web.RequestKey("eyrie_endpoint", object)  # the endpoint a request was routed to
_GEN_ID = web.RequestKey("eyrie_generation", str)  # the generation's id: one per request, as OpenRouter's
_EARLY = web.RequestKey("eyrie_early", object)  # a stream whose head went out before the model's latency
GENERATIONS_KEPT = 200_000  # `GET /generation` answers for the latest this many


def check_providers(providers: list[dict[str, Any]]) -> None:
    """Each entry must be a SimulatedProvider (the spec's own model checks it), tags unique."""
    from pydantic import ValidationError

    tags = []
    for i, p in enumerate(providers):
        try:
            tags.append(SimulatedProvider.model_validate(p).tag)
        except ValidationError as e:
            raise ValueError(f"simulator providers[{i}]: {e.errors()[0]['msg']}") from None
    if len(set(tags)) != len(tags):
        raise ValueError(f"simulator providers: tags must be unique, got {tags}")


def _slug_matches(tag: str, slugs: Any) -> bool:
    """OpenRouter's base-slug matching: "deepinfra" names deepinfra and deepinfra/turbo."""
    return isinstance(slugs, list) and any(isinstance(s, str) and (tag == s or tag.startswith(s + "/"))
                                           for s in slugs)


@dataclass
class SimEndpoint:
    """One provider endpoint: its own answers (a SimulatorConfig of its own) and its own faults."""

    spec: SimulatedProvider
    cfg: SimulatorConfig
    counter: PromptCounter | None = None

    @property
    def tag(self) -> str:
        return self.spec.tag

    @property
    def name(self) -> str:
        return self.spec.name or self.spec.tag

    @property
    def parameters(self) -> tuple[str, ...]:
        listed = self.spec.supported_parameters
        return tuple(listed) if listed is not None else SUPPORTED_PARAMETERS

    def price(self) -> Decimal:
        return self.cfg.input_per_million + self.cfg.output_per_million

    def listing_entry(self, model: str) -> dict[str, Any]:
        """Its PublicEndpoint object, as OpenRouter's API reference documents it (prices per token)."""
        p = self.spec
        per_token = {"prompt": format((self.cfg.input_per_million / _MILLION).normalize(), "f"),
                     "completion": format((self.cfg.output_per_million / _MILLION).normalize(), "f"),
                     "request": "0", "image": "0"}
        return {"name": f"{self.name} | {model}", "model_id": model, "model_name": model,
                "context_length": p.context_length, "pricing": per_token, "provider_name": self.name,
                "tag": p.tag, "quantization": p.quantization,
                "max_completion_tokens": p.max_completion_tokens, "max_prompt_tokens": None,
                "supported_parameters": list(self.parameters), "status": 0, "uptime_last_30m": 100.0,
                "uptime_last_5m": 100.0, "uptime_last_1d": 100.0, "supports_implicit_caching": False,
                "latency_last_30m": None, "throughput_last_30m": None}

    def context_limit(self, body: dict[str, Any], ans: Answer) -> dict[str, Any] | None:
        """The request body cut to the completion its context window leaves (None: it fits);
        a prompt that fills the window is refused before (`too_long`)."""
        room = self.spec.context_length - ans.prompt_tokens
        cap = min(x for x in (room, self.spec.max_completion_tokens) if x is not None)
        if ans.completion_tokens <= cap:
            return None
        return {**body, "max_tokens": max(1, cap), "max_completion_tokens": max(1, cap)}

    def too_long(self, ans: Answer) -> bool:
        return ans.prompt_tokens >= self.spec.context_length

    def degrade(self, body: dict[str, Any], ans: Answer) -> Answer:
        """Its faults on a completed answer: tool calls whose arguments break the schema, calls
        leaked as raw markers, reasoning summarised or encrypted or withheld. Deterministic per
        (answer, endpoint)."""
        p = self.spec
        rng = random.Random(hashlib.sha256(f"{ans.gen_id}/{p.tag}/{self.cfg.seed}".encode()).digest())
        if ans.tool_calls and p.schema_error_rate:
            fns = {f.get("name"): f for f in _functions(body.get("tools"))}
            ans = replace(ans, tool_calls=[_break_arguments(c, fns) if rng.random() < p.schema_error_rate else c
                                           for c in ans.tool_calls])
        if ans.tool_calls and p.leak_rate and rng.random() < p.leak_rate:
            ans = apply_content_fault(ans, "leak", body, completion_limit(body, self.cfg))
        if ans.reasoning and p.reasoning != "full":
            text, details = ans.reasoning, None
            if p.reasoning == "summarised":
                details = [{"type": "reasoning.summary", "summary": "Summary: " + text[: max(8, len(text) // 5)],
                            "id": f"rs-{ans.gen_id}", "format": "unknown", "index": 0}]
            elif p.reasoning == "encrypted":
                data = hashlib.sha256(text.encode()).hexdigest()
                details = [{"type": "reasoning.encrypted", "data": data, "id": f"re-{ans.gen_id}",
                            "format": "unknown", "index": 0}]
            ans = replace(ans, reasoning=None, reasoning_details=details)
        return ans


def _break_arguments(call: dict[str, Any], fns: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    """The call with arguments that break its function's schema (`simulated_text.break_arguments`)."""
    fn = call["function"]
    broken = break_arguments(fn["arguments"], fns.get(fn["name"], {}).get("parameters"))
    return {**call, "function": {**fn, "arguments": broken}}


class SimEndpoints:
    """The endpoints of the model and OpenRouter's routing over them (provider-selection guide):
    `only`/`ignore` with base-slug matching, `quantizations`, `require_parameters`, then `order`
    (with `allow_fallbacks: false` nothing outside it), else the cheapest first."""

    def __init__(self, cfg: SimulatorConfig):
        self.cfg = cfg
        self.items: list[SimEndpoint] = []
        for raw in cfg.providers:
            p = SimulatedProvider.model_validate(raw)
            own = replace(
                cfg, providers=[],
                latency_ms=p.latency_ms if p.latency_ms is not None else cfg.latency_ms,
                tool_call_rate=p.tool_call_rate if p.tool_call_rate is not None else cfg.tool_call_rate,
                template_variant=p.template_variant if p.template_variant is not None else cfg.template_variant,
                input_per_million=p.input_per_million if p.input_per_million is not None else cfg.input_per_million,
                output_per_million=(p.output_per_million if p.output_per_million is not None
                                    else cfg.output_per_million))
            self.items.append(SimEndpoint(p, own, PromptCounter(own) if own.tokenizer else None))
        # load the tokenizer in the background now: a probe measures each endpoint's latency, and
        # the first answers must not carry the load
        for e in self.items:
            if e.counter is not None:
                threading.Thread(target=e.counter._format, daemon=True, name=f"sim-load-{e.tag}").start()

    def route(self, body: dict[str, Any]) -> SimEndpoint | None:
        """The endpoint that serves `body` (None: none may: OpenRouter's 404)."""
        prov = body.get("provider") if isinstance(body.get("provider"), dict) else {}
        eps = list(self.items)
        if "only" in prov:
            eps = [e for e in eps if _slug_matches(e.tag, prov["only"])]
        if "ignore" in prov:
            eps = [e for e in eps if not _slug_matches(e.tag, prov["ignore"])]
        if isinstance(prov.get("quantizations"), list):
            eps = [e for e in eps if e.spec.quantization in prov["quantizations"]]
        if prov.get("require_parameters"):
            sent = {k for k in body if k in SUPPORTED_PARAMETERS}
            eps = [e for e in eps if sent <= set(e.parameters)]
        order = prov.get("order") if isinstance(prov.get("order"), list) else []
        ordered = [e for slug in order for e in eps if _slug_matches(e.tag, [slug])]
        if order and prov.get("allow_fallbacks") is False:
            eps = ordered
        else:
            eps = ordered + sorted((e for e in eps if e not in ordered), key=lambda e: (e.price(), e.tag))
        return eps[0] if eps else None

    def listed(self) -> list[SimEndpoint]:
        """What the listing names: the configured endpoints, or the simulator itself."""
        return self.items or [SimEndpoint(SimulatedProvider(tag=PROVIDER), self.cfg)]

    def listing(self, model: str) -> dict[str, Any]:
        return {"data": {"id": model, "name": model, "created": 0, "description": "simulated (eyrie simulator)",
                         "architecture": {"tokenizer": "Other", "instruct_type": None, "modality": "text->text",
                                          "input_modalities": ["text"], "output_modalities": ["text"]},
                         "endpoints": [e.listing_entry(model) for e in self.listed()]}}


# -------------------------------------------------------------------------------------- the server


def _error_body(code: int, message: str, **meta: Any) -> bytes:
    err: dict[str, Any] = {"code": code, "message": message}
    if meta:
        err["metadata"] = meta
    return orjson.dumps({"error": err})


_HTTP_FAULTS: dict[str, tuple[int, str]] = {
    "429": (429, "Rate limit exceeded: simulated upstream limit"),
    "429-no-retry-after": (429, "Rate limit exceeded: simulated upstream limit"),
    "500": (500, "Internal Server Error (simulated)"),
    "502": (502, "Provider returned error (simulated)"),
    "503": (503, "No instances available (simulated)"),
    "402": (402, "Insufficient credits. Add more using https://openrouter.ai/settings/credits (simulated)"),
    "402-in-flight": (402, "This request would exceed your available credits given your current in-flight "
                      "requests. Retry after in-flight requests settle, or add credits. (simulated)"),
    "403-moderation": (403, "Input flagged by moderation (simulated)"),
}


def _flagged(messages: list[Any]) -> str:
    """The flagged text as OpenRouter reports it: at most 100 characters, cut in the middle."""
    text = str(messages[-1].get("content") if isinstance(messages[-1], dict) else messages[-1])
    return text if len(text) <= 100 else text[:48] + "..." + text[-49:]


class _Sim:
    """Request handling and counters; one per server."""

    def __init__(self, cfg: SimulatorConfig):
        self.cfg = cfg
        self.faults = tuple(cfg.faults) or DEFAULT_FAULTS
        self.prompt_counter = PromptCounter(cfg) if cfg.tokenizer else None
        self.endpoints = SimEndpoints(cfg)
        self.reset()

    def warm(self) -> None:
        """Load what the first answer needs (the target's tokenizer and format; `answerModel`'s weights) before
        it is asked for: otherwise the first requests wait for it, ~10 s of torch and the model on a loaded 2-core
        machine, while the client starting up (a local run's Ray) leaves the simulator idle."""
        if self.prompt_counter is None:
            return
        self.prompt_counter._format()
        if self.cfg.answer_model:
            from eyrie.jobs.extract import tiny

            tiny.preload(tiny.model_folder(str(self.cfg.answer_model)))

    def reset(self) -> None:
        self.rng = random.Random(self.cfg.seed)
        self.requests = 0
        self.completed = 0
        self.billed = Decimal(0)
        self.credits = Decimal(0)  # what the key's `usage` says: the billed cost without BYOK's upstream part
        self.byok = Decimal(0)
        self.generations: dict[str, dict[str, Any]] = {}  # id -> what `GET /generation` says (finished ones)
        self.generation_seq = 0
        self.fault_counts: Counter[str] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self.by_provider: Counter[str] = Counter()  # requests routed to each endpoint (several providers)

    def stats(self) -> dict[str, Any]:
        return {"requests": self.requests, "completed": self.completed, "billedUSD": str(self.billed),
                "faults": dict(self.fault_counts), "inFlight": self.in_flight,
                "maxInFlight": self.max_in_flight,
                **({"byProvider": dict(self.by_provider)} if self.endpoints.items else {})}

    def _cost(self, ans: Answer, cfg: SimulatorConfig | None = None) -> float:
        cfg = cfg or self.cfg
        c = (ans.prompt_tokens * cfg.input_per_million + ans.completion_tokens * cfg.output_per_million) / _MILLION
        return float(c)

    def _bill(self, usage: dict[str, Any], request: web.Request) -> None:
        """Bill exactly what the usage tells the client: `cost`, plus with BYOK what the provider
        charged the user's own key (usage accounting: cost_details.upstream_inference_cost); the
        generation's record says the same (`GET /generation?id=`)."""
        self.completed += 1
        self.billed += Decimal(str(usage["cost"]))
        self.credits += Decimal(str(usage["cost"]))
        upstream = usage["cost_details"]["upstream_inference_cost"] if usage["is_byok"] else None
        if upstream is not None:
            self.billed += Decimal(str(upstream))
            self.byok += Decimal(str(upstream))
        self._record_generation(request, usage["cost"], cancelled=False, usage=usage, upstream=upstream)

    def _record_generation(self, request: web.Request, cost: float, *, cancelled: bool,
                           usage: dict[str, Any] | None = None, upstream: float | None = None) -> None:
        gen = request.get(_GEN_ID)
        if gen is None or gen in self.generations:
            return
        if len(self.generations) >= GENERATIONS_KEPT:
            del self.generations[next(iter(self.generations))]
        endpoint = request.get(_ENDPOINT)
        self.generations[gen] = {
            "id": gen, "total_cost": cost, "usage": cost, "is_byok": upstream is not None,
            "upstream_inference_cost": upstream, "cancelled": cancelled,
            "streamed": request.get(_EARLY) is not None, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "provider_name": endpoint.name if endpoint is not None else PROVIDER,
            "tokens_prompt": (usage or {}).get("prompt_tokens", 0),
            "tokens_completion": (usage or {}).get("completion_tokens", 0),
            "finish_reason": None if cancelled else "stop"}

    async def generation(self, request: web.Request) -> web.StreamResponse:
        """GET /generation?id=: a finished generation's cost and tokens, as documented; 404 for one
        unknown or still running (OpenRouter stores a generation once it ends)."""
        if (denied := self._auth(request)) is not None:
            return denied
        doc = self.generations.get(request.query.get("id", ""))
        if doc is None:
            return web.Response(status=404, body=_error_body(404, "Generation not found"),
                                content_type="application/json")
        return web.Response(body=orjson.dumps({"data": doc}), content_type="application/json")

    async def key(self, request: web.Request) -> web.StreamResponse:
        """GET /key: the key's `usage` (credits billed so far; BYOK's upstream part in `byok_usage`)."""
        if (denied := self._auth(request)) is not None:
            return denied
        used, byok = float(self.credits), float(self.byok)
        return web.Response(body=orjson.dumps({"data": {
            "label": "sk-or-v1-sim...", "limit": None, "limit_remaining": None, "limit_reset": None,
            "usage": used, "usage_daily": used, "usage_weekly": used, "usage_monthly": used,
            "byok_usage": byok, "byok_usage_daily": byok, "byok_usage_weekly": byok, "byok_usage_monthly": byok,
            "include_byok_in_limit": False, "is_free_tier": False, "is_management_key": False,
            "is_provisioning_key": False}}), content_type="application/json")

    def _usage(self, ans: Answer, byok: bool = False, cfg: SimulatorConfig | None = None) -> dict[str, Any]:
        cost = self._cost(ans, cfg)
        usage = {"prompt_tokens": ans.prompt_tokens, "completion_tokens": ans.completion_tokens,
                 "total_tokens": ans.prompt_tokens + ans.completion_tokens, "cost": cost,
                 "is_byok": False, "cost_details": {"upstream_inference_cost": None},
                 "prompt_tokens_details": {"cached_tokens": 0},
                 "completion_tokens_details": {"reasoning_tokens": ans.reasoning_tokens}}
        if byok:  # the provider bills the user's key the price; OpenRouter's credits only its fee
            usage.update(cost=round(cost * BYOK_FEE, 12), is_byok=True,
                         cost_details={"upstream_inference_cost": cost})
        return usage

    async def models(self, request: web.Request) -> web.StreamResponse:
        if (denied := self._auth(request)) is not None:
            return denied
        return web.Response(body=orjson.dumps({"object": "list", "data": [
            {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": PROVIDER}]}),
            content_type="application/json")

    async def endpoints_listing(self, request: web.Request) -> web.StreamResponse:
        """GET /models/{author}/{slug}/endpoints: the documented listing (404 for another model)."""
        if (denied := self._auth(request)) is not None:
            return denied
        model = f"{request.match_info['author']}/{request.match_info['slug']}"
        if self.cfg.model is not None and model != self.cfg.model:
            return web.Response(status=404, body=_error_body(404, "Model not found"), content_type="application/json")
        return web.Response(body=orjson.dumps(self.endpoints.listing(model)), content_type="application/json")

    async def get_stats(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=orjson.dumps(self.stats()), content_type="application/json")

    async def post_reset(self, request: web.Request) -> web.StreamResponse:
        self.reset()
        return web.Response(body=orjson.dumps(self.stats()), content_type="application/json")

    def _auth(self, request: web.Request) -> web.Response | None:
        if self.cfg.api_key is None or request.headers.get("Authorization") == f"Bearer {self.cfg.api_key}":
            return None
        return web.Response(status=401, body=_error_body(401, "No auth credentials found"),
                            content_type="application/json")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.generation_seq += 1
        request[_GEN_ID] = f"gen-{self.generation_seq}-{os.urandom(6).hex()}"
        try:
            return await self._chat(request)
        finally:
            self.in_flight -= 1
            # not billed (an error, a cut stream, a client that hung up): the record says so, at no cost
            self._record_generation(request, 0.0, cancelled=True)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if (denied := self._auth(request)) is not None:
            return denied
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as e:
            return web.Response(status=400, body=_error_body(400, f"request body is not JSON: {e}"),
                                content_type="application/json")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            return web.Response(status=400, body=_error_body(400, "messages: a non-empty array is required"),
                                content_type="application/json")
        if not isinstance(body.get("model"), str):
            return web.Response(status=400, body=_error_body(400, "model: a string is required"),
                                content_type="application/json")
        endpoint = None
        if self.endpoints.items:  # several providers: route as OpenRouter does, answer as that one
            endpoint = self.endpoints.route(body)
            if endpoint is None:
                return web.Response(status=404, body=_error_body(404, NO_ENDPOINT), content_type="application/json")
            self.by_provider[endpoint.tag] += 1
        cfg = endpoint.cfg if endpoint is not None else self.cfg
        fault = None
        if self.cfg.fault_rate and self.rng.random() < self.cfg.fault_rate:
            fault = self.rng.choice(self.faults)
            self.fault_counts[fault] += 1
        if cfg.latency_ms and body.get("stream") and endpoint is None and fault in (None, "leak", "byok"):
            # as OpenRouter streams: the head (and the generation's id) at once, the model's tokens later
            early = web.StreamResponse(headers={**_SSE_HEADERS, "X-Generation-Id": request[_GEN_ID]})
            await early.prepare(request)
            await early.write(_COMMENT + self._chunk(self._head(body, "chat.completion.chunk", request),
                                                     {"role": "assistant", "content": ""}))
            request[_EARLY] = early
        if cfg.latency_ms:
            await asyncio.sleep(cfg.latency_ms / 1000)
        if fault in _HTTP_FAULTS:
            status, msg = _HTTP_FAULTS[fault]
            meta: dict[str, Any] = {"provider_name": PROVIDER}
            if fault == "402-in-flight":  # the limits page's in-flight spending budget 402
                meta = {"reason": "in_flight_budget_exhausted", "limit_source": "openrouter_in_flight_budget",
                        "remedy_hint": "Retry after your in-flight requests settle (see the Retry-After header)."}
            elif fault == "403-moderation":  # the errors page's ModerationErrorMetadata
                meta = {"reasons": ["harassment"], "flagged_input": _flagged(body["messages"]),
                        "provider_name": PROVIDER, "model_slug": body["model"]}
            retry = fault in ("429", "402-in-flight")
            headers = {"Retry-After": str(self.cfg.retry_after_s)} if retry else None
            return web.Response(status=status, body=_error_body(status, msg, **meta),
                                headers=headers, content_type="application/json")
        if fault == "timeout":
            await asyncio.sleep(self.cfg.hang_s)  # cancelled when the client hangs up
            return web.Response(status=504, body=_error_body(504, "simulated hang ended"),
                                content_type="application/json")
        ans = make_answer(body, cfg)
        counter = endpoint.counter if endpoint is not None else self.prompt_counter
        cut = None
        if endpoint is not None and (cut := endpoint.context_limit(body, ans)) is not None:
            if endpoint.too_long(ans):
                return web.Response(status=400, body=_error_body(
                    400, f"This endpoint's maximum context length is {endpoint.spec.context_length} tokens. "
                    f"However, you requested about {ans.prompt_tokens} tokens.", provider_name=endpoint.name),
                    content_type="application/json")
            ans = make_answer(cut, cfg)  # the answer as far as its context window lets it go
        if cfg.answer_model and counter is not None:
            ans = await asyncio.to_thread(model_answer, counter, cut or body, ans, cfg)
        if self.cfg.chat_format == "kimi-k2.5" and ans.tool_calls:
            ans = replace(ans, tool_calls=kimi_call_ids(body, ans.tool_calls))
        if counter is not None:
            counted = await asyncio.to_thread(counter, body, ans)
            ans = replace(ans, prompt_tokens=ans.prompt_tokens if counted is None else counted)
        ans = await asyncio.to_thread(count_completion, counter, cut or body, ans, cfg)
        if endpoint is not None:
            ans = endpoint.degrade(body, ans)
        if fault in ("leak", "length-empty"):
            ans = apply_content_fault(ans, fault, body, completion_limit(body, cfg))
        request[_ENDPOINT] = endpoint
        if body.get("stream"):
            return await self._stream(request, body, ans, fault)
        return await self._plain(request, body, ans, fault)

    def _head(self, body: dict[str, Any], obj: str, request: web.Request) -> dict[str, Any]:
        endpoint = request.get(_ENDPOINT)
        return {"id": request[_GEN_ID], "provider": endpoint.name if endpoint is not None else PROVIDER,
                "model": body["model"], "object": obj, "created": int(time.time())}

    @staticmethod
    def _chunk(head: dict[str, Any], delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        c = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                  "native_finish_reason": finish, "logprobs": None}], **extra}
        return b"data: " + orjson.dumps(c) + b"\n\n"

    def _usage_of(self, request: web.Request, ans: Answer, byok: bool) -> dict[str, Any]:
        endpoint = request.get(_ENDPOINT)
        return self._usage(ans, byok, endpoint.cfg if endpoint is not None else None)

    async def _plain(self, request: web.Request, body: dict[str, Any], ans: Answer,
                     fault: str | None) -> web.StreamResponse:
        if fault == "200-error":
            return web.Response(body=_error_body(502, "Provider returned error (simulated)",
                                                 provider_name=PROVIDER), content_type="application/json")
        if fault == "malformed-json":
            return web.Response(body=orjson.dumps(self._head(body, "chat.completion", request))[:-1]
                                + b', "choices": [{"message": {"content": "unterminated',
                                content_type="application/json")
        if fault == "empty-choices":
            empty = {**self._head(body, "chat.completion", request), "choices": []}
            return web.Response(body=orjson.dumps(empty), content_type="application/json")
        usage = self._usage_of(request, ans, fault == "byok")
        message: dict[str, Any] = {"role": "assistant", "content": ans.content, "refusal": None,
                                   "reasoning": ans.reasoning}
        if ans.reasoning_details is not None:
            message["reasoning_details"] = ans.reasoning_details
        if ans.tool_calls:
            message["tool_calls"] = ans.tool_calls
        out = {**self._head(body, "chat.completion", request),
               "choices": [{"index": 0, "logprobs": None, "finish_reason": ans.finish_reason,
                            "native_finish_reason": ans.finish_reason, "message": message}],
               "usage": usage}
        data = orjson.dumps(out)
        if fault == "stream-cut":  # the body stops half-way; the connection closes
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.content_length = len(data)
            await resp.prepare(request)
            await resp.write(data[: len(data) // 2])
            _hang_up(request)
            return resp
        self._bill(usage, request)
        return web.Response(body=data, content_type="application/json", headers={"X-Generation-Id": request[_GEN_ID]})

    async def _stream(self, request: web.Request, body: dict[str, Any], ans: Answer,
                      fault: str | None) -> web.StreamResponse:
        head = self._head(body, "chat.completion.chunk", request)

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
            return self._chunk(head, delta, finish, **extra)

        early: web.StreamResponse | None = request.get(_EARLY)
        parts: list[bytes] = [] if early is not None else [_COMMENT, chunk({"role": "assistant", "content": ""})]
        for p in _pieces(ans.reasoning or ""):
            parts.append(chunk({"role": "assistant", "content": "", "reasoning": p}))
        if ans.reasoning_details is not None:
            parts.append(chunk({"role": "assistant", "content": "", "reasoning_details": ans.reasoning_details}))
        parts.append(_COMMENT)
        for p in _pieces(ans.content or ""):
            parts.append(chunk({"role": "assistant", "content": p}))
        for i, call in enumerate(ans.tool_calls):
            fn = call["function"]
            parts.append(chunk({"role": "assistant", "content": None, "tool_calls": [
                {"index": i, "id": call["id"], "type": "function",
                 "function": {"name": fn["name"], "arguments": ""}}]}))
            for p in _pieces(fn["arguments"]):
                parts.append(chunk({"role": "assistant", "content": None, "tool_calls": [
                    {"index": i, "function": {"arguments": p}}]}))
        if fault is None or fault in ("leak", "length-empty", "byok"):
            # the whole stream in one write: at thousands of requests/s the simulator must not be
            # what is measured (clients see it split anyway; the faults below write in pieces)
            usage = self._usage_of(request, ans, fault == "byok")
            parts.append(chunk({}, ans.finish_reason, usage=usage))
            parts.append(_DONE)
            if early is not None:
                await early.write(b"".join(parts))
                await early.write_eof()
                self._bill(usage, request)
                return early
            self._bill(usage, request)
            return web.Response(body=b"".join(parts), headers={**_SSE_HEADERS, "X-Generation-Id": request[_GEN_ID]})
        resp = web.StreamResponse(headers={**_SSE_HEADERS, "X-Generation-Id": request[_GEN_ID]})
        await resp.prepare(request)
        half = max(1, len(parts) // 2)
        if fault == "stream-cut":
            await resp.write(b"".join(parts[:half]))
            _hang_up(request)
            return resp
        if fault == "200-error":
            parts[half:] = [chunk({"content": ""}, "error", error={
                "code": 502, "message": "Provider disconnected (simulated)",
                "metadata": {"provider_name": PROVIDER}})]
        elif fault == "malformed-json":
            parts[half:] = [b'data: {"id": "' + request[_GEN_ID].encode() + b'", "choices": [{"delta": {"cont\n\n',
                            _DONE]
        else:  # empty-choices
            parts = [_COMMENT, b"data: " + orjson.dumps({**head, "choices": []}) + b"\n\n", _DONE]
        await resp.write(b"".join(parts[:half]))
        await resp.write(b"".join(parts[half:]))
        await resp.write_eof()
        return resp


_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_PIECE_SIZES = (17, 31, 8, 45, 23, 12, 38, 27)


def _pieces(text: str) -> list[str]:
    """Deterministic uneven pieces of a streamed text."""
    out, i, k = [], 0, 0
    while i < len(text):
        n = _PIECE_SIZES[k % len(_PIECE_SIZES)]
        out.append(text[i:i + n])
        i, k = i + n, k + 1
    return out


def _hang_up(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.close()


class SimulatorServer:
    """An in-process simulator on the running event loop."""

    def __init__(self, sim: _Sim, runner: web.AppRunner, base_url: str):
        self._sim = sim
        self._runner = runner
        self.base_url = base_url
        self.config = sim.cfg

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1].split("/", 1)[0])

    async def stats(self) -> dict[str, Any]:
        return self._sim.stats()

    def reset(self) -> None:
        self._sim.reset()

    def warm(self) -> None:
        """_Sim.warm, for a background thread: a failure is left to the request that needs the load, which
        reports it to the client."""
        with contextlib.suppress(Exception):
            self._sim.warm()

    async def close(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> SimulatorServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def build_app(sim: _Sim) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", sim.chat)
    app.router.add_post("/chat/completions", sim.chat)
    app.router.add_get("/v1/models", sim.models)
    app.router.add_get("/models", sim.models)
    app.router.add_get("/v1/models/{author}/{slug}/endpoints", sim.endpoints_listing)
    app.router.add_get("/models/{author}/{slug}/endpoints", sim.endpoints_listing)
    app.router.add_get("/v1/generation", sim.generation)
    app.router.add_get("/generation", sim.generation)
    app.router.add_get("/v1/key", sim.key)
    app.router.add_get("/key", sim.key)
    app.router.add_get("/sim/stats", sim.get_stats)
    app.router.add_post("/sim/reset", sim.post_reset)
    return app


async def start_simulator(config: SimulatorConfig | None = None, host: str = "127.0.0.1",
                          port: int = 0) -> SimulatorServer:
    """Serve on host:port (0 = a free port); handlers are cancelled when their client hangs up."""
    sim = _Sim(config or SimulatorConfig())
    runner = web.AppRunner(build_app(sim), handler_cancellation=True, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=8192)
    await site.start()
    bound = runner.addresses[0][1]
    url_host = f"[{host}]" if ":" in host else host
    return SimulatorServer(sim, runner, f"http://{url_host}:{bound}/v1")


# ------------------------------------------------------------------------------- child process


_LISTENING_RE = re.compile(r"listening on (http://\S+)")


class SimulatorProcess:
    """The simulator in a child process on loopback (reachable from Ray workers); stopped by PID."""

    def __init__(self, config: SimulatorConfig | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 startup_timeout: float = 30.0):
        self.config = config or SimulatorConfig()
        self.host, self.port = host, port
        self.startup_timeout = startup_timeout
        self.base_url = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("simulator process not started")
        return self._proc.pid

    def start(self) -> SimulatorProcess:
        cmd = [sys.executable, "-m", "eyrie.jobs.simulator", "--host", self.host, "--port", str(self.port),
               "--config-json", self.config.to_json(), "--parent-pid", str(os.getpid())]
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the child; closed in stop()
        # its own session: a Ctrl-C meant for the run (which drains in-flight requests) must not
        # kill the provider those requests are waiting on; stop() ends it by PID.
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        assert self._proc.stdout is not None
        deadline = time.monotonic() + self.startup_timeout
        line = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self._proc.stdout], [], [], 0.1)
            if ready:
                line = self._proc.stdout.readline()
                if m := _LISTENING_RE.search(line.decode(errors="replace")):
                    self.base_url = m.group(1)
                    return self
                if not line:
                    break
            elif self._proc.poll() is not None:
                break
        self._stderr.seek(0)
        tail = self._stderr.read()[-2000:].decode(errors="replace")
        self.stop()
        raise RuntimeError(f"simulator did not start within {self.startup_timeout}s: {tail or line!r}")

    def stats(self) -> dict[str, Any]:
        import httpx

        r = httpx.get(self.base_url.removesuffix("/v1") + "/sim/stats", timeout=10, trust_env=False)
        r.raise_for_status()
        return r.json()

    def stop(self, grace: float = 3.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(grace)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> SimulatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------------------------------------------ CLI


def _raise_nofile_limit() -> None:
    """Thousands of concurrent connections need as many descriptors as the hard limit allows."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 65536 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def _warm_own_process(server: SimulatorServer, config: SimulatorConfig) -> None:
    """Warm the simulator of this process (`eyrie simulate`, SimulatorProcess), which owns torch's thread
    count: one thread, since decoding one token at a time through a tiny model gives more threads nothing
    but contention (on a loaded 2-core machine they spin against each other). Only here: a simulator
    started in another program's process (`start_simulator`) leaves that program's setting alone."""
    if config.answer_model:
        import torch

        torch.set_num_threads(1)
    server.warm()


async def _serve(config: SimulatorConfig, host: str, port: int, parent_pid: int | None) -> None:
    server = await start_simulator(config, host, port)
    print(f"eyrie simulator (a demo/test tool, not a real model) listening on {server.base_url}", flush=True)
    # the tokenizer and answer model load while the client starts (a local run's Ray), not on its first requests
    threading.Thread(target=_warm_own_process, args=(server, config), name="simulator-warm", daemon=True).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            if parent_pid is not None and os.getppid() != parent_pid:
                break  # the parent died (e.g. kill -9): do not linger as an orphan
    finally:
        await server.close()


def cli_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="eyrie simulate",
        description="Run the built-in SIMULATED OpenAI-compatible provider, a tool for demos and tests: "
        "scripted deterministic answers (reasoning, content, tool calls), usage.cost, latency and "
        "injected faults. It is not a model; never point real work at it. Binds 127.0.0.1 by default.",
    )
    p.add_argument("--port", type=int, default=0, help="port (0 = a free one; the URL is printed)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1, loopback only)")
    p.add_argument("--latency-ms", type=float, help="delay before each answer")
    p.add_argument("--fault-rate", type=float, help="share of requests that get a fault, 0..1")
    p.add_argument("--fault", action="append", choices=FAULTS, metavar="NAME",
                   help=f"a fault to inject (repeatable): {', '.join(FAULTS)}")
    p.add_argument("--seed", type=int, help="seed of answers and fault draws")
    p.add_argument("--config-json", help="a full SimulatorConfig as JSON (flags above override it)")
    p.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    try:
        config = SimulatorConfig.from_json(a.config_json) if a.config_json else SimulatorConfig()
        for name in ("latency_ms", "fault_rate", "seed"):
            if getattr(a, name) is not None:
                setattr(config, name, getattr(a, name))
        if a.fault:
            config.faults = list(a.fault)
        config.__post_init__()
    except (ValueError, TypeError) as e:
        print(f"eyrie simulate: {e}", file=sys.stderr)
        return 2
    _raise_nofile_limit()
    try:
        asyncio.run(_serve(config, a.host, a.port, a.parent_pid))
    except OSError as e:
        print(f"eyrie simulate: cannot listen on {a.host}:{a.port}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(cli_main(sys.argv[1:]))
