"""Stage 1's wire: the async chat-completions client (SSE and JSON), its retries and limits.

`ChatClient` is the way to call a provider; the errors say whether the run or only the sample stops.
"""

from eyrie.jobs.api.client import ChatClient, ClientStats, Completion, reported_cost
from eyrie.jobs.api.errors import (
    ApiError,
    ApiUnreachable,
    AuthError,
    InsufficientCredits,
    Refusal,
    RequestFailed,
    SampleRefused,
)

__all__ = ["ApiError", "ApiUnreachable", "AuthError", "ChatClient", "ClientStats", "Completion",
           "InsufficientCredits", "Refusal", "RequestFailed", "SampleRefused", "reported_cost"]
