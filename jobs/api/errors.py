"""What the client raises: each names what failed and whether a retry could help."""

from __future__ import annotations

from eyrie.jobs.errors import EyrieError


class ApiError(EyrieError):
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
