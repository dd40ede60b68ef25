"""Writes examples/prompts/agentic.jsonl: small multi-turn, tool-using conversations for the agentic
quickstart (examples/quickstart-agentic.yaml). Written by the project; the dataset's tool calls are
the ones the simulator plans for each user turn (`simulator.planned_calls`), so a simulated run
follows the dataset except where its simulator config file's `divergenceRate` makes it leave. Rerun after changing
the simulator's planning; tests/generate/test_agentic_run.py checks the file is current.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from eyrie.jobs.simulator import SimulatorConfig, planned_calls

OUT = Path(__file__).resolve().parent.parent / "examples" / "prompts" / "agentic.jsonl"
CITIES = ["Oslo", "Rome", "Paris", "Tokyo", "Lima"]
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": CITIES},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "search_flights", "description": "Direct flights between two cities on a date.",
        "parameters": {"type": "object", "properties": {
            "origin": {"type": "string", "enum": CITIES}, "destination": {"type": "string", "enum": CITIES},
            "date": {"type": "string", "enum": ["2026-12-01", "2026-12-02", "2026-12-03"]}},
            "required": ["origin", "destination", "date"], "additionalProperties": False}}},
]
SYSTEM = "You are a travel assistant. Use the tools for facts; answer in one or two sentences."
QUESTIONS = [
    ["Is it cold in Oslo right now?", "And should I pack an umbrella for Rome?", "Any flights from Oslo to Rome?"],
    ["What is the weather like in Tokyo?", "Find me a flight from Tokyo to Paris."],
    ["I am flying Lima to Oslo next week. What's the weather there?", "Which dates have flights?"],
    ["Compare the weather in Paris and Rome.", "Book me the warmer one, what flights are there from Oslo?"],
    ["Tell me about flights from Rome to Lima.", "What will the weather be when I land?", "Thanks, anything else?"],
    ["Is it sunny in Paris?"],
]


def result_for(name: str, arguments: str) -> str:
    """A canned tool result, a pure function of the call (no tool is ever executed)."""
    args = json.loads(arguments)
    if name == "get_weather":
        temp = sum(map(ord, args.get("city", ""))) % 30 - 5
        return json.dumps({"city": args.get("city"), "temperature": temp, "unit": args.get("unit", "celsius"),
                           "conditions": ["rain", "sun", "clouds", "snow"][temp % 4]})
    return json.dumps({"flights": [{"number": f"EY{sum(map(ord, arguments)) % 900 + 100}", "departs": "09:40"}]})


def conversation(questions: list[str], cfg: SimulatorConfig) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for q, question in enumerate(questions):
        messages.append({"role": "user", "content": question})
        calls = planned_calls(messages, TOOLS, cfg)
        if calls:
            ids = [f"call_{q}_{j}" for j in range(len(calls))]
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                for cid, (name, args) in zip(ids, calls, strict=True)]})
            messages += [{"role": "tool", "tool_call_id": cid, "content": result_for(name, args)}
                         for cid, (name, args) in zip(ids, calls, strict=True)]
            messages.append({"role": "assistant", "content": "Here is what I found: " + "; ".join(
                m["content"] for m in messages[-len(calls):]) + "."})
        else:
            messages.append({"role": "assistant", "content": "I can answer that without a tool: have a good trip."})
    return {"messages": messages, "tools": TOOLS}


def render(cfg: SimulatorConfig | None = None) -> str:
    cfg = cfg or SimulatorConfig()
    return "".join(json.dumps(conversation(qs, cfg), ensure_ascii=False) + "\n" for qs in QUESTIONS)


if __name__ == "__main__":
    OUT.write_text(render())
    sys.stdout.write(f"wrote {OUT}\n")
