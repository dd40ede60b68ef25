"""The store layout of DESIGN §3: every key a stage writes or reads, and the sample identity.

The one place that knows the store's keys: the data plane and the operator both import it.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson

MANIFEST = "manifest.json"
PROGRESS = "progress.json"
AUDIT = "audit.json"
AUDIT_ANSWERS = "audit/answers"  # what `eyrie audit` bought: one folder per settings fingerprint
AUDIT_SHARDS = {"text": 0, "structured": 1}  # the audit's answers of each tools mode, as a shard
AUDIT_ROWS = "audit/rows.jsonl"  # the latest audit's verdict per row or answer (contract/audit.row_entry)
BUDGET = "budget.json"  # requests stops abandoned in flight: their bounds and what they really cost
INFLIGHT = "inflight"  # one object per sending worker: what bounds its requests in flight (generate/budget/inflight.py)
FINGERPRINT = "fingerprint.json"  # what shaped the output's answers (contract/fingerprint.py)
GENERATIONS = "generations"
PLAN = "generations/plan.json"  # the shards' row ranges, kept by every attempt (generate/plan.py)
SAMPLES = "samples"
HIDDEN = "hidden"
FIDELITY = "fidelity"  # per-sample target-model scores of the answers, one Parquet per input shard
SAMPLES_SUMMARY = "samples/summary.json"  # the reconstruction summary the manifest quotes
BAD_ROWS = "samples/bad_rows.jsonl"  # every row never sent: source, row (1-based), error type, reason
TIMESERIES = "timeseries.jsonl"  # spend, requests and retries over time, rewritten with progress.json
REPORT = "report.html"  # `eyrie report --html`, written by `eyrie run` when it ends
PROVIDERS = "providers.json"  # the provider probe's measures and verdict per endpoint (generate/probe/run.py)
SPECFORGE_ONLINE = "exports/specforge-online.json"  # `eyrie export specforge-online`'s summary, for the report
EVALUATION = "evaluation.json"  # `eyrie evaluate`: drafters trained on this output (and others), their acceptance
EVALUATION_DRAFTERS = "evaluation/drafters"  # each drafter's result by what decides it, reused by later evaluations
PROBE_ANSWERS = "providers/answers"  # the probe's records, one object per group commit
FIDELITY = "fidelity"  # per-sample fidelity scores (fidelity/shard-NNNNN.parquet), when scored
PILOT = "pilot.json"  # the pilot's verdict (contract/pilot.py), written once it decided
PILOT_SLICES = "pilot"  # the pilot's slices: one output-like folder per option (pilot_slice_prefix)

_PART_RE = re.compile(r"^generations/shard-(\d{5})/part-(\d{5})\.jsonl\.gz$")
_JOURNAL_RE = re.compile(r"^generations/shard-(\d{5})/journal/([0-9a-f]{8})-(\d{8})\.jsonl\.gz$")
_FINGERPRINT_RE = re.compile(r"^[0-9a-f]{12,16}$")  # contract/fingerprint ids (12 hex digits)
_AUDIT_RE = re.compile(r"^audit/answers/([0-9a-f]{12,16})/")
_SAMPLES_RE = re.compile(r"^samples/shard-(\d{5})\.parquet$")


def shard_prefix(shard: int) -> str:
    return f"{GENERATIONS}/shard-{shard:05d}"


def part_key(shard: int, part: int) -> str:
    return f"{shard_prefix(shard)}/part-{part:05d}.jsonl.gz"


def journal_prefix(shard: int) -> str:
    return f"{shard_prefix(shard)}/journal"


def journal_key(shard: int, writer: str, seq: int) -> str:
    """One group commit of a shard's answers (`writer`: 8 hex digits naming the worker instance,
    `seq`: its commit number); compacted into parts when the shard ends (records.compact_shard)."""
    return f"{journal_prefix(shard)}/{writer}-{seq:08d}.jsonl.gz"


def audit_answers_prefix(fingerprint: str) -> str:
    """The folder of one audit answer set: a store of its own (`store.PrefixedStore`) laid out like a
    run's output (`generations/shard-NNNNN/...`, one shard per tools mode, `AUDIT_SHARDS`), plus
    `settings.json`, the fingerprint's fields (model, routing, sampling, ...)."""
    if not _FINGERPRINT_RE.match(fingerprint):
        raise ValueError(f"not an audit fingerprint: {fingerprint!r}")
    return f"{AUDIT_ANSWERS}/{fingerprint}"


AUDIT_SETTINGS = "settings.json"  # inside an answer set's folder


def parse_audit_answers_key(key: str) -> str | None:
    """The fingerprint of the answer set a key belongs to (None for any other key)."""
    m = _AUDIT_RE.match(key)
    return m.group(1) if m else None


def probe_answers_key(writer: str, seq: int) -> str:
    """One group commit of the provider probe's records (`writer`, `seq` as in `journal_key`)."""
    return f"{PROBE_ANSWERS}/{writer}-{seq:08d}.jsonl.gz"


def pilot_slice_prefix(option: str) -> str:
    """The folder of one pilot option's slice: a store of its own laid out like a run's output
    (generations/, samples/, hidden/), what the option's drafter trains on; the structured slice also holds
    the pilot's evaluation.json (the held-out answers are its)."""
    if option not in ("structured", "text", "dataset"):
        raise ValueError(f"not a pilot option: {option!r}")
    return f"{PILOT_SLICES}/{option}"


def inflight_key(worker: str, writer: str) -> str:
    """A sending worker's in-flight object (`writer`: 8 hex digits naming the worker instance)."""
    return f"{INFLIGHT}/{worker}-{writer}.json"


def evaluation_drafter(key: str) -> str:
    """One drafter's result (its held-out counts, losses, training figures), keyed by `evaluate.run.drafter_key`."""
    return f"{EVALUATION_DRAFTERS}/{key}.json"


def samples_key(shard: int) -> str:
    return f"{SAMPLES}/shard-{shard:05d}.parquet"


def fidelity_key(shard: int) -> str:
    return f"{FIDELITY}/shard-{shard:05d}.parquet"


def summary_key(index: int, count: int) -> str:
    """One extraction pod's summary (pod `index` of `count`)."""
    return f"{HIDDEN}/summary-{index:05d}-of-{count:05d}.json"


def parse_part_key(key: str) -> tuple[int, int] | None:
    m = _PART_RE.match(key)
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_journal_key(key: str) -> tuple[int, str, int] | None:
    """(shard, writer, seq) of a journal object's key (None for any other key)."""
    m = _JOURNAL_RE.match(key)
    return (int(m.group(1)), m.group(2), int(m.group(3))) if m else None


def parse_samples_key(key: str) -> int | None:
    """The shard of a samples Parquet key (None for any other key)."""
    m = _SAMPLES_RE.match(key)
    return int(m.group(1)) if m else None


def sample_id(source: str, row: int, prompt: Any) -> str:
    """Stable id of one prompt: a hash of (source name, row index, prompt content)."""
    h = hashlib.sha256()
    h.update(source.encode())
    h.update(b"\0")
    h.update(str(row).encode())
    h.update(b"\0")
    h.update(orjson.dumps(prompt, option=orjson.OPT_SORT_KEYS))
    return h.hexdigest()[:32]


def turn_sample_key(sid: str, turn: int) -> str:
    """The key of one regenerated turn's sample in the hidden-state index and fidelity files
    (`generation.turns: all`, perTurn): the sample id for turn 0, `<id>.t<turn>` after it."""
    return sid if turn == 0 else f"{sid}.t{turn}"
