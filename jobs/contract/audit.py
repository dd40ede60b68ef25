"""What `eyrie audit` leaves in the store: its answers (`audit/answers/<fingerprint>/`),
`audit.json` (the latest audit's figures and verdict, and the history of every audit before it) and
`audit/rows.jsonl` (the latest audit's verdict on each row or answer, to filter the rows paid for).

The answers are the truth of what the audits paid: `audit_spend` sums them, so a run's checkpoint and
the report count audit spend the moment an answer is durable, even when the audit was killed before
writing audit.json.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any

import orjson

from eyrie.jobs.contract import layout, records
from eyrie.jobs.errors import InputError
from eyrie.jobs.store import NotFound, PrefixedStore, Store

VERSION = 2
MAX_HISTORY = 100  # audits remembered in audit.json (their figures; the answers stay in the store)


def answer_store(store: Store, fingerprint: str) -> PrefixedStore:
    """One answer set, as a store laid out like a run's output (journal, parts, iter_records)."""
    return PrefixedStore(store, layout.audit_answers_prefix(fingerprint))


def fingerprints(store: Store) -> list[str]:
    """Every answer set the store holds."""
    return sorted({fp for k in store.list(layout.AUDIT_ANSWERS) if (fp := layout.parse_audit_answers_key(k))})


def iter_audit_records(store: Store) -> Iterator[records.Record]:
    """Every answer any audit bought, each once per answer set and mode."""
    for fp in fingerprints(store):
        yield from records.iter_records(answer_store(store, fp))


def _usd(value: Any) -> Decimal:
    try:
        d = Decimal(str(value or "0"))
    except InvalidOperation:
        return Decimal(0)
    return d if d.is_finite() else Decimal(0)


class AuditDocError(InputError, ValueError):
    """audit.json is not a document this eyrie writes."""


def read_audit(store: Store) -> dict[str, Any] | None:
    """audit.json (None before the first audit); AuditDocError for one of another version."""
    try:
        doc = orjson.loads(store.get(layout.AUDIT))
    except NotFound:
        return None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        version = doc.get("version") if isinstance(doc, dict) else None
        raise AuditDocError(f"{layout.AUDIT}: version {version!r}, not {VERSION}: written by another eyrie; move it "
                            "aside and run `eyrie audit` again (the answers it bought are kept and reused)")
    return doc


def audit_spend(store: Store) -> Decimal:
    """What every audit paid: the cost of every answer kept."""
    return sum((_usd(r.get("costUSD")) for r in iter_audit_records(store)), Decimal(0))


def history_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """What audit.json remembers of an audit once a newer one is the latest: its overall figures and
    verdict, not its per-source/per-tool tables, examples or sample ids."""
    figures = entry.get("figures") or {}
    keep = ("kind", "at", "samples", "seed", "model", "fingerprint", "changedSince", "from", "outcome", "spentUSD",
            "sent", "reused", "verdict")
    out = {k: entry[k] for k in keep if k in entry}
    if figures:
        out["figures"] = {k: figures[k] for k in ("modes", "paired", "projection") if k in figures}
    return out


def with_entry(previous: dict[str, Any] | None, entry: dict[str, Any], spent_total: Decimal) -> dict[str, Any]:
    """The audit.json that makes `entry` the latest and appends it to the history (bounded)."""
    prev = previous or {}
    history = [*prev.get("history", []), history_entry(entry)][-MAX_HISTORY:]
    return {"version": VERSION, **entry, "cumulativeSpentUSD": str(spent_total), "history": history}


def write_audit(store: Store, doc: dict[str, Any]) -> None:
    store.put(layout.AUDIT, orjson.dumps(doc, option=orjson.OPT_INDENT_2))


class RowStatus(StrEnum):
    """What became of one row (or bought answer) in an audit: `audit/rows.jsonl`'s `status`."""

    OK = "ok"  # an answer, judged: see its calls
    FAILED = "failed"  # the provider's error instead of an answer
    UNPARSABLE = "unparsable"  # its declared functions do not parse: not judged
    NO_DECLARATIONS = "no-declarations"  # it declares no function in a shape eyrie reads: not judged
    BAD_ROW = "bad-row"  # the row cannot be read (not JSON, no prompt, no answer)


MAX_WHY = 5  # reasons kept per row in rows.jsonl


def row_entry(base: dict[str, Any], status: RowStatus, checks: dict[str, Any] | None = None,
              error: str | None = None) -> dict[str, Any]:
    """One line of `audit/rows.jsonl`: `base` (row, sampleId, source, mode, model, costUSD, ...), the
    status, the calls found (name, format, valid, errors; from a record's `checks`), and `valid`: the
    answer's calls all validate and nothing leaked (None: not judged), with `why` not when it is not."""
    entry: dict[str, Any] = {**base, "status": str(status)}
    if error:
        entry["error"] = error
    if status != RowStatus.OK or checks is None:
        entry["valid"] = None
        return entry
    calls = [{"name": c.get("name"), "format": c.get("format") or "structured", "valid": bool(c.get("valid")),
              "errors": list(c.get("errors") or ())} for c in checks.get("calls") or ()]
    why = [f"call {i + 1} ({c['name']}, {c['format']}): {_errors_text(c['errors'])}"
           for i, c in enumerate(calls) if not c["valid"]]
    why += [f"leaked tool-call markers in the {where}" for where in sorted(checks.get("leaks") or {})]
    entry.update({"calls": calls, "prose": bool(checks.get("prose")), "valid": not why})
    if why:
        entry["why"] = why[:MAX_WHY]
    return entry


def _errors_text(errors: list[Any]) -> str:
    """A call's errors (`{"path", "message"}`, as the validator gives them) in one line."""
    out = [f"{e.get('path') or '(arguments)'}: {e.get('message')}" if isinstance(e, dict) else str(e) for e in errors]
    return "; ".join(out) or "invalid"


def write_rows(store: Store, lines: Iterable[bytes]) -> None:
    """`audit/rows.jsonl`, one `row_entry` a line (orjson-encoded, newline-terminated), in one put."""
    store.put(layout.AUDIT_ROWS, b"".join(lines))


def read_rows(store: Store) -> list[dict[str, Any]]:
    try:
        data = store.get(layout.AUDIT_ROWS)
    except NotFound:
        return []
    return [orjson.loads(line) for line in data.splitlines() if line.strip()]
