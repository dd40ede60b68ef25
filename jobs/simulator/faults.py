"""The faults the simulator injects, as OpenRouter's failures look on the wire: HTTP errors with OpenRouter's
error bodies (429 with Retry-After, 5xx, 402 out of credits or its in-flight budget, 403 moderation), and the
faults of an answer that still completes and bills (leaked tool-call markers, `length` with nothing returned).
Which request gets one is the server's draw (config.fault_rate); the broken streams and bodies are written by the
server (server.py), which alone writes the wire. `RequestWindow` is a rate limit the simulator enforces (a config
file's `rateLimit`): 429 past N requests in any window, never drawn at random."""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

import orjson

from eyrie.jobs.simulator.answers import Answer, kimi_markers


def error_body(code: int, message: str, **meta: Any) -> bytes:
    err: dict[str, Any] = {"code": code, "message": message}
    if meta:
        err["metadata"] = meta
    return orjson.dumps({"error": err})



HTTP_FAULTS: dict[str, tuple[int, str]] = {
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



class RequestWindow:
    """A provider that counts requests over a sliding window: past `limit` accepted in any `window_s` seconds, a
    request is refused (`admit` returns the Retry-After: until the oldest accepted leaves the window). It also
    counts every request it received in the window, accepted or not (`max_in_window`): what a client that keeps to
    the limit must never push above `limit`."""

    def __init__(self, limit: int, window_s: float, clock: Any = time.monotonic):
        self.limit, self.window_s, self._clock = limit, window_s, clock
        self.accepted: deque[float] = deque()
        self.received: deque[float] = deque()
        self.max_in_window = 0
        self.refused = 0

    def admit(self) -> float | None:
        """None: the request is accepted; else the seconds until it would be (its Retry-After)."""
        now = self._clock()
        for q in (self.accepted, self.received):
            while q and q[0] <= now - self.window_s:
                q.popleft()
        self.received.append(now)
        self.max_in_window = max(self.max_in_window, len(self.received))
        if len(self.accepted) >= self.limit:
            self.refused += 1
            return self.accepted[0] + self.window_s - now
        self.accepted.append(now)
        return None

    def stats(self) -> dict[str, Any]:
        return {"requests": self.limit, "windowS": self.window_s, "maxInWindow": self.max_in_window,
                "refused": self.refused}

    def refusal(self, retry_after: float) -> tuple[int, bytes, dict[str, str]]:
        """The 429 as OpenRouter sends it: status, body, headers (Retry-After in whole seconds, rounded up)."""
        msg = f"Rate limit exceeded: {self.limit} requests per {self.window_s:g}s (simulated)"
        return 429, error_body(429, msg), {"Retry-After": str(max(1, math.ceil(retry_after)))}


def flagged(messages: list[Any]) -> str:
    """The flagged text as OpenRouter reports it: at most 100 characters, cut in the middle."""
    text = str(messages[-1].get("content") if isinstance(messages[-1], dict) else messages[-1])
    return text if len(text) <= 100 else text[:48] + "..." + text[-49:]



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


