"""What a test may not leave changed behind it: the process-global state library code must restore or
leave to the process that owns it (torch's thread count and its global generator's seed, the working
directory, the root logger, transformers' progress bars). A snapshot, compared after every test by
conftest's autouse fixture.

Environment variables are not in it: Ray's own `ray.init` in a test's process writes some
(RAY_AUTH_MODE, RAY_USAGE_STATS_ENABLED, PYTHONBREAKPOINT), which is Ray's and not eyrie's to undo;
eyrie's own writes are in the CLI entry points that own their process (`eyrie run`) or in child
processes' initializers (the SpecForge parser's workers) and in SGLangBackend, which restores them."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any


def snapshot() -> dict[str, Any]:
    """The state now; torch's only where torch is imported already (a torch-free test run stays so).
    In the suite torch is imported while test modules are collected, so every test is checked."""
    root = logging.getLogger()
    state: dict[str, Any] = {
        "cwd": os.getcwd(),
        "root logger level": root.level,
        # pytest's own capture handlers come and go with each phase; any other is the code's
        "root logger handlers": [h for h in root.handlers if not type(h).__module__.startswith("_pytest")],
    }
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is not None and hasattr(hf_logging, "is_progress_bar_enabled"):
        state["transformers' progress bars"] = hf_logging.is_progress_bar_enabled()
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        state["torch.get_num_threads()"] = torch.get_num_threads()
        # torch.set_num_threads called on any thread sets what every thread started later begins with (its
        # OpenMP count is per thread, read from a global at a thread's first parallel op): the main thread
        # can read 2 while a new executor thread (the extraction's writer, asyncio.to_thread) runs on 1
        state["torch.get_num_threads() in a new thread"] = _in_new_thread(torch.get_num_threads)
        state["torch.initial_seed()"] = torch.initial_seed()  # torch.manual_seed changes it; drawing numbers does not
    return state


def _in_new_thread(fn: Callable[[], Any]) -> Any:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), name="process-state-probe")
    t.start()
    t.join()
    return out[0]


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What differs, worded (keys in one only, e.g. torch imported meanwhile, are not changes)."""
    return [f"{k}: {before[k]!r}, then {after[k]!r}" for k in before if k in after and before[k] != after[k]]
