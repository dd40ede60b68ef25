"""A recorded text-mode dataset as the engineer in issue 45 had it: glaive-style rows whose answers
carry Kimi K2.5's native call markers in the content (wrong argument names, missing required
arguments, a bad enum, a string for a number, an undeclared function, a call `maxTokens` cut), two
multi-turn rows, and the same answers in the shapes training data is usually kept in (OpenAI
fine-tuning `messages`, ShareGPT `conversations`). Every expected count is known by construction
(`EXPECT`), never read from the code under test."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from eyrie.jobs.reconstruct import kimi_facts as kimi

MODEL = "moonshotai/kimi-k2.5"
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
               "required": ["city"]}}
DISCOUNT = {"name": "calculate_discount", "description": "Price after a discount",
            "parameters": {"type": "object", "properties": {
                "original_price": {"type": "number"}, "discount_percentage": {"type": "number"}},
                "required": ["original_price", "discount_percentage"]}}


def system(*functions: dict[str, Any]) -> str:
    return ("SYSTEM: You are a helpful assistant with access to the following functions. Use them if required -\n"
            + "\n".join(json.dumps(f, indent=4) for f in functions))


def call(name: str, args: dict[str, Any] | str, idx: int = 0, closed: bool = True) -> str:
    body = args if isinstance(args, str) else json.dumps(args)
    text = f"{kimi.SECTION_BEGIN}{kimi.CALL_BEGIN}functions.{name}:{idx}{kimi.CALL_ARG_BEGIN}{body}"
    return text + (f"{kimi.CALL_END}{kimi.SECTION_END}" if closed else "")


# (case, functions declared, the answer's content, why its call is invalid (None: valid; "-": no call), rows)
CASES: list[tuple[str, tuple[dict[str, Any], ...], str, str | None, int]] = [
    ("weather", (WEATHER,), call("get_weather", {"city": "Paris"}), None, 5),
    ("weather-enum", (WEATHER,), call("get_weather", {"city": "Oslo", "unit": "kelvin"}), "not in enum", 1),
    ("weather-cut", (WEATHER,), call("get_weather", '{"city": "Li', closed=False), "never closed", 1),
    ("undeclared", (WEATHER,), call("book_hotel", {"city": "Paris"}), "undeclared function", 1),
    ("prose", (WEATHER,), "It is usually mild in Paris in spring.", "-", 3),
    ("discount", (DISCOUNT,), call("calculate_discount", {"original_price": 80, "discount_percentage": 10}), None, 2),
    ("discount-renamed", (DISCOUNT,), call("calculate_discount", {"price": 100, "discount_percentage": 20}),
     "missing required", 2),
    ("discount-missing", (DISCOUNT,), call("calculate_discount", {"original_price": 100}), "missing required", 2),
    ("discount-string", (DISCOUNT,), call("calculate_discount", {"original_price": "100", "discount_percentage": 5}),
     "wrong type", 1),
]
USAGE = {"prompt_tokens": 400, "completion_tokens": 120}  # no cost: priced at the spec's prices
MULTI_TURN = 2  # rows with an earlier call and its result, then the answer (a valid get_weather call)


def _rows(shape: str) -> list[dict[str, Any]]:
    rows = []
    for case, functions, content, _why, n in CASES:
        for i in range(n):
            user = f"{case} {i}: what now?"
            rows.append(_row(shape, functions, [("user", user)], content))
    earlier = call("get_weather", {"city": "Rome"})
    for i in range(MULTI_TURN):
        turns = [("user", f"multi {i}: weather in Rome, then Paris?"), ("assistant", earlier),
                 ("tool", '{"temperature": 21}'), ("user", "and Paris?")]
        rows.append(_row(shape, (WEATHER,), turns, call("get_weather", {"city": "Paris"}, idx=1)))
    return rows


def _row(shape: str, functions: tuple[dict[str, Any], ...], turns: list[tuple[str, str]], answer: str,
         ) -> dict[str, Any]:
    sys_text = system(*functions)
    extra = {"reasoning": "The user asks; I call the tool.", "usage": USAGE, "model": MODEL}
    if shape == "glaive":
        said = {"user": "USER", "assistant": "ASSISTANT", "tool": "FUNCTION RESPONSE"}
        chat = "\n\n\n".join(f"{said[who]}: {text}" for who, text in turns)
        return {"system": sys_text, "chat": chat, "content": answer, **extra}
    if shape == "openai":  # OpenAI fine-tuning: the last assistant turn is the answer
        msgs = [{"role": "system", "content": sys_text.removeprefix("SYSTEM: ")}]
        msgs += [{"role": "user" if who == "tool" else who,
                  "content": f"FUNCTION RESPONSE: {text}" if who == "tool" else text} for who, text in turns]
        msgs.append({"role": "assistant", "content": answer})
        return {"messages": msgs, "usage": USAGE, "model": MODEL}
    assert shape == "sharegpt"  # ShareGPT / SpecForge: the last `gpt` turn is the answer
    said = {"user": "human", "assistant": "gpt", "tool": "human"}
    conv = [{"from": "system", "value": sys_text.removeprefix("SYSTEM: ")}]
    conv += [{"from": said[who], "value": f"FUNCTION RESPONSE: {text}" if who == "tool" else text}
             for who, text in turns]
    conv.append({"from": "gpt", "value": answer})
    return {"conversations": conv}


def write(tmp: Path, shape: str = "glaive", name: str | None = None) -> Path:
    """The file, one JSON object a line, with one malformed line at the end."""
    path = tmp / (name or f"kimi-{shape}.jsonl")
    lines = [json.dumps(r) for r in _rows(shape)] + ['{"system": "SYSTEM: x", "chat": ']
    path.write_text("\n".join(lines) + "\n")
    return path


def _expect() -> dict[str, Any]:
    reasons: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    declared: Counter[str] = Counter()
    called: Counter[str] = Counter()
    for _case, functions, content, why, n in CASES:
        name = content.split("functions.", 1)[1].split(":", 1)[0] if "functions." in content else None
        for f in functions:
            declared[f["name"]] += n
            called[f["name"]] += n if name == f["name"] else 0
        if name is not None:
            calls[name if any(f["name"] == name for f in functions) else "(not declared)"] += n
        if why not in (None, "-"):
            reasons[why] += n
    declared["get_weather"] += MULTI_TURN
    called["get_weather"] += MULTI_TURN
    calls["get_weather"] += MULTI_TURN
    answers = sum(n for *_, n in CASES) + MULTI_TURN
    return {"answers": answers, "rows": answers + 1, "calls": sum(calls.values()), "reasons": dict(reasons),
            "invalid": sum(reasons.values()), "undeclared": calls["(not declared)"],
            "declaredIn": dict(declared), "called": dict(called), "tokens": (USAGE["prompt_tokens"] * answers,
                                                                            USAGE["completion_tokens"] * answers)}


EXPECT = _expect()
