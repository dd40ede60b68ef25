"""What a run is told by whoever starts it, read once at start-up: the operator's attempt and uid,
the fingerprint a user accepted, and the API key. Nothing else in eyrie reads these from the environment."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

API_KEY_ENV = "EYRIE_API_KEY"


def usable_cores() -> int:
    """The cores this process may run on: its affinity (what taskset or a container's cpuset leaves it),
    not the host's count: what a pool of worker processes is sized by."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def api_key_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
    """Under Ray, workers call this in their own process: the key never travels as an argument
    (Ray records those); it reaches them through their environment (a local cluster) or their pod's."""
    return environ.get(API_KEY_ENV) or None


@dataclass(frozen=True)
class RunContext:
    attempt: str  # EYRIE_ATTEMPT from the operator; a local run makes one up
    run_id: str | None = None  # EYRIE_RUN_ID: the DatasetGeneration's uid
    api_key: str | None = field(default=None, repr=False)  # never printed
    # EYRIE_ACCEPT_FINGERPRINT: the operator passes the new fingerprint's id a user accepted (the
    # annotation eyrie.dev/accept-fingerprint); `eyrie run --accept-changed FIELD...` is the local way
    accept_fingerprint: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> RunContext:
        attempt = environ.get("EYRIE_ATTEMPT") or (
            f"local-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}")
        return cls(attempt=attempt, run_id=environ.get("EYRIE_RUN_ID") or None, api_key=api_key_from_env(environ),
                   accept_fingerprint=environ.get("EYRIE_ACCEPT_FINGERPRINT") or None)
