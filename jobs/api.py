"""Async chat-completions client for OpenAI-compatible APIs (OpenRouter first), built for throughput.

One `ChatClient` per worker: it sends the caller's body as-is (adding only the streaming and usage
flags), parses SSE or JSON into the generation record's `Response`, retries what a retry can fix
(429 honouring Retry-After, 408, 5xx, timeouts, dropped connections and streams, errors inside an
HTTP 200, malformed JSON, empty choices) with capped full-jitter backoff, and stops at once on what
it cannot (402 -> InsufficientCredits, 401/403 -> AuthError, other 4xx -> RequestFailed). The API
key lives only in the Authorization header: never in a message, a repr or a log line.

The per-request path is kept lean (benchmarked against a bare httpx loop): orjson, bytes-level SSE
parsing, no logging, no per-request objects beyond what httpx itself builds.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import time
from dataclasses import dataclass, field
from decimal import Decimal
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport

from eyrie.jobs.records import Response, ToolCall

_loads = orjson.loads
_MSG_LIMIT = 500  # characters of a provider's error message kept in ours


# ------------------------------------------------------------------------------------ exceptions


class ApiError(Exception):
    """Base of every error this client raises."""


class RequestFailed(ApiError):
    """The request failed for good: retries exhausted, or an error no retry can fix (e.g. HTTP 400)."""

    def __init__(self, kind: str, message: str, attempts: int):
        self.kind, self.message, self.attempts = kind, message, attempts
        super().__init__(f"{kind} after {attempts} attempt(s): {message}")


class InsufficientCredits(ApiError):
    """HTTP 402: the account is out of credits. Never retried; the run stops."""


class AuthError(ApiError):
    """Missing or rejected API key (401/403). Never retried."""


class ApiUnreachable(ApiError):
    """The base URL does not answer (connection refused, DNS, timeout)."""


class _Retry(Exception):
    """One attempt failed in a way a retry can fix."""

    def __init__(self, kind: str, message: str, retry_after: float | None = None):
        self.kind, self.message, self.retry_after = kind, message, retry_after


# ------------------------------------------------------------------------------------ results


@dataclass(slots=True)
class Completion:
    response: Response
    usage: dict[str, Any] | None
    cost: Decimal | None  # usage.cost when the provider reports it; None -> the caller prices it
    attempts: int
    latency_s: float


@dataclass(slots=True)
class ClientStats:
    """Counters for the progress bar; `requests` counts HTTP attempts, `retries` the repeats."""

    requests: int = 0
    retries: int = 0
    completed: int = 0
    in_flight: int = 0
    errors_by_kind: dict[str, int] = field(default_factory=dict)


# ----------------------------------------------------------------------------------- pure helpers


class TokenBucket:
    """Smooth rate limit: at most a second's worth of burst, then evenly spaced.

    `reserve` takes the tokens at once (going into debt if needed) and returns how long the caller
    must wait, so concurrent callers queue in arrival order without a lock.
    """

    def __init__(self, per_minute: float, clock: Any = time.monotonic):
        if per_minute <= 0:
            raise ValueError("a rate limit must be positive")
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, self.rate)
        self.level = self.capacity
        self._clock = clock
        self._t = clock()

    def reserve(self, n: float) -> float:
        now = self._clock()
        self.level = min(self.capacity, self.level + (now - self._t) * self.rate)
        self._t = now
        self.level -= n
        return 0.0 if self.level >= 0 else -self.level / self.rate

    async def acquire(self, n: float = 1.0) -> None:
        wait = self.reserve(n)
        if wait > 0:
            await asyncio.sleep(wait)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds (delay-seconds or an HTTP-date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def backoff_delay(failures: int, base: float, cap: float, retry_after: float | None,
                  rand: float | None = None) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**(failures-1))]; at least Retry-After (<= cap)."""
    span = min(cap, base * (2 ** (failures - 1)))
    delay = span * (random.random() if rand is None else rand)
    if retry_after is not None:
        delay = max(delay, min(retry_after, cap))
    return delay


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _provider_message(raw: bytes) -> str:
    """The provider's own error text (OpenRouter: error.message + metadata.raw), truncated."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:_MSG_LIMIT].decode("utf-8", "replace").strip() or "(empty body)"
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        msg = str(err.get("message") or err)
        meta = err.get("metadata")
        if isinstance(meta, dict) and meta.get("raw"):
            msg += f" ({str(meta['raw'])[:200]})"
    elif err:
        msg = str(err)
    else:
        msg = raw[:_MSG_LIMIT].decode("utf-8", "replace")
    return msg[:_MSG_LIMIT]


def _error_code(err: Any) -> str:
    return str(err.get("code", "")) if isinstance(err, dict) else ""


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


def parse_completion(doc: Any) -> tuple[Response, dict[str, Any] | None]:
    """A non-streaming chat.completion body -> (Response, usage). Raises _Retry for bad bodies."""
    if not isinstance(doc, dict):
        raise _Retry("malformed-json", "the response body is not a JSON object")
    if doc.get("error"):
        _raise_body_error(doc["error"])
    choices = doc.get("choices")
    if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise _Retry("empty-choices", "the response has no choices")
    choice = choices[0]
    msg = choice.get("message") or {}
    if choice.get("finish_reason") == "error":
        raise _Retry("error-body", "the provider ended the answer with finish_reason=error")
    resp: Response = {
        "id": doc.get("id"), "provider": doc.get("provider"), "model": doc.get("model"),
        "finish_reason": choice.get("finish_reason"),
        "reasoning": _text(msg.get("reasoning") or msg.get("reasoning_content")),
        "content": _text(msg.get("content")),
        "tool_calls": [_tool_call(tc) for tc in msg.get("tool_calls") or () if isinstance(tc, dict)],
    }
    if choice.get("logprobs"):
        resp["logprobs"] = choice["logprobs"]
    usage = doc.get("usage")
    return resp, usage if isinstance(usage, dict) else None


def _raise_body_error(err: Any) -> None:
    msg = (str(err.get("message") or err) if isinstance(err, dict) else str(err))[:_MSG_LIMIT]
    if _error_code(err) == "402":
        raise InsufficientCredits(f"the provider reports insufficient credits (402): {msg}")
    raise _Retry("error-body", f"error inside an HTTP 200 answer: {msg}")


class SSEAccumulator:
    """Assembles a chat.completion.chunk SSE stream into a Response, fed raw bytes in any split.

    Comment lines (`: OPENROUTER PROCESSING`), blank lines and unknown fields are ignored; data
    lines of one event are joined as the SSE spec says; tool-call deltas are merged by `index` with
    `arguments` concatenated byte-for-byte.
    """

    __slots__ = ("_buf", "_calls", "_content", "_data", "_logprobs", "_reasoning", "done", "finish_reason",
                 "id", "model", "provider", "saw_choice", "usage")

    def __init__(self) -> None:
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
            raise _Retry("malformed-json", f"unparseable SSE data: {data[:120]!r}") from None
        if type(chunk) is not dict:
            raise _Retry("malformed-json", "an SSE chunk is not a JSON object")
        if chunk.get("error"):
            _raise_body_error(chunk["error"])
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
        if choice.get("logprobs"):
            self._merge_logprobs(choice["logprobs"])
        fr = choice.get("finish_reason")
        if fr:
            if fr == "error":
                raise _Retry("error-body", "the provider ended the stream with finish_reason=error")
            self.finish_reason = fr

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
        """The assembled answer; raises _Retry for a stream that ended before the answer did."""
        if self._buf.strip() or self._data:  # a last event without its blank line
            self.feed(b"\n\n")
        if not self.saw_choice:
            if self.done:
                raise _Retry("empty-choices", "the stream carried no choices")
            raise _Retry("dropped-stream", "the stream ended before any answer")
        if self.finish_reason is None:
            raise _Retry("dropped-stream", "the stream ended without finish_reason")
        resp: Response = {
            "id": self.id, "provider": self.provider, "model": self.model,
            "finish_reason": self.finish_reason,
            "reasoning": "".join(self._reasoning) or None,
            "content": "".join(self._content) or None,
            "tool_calls": [{"id": s[0], "type": s[1] or "function",
                            "function": {"name": s[2] or None, "arguments": "".join(s[3])}}
                           for _, s in sorted(self._calls.items())],
        }
        if self._logprobs:
            resp["logprobs"] = {"content": self._logprobs}
        return resp, self.usage


def _transport_kind(exc: BaseException) -> str:
    cause = exc.__cause__
    if isinstance(exc, (TimeoutError, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout)) or \
            isinstance(cause, TimeoutError):
        return "timeout"
    return "connection"


# ------------------------------------------------------------------------------------------ client


class ChatClient:
    """Chat completions against one base URL with retries, concurrency and rate limits.

    Limits are per client; a caller running several workers divides the global limits among them.
    """

    def __init__(self, base_url: str, api_key: str | None, *, timeout: float, max_retries: int,
                 max_concurrency: int, requests_per_minute: int | None = None,
                 tokens_per_minute: int | None = None, stream: bool = True,
                 headers: dict[str, str] | None = None, backoff_base: float = 0.5,
                 backoff_max: float = 60.0, openrouter_usage: bool | None = None):
        if max_concurrency < 1 or max_retries < 0 or timeout <= 0:
            raise ValueError("max_concurrency >= 1, max_retries >= 0 and timeout > 0 are required")
        self.base_url = base_url.rstrip("/")
        self._key = api_key or None
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self.stream = stream
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.stats = ClientStats()
        self._url = httpx.URL(self.base_url + "/chat/completions")
        self._sem = asyncio.Semaphore(max_concurrency)
        self._rpm = TokenBucket(requests_per_minute) if requests_per_minute else None
        self._tpm = TokenBucket(tokens_per_minute) if tokens_per_minute else None
        # OpenRouter reports usage.cost only when asked; other APIs may reject the unknown field.
        self._openrouter = (urlsplit(self.base_url).hostname or "").endswith("openrouter.ai")
        if openrouter_usage is None:
            openrouter_usage = self._openrouter
        self._extra: dict[str, Any] = {"usage": {"include": True}} if openrouter_usage else {}
        if stream:
            self._extra.update(stream=True, stream_options={"include_usage": True})
        else:
            self._extra["stream"] = False  # the answer is parsed as one JSON body whatever the caller set
        hdrs = {"Content-Type": "application/json", "User-Agent": "eyrie", **(headers or {})}
        if self._key:
            hdrs["Authorization"] = f"Bearer {self._key}"
        # httpx on the aiohttp transport; the session (made on first use, inside the event loop) has
        # one connection per concurrency slot and takes proxies from the environment, except for
        # loopback. Chat requests go straight to the transport (see _open): the client's per-request
        # machinery (auth flow, redirects, cookies, hooks, logging) costs a quarter of the CPU.
        self._transport = AiohttpTransport(client=self._session)
        self._http = httpx.AsyncClient(transport=self._transport, headers=hdrs, timeout=httpx.Timeout(timeout))
        self._headers = httpx.Headers(hdrs)
        self._extensions = {"timeout": httpx.Timeout(timeout).as_dict()}

    def _session(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=self.max_concurrency + 1, ttl_dns_cache=300)
        return aiohttp.ClientSession(connector=connector, trust_env=not is_loopback(self.base_url))

    def __repr__(self) -> str:
        return (f"ChatClient(base_url={self.base_url!r}, key={'set' if self._key else 'none'}, "
                f"max_concurrency={self.max_concurrency}, stream={self.stream})")

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def _redact(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text

    # ---------------------------------------------------------------------------------- preflight

    async def preflight(self) -> None:
        """Fail before any paid request: no key for a remote API, an unreachable URL, a rejected key."""
        if not self._key and not is_loopback(self.base_url):
            raise AuthError("no API key: set EYRIE_API_KEY or api.apiKeySecretRef")
        # /models answers without a key on OpenRouter; its /key endpoint is what rejects a bad one
        paths = ["/models", "/key"] if self._openrouter and self._key else ["/models"]
        for path in paths:
            try:
                resp = await self._http.get(self.base_url + path, timeout=min(self.timeout, 30.0))
            except (httpx.HTTPError, aiohttp.ClientError, OSError) as e:
                reason = self._redact(str(e) or type(e).__name__)
                raise ApiUnreachable(f"the API at {self.base_url} is unreachable ({reason}); "
                                     "check api.baseUrl and the network") from None
            if resp.status_code in (401, 403):
                raise AuthError(f"the API at {self.base_url} rejected the API key (HTTP {resp.status_code} "
                                f"on {path}: {self._redact(_provider_message(resp.content))}); check "
                                "EYRIE_API_KEY or api.apiKeySecretRef")

    # --------------------------------------------------------------------------------- requests

    async def complete(self, body: dict[str, Any], *, est_tokens: int = 0) -> Completion:
        """Send one chat completion (retrying per the policy above) and return the parsed answer."""
        data = orjson.dumps({**body, **self._extra})
        stats = self.stats
        start = time.monotonic()
        attempts = 0
        while True:
            attempts += 1
            try:
                resp, usage = await self._attempt(data, est_tokens)
            except _Retry as e:
                stats.errors_by_kind[e.kind] = stats.errors_by_kind.get(e.kind, 0) + 1
                if attempts > self.max_retries:
                    raise RequestFailed(e.kind, self._redact(e.message), attempts) from None
                stats.retries += 1
                delay = backoff_delay(attempts, self.backoff_base, self.backoff_max, e.retry_after)
                await asyncio.sleep(delay)
                continue
            except ApiError as e:
                kind = type(e).__name__
                stats.errors_by_kind[kind] = stats.errors_by_kind.get(kind, 0) + 1
                if isinstance(e, RequestFailed):
                    e.attempts = attempts
                raise
            stats.completed += 1
            cost = usage.get("cost") if usage else None
            return Completion(resp, usage, Decimal(str(cost)) if cost is not None else None, attempts,
                              time.monotonic() - start)

    async def _attempt(self, data: bytes, est_tokens: int) -> tuple[Response, dict[str, Any] | None]:
        async with self._sem:
            if self._rpm is not None:
                await self._rpm.acquire(1)
            if self._tpm is not None and est_tokens:
                await self._tpm.acquire(est_tokens)
            stats = self.stats
            stats.requests += 1
            stats.in_flight += 1
            try:
                async with asyncio.timeout(self.timeout):
                    if self.stream:
                        return await self._send_stream(data)
                    return await self._send(data)
            except TimeoutError:
                raise _Retry("timeout", f"no complete answer within {self.timeout:g}s") from None
            except (httpx.TransportError, aiohttp.ClientError, OSError) as e:
                kind = _transport_kind(e)
                raise _Retry(kind, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None
            finally:
                stats.in_flight -= 1

    async def _open(self, data: bytes) -> httpx.Response:
        req = httpx.Request("POST", self._url, headers=self._headers, content=data, extensions=self._extensions)
        return await self._transport.handle_async_request(req)

    async def _send(self, data: bytes) -> tuple[Response, dict[str, Any] | None]:
        resp = await self._open(data)
        try:
            raw = await resp.aread()
        finally:
            await resp.aclose()
        if resp.status_code != 200:
            self._status_error(resp.status_code, resp.headers, raw)
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise _Retry("malformed-json", f"unparseable response body: {raw[:120]!r}") from None
        return parse_completion(doc)

    async def _send_stream(self, data: bytes) -> tuple[Response, dict[str, Any] | None]:
        resp = await self._open(data)
        try:
            if resp.status_code != 200:
                self._status_error(resp.status_code, resp.headers, await resp.aread())
            if not resp.headers.get("content-type", "").startswith("text/event-stream"):
                raw = await resp.aread()  # a JSON answer (often an error) instead of a stream
                try:
                    doc = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    raise _Retry("malformed-json", f"unparseable response body: {raw[:120]!r}") from None
                return parse_completion(doc)
            acc = SSEAccumulator()
            try:
                async for piece in resp.aiter_bytes():
                    acc.feed(piece)
            except httpx.TransportError as e:
                if _transport_kind(e) == "timeout":
                    raise
                raise _Retry("dropped-stream", f"the stream broke off: {type(e).__name__}") from None
            return acc.finish()
        finally:
            await resp.aclose()

    def _status_error(self, status: int, headers: httpx.Headers, raw: bytes) -> None:
        msg = self._redact(_provider_message(raw))
        if status == 402:
            raise InsufficientCredits(f"the provider reports insufficient credits (HTTP 402): {msg}")
        if status in (401, 403):
            raise AuthError(f"the API at {self.base_url} rejected the request (HTTP {status}): {msg}; "
                            "check EYRIE_API_KEY or api.apiKeySecretRef")
        if status == 429 or status == 408 or status >= 500:
            retry_after = parse_retry_after(headers.get("retry-after"))
            raise _Retry(f"http-{status}", f"HTTP {status}: {msg}", retry_after)
        raise RequestFailed(f"http-{status}", f"HTTP {status}: {msg}", 1)
