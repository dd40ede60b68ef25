"""Agentic conversations turn by turn (`generation.turns: all`): what request k carries, whether the
model's tool calls match the dataset's, and when a conversation ends. Pure: no I/O, no clock.

A conversation's turns are its assistant messages, plus one more when it ends in a user or tool
message (the answer it asks for). Request k carries the conversation's system, user and tool
messages before turn k and, in place of the dataset's assistant turns, the model's own answers.
When the model's calls at a turn match the dataset's (same names, arguments equal as JSON,
parallel calls as a multiset), the dataset's tool results follow with `tool_call_id` rewritten to
the model's ids. When they diverge, `stop` ends the conversation there; `keepOriginal` keeps the
dataset's assistant turn and results in the history (a result can only answer a call the request
shows) and marks every later turn as diverged. No tool is ever executed.

With `tools.mode: text` (`declared`: the prompt's function names) the request has no `tools`, so its
history has no structured calls either: the model's calls are read from its content
(`textcalls.find_calls`, as the tool checks read them), its answer goes back as it wrote it, a
dataset assistant turn kept by `keepOriginal` is written as Hermes `<tool_call>` blocks, and the
dataset's tool results follow as a user turn of `<tool_response>` blocks (how Qwen's and Hermes'
templates show tool results).

Everything is recomputed from the persisted answers (`next_turn(messages, answers, ...)`), so a
resumed run continues at the first turn without a record and pays for no earlier one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

import orjson

from eyrie.jobs.contract.progress import AgenticFigures
from eyrie.jobs.status import SampleCounts
from eyrie.jobs.tools.textcalls import find_calls

Message = dict[str, Any]
OnDivergence = Literal["stop", "keepOriginal"]


class Divergence(StrEnum):
    """How the model's calls at a turn differ from the dataset's (the manifest counts each kind)."""

    OTHER_TOOL = "otherTool"
    OTHER_ARGUMENTS = "otherArguments"
    MISSING_CALL = "missingCall"  # the dataset called a tool, the model did not (or fewer)
    EXTRA_CALL = "extraCall"  # the model called a tool where the dataset did not (or more)


class End(StrEnum):
    """Why a conversation has no next turn."""

    DONE = "done"  # every turn regenerated
    DIVERGED = "diverged"  # onDivergence: stop
    MAX_TURNS = "maxTurns"  # generation.maxTurns reached
    FAILED = "failed"  # a turn has no answer (failed or rejected): nothing to continue from


@dataclass(frozen=True)
class NextTurn:
    turn: int
    messages: list[Message]  # the request's messages
    spliced: int  # dataset tool results this request carries for the first time
    diverged_from: int | None  # the first earlier turn that diverged (keepOriginal), else None


@dataclass(frozen=True)
class Finished:
    end: End
    dropped: int  # dataset turns that will never be regenerated


@dataclass(frozen=True)
class CallMatch:
    """The model's calls at one turn against the dataset's: `ids` maps dataset call id -> model's."""

    divergence: Divergence | None
    ids: dict[str, str]


def turn_positions(messages: list[Message]) -> list[int]:
    """Index of each turn: every assistant message, and len(messages) when the conversation ends
    with something to answer."""
    pos = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if messages and messages[-1].get("role") != "assistant":
        pos.append(len(messages))
    return pos


def tool_result_too_large(messages: list[Message], max_chars: int) -> str | None:
    """The reason a conversation is a bad row when a tool result is over the tool checks' limit."""
    for i, m in enumerate(messages):
        if m.get("role") != "tool":
            continue
        content = m.get("content")
        size = len(content) if isinstance(content, str) else len(orjson.dumps(content))
        if size > max_chars:
            return f"message {i}: the tool result is {size} characters, over the {max_chars} limit"
    return None


