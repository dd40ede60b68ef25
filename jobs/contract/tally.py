"""What the persisted records say, gathered in one pass: per fingerprint and per attempt, the bad rows.

The manifest and the run's summary describe the records, never the spec: which model and sampling
the requests carried (read from the request bodies as sent), how many answers each fingerprint
holds and what they cost, what each attempt paid, and every row that was never sent. Torch-free,
bounded: a few keys per fingerprint, `BAD_ROWS_SHOWN` bad rows kept whole (all of them are
streamed to `samples/bad_rows.jsonl` by whoever writes it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

import orjson

from eyrie.jobs.contract import records
from eyrie.jobs.contract.progress import BadRow, FingerprintTally, SamplingSeen

BAD_ROWS_SHOWN = 5  # bad rows printed by a run and kept in progress.json
MAX_MODELS = 16  # distinct models (or sampling settings) kept per fingerprint
SAMPLING_KEYS = ("temperature", "top_p", "max_tokens", "seed", "reasoning", "provider")


def cost_of(rec: records.Record) -> Decimal:
    try:
        return Decimal(str(rec.get("costUSD") or "0"))
    except InvalidOperation:
        return Decimal(0)


@dataclass
class Group:
    """The records of one fingerprint or one attempt."""

    records: int = 0
    done: int = 0
    rejected: int = 0
    discarded: int = 0
    failed: int = 0
    paid: Decimal = Decimal(0)
    answers_usd: Decimal = Decimal(0)  # what the answered records cost (kept or discarded)
    discarded_usd: Decimal = Decimal(0)
    models: Counter[str] = field(default_factory=Counter)
    sampling: Counter[bytes] = field(default_factory=Counter)
    attempts: list[str] = field(default_factory=list)

    @property
    def answers(self) -> int:
        """Records the provider answered (kept or discarded)."""
        return self.done + self.discarded

    @property
    def sent(self) -> int:
        """Records whose request was sent (answered or failed)."""
        return self.done + self.discarded + self.failed

    def add(self, rec: records.Record) -> None:
        self.records += 1
        status = rec.get("status")
        cost = cost_of(rec)
        self.paid += cost
        if status == "ok":
            self.answers_usd += cost
        if status == "ok" and rec.get("policy") == "drop":
            self.discarded += 1
            self.discarded_usd += cost
        elif status == "ok":
            self.done += 1
        elif status == "rejected":
            self.rejected += 1
        else:
            self.failed += 1
        attempt = str(rec.get("attempt") or "")
        if attempt and attempt not in self.attempts and len(self.attempts) < MAX_MODELS:
            self.attempts.append(attempt)
        body = rec.get("request")
        if isinstance(body, dict):
            model = body.get("model")
            if isinstance(model, str) and (model in self.models or len(self.models) < MAX_MODELS):
                self.models[model] += 1
            key = orjson.dumps({k: body.get(k) for k in SAMPLING_KEYS if body.get(k) is not None},
                               option=orjson.OPT_SORT_KEYS)
            if key in self.sampling or len(self.sampling) < MAX_MODELS:
                self.sampling[key] += 1

    def figures(self) -> FingerprintTally:
        return FingerprintTally(records=self.records, done=self.done, rejected=self.rejected,
                                discarded=self.discarded, failed=self.failed, paid=self.paid,
                                discarded_usd=self.discarded_usd, attempts=list(self.attempts),
                                models=dict(self.models.most_common()),
                                sampling=[SamplingSeen(request=orjson.loads(k), records=n)
                                          for k, n in self.sampling.most_common()])


@dataclass
class Tally:
    """Every record, once: by fingerprint, by attempt, and the rows never sent."""

    all: Group = field(default_factory=Group)
    by_fingerprint: dict[str, Group] = field(default_factory=dict)
    by_attempt: dict[str, Group] = field(default_factory=dict)
    bad_rows: int = 0
    first_bad: list[BadRow] = field(default_factory=list)

    def add(self, rec: records.Record) -> None:
        self.all.add(rec)
        fp = str(rec["fingerprint"])
        self.by_fingerprint.setdefault(fp, Group()).add(rec)
        self.by_attempt.setdefault(str(rec.get("attempt") or ""), Group()).add(rec)
        if rec.get("status") == "rejected":
            self.bad_rows += 1
            if len(self.first_bad) < BAD_ROWS_SHOWN:
                self.first_bad.append(bad_row(rec))

    def models(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for g in self.by_fingerprint.values():
            out.update(g.models)
        return dict(out.most_common())

    def fingerprints(self) -> dict[str, FingerprintTally]:
        return {fp: g.figures() for fp, g in sorted(self.by_fingerprint.items())}


def bad_row(rec: records.Record) -> BadRow:
    """One line of `samples/bad_rows.jsonl`: where the row is (1-based, as editors count lines) and why."""
    err = rec.get("error") or {}
    row = rec.get("row")
    return BadRow(source=rec.get("source"), row=row + 1 if isinstance(row, int) else row, error=err.get("type"),
                  reason=err.get("message"), turn=rec.get("turn") or None)


def describe_bad_row(b: BadRow) -> str:
    return f"{b.source} row {b.row}: {b.reason}"
