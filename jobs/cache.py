"""Where eyrie keeps what it builds or downloads once per machine: `$EYRIE_CACHE_DIR` (default
`~/.cache/eyrie`), with `tokenizers/` (downloaded tokenizer folders) and `models/` (the builtin demo
models made on first use). Below every stage, so a tokenizer loader and a model builder share it without importing
each other."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("EYRIE_CACHE_DIR") or Path.home() / ".cache" / "eyrie")


def models_dir() -> Path:
    """The builtin models built here (`builtin:tiny-llama`; tiny-chat's int8 and fp8 impostors, derived from
    the weights eyrie ships)."""
    return cache_dir() / "models"
