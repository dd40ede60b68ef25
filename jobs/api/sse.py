"""Answers parsed: JSON bodies and SSE streams into the generation record's `Response`, bytes-level."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from eyrie.jobs.api.errors import RequestFailed, Retryable
from eyrie.jobs.api.provider_errors import as_is, classify, parse_error
from eyrie.jobs.contract.records import ReasoningDetail, Response, ToolCall

_loads = orjson.loads
_PIECES = ("text", "summary", "data")  # the streamed fields of a reasoning_details item


def _text(value: Any) -> str | None:
    """Content as a string (a list of text parts is joined); empty -> None."""
    if isinstance(value, list):
        value = "".join(p.get("text", "") for p in value if isinstance(p, dict))
    return value or None


def _tool_call(tc: dict[str, Any]) -> ToolCall:
    fn = tc.get("function") or {}
    args = fn.get("arguments")
    if args is None:
        args = ""
    elif not isinstance(args, str):  # a provider that returns an object: keep it, as JSON
        args = orjson.dumps(args).decode()
    return {"id": tc.get("id"), "type": tc.get("type") or "function",
            "function": {"name": fn.get("name"), "arguments": args}}


def reasoning_text(details: list[dict[str, Any]]) -> str | None:
    """The `reasoning.text` items of reasoning_details, in order (summaries and encrypted data are
    not the model's reasoning and are left out)."""
    return "".join(d["text"] for d in details
                   if d.get("type") == ReasoningDetail.TEXT and isinstance(d.get("text"), str)) or None


def merge_details(pieces: Any) -> list[dict[str, Any]]:
    """reasoning_details as returned: consecutive pieces of one item (same type and index, or id)
    joined, their text/summary/data concatenated, other fields the latest value (a signature arrives
    with the last piece). A JSON answer's items pass through as they are."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, list[str]]] = []
    last: dict[str, Any] = {}
    texts: dict[str, list[str]] = {}
    kind = key = None
    for piece in pieces if isinstance(pieces, list) else ():
        if type(piece) is not dict:
            continue
        idx = piece.get("index")
        this = idx if idx is not None else piece.get("id")
        if out and this == key and piece.get("type") == kind:
            for k, v in piece.items():
                if v is None:
                    continue
                if k in _PIECES and type(v) is str:
                    got = texts.get(k)
                    if got is None:
                        texts[k] = [v]
                    else:
                        got.append(v)
                else:
                    last[k] = v
        else:
            last, texts = dict(piece), {k: [v] for k, v in piece.items() if k in _PIECES and type(v) is str}
            out.append(last)
            parts.append(texts)
            kind, key = piece.get("type"), this
    for item, texts in zip(out, parts, strict=True):
        for k, vs in texts.items():
            item[k] = "".join(vs)
    return out


def _raise_body_error(err: Any, usage: Any = None, redact: Callable[[str], str] = as_is) -> None:
    """An error inside an HTTP 200 answer; a refusal keeps the usage the provider reported with it."""
    exc = classify(parse_error(err), http_status=None, redact=redact)
    if isinstance(exc, RequestFailed) and isinstance(usage, dict):
        exc.usage = usage
    raise exc


def parse_completion(doc: Any, redact: Callable[[str], str] = as_is) -> tuple[Response, dict[str, Any] | None]:
    """A non-streaming chat.completion body -> (Response, usage). Raises Retryable for bad bodies."""
    if not isinstance(doc, dict):
        raise Retryable("malformed-json", "the response body is not a JSON object")
    if doc.get("error"):
        _raise_body_error(doc["error"], doc.get("usage"), redact)
    choices = doc.get("choices")
    if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise Retryable("empty-choices", "the response has no choices")
    choice = choices[0]
    msg = choice.get("message") or {}
    if choice.get("error"):  # the documented non-streaming form: the error beside partial output
        _raise_body_error(choice["error"], doc.get("usage"), redact)
    if choice.get("finish_reason") == "error":
        raise Retryable("error-body", "the provider ended the answer with finish_reason=error")
    details = merge_details(msg.get("reasoning_details"))
    resp: Response = {
        "id": doc.get("id"), "provider": doc.get("provider"), "model": doc.get("model"),
        "finish_reason": choice.get("finish_reason"),
        "reasoning": _text(msg.get("reasoning") or msg.get("reasoning_content")) or reasoning_text(details),
        "content": _text(msg.get("content")),
        "tool_calls": [_tool_call(tc) for tc in msg.get("tool_calls") or () if isinstance(tc, dict)],
    }
    if choice.get("native_finish_reason") is not None:
        resp["native_finish_reason"] = choice["native_finish_reason"]
    if details:
        resp["reasoning_details"] = details
    if choice.get("logprobs"):
        resp["logprobs"] = choice["logprobs"]
    usage = doc.get("usage")
    return resp, usage if isinstance(usage, dict) else None


class SSEAccumulator:
    """Assembles a chat.completion.chunk SSE stream into a Response, fed raw bytes in any split.

    Comment lines (`: OPENROUTER PROCESSING`), blank lines and unknown fields are ignored; data
    lines of one event are joined as the SSE spec says; tool-call deltas are merged by `index` with
    `arguments` concatenated byte-for-byte.
    """

    __slots__ = ("_buf", "_calls", "_content", "_data", "_details", "_logprobs", "_reasoning", "_redact", "done",
                 "finish_reason", "id", "model", "native_finish_reason", "provider", "saw_choice", "usage")

    def __init__(self, redact: Callable[[str], str] = as_is) -> None:
        self._redact = redact
        self._details: list[Any] = []  # reasoning_details pieces as streamed
        self.native_finish_reason: str | None = None
        self._buf = b""
        self._data: list[bytes] = []
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, list[Any]] = {}  # index -> [id, type, name, [argument pieces]]
        self._logprobs: list[Any] | None = None
        self.id: str | None = None
        self.provider: str | None = None
        self.model: str | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.saw_choice = False

    def feed(self, data: bytes) -> None:
        if self._buf:
            data = self._buf + data
        lines = data.split(b"\n")
        self._buf = lines.pop()
        cr = b"\r" in data
        pending = self._data
        for line in lines:
            if cr and line[-1:] == b"\r":
                line = line[:-1]
            if line[:6] == b"data: ":
                pending.append(line[6:])
            elif not line:
                if pending:
                    self._event(pending[0] if len(pending) == 1 else b"\n".join(pending))
                    pending.clear()
            elif line[:5] == b"data:":
                pending.append(line[5:])
            # ":" comments and other fields (event, id, retry) carry nothing for us

    def _event(self, data: bytes) -> None:
        try:
            chunk = _loads(data)
        except orjson.JSONDecodeError:
            if data == b"[DONE]":
                self.done = True
                return
            raise Retryable("malformed-json", f"unparseable SSE data: {data[:120]!r}") from None
        if type(chunk) is not dict:
            raise Retryable("malformed-json", "an SSE chunk is not a JSON object")
        if chunk.get("error"):  # a mid-stream error: OpenRouter's unified error chunk
            _raise_body_error(chunk["error"], chunk.get("usage") or self.usage, self._redact)
        if self.id is None:
            self.id = chunk.get("id")
            self.provider = chunk.get("provider")
            self.model = chunk.get("model")
        usage = chunk.get("usage")
        if usage:
            self.usage = usage
        choices = chunk.get("choices")
        if not choices:
            return
        choice = choices[0]
        self.saw_choice = True
        delta = choice.get("delta")
        if delta:
            c = delta.get("content")
            if c:
                self._content.append(c)
            r = delta.get("reasoning") or delta.get("reasoning_content")
            if r:
                self._reasoning.append(r)
            if delta.get("tool_calls"):
                self._tool_deltas(delta["tool_calls"])
            rd = delta.get("reasoning_details")
            if rd and type(rd) is list:
                self._details += rd  # merged once, in finish(): OpenRouter sends it with every reasoning delta
        if choice.get("logprobs"):
            self._merge_logprobs(choice["logprobs"])
        fr = choice.get("finish_reason")
        if fr:
            if fr == "error":
                raise Retryable("error-body", "the provider ended the stream with finish_reason=error")
            self.finish_reason = fr
            self.native_finish_reason = choice.get("native_finish_reason") or self.native_finish_reason

    def _tool_deltas(self, tcs: list[Any]) -> None:
        calls = self._calls
        for tc in tcs:
            idx = tc.get("index")
            if idx is None:  # providers that omit the index: a new id opens a new call
                idx = len(calls) if tc.get("id") or not calls else max(calls)
            slot = calls.get(idx)
            if slot is None:
                slot = calls[idx] = [None, None, "", []]
            if tc.get("id"):
                slot[0] = tc["id"]
            if tc.get("type"):
                slot[1] = tc["type"]
            fn = tc.get("function")
            if fn:
                name = fn.get("name")
                if name and name != slot[2]:
                    slot[2] += name
                args = fn.get("arguments")
                if args:
                    slot[3].append(args if isinstance(args, str) else orjson.dumps(args).decode())

    def _merge_logprobs(self, lp: Any) -> None:
        if self._logprobs is None:
            self._logprobs = []
        content = lp.get("content") if isinstance(lp, dict) else None
        if content:
            self._logprobs.extend(content)

    def finish(self) -> tuple[Response, dict[str, Any] | None]:
        """The assembled answer; raises Retryable for a stream that ended before the answer did."""
        if self._buf.strip() or self._data:  # a last event without its blank line
            self.feed(b"\n\n")
        if not self.saw_choice:
            if self.done:
                raise Retryable("empty-choices", "the stream carried no choices")
            raise Retryable("dropped-stream", "the stream ended before any answer")
        if self.finish_reason is None:
            raise Retryable("dropped-stream", "the stream ended without finish_reason")
        details = merge_details(self._details)
        resp: Response = {
            "id": self.id, "provider": self.provider, "model": self.model,
            "finish_reason": self.finish_reason,
            "reasoning": "".join(self._reasoning) or reasoning_text(details),
            "content": "".join(self._content) or None,
            "tool_calls": [{"id": s[0], "type": s[1] or "function",
                            "function": {"name": s[2] or None, "arguments": "".join(s[3])}}
                           for _, s in sorted(self._calls.items())],
        }
        if self.native_finish_reason is not None:
            resp["native_finish_reason"] = self.native_finish_reason
        if details:
            resp["reasoning_details"] = details
        if self._logprobs:
            resp["logprobs"] = {"content": self._logprobs}
        return resp, self.usage
