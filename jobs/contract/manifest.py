"""manifest.json (DESIGN §3): what a finished run holds, built from what the stages left in the store.

Torch-free: `eyrie run` writes it when its last stage ends; the operator writes it when the last
extraction pod's summary lands.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from eyrie.jobs.contract import layout
from eyrie.jobs.contract.extraction import summarize
from eyrie.jobs.contract.fidelity import fidelity_section
from eyrie.jobs.contract.progress import load_progress
from eyrie.jobs.spec import DatasetGenerationSpec
from eyrie.jobs.store import NotFound, Store


def read_json(store: Store, key: str) -> Any:
    """A JSON document of the store, or None when it is not there."""
    try:
        return orjson.loads(store.get(key))
    except NotFound:
        return None


def finalize_manifest(spec: DatasetGenerationSpec, store: Store) -> dict:
    """Write manifest.json from what the stages left in the store."""
    typed = load_progress(store)
    progress = typed.to_json() if typed else {}  # its figures as progress.json spells them, quoted as they are
    models = dict(progress.get("models") or {})
    keys = store.list()
    extraction = summarize(store)
    pods = sum(1 for k in keys if k.startswith(f"{layout.HIDDEN}/summary-"))
    reconstruction = read_json(store, layout.SAMPLES_SUMMARY)
    scored = extraction.fidelity if extraction else None
    fid = spec.extraction.fidelity
    fidelity = None
    if scored is not None or reconstruction:
        fidelity = fidelity_section(scored or {}, (reconstruction or {}).get("samples"), fid.min_top1_agreement,
                                    fid.on_low)
    manifest = {
        "apiVersion": "eyrie.dev/v1alpha1",
        "kind": "DatasetManifest",
        "specHash": spec.spec_hash(),
        # what the records say, never what the spec says: the model(s) the requests named, and per
        # fingerprint (contract/fingerprint.py) the sampling they carried and what they hold
        "model": next(iter(models)) if len(models) == 1 else None,
        "models": models,
        "fingerprints": progress.get("fingerprints"),
        "attempt": progress.get("attempt"),
        "attempts": progress.get("attempts"),
        "spentUSD": progress.get("spentUSD"),
        "paidUSD": progress.get("paidUSD"),
        "samples": progress.get("samples"),
        "discardedUSD": progress.get("discardedUSD"),
        "badRows": progress.get("badRows"),
        "failures": progress.get("failures"),  # failed samples by error type (moderation, timeout, ...)
        "resendOnResume": progress.get("resendOnResume"),  # of them, failed only on transient errors
        "tokens": progress.get("tokens"),
        "tools": progress.get("tools"),
        "templateVariants": progress.get("templateVariants"),
        "agentic": progress.get("agentic"),  # generation.turns: all: conversations, turns, divergence
        "reconstruction": reconstruction,
        "extraction": {**extraction.to_manifest(), "pods": pods} if extraction else None,
        # per provider and source: target-model scores beside the tool and gap figures (contract/fidelity.py)
        "fidelity": fidelity,
        "files": {
            "generations": [k for k in keys if layout.parse_part_key(k)],
            "samples": [k for k in keys if k.startswith(f"{layout.SAMPLES}/shard-")],
            "hidden": [k for k in keys if k.startswith(f"{layout.HIDDEN}/") and "summary-" not in k],
            "fidelity": [k for k in keys if k.startswith(f"{layout.FIDELITY}/")],
        },
        "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    store.put(layout.MANIFEST, orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    return manifest
