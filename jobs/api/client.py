"""Async chat-completions client for OpenAI-compatible APIs (OpenRouter first), built for throughput.

One `ChatClient` per worker: it sends the caller's body as-is (adding only the streaming and usage
flags), parses SSE or JSON into the generation record's `Response`, retries what a retry can fix
(429 and OpenRouter's transient in-flight-budget 402 honouring Retry-After, 408, 5xx, timeouts,
dropped connections and streams, errors inside an HTTP 200, malformed JSON, empty choices) with
capped full-jitter backoff, and stops at once on what it cannot (`provider_errors.classify` is the
table: other 402s -> InsufficientCredits, a moderated prompt or a length limit -> SampleRefused,
401 and other 403s -> AuthError, other 4xx -> RequestFailed). The API key lives only in the
Authorization header: never in a message, a repr or a log line.

The per-request path is kept lean (benchmarked against a bare httpx loop): orjson, bytes-level SSE
parsing, no logging, no per-request objects beyond what httpx itself builds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, NoReturn
from urllib.parse import quote, urlsplit

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport

from eyrie.jobs.api.errors import ApiError, ApiUnreachable, AuthError, RequestFailed, Retryable
from eyrie.jobs.api.limits import Limits, Rates, Taken, backoff_delay, is_loopback, parse_retry_after, pause
from eyrie.jobs.api.provider_errors import classify, parse_error_body
from eyrie.jobs.api.sse import SSEAccumulator, parse_completion
from eyrie.jobs.contract.records import Response

_loads = orjson.loads


def reported_cost(usage: dict[str, Any] | None) -> Decimal | None:
    """What the provider says the request cost the user, or None when it does not say.

    OpenRouter's usage accounting: `cost` is what it charged the account; with the user's own
    provider key (BYOK) that is only OpenRouter's fee, and `cost_details.upstream_inference_cost` is
    what the provider charged that key. The budget counts both: the sum when `is_byok`, or when
    upstream cost is reported without `is_byok` (counting it can only stop a run early, never let it
    overspend); with `is_byok: false` the upstream figure is already inside `cost`.
    """
    if not usage or usage.get("cost") is None:
        return None
    try:
        cost = Decimal(str(usage["cost"]))
        details = usage.get("cost_details")
        upstream = details.get("upstream_inference_cost") if isinstance(details, dict) else None
        if upstream is not None and usage.get("is_byok") is not False:
            cost += Decimal(str(upstream))
    except ArithmeticError:
        return None
    return cost if cost.is_finite() and cost >= 0 else None


@dataclass(slots=True)
class Completion:
    response: Response
    usage: dict[str, Any] | None
    cost: Decimal | None  # reported_cost(usage); None -> the caller prices it
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
    first_sent: float | None = None  # wall-clock time the first request left (the start-up timeline)
    first_answer: float | None = None  # and the first answer was whole


def raise_open_files(need: int) -> int:
    """Let this process hold `need` sockets (plus room for files and Ray's own): the soft limit on open files raised
    towards the hard one when it is lower (a shell's 1,024 or 20,000 against 10,000 requests in flight). Called by
    the process that owns the limit (`eyrie run`, `eyrie simulate`), never by library code; returns the soft
    limit now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = need + 4096
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if target > soft:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ----------------------------------------------------------------------------------- pure helpers


def _transport_kind(exc: BaseException) -> str:
    cause = exc.__cause__
    if isinstance(exc, (TimeoutError, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout)) or \
            isinstance(cause, TimeoutError):
        return "timeout"
    return "connection"


# ------------------------------------------------------------------------------------------ client


UNPAID_TIMEOUT_S = 30.0  # an unpaid GET (`ChatClient.unpaid`) that takes longer is not waited for


class ChatClient:
    """Chat completions against one base URL with retries, concurrency and rate limits.

    The rates are `rates` (shared by every client of the senders of one process that share the provider's limits;
    generate/sending/session.py), else this client's own of `requests_per_minute` and `tokens_per_minute`.
    Every attempt, a retry too, takes its request and its estimated tokens from them.
    """

    def __init__(self, base_url: str, api_key: str | None, *, timeout: float, max_retries: int,
                 max_concurrency: int, requests_per_minute: int | None = None,
                 tokens_per_minute: int | None = None, stream: bool = True,
                 headers: dict[str, str] | None = None, backoff_base: float = 0.5,
                 backoff_max: float = 60.0, openrouter_usage: bool | None = None, rates: Rates | None = None):
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
        self._url = self.base_url + "/chat/completions"
        self._sem = asyncio.Semaphore(max_concurrency)
        if rates is None:
            rates = Rates(Limits(max_concurrency, requests_per_minute, tokens_per_minute))
        self._rpm, self._tpm = rates.requests, rates.tokens
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
        # One aiohttp session (made on first use, inside the event loop): one connection per concurrency
        # slot, proxies from the environment except for loopback. Chat requests use it directly (`_open`):
        # httpx's request, header and response objects around each one cost a fifth of a request's CPU at
        # 10,000 in flight. The unpaid GETs go through httpx on the same session.
        self._aio: aiohttp.ClientSession | None = None
        self._headers = hdrs
        self._transport = AiohttpTransport(client=self._session)
        self._http = httpx.AsyncClient(transport=self._transport, headers=hdrs, timeout=httpx.Timeout(timeout))

    def _session(self) -> aiohttp.ClientSession:
        if self._aio is None:
            connector = aiohttp.TCPConnector(limit=self.max_concurrency + 1, ttl_dns_cache=300)
            # no limit of aiohttp's own (its default is 5 minutes in all): each attempt runs under
            # asyncio.timeout(timeout), which bounds its connect and every read too; a socket timer beside it would
            # never fire first and costs a timer rescheduled on every read (the unpaid GETs set theirs per request)
            self._aio = aiohttp.ClientSession(connector=connector, trust_env=not is_loopback(self.base_url),
                                              timeout=aiohttp.ClientTimeout(total=None))
        return self._aio

    def __repr__(self) -> str:
        return (f"ChatClient(base_url={self.base_url!r}, key={'set' if self._key else 'none'}, "
                f"max_concurrency={self.max_concurrency}, stream={self.stream})")

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._aio is not None and not self._aio.closed:  # chat requests only: httpx never took the session
            await self._aio.close()

    def _redact(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text

    @classmethod
    def unpaid(cls, base_url: str, api_key: str | None, *, timeout: float = UNPAID_TIMEOUT_S, concurrency: int = 1,
               headers: dict[str, str] | None = None) -> ChatClient:
        """A client for the provider's unpaid GETs (preflight's `/models`, the key's usage, a generation's cost,
        the endpoint listing): no retries (the caller decides what an answer that does not come means), at most
        `UNPAID_TIMEOUT_S` each. Use as `async with ChatClient.unpaid(...) as client:`."""
        return cls(base_url, api_key, timeout=min(UNPAID_TIMEOUT_S, timeout), max_retries=0,
                   max_concurrency=concurrency, headers=headers)

    # ---------------------------------------------------------------------------------- preflight

    async def preflight(self) -> None:
        """Fail before any paid request: no key for a remote API, an unreachable URL, a rejected key."""
        if not self._key and not is_loopback(self.base_url):
            raise AuthError("no API key: set EYRIE_API_KEY or api.apiKeySecretRef")
        # /models answers without a key on OpenRouter; its /key endpoint is what rejects a bad one
        paths = ["/models", "/key"] if self._openrouter and self._key else ["/models"]
        for path in paths:
            await self.get(path)

    @property
    def is_openrouter(self) -> bool:
        return self._openrouter

    async def get(self, path: str) -> tuple[int, bytes]:
        """GET a path under the base URL once (no retries: listings and checks, never paid): the
        status and body; ApiUnreachable when nothing answers, AuthError on 401/403."""
        try:
            resp = await self._http.get(self.base_url + path, timeout=min(self.timeout, 30.0))
        except (httpx.HTTPError, aiohttp.ClientError, OSError) as e:
            reason = self._redact(str(e) or type(e).__name__)
            raise ApiUnreachable(f"the API at {self.base_url} is unreachable ({reason}); "
                                 "check api.baseUrl and the network") from None
        if resp.status_code in (401, 403):
            raise AuthError(f"the API at {self.base_url} rejected the API key (HTTP {resp.status_code} "
                            f"on {path}: {self._redact(parse_error_body(resp.content).message)}); check "
                            "EYRIE_API_KEY or api.apiKeySecretRef")
        return resp.status_code, resp.content

    async def generation_cost(self, generation_id: str) -> Decimal | None:
        """What the provider billed for one generation (OpenRouter's `GET /generation?id=`:
        `total_cost`, plus `upstream_inference_cost` with the user's own provider key, as
        `reported_cost` counts a usage); None when it does not say (not found yet, no such
        endpoint, unreachable)."""
        try:
            status, raw = await self.get(f"/generation?id={quote(generation_id, safe='')}")
            data = orjson.loads(raw).get("data") if status == 200 else None
        except (ApiError, orjson.JSONDecodeError, AttributeError):
            return None
        if not isinstance(data, dict) or data.get("total_cost") is None:
            return None
        return reported_cost({"cost": data["total_cost"], "is_byok": data.get("is_byok"),
                              "cost_details": {"upstream_inference_cost": data.get("upstream_inference_cost")}})

    async def key_usage(self) -> Decimal | None:
        """The key's `usage` in dollars (OpenRouter's `GET /key`: all it was ever billed); None when
        the provider does not say."""
        try:
            status, raw = await self.get("/key")
            data = orjson.loads(raw).get("data") if status == 200 else None
            value = Decimal(str(data["usage"])) if isinstance(data, dict) and data.get("usage") is not None else None
        except (ApiError, orjson.JSONDecodeError, AttributeError, ArithmeticError):
            return None
        return value if value is not None and value.is_finite() and value >= 0 else None

    # --------------------------------------------------------------------------------- requests

    async def complete(self, body: dict[str, Any], *, est_tokens: int = 0,
                       on_id: Callable[[str], None] | None = None, stop: asyncio.Event | None = None) -> Completion:
        """Send one chat completion (retrying per the policy above) and return the parsed answer.
        `on_id` hears the provider's generation id of each attempt as soon as it is known (the
        `X-Generation-Id` header, else a stream's first chunk): what to ask the provider about if
        the request is abandoned before its answer arrives (`generation_cost`). Once `stop` is set (the run
        stopped) nothing more goes out: a request still waiting for the rate limits or for its retry raises
        NotSent (no record: a resume sends it again; a failed attempt is one a retry could fix, not an answer)."""
        data = orjson.dumps({**body, **self._extra})
        stats = self.stats
        start = time.monotonic()
        attempts = 0
        while True:
            attempts += 1
            try:
                resp, usage = await self._attempt(data, est_tokens, on_id, stop)
            except Retryable as e:
                stats.errors_by_kind[e.kind] = stats.errors_by_kind.get(e.kind, 0) + 1
                if attempts > self.max_retries:
                    raise RequestFailed(e.kind, self._redact(e.message), attempts, transient=True) from None
                stats.retries += 1
                delay = backoff_delay(attempts, self.backoff_base, self.backoff_max, e.retry_after)
                await pause(delay, stop)  # NotSent once the run stopped: the retry is not sent
                continue
            except ApiError as e:
                kind = type(e).__name__
                stats.errors_by_kind[kind] = stats.errors_by_kind.get(kind, 0) + 1
                if isinstance(e, RequestFailed):
                    e.attempts = attempts
                raise
            stats.completed += 1
            if stats.first_answer is None:
                stats.first_answer = time.time()
            return Completion(resp, usage, reported_cost(usage), attempts, time.monotonic() - start)

    async def _attempt(self, data: bytes, est_tokens: int, on_id: Callable[[str], None] | None = None,
                       stop: asyncio.Event | None = None) -> tuple[Response, dict[str, Any] | None]:
        async with self._sem:
            taken: list[Taken] = []
            try:
                if self._rpm is not None:
                    taken.append(await self._rpm.acquire(1, stop))
                if self._tpm is not None and est_tokens:
                    taken.append(await self._tpm.acquire(est_tokens, stop))
            except BaseException:  # NotSent, or cancelled: what was taken for it goes back
                for t in taken:
                    t.release()
                raise
            stats = self.stats
            stats.requests += 1
            stats.in_flight += 1
            try:
                async with asyncio.timeout(self.timeout):
                    if self.stream:
                        return await self._send_stream(data, on_id, taken)
                    return await self._send(data, on_id, taken)
            except TimeoutError:
                raise Retryable("timeout", f"no complete answer within {self.timeout:g}s") from None
            except (httpx.TransportError, aiohttp.ClientError, OSError) as e:
                kind = _transport_kind(e)
                raise Retryable(kind, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None
            finally:
                stats.in_flight -= 1
                for t in taken:
                    t.seen()

    async def _open(self, data: bytes, taken: list[Taken]) -> aiohttp.ClientResponse:
        if self.stats.first_sent is None:
            self.stats.first_sent = time.time()
        resp = await self._session().post(self._url, data=data, headers=self._headers, allow_redirects=False)
        for t in taken:  # the answer's head is here: the provider has seen the request
            t.seen()
        return resp

    async def _send(self, data: bytes, on_id: Callable[[str], None] | None, taken: list[Taken]
                    ) -> tuple[Response, dict[str, Any] | None]:
        resp = await self._open(data, taken)
        if on_id is not None and (gen := resp.headers.get("x-generation-id")):
            on_id(gen)
        try:
            raw = await resp.read()
        finally:
            resp.release()
        if resp.status != 200:
            self._status_error(resp.status, resp.headers, raw)
        return self._json_answer(raw)

    async def _send_stream(self, data: bytes, on_id: Callable[[str], None] | None, taken: list[Taken]
                           ) -> tuple[Response, dict[str, Any] | None]:
        resp = await self._open(data, taken)
        if on_id is not None and (gen := resp.headers.get("x-generation-id")):
            on_id(gen)
            on_id = None
        try:
            if resp.status != 200:
                self._status_error(resp.status, resp.headers, await resp.read())
            if not resp.headers.get("content-type", "").startswith("text/event-stream"):
                return self._json_answer(await resp.read())  # a JSON answer (often an error) instead of a stream
            acc = SSEAccumulator(self._redact)
            try:
                async for piece in resp.content.iter_any():
                    acc.feed(piece)
                    if on_id is not None and acc.id:  # the first chunk carries the generation's id
                        on_id(acc.id)
                        on_id = None
            except TimeoutError:
                raise
            except aiohttp.ClientError as e:
                raise Retryable("dropped-stream", f"the stream broke off: {type(e).__name__}") from None
            return acc.finish()
        finally:
            resp.release()

    def _json_answer(self, raw: bytes) -> tuple[Response, dict[str, Any] | None]:
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise Retryable("malformed-json", f"unparseable response body: {raw[:120]!r}") from None
        return parse_completion(doc, self._redact)

    def _status_error(self, status: int, headers: Mapping[str, str], raw: bytes) -> NoReturn:
        raise classify(parse_error_body(raw), http_status=status, retry_after=parse_retry_after(
            headers.get("retry-after")), where=self.base_url, redact=self._redact)