def _json_equal(a: Any, b: Any) -> bool:
    """Equal as JSON values: 1 == 1.0, but true is not 1 and key order does not matter."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


_UNPARSED = object()


def _arguments(args: Any) -> Any:
    if not isinstance(args, str):
        return args
    try:
        return orjson.loads(args)
    except orjson.JSONDecodeError:
        return (_UNPARSED, args)  # compared as text: equal only to the same text


def model_calls(response: dict[str, Any], turn: int, declared: Collection[str] | None = None) -> list[dict[str, Any]]:
    """The answer's calls as they go back into the history; a call without an id gets one. Text
    mode (`declared` given): the structured ones, else those written in the content (a call that
    cannot be read keeps its name, with arguments that match nothing)."""
    out = []
    for j, tc in enumerate(response.get("tool_calls") or ()):
        fn = (tc or {}).get("function") or {}
        out.append({"id": str(tc.get("id") or f"call_t{turn}_{j}"), "type": "function",
                    "function": {"name": str(fn.get("name") or ""), "arguments": fn.get("arguments") or ""}})
    if out or declared is None or not isinstance(response.get("content"), str):
        return out
    for j, c in enumerate(find_calls(response["content"], declared)):
        args = c.arguments if isinstance(c.arguments, str) or c.problem else orjson.dumps(c.arguments).decode()
        out.append({"id": c.id or f"call_t{turn}_{j}", "type": "function",
                    "function": {"name": c.name or "", "arguments": "" if c.problem else args}})
    return out


def judge(expected: Message | None, response: dict[str, Any], turn: int,
          declared: Collection[str] | None = None) -> CallMatch:
    """Compare the model's calls at `turn` with the dataset's turn `expected` (None: the dataset has
    no answer there, so there is nothing to diverge from); `declared`: text mode."""
    got = model_calls(response, turn, declared)
    if expected is None:
        return CallMatch(None, {})
    want = expected.get("tool_calls") or []
    if not want and not got:
        return CallMatch(None, {})
    if want and not got:
        return CallMatch(Divergence.MISSING_CALL, {})
    if got and not want:
        return CallMatch(Divergence.EXTRA_CALL, {})
    unused = list(range(len(got)))
    ids: dict[str, str] = {}
    for w in want:
        name, args = w["function"]["name"], _arguments(w["function"]["arguments"])
        hit = next((u for u in unused if got[u]["function"]["name"] == name
                    and _json_equal(_arguments(got[u]["function"]["arguments"]), args)), None)
        if hit is not None:
            unused.remove(hit)
            ids[w["id"]] = got[hit]["id"]
    if len(ids) == len(want) and not unused:
        return CallMatch(None, ids)
    names_want = Counter(w["function"]["name"] for w in want)
    names_got = Counter(g["function"]["name"] for g in got)
    if names_want == names_got:
        kind = Divergence.OTHER_ARGUMENTS
    elif len(got) < len(want) and names_got <= names_want:
        kind = Divergence.MISSING_CALL
    elif len(got) > len(want) and names_want <= names_got:
        kind = Divergence.EXTRA_CALL
    else:
        kind = Divergence.OTHER_TOOL
    return CallMatch(kind, {})


def answer_message(response: dict[str, Any], turn: int) -> Message:
    """The model's answer as the history's assistant message: its content, its calls with its own
    ids and arguments as returned, and its reasoning, also as OpenRouter's `reasoning_details`
    (templates that keep the reasoning of the current tool loop, like Kimi K2.5's, show it to the
    next turn; OpenRouter passes it on only when it comes back)."""
    msg: Message = {"role": "assistant", "content": response.get("content")}
    calls = model_calls(response, turn)
    if calls:
        msg["tool_calls"] = calls
    elif msg["content"] is None:
        msg["content"] = ""
    if response.get("reasoning"):
        msg["reasoning"] = response["reasoning"]
    if response.get("reasoning_details"):  # OpenRouter: reasoning blocks go back as returned
        msg["reasoning_details"] = response["reasoning_details"]
    return msg


def _text_answer(response: dict[str, Any]) -> Message:
    """Text mode: the model's answer as it wrote it (its calls inside the content), with its reasoning."""
    msg = answer_message({**response, "tool_calls": None}, 0)
    if msg["content"] is None:
        msg["content"] = ""
    return msg


def _written(message: Message) -> Message:
    """Text mode: a dataset assistant turn with its calls written as Hermes `<tool_call>` blocks."""
    calls = message.get("tool_calls") or []
    if not calls:
        return message
    blocks = []
    for c in calls:
        fn = c.get("function") or {}
        args = _arguments(fn.get("arguments"))
        value = args[1] if isinstance(args, tuple) else args
        blocks.append("<tool_call>\n" + orjson.dumps({"name": fn.get("name"), "arguments": value}).decode()
                      + "\n</tool_call>")
    text = "\n".join(blocks)
    content = message.get("content")
    out = {k: v for k, v in message.items() if k not in ("tool_calls", "function_call")}
    out["content"] = f"{content}\n{text}" if isinstance(content, str) and content else text
    return out


def _result_text(content: Any) -> str:
    return content if isinstance(content, str) else orjson.dumps(content).decode()


def _carry(messages: list[Message], ids: dict[str, str], as_text: bool = False) -> list[Message]:
    """Messages between two turns as the next request carries them: tool results answer the model's
    call ids; in text mode consecutive results are one user turn of `<tool_response>` blocks."""
    if not as_text:
        return [{**m, "tool_call_id": ids.get(str(m.get("tool_call_id")), m.get("tool_call_id"))}
                if m.get("role") == "tool" else m for m in messages]
    out: list[Message] = []
    results: list[str] = []
    for m in [*messages, None]:
        if m is not None and m.get("role") == "tool":
            results.append(f"<tool_response>\n{_result_text(m.get('content'))}\n</tool_response>")
            continue
        if results:
            out.append({"role": "user", "content": "\n".join(results)})
            results = []
        if m is not None:
            out.append(_written(m) if m.get("role") == "assistant" else m)
    return out


