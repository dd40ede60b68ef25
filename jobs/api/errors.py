"""What the client raises: each names what failed and whether a retry could help."""

from __future__ import annotations

from decimal import Decimal
from enum import StrEnum
from typing import Any

from eyrie.jobs.errors import EyrieError


class ApiError(EyrieError):
    """Base of every error this client raises."""


class NotSent(EyrieError):
    """The run stopped while the request waited for its turn (the provider's rate limits) or for a retry (an
    attempt that failed in a way a retry could fix): nothing more is sent, and the sender drops it as if the stop
    had come before it (a resume sends it)."""


class RequestFailed(ApiError):
    """The request failed for good: retries exhausted, or an error no retry can fix (e.g. HTTP 400).

    `details` is the provider's structured reason, where it gave one; `usage` and `cost` what the
    provider reported for a failed attempt it may have billed (None: nothing reported, nothing billed).
    `transient`: every attempt failed in a way a retry can fix (429, 5xx, the in-flight 402, a
    timeout, a broken stream) and the retries ran out; a resume sends the sample again. Otherwise
    (400, a moderation refusal, a length limit) sending it again would meet the same answer.
    """

    def __init__(self, kind: str, message: str, attempts: int, *, details: dict[str, Any] | None = None,
                 usage: dict[str, Any] | None = None, cost: Decimal | None = None, transient: bool = False):
        self.kind, self.message, self.attempts = kind, message, attempts
        self.details, self.usage, self.cost = details, usage, cost
        self.transient = transient
        super().__init__(kind, message, attempts)

    def __str__(self) -> str:
        # from the attributes: the client sets `attempts` after raising from inside an attempt
        return f"{self.kind} after {self.attempts} attempt(s): {self.message}"


class Refusal(StrEnum):
    """Why a provider refused one sample for good: sending it again would only pay again."""

    MODERATION = "moderation"  # 403 moderation flag or guardrail content block; content_policy_violation
    LENGTH_LIMIT = "length-limit"  # mid-stream max_tokens / context-window error


class SampleRefused(RequestFailed):
    """The provider refused this prompt (moderation, a length limit): the sample fails, the run goes on."""

    def __init__(self, kind: Refusal, message: str, *, details: dict[str, Any] | None = None,
                 usage: dict[str, Any] | None = None):
        super().__init__(str(kind), message, 1, details=details, usage=usage)


class InsufficientCredits(ApiError):
    """The account or key cannot pay (402 out of credits, a spent key or guardrail budget). Never
    retried; the run stops."""


class AuthError(ApiError):
    """Missing or rejected API key (401), or a key without permission (403). Never retried."""


class ApiUnreachable(ApiError):
    """The base URL does not answer (connection refused, DNS, timeout)."""


class Retryable(EyrieError):
    """One attempt failed in a way a retry can fix: raised by the parsers and the error table, caught by the
    client's retry loop (it never leaves the client: retries that run out become a transient `RequestFailed`)."""

    def __init__(self, kind: str, message: str, retry_after: float | None = None):
        self.kind, self.message, self.retry_after = kind, message, retry_after
