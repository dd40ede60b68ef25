"""Stage 1's wire: the async chat-completions client (SSE and JSON), its retries and limits.

`ChatClient` is the way to call a provider; the errors say whether the run or only the sample stops.
"""

from eyrie.jobs.api.client import ChatClient, ClientStats, Completion
from eyrie.jobs.api.errors import ApiError, ApiUnreachable, AuthError, InsufficientCredits, RequestFailed

__all__ = ["ApiError", "ApiUnreachable", "AuthError", "ChatClient", "ClientStats", "Completion",
           "InsufficientCredits", "RequestFailed"]