def next_turn(messages: list[Message], answers: list[dict[str, Any] | None], on_divergence: OnDivergence,
              max_turns: int, declared: Collection[str] | None = None) -> NextTurn | Finished:
    """The request for the first turn without an answer, or why there is none.

    `answers` are the model's responses to turns 0..k-1 in order (None: that turn failed).
    `declared`: the prompt's function names in text mode (None: structured).
    """
    as_text = declared is not None
    pos = turn_positions(messages)
    history: list[Message] = []
    ids: dict[str, str] = {}
    diverged_from: int | None = None
    prev = 0
    for j, answer in enumerate(answers):
        if answer is None:
            return Finished(End.FAILED, len(pos) - j - 1)
        p = pos[j]
        history += _carry(messages[prev:p], ids, as_text)
        expected = messages[p] if p < len(messages) else None
        verdict = judge(expected, answer, j, declared)
        if verdict.divergence is None:
            history.append(_text_answer(answer) if as_text else answer_message(answer, j))
            ids = verdict.ids
        elif on_divergence == "stop":
            return Finished(End.DIVERGED, len(pos) - j - 1)
        else:
            diverged_from = j if diverged_from is None else diverged_from
            if expected is not None:
                history.append(_written(expected) if as_text else expected)
            else:
                history.append(_text_answer(answer) if as_text else answer_message(answer, j))
            ids = {}
        prev = p + 1
    k = len(answers)
    if k >= len(pos):
        return Finished(End.DONE, 0)
    if k >= max_turns:
        return Finished(End.MAX_TURNS, len(pos) - k)
    between = messages[prev:pos[k]]
    spliced = sum(m.get("role") == "tool" for m in between)
    return NextTurn(k, history + _carry(between, ids, as_text), spliced, diverged_from)


def annotate(messages: list[Message], answers: list[dict[str, Any] | None], nt: NextTurn,
             response: dict[str, Any] | None, on_divergence: OnDivergence, max_turns: int,
             declared: Collection[str] | None = None) -> dict[str, Any]:
    """The `agentic` field of turn `nt.turn`'s record: how it relates to the dataset and, when it is
    the conversation's last, why (`end`) and how many dataset turns were never regenerated."""
    pos = turn_positions(messages)
    expected = messages[pos[nt.turn]] if pos[nt.turn] < len(messages) else None
    diverged = judge(expected, response, nt.turn, declared).divergence if response is not None else None
    diverged_from = nt.diverged_from
    if diverged is not None and on_divergence == "keepOriginal" and diverged_from is None:
        diverged_from = nt.turn
    after = next_turn(messages, [*answers, response], on_divergence, max_turns, declared)
    return {"turns": len(pos), "spliced": nt.spliced, "diverged": str(diverged) if diverged else None,
            "divergedFrom": diverged_from, "end": str(after.end) if isinstance(after, Finished) else None,
            "dropped": after.dropped if isinstance(after, Finished) else 0}


@dataclass
class AgenticSummary:
    """The manifest's and progress's `agentic` summary, counted from the turn records."""

    conversations: set[str] = field(default_factory=set)
    turns: int = 0  # turns regenerated (answered)
    failed_turns: int = 0
    spliced: int = 0  # dataset tool results sent back
    diverged: Counter[str] = field(default_factory=Counter)
    ended: Counter[str] = field(default_factory=Counter)
    dropped: int = 0  # dataset turns never regenerated (diverged, maxTurns, failed)
    rejected: int = 0  # rows never sent (bad rows, unusable declarations)

    def add(self, rec: dict[str, Any]) -> None:
        info = rec.get("agentic")
        if not isinstance(info, dict):
            self.rejected += rec.get("status") == "rejected"
            return
        self.conversations.add(str(rec.get("sample_id")))
        if rec.get("status") == "ok":
            self.turns += 1
            self.spliced += int(info.get("spliced") or 0)
        else:
            self.failed_turns += 1
        if info.get("diverged"):
            self.diverged[str(info["diverged"])] += 1
        if info.get("end"):
            self.ended[str(info["end"])] += 1
            self.dropped += int(info.get("dropped") or 0)

    def samples(self, total: int) -> SampleCounts:
        """progress.json's `samples` in conversations: `total` rows; done (ended: every turn, a
        divergence, maxTurns), rejected (rows never sent), failed (a turn failed); `discarded` stays
        0 here: the tool policy discards turns, not conversations (`discardedUSD` counts them). A
        conversation that has not ended is neither: a stopped run resumes it."""
        failed = self.ended.get(End.FAILED.value, 0)
        return SampleCounts(total=total, done=sum(self.ended.values()) - failed, rejected=self.rejected,
                            discarded=0, failed=failed)

    def figures(self) -> AgenticFigures:
        """progress.json's `agentic`."""
        return AgenticFigures(conversations=len(self.conversations), turns_regenerated=self.turns,
                              turns_failed=self.failed_turns, spliced_tool_results=self.spliced,
                              diverged={k.value: self.diverged.get(k.value, 0) for k in Divergence},
                              ended=dict(sorted(self.ended.items())), dropped_turns=self.dropped)
