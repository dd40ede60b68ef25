"""The simulated model's answers: deterministic per prompt (reasoning, content, tool calls that validate against
their schemas, text-declared calls), or with `answerModel` a builtin chat model's own decoded text; and the usage a
provider counts for them (prompt tokens as a template variant renders the prompt, completion tokens as the
target's tokenizer writes the answer). Pure functions of (request, config) but for the model's decode cache."""

from __future__ import annotations

import hashlib
import json
import math
import random
import threading
from dataclasses import dataclass, replace
from typing import Any

import orjson

from eyrie.jobs.simulator.config import MODEL_ID, SimulatorConfig
from eyrie.jobs.simulator.text import TextPlan, text_answer
from eyrie.jobs.spec import TargetSpec
from eyrie.jobs.tools.declarations import DeclarationError, normalize_tools, parse_text_declarations

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




def schema_value(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A value that validates against a (practical subset of) JSON Schema."""
    if not isinstance(schema, dict):
        return rng.choice(_WORDS)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return schema_value(schema[key][0], rng, depth)
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
        return schema_value({**{k: v for k, v in schema.items() if k != "allOf"}, **merged}, rng, depth)
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
                out[name] = schema_value(sub, rng, depth + 1)
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
                v = schema_value(items, rng, depth + 1)
                if v not in vals:
                    vals.append(v)
                if len(vals) == n:
                    break
            return vals
        return [schema_value(items, rng, depth + 1) for _ in range(n)]
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

    def load(self) -> tuple[Any, Any]:
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

        tok, fmt = self.load()
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

        tok, fmt = self.load()
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
        tok, fmt = counter.load()
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
    args = schema_value(fn.get("parameters") or {"type": "object", "properties": {}}, rng)
    return {"id": f"call_{rng.getrandbits(96):024x}", "type": "function",
            "function": {"name": str(fn.get("name", "tool")), "arguments": orjson.dumps(args).decode()}}


def _as_tools(fns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Functions read from a prompt's text as the `tools` the same prompt sends in structured mode."""
    try:
        return normalize_tools(fns)
    except DeclarationError:
        return [{"type": "function", "function": f} for f in fns]


def tool_functions(tools: Any) -> list[dict[str, Any]]:
    """The functions a request's structured `tools` declare (what an endpoint's schema faults break too)."""
    return [t["function"] for t in tools or [] if isinstance(t, dict) and isinstance(t.get("function"), dict)]


def planned_calls(messages: list[Any], tools: Any, cfg: SimulatorConfig,
                  rate: float | None = None) -> list[tuple[str, str]]:
    """The (name, arguments) the simulated model calls when it does not diverge: none after a tool
    result (it answers), else a pure function of the declared tools and the last user message, so
    a conversation's tool calls can be written down beforehand (an agentic example, a test).
    `rate` stands in for cfg.tool_call_rate (1.0: the calls it makes when it calls)."""
    fns = tool_functions(tools)
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
    fns = tool_functions(tools)
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
