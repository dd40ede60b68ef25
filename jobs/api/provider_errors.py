"""What a provider's error means for a run: the one table (docs/operating.md prints it for users).

The same classification serves an HTTP error status, an error inside an HTTP 200 body and an error
event in the middle of an SSE stream, because OpenRouter sends the same `error` object in all three
(API reference, "Errors and debugging": `{code, message, metadata}`; mid-stream errors carry
`metadata.error_type`). Pure: the client parses, asks `classify`, raises what it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from eyrie.jobs.api.errors import (
    AuthError,
    InsufficientCredits,
    Refusal,
    RequestFailed,
    Retryable,
    SampleRefused,
)

MESSAGE_LIMIT = 500  # characters of a provider's error message kept in ours

# error_type values of the "Token and length limits" table: the same request hits the same limit
LENGTH_LIMITS = frozenset({"context_length_exceeded", "max_tokens_exceeded", "token_limit_exceeded",
                           "string_too_long"})
# Limits page, "In-flight spending budget": transient, with a Retry-After header
IN_FLIGHT_REASON = "in_flight_budget_exhausted"
IN_FLIGHT_SOURCE = "openrouter_in_flight_budget"
# metadata kept with a refused sample: moderation (reasons, flagged_input, provider_name,
# model_slug), guardrail content filters (patterns), typed provider errors (error_type, provider_code)
DETAIL_KEYS = ("reasons", "flagged_input", "provider_name", "model_slug", "patterns", "error_type",
               "provider_code")


@dataclass(frozen=True)
class ProviderError:
    """One `error` object as the provider sent it."""

    code: str  # error.code as text: "402", or a string code such as "server_error"
    message: str  # error.message (+ metadata.raw), truncated
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> int | None:
        return int(self.code) if self.code.isdigit() else None

    @property
    def error_type(self) -> str:
        return str(self.metadata.get("error_type") or "")

    def details(self, redact: Callable[[str], str]) -> dict[str, Any] | None:
        out = {k: self.metadata[k] for k in DETAIL_KEYS if self.metadata.get(k) not in (None, "", [])}
        return orjson.loads(redact(orjson.dumps(out).decode())) if out else None


def parse_error(err: Any) -> ProviderError:
    """An `error` value (an object, or whatever else a provider put there)."""
    if not isinstance(err, dict):
        return ProviderError("", str(err)[:MESSAGE_LIMIT])
    meta = err.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    msg = str(err.get("message") or err)
    if meta.get("raw"):
        msg += f" ({str(meta['raw'])[:200]})"
    return ProviderError(str(err.get("code", "")), msg[:MESSAGE_LIMIT], meta)


def parse_error_body(raw: bytes) -> ProviderError:
    """The error of a non-200 response body; a body that is not OpenRouter-shaped becomes its text."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return ProviderError("", raw[:MESSAGE_LIMIT].decode("utf-8", "replace").strip() or "(empty body)")
    err = doc.get("error") if isinstance(doc, dict) else None
    if err:
        return parse_error(err)
    return ProviderError("", raw[:MESSAGE_LIMIT].decode("utf-8", "replace"))


def _content_block(err: ProviderError) -> bool:
    """A 403 for this prompt's content: moderation metadata (`reasons`, `flagged_input`), a guardrail
    pattern match (`patterns`), or a guardrail's "Request blocked..." message. Budget and allowlist
    403s also come from guardrails but name a `limit_source` or no block: those stop the run."""
    meta = err.metadata
    if meta.get("limit_source"):
        return False
    return bool(meta.get("reasons") or meta.get("flagged_input") or meta.get("patterns")
                or err.message.lower().startswith("request blocked"))


def as_is(text: str) -> str:
    """No redaction (parsing without a key to hide)."""
    return text


def classify(err: ProviderError, *, http_status: int | None, retry_after: float | None = None,
             where: str = "", redact: Callable[[str], str] = as_is) -> BaseException:
    """The exception for `err`: `http_status` is the response's status, None for an error inside an
    HTTP 200 answer (a JSON body or an SSE event), where only the documented special cases differ
    from "retry"."""
    msg = redact(err.message)
    meta = err.metadata
    code = http_status if http_status is not None else err.status
    if err.error_type in LENGTH_LIMITS:
        return SampleRefused(Refusal.LENGTH_LIMIT, f"{err.error_type}: {msg}; not retried, a retry meets the "
                             "same limit", details=err.details(redact))
    if err.error_type == "content_policy_violation" or (code == 403 and _content_block(err)):
        reasons = meta.get("reasons") or meta.get("patterns")
        why = f" (reasons: {', '.join(map(str, reasons))})" if isinstance(reasons, list) and reasons else ""
        return SampleRefused(Refusal.MODERATION, f"the provider refused this prompt{why}: {msg}",
                             details=err.details(redact))
    source, hint = meta.get("limit_source"), meta.get("remedy_hint")
    hint_text = f" ({redact(str(hint))})" if hint else ""
    if code == 402:
        if meta.get("reason") == IN_FLIGHT_REASON or source == IN_FLIGHT_SOURCE:
            return Retryable("402-in-flight", f"HTTP 402, in-flight spending budget full (transient): {msg}",
                          retry_after)
        if meta.get("reason") == "weight_exceeds_budget":
            return InsufficientCredits(f"one request's estimated cost is larger than the account's whole "
                                       f"in-flight budget (HTTP 402): {msg}{hint_text}; lower "
                                       "api.sampling.maxTokens or add credits, then resume")
        if source == "openrouter_key_limit":
            return InsufficientCredits(f"the API key's credit limit is spent (HTTP 402): {msg}{hint_text}; "
                                       "raise the key's limit or wait for its reset, then resume")
        return InsufficientCredits(f"the provider reports insufficient credits (HTTP 402): {msg}{hint_text}; "
                                   "add credits, then resume")
    if code == 403 and source:
        return InsufficientCredits(f"a spending limit set on the provider is spent (HTTP 403, {source}): "
                                   f"{msg}{hint_text}; raise it or wait for its reset, then resume")
    if code == 403 or (code == 401 and http_status is not None):
        at = f" at {where}" if where else ""
        return AuthError(f"the API{at} rejected the request (HTTP {code}): {msg}; check "
                         "EYRIE_API_KEY or api.apiKeySecretRef and the key's permissions")
    if http_status is None:
        return Retryable("error-body", f"error inside an HTTP 200 answer: {msg}")
    if code in (408, 429) or (code is not None and code >= 500):
        return Retryable(f"http-{code}", f"HTTP {code}: {msg}", retry_after)
    return RequestFailed(f"http-{code}", f"HTTP {code}: {msg}", 1)
