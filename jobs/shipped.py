"""The builtin demo models' shipped files (package data in `extract/builtin/`): their names, MANIFEST.json, the
check of every file against it. Torch-free and below every stage: tokenizer loading (`reconstruct/tokenizers.py`)
finds a builtin model's tokenizer here, extraction and the simulator its weights (`extract/tiny.py`, the recipe
that made them and the decoder).
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eyrie.jobs.contract.extraction import ExtractionError

VERSION = 2  # bump when the recipe changes; `python hack/tiny_models.py` then rebuilds the shipped models
SHIPPED = Path(__file__).parent / "extract" / "builtin"  # package data: the trained models and MANIFEST.json
TRAINED = {"builtin:tiny-chat": 0, "builtin:tiny-chat-seed1": 1}  # name -> seed of `build`
DERIVED = {"builtin:tiny-chat-int8": "int8", "builtin:tiny-chat-fp8": "fp8"}  # name -> `quantize` of tiny-chat
NAMES = (*TRAINED, *DERIVED)
WEIGHTS = "model.safetensors"


class BuiltinModelError(ExtractionError):
    """A shipped model's file (or a derived one's weights) is not what MANIFEST.json says: never
    rebuilt silently, since a rebuilt model is another model (see `extract/tiny.py`)."""


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


_REBUILD = "python hack/tiny_models.py (it retrains them and rewrites builtin/ and MANIFEST.json)"


@functools.lru_cache(maxsize=1)
def manifest() -> dict[str, Any]:
    """builtin/MANIFEST.json: the recipe VERSION, the platform the models were trained on, and per
    model the sha256 of each shipped file (trained) or the digest of its weights (derived)."""
    path = SHIPPED / "MANIFEST.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BuiltinModelError(f"the builtin models' manifest {path} cannot be read ({e}): reinstall eyrie") from e
    if doc.get("version") != VERSION:
        raise BuiltinModelError(f"the shipped builtin models are of recipe version {doc.get('version')}, "
                                f"jobs/shipped.py's VERSION is {VERSION}: rebuild them with {_REBUILD}")
    return doc


_CHECKED: set[str] = set()  # folders whose files matched the manifest in this process
_CHECK_LOCK = threading.Lock()


def check_shipped(name: str) -> Path:
    """The folder of a shipped (trained) model, its files checked against MANIFEST.json once per process."""
    entry = manifest()["models"][name]
    folder = SHIPPED / entry["folder"]
    with _CHECK_LOCK:
        if str(folder) in _CHECKED:
            return folder
        for file, want in entry["files"].items():
            path = folder / file
            got = file_sha256(path) if path.is_file() else "missing"
            if got != want:
                raise BuiltinModelError(f"{name}: {path} has sha256 {got}, MANIFEST.json says {want}: reinstall "
                                        f"eyrie, or if the recipe changed, rebuild them with {_REBUILD}")
        _CHECKED.add(str(folder))
    return folder


def check_once(folder: Path, check: Callable[[], None]) -> None:
    """Run `check` on `folder` unless it passed in this process already (a derived model's weights)."""
    with _CHECK_LOCK:
        if str(folder) in _CHECKED:
            return
        check()
        _CHECKED.add(str(folder))


def clear_checks() -> None:
    """Forget the manifest and which folders matched it (tests, or a long-lived process whose files changed)."""
    manifest.cache_clear()
    with _CHECK_LOCK:
        _CHECKED.clear()


def tokenizer_folder(name: str) -> Path:
    """Where a builtin model's tokenizer is, without torch: an impostor's files other than its
    weights are tiny-chat's, byte for byte, so its tokenizer is read from the shipped tiny-chat."""
    if name not in NAMES:
        raise ExtractionError(f"unknown builtin chat model {name!r}; known: {', '.join(NAMES)}")
    return check_shipped(name if name in TRAINED else NAMES[0])
