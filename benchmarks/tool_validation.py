"""Validation cost per tool call: eyrie's ToolValidator.check_calls vs a bare pre-compiled validator.

The peer is the least any validator must do: `json.loads` the arguments and run a pre-compiled
jsonschema Draft202012Validator's `iter_errors` over them. eyrie additionally checks names and shapes,
caps sizes and turns errors into JSON Pointer verdicts for the record. Target: ratio <= 1.3.
Also printed for information: the whole per-answer `check_response` (validator lookup + leak scan).

Run: python benchmarks/tool_validation.py [--calls N]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from typing import Any

from jsonschema import Draft202012Validator

from eyrie.jobs.tools.checks import check_response
from eyrie.jobs.tools.declarations import Prepared, normalize_tools
from eyrie.jobs.tools.validation import ToolValidator

TARGET = 1.3

TOOLS = normalize_tools([
    {"name": "get_news_headlines", "description": "Get the latest news headlines", "parameters": {
        "type": "object", "properties": {"country": {"type": "string"}}, "required": ["country"]}},
    {"name": "calculate_loan_payment", "description": "Monthly payment", "parameters": {
        "type": "object", "properties": {"principal": {"type": "number"}, "interest_rate": {"type": "number"},
                                         "loan_term": {"type": "integer", "minimum": 1}},
        "required": ["principal", "interest_rate", "loan_term"]}},
    {"name": "get_current_weather", "description": "Weather", "parameters": {
        "type": "object", "properties": {"location": {"type": "string"},
                                         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["location"]}},
    {"name": "search_flights", "description": "Flights", "parameters": {
        "type": "object", "properties": {
            "origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "destination": {"type": "string", "pattern": "^[A-Z]{3}$"}, "date": {"type": "string"},
            "passengers": {"type": "integer", "minimum": 1},
            "cabin": {"type": "string", "enum": ["economy", "business", "first"]}},
        "required": ["origin", "destination", "date"], "additionalProperties": False}},
    {"name": "create_order", "description": "Order", "parameters": {
        "type": "object", "properties": {
            "customer": {"type": "object", "properties": {
                "name": {"type": "string"},
                "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                            "required": ["street", "city"]}}, "required": ["name", "address"]},
            "items": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
                "product_id": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1}},
                "required": ["product_id", "quantity"], "additionalProperties": False}},
            "shipping": {"type": "string", "enum": ["standard", "express", "overnight"]}},
        "required": ["customer", "items", "shipping"]}},
])

VALID: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "get_news_headlines": lambda r: {"country": r.choice(["France", "Japan", "Peru"])},
    "calculate_loan_payment": lambda r: {"principal": r.randint(1000, 90000), "interest_rate": r.random() * 9,
                                         "loan_term": r.randint(1, 30)},
    "get_current_weather": lambda r: {"location": r.choice(["Paris", "Oslo"]), "unit": "celsius"},
    "search_flights": lambda r: {"origin": "JFK", "destination": "LAX", "date": "2024-06-01",
                                 "passengers": r.randint(1, 4), "cabin": "business"},
    "create_order": lambda r: {"customer": {"name": "Jane", "address": {"street": "1 Main St", "city": "X"}},
                               "items": [{"product_id": f"SKU-{i}", "quantity": r.randint(1, 3)}
                                         for i in range(r.randint(1, 6))], "shipping": "express"},
}


def mistake(r: random.Random, name: str, args: dict[str, Any]) -> str:
    """A realistic invalid call: wrong type, missing required, bad enum, extra key, or broken JSON."""
    kind = r.choice(["type", "missing", "enum", "extra", "json"])
    a = json.loads(json.dumps(args))
    if kind == "json":
        return json.dumps(a)[:-1]
    key = next(iter(a))
    if kind == "type":
        a[key] = [a[key]]
    elif kind == "missing":
        del a[key]
    elif kind == "enum":
        a["cabin" if name == "search_flights" else "unit" if name == "get_current_weather" else key] = "other"
    else:
        a["unexpected"] = 1
    return json.dumps(a)


def make_answers(n_calls: int, seed: int = 7) -> list[list[dict[str, Any]]]:
    """Answers of 1-3 parallel calls; about 75% valid, the rest invalid in varied ways."""
    r = random.Random(seed)
    answers, total = [], 0
    while total < n_calls:
        calls = []
        for i in range(r.choice([1, 1, 1, 2, 3])):
            name = r.choice(list(VALID))
            args = VALID[name](r)
            text = json.dumps(args) if r.random() < 0.75 else mistake(r, name, args)
            calls.append({"id": f"functions.{name}:{i}", "type": "function",
                          "function": {"name": name, "arguments": text}})
        answers.append(calls)
        total += len(calls)
    return answers


def bare(validators: dict[str, Draft202012Validator], answers: list[list[dict[str, Any]]]) -> int:
    invalid = 0
    for calls in answers:
        for c in calls:
            fn = c["function"]
            try:
                args = json.loads(fn["arguments"])
            except json.JSONDecodeError:
                invalid += 1
                continue
            invalid += bool(list(validators[fn["name"]].iter_errors(args)))
    return invalid


def eyrie_check_calls(validator: ToolValidator, answers: list[list[dict[str, Any]]]) -> int:
    return sum(not v.valid for calls in answers for v in validator.check_calls(calls))


def eyrie_check_response(prepared: Prepared, answers: list[list[dict[str, Any]]]) -> int:
    return sum(check_response(prepared, {"content": "Calling the tool now.", "reasoning": "The user asked.",
                                         "tool_calls": calls}).invalid_calls for calls in answers)


def best_of(fns: list[Callable[[], Any]], repeats: int,
            clock: Callable[[], float] = time.perf_counter) -> list[tuple[float, Any]]:
    """Best time of each, interleaved so that a busy machine slows all of them alike (`clock`:
    time.process_time counts only this process's CPU seconds, which other processes do not inflate)."""
    best, results = [float("inf")] * len(fns), [None] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = clock()
            results[i] = fn()
            best[i] = min(best[i], clock() - t0)
    return list(zip(best, results, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    answers = make_answers(args.calls)
    n = sum(len(a) for a in answers)
    peers = {t["function"]["name"]: Draft202012Validator(t["function"]["parameters"]) for t in TOOLS}
    validator = ToolValidator.for_tools(TOOLS)
    prepared = Prepared([], TOOLS, TOOLS, "row", "structured")
    for fn in (lambda: bare(peers, answers[:200]), lambda: eyrie_check_calls(validator, answers[:200])):
        fn()  # warm caches (regex compilation inside jsonschema)

    (t_bare, inv_bare), (t_ours, inv_ours), (t_full, inv_full) = best_of([
        lambda: bare(peers, answers), lambda: eyrie_check_calls(validator, answers),
        lambda: eyrie_check_response(prepared, answers)], args.repeats)
    assert inv_bare == inv_ours == inv_full, (inv_bare, inv_ours, inv_full)

    us = 1e6 / n
    ratio = t_ours / t_bare
    print(f"tool calls: {n} in {len(answers)} answers, {inv_ours} invalid ({inv_ours / n:.0%})")
    print(f"bare jsonschema (json.loads + iter_errors):  {t_bare * us:7.2f} us/call")
    print(f"eyrie ToolValidator.check_calls:             {t_ours * us:7.2f} us/call")
    print(f"eyrie check_response (lookup + leak scan):   {t_full * us:7.2f} us/call "
          f"(ratio {t_full / t_bare:.2f}, for information)")
    print(f"ratio check_calls / bare: {ratio:.2f}  (target <= {TARGET})  {'OK' if ratio <= TARGET else 'MISSED'}")
    print(f"RESULT tool_validation ratio={ratio:.2f} target<={TARGET} {'PASS' if ratio <= TARGET else 'MISS'}")


if __name__ == "__main__":
    main()
