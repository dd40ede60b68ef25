"""A local OpenAI-compatible chat-completions provider for demos and tests. Not a real model.

It answers like OpenRouter does (reasoning, content, structured tool calls, `usage.cost`, SSE with
comment lines), deterministically per prompt, and injects the failures a real provider produces
(429, 5xx, 402 out of credits or in-flight budget full, 403 moderation, hangs, cut streams, errors
inside HTTP 200, malformed JSON, leaked tool-call markers, BYOK billing) so the client, the budget
and the tool checks can be exercised over real HTTP on loopback. It bills only the responses it
completed, so a test can compare eyrie's spend with the provider's (BYOK: fee plus upstream cost).

`api.baseUrl: simulated` starts it as a child process (`SimulatorProcess`); `eyrie simulate` runs it
in the foreground. It binds 127.0.0.1 unless told otherwise and must never stand in for a real API.

One module per provider behaviour (docs/architecture.md, "where a change goes"):
  config     what a spec's `api.simulator` and a simulator config file say (`SimulatorBehaviour`: the faults and
             other demo and test behaviours, outside the v1alpha1 CRD), as the `SimulatorConfig` a server runs on
  text       how the model writes calls to functions described only in the prompt
  answers    the answers and the usage counted for them (prompt and completion tokens, `answerModel`'s decode)
  faults     OpenRouter's failures as they look on the wire
  endpoints  several providers of one model and OpenRouter's routing between them
  server     the HTTP server and its counters
  process    the server as a child process, and the foreground loop `eyrie simulate` runs
"""

from __future__ import annotations

import importlib
from typing import Any

# Each name from its module, imported on first use: a run starts the simulator's process from `config` and
# `process` alone, without the server and answer machinery it will never run itself (start-up seconds).
_HOMES = {
    "answers": ("UNKNOWN_EXTRA_TOKENS", "UNKNOWN_VARIANT", "Answer", "PromptCounter", "make_answer", "planned_calls"),
    "config": ("DEFAULT_FAULTS", "FAULTS", "MODEL_ID", "PROVIDER", "SimulatorBehaviour", "SimulatorConfig",
               "SimulatorConfigError", "read_behaviour"),
    "process": ("SimulatorProcess",),
    "server": ("SimulatorServer", "start_simulator"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = ["DEFAULT_FAULTS", "FAULTS", "MODEL_ID", "PROVIDER", "UNKNOWN_EXTRA_TOKENS", "UNKNOWN_VARIANT", "Answer",
           "PromptCounter", "SimulatorBehaviour", "SimulatorConfig", "SimulatorConfigError", "SimulatorProcess",
           "SimulatorServer", "make_answer", "planned_calls", "read_behaviour", "start_simulator"]


def __getattr__(name: str) -> Any:
    if name not in _HOME_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME_OF[name]}"), name)
