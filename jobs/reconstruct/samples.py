"""The samples stage: generation records -> `samples/shard-NNNNN.parquet`, one file per shard.

Rebuilt from the records every time (idempotent): each generation shard's parts are read, every
record is reconstructed (`eyrie.jobs.reconstruct`), the kept samples are written atomically through
the store, and what was excluded is counted by reason. The summary goes into manifest.json.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import itertools
import statistics
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from eyrie.jobs.contract import layout, records
from eyrie.jobs.contract.calltally import CallTally
from eyrie.jobs.contract.fidelity import UNKNOWN_PROVIDER
from eyrie.jobs.contract.progress import load_progress
from eyrie.jobs.reconstruct.base import ChatFormat
from eyrie.jobs.reconstruct.formats import PackingRefused, packing_refused, resolve_format
from eyrie.jobs.reconstruct.reconstructor import Excluded, Reconstructor, Sample
from eyrie.jobs.reconstruct.tokenizers import LoadedTokenizer, load_tokenizer
from eyrie.jobs.reconstruct.variants import OTHER_PROVIDERS, Choice, chosen_variants
from eyrie.jobs.spec import DatasetGenerationSpec
from eyrie.jobs.store import Store

SCHEMA = pa.schema([
    ("sample_id", pa.string()),
    ("turn", pa.int32()),  # the regenerated assistant turn (generation.turns: all; packed: the last), else 0
    ("source", pa.string()),
    ("input_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.int8())),
    ("n_tokens", pa.int32()),
    ("flags", pa.list_(pa.string())),
    ("provider", pa.string()),  # the provider that served the answer (null when it was not named)
    ("segments", pa.list_(pa.int32())),  # token positions where reasoning, content, tool calls start
    ("fingerprint", pa.string()),  # the id of what shaped the answer (contract/fingerprint.py; null: unrecorded)
])
MIXED = "mixed_fingerprint"  # a turn whose prompt holds earlier answers bought under another fingerprint
EXAMPLES = 20  # excluded samples quoted in the summary (with their reason), the rest only counted
ROW_GROUP = 256  # samples per parquet row group: what is held as Python lists at a time
GAP_CLIP = 256  # gap histograms count |gap| > GAP_CLIP at +-GAP_CLIP: at most 513 bins whatever the run


def _distribution(values: list[int]) -> dict[str, Any]:
    if not values:
        return {"count": 0}
    s = sorted(values)

    def q(p: float) -> int:
        return s[min(len(s) - 1, round(p * (len(s) - 1)))]

    hist = Counter(max(-GAP_CLIP, min(GAP_CLIP, v)) for v in s)
    return {"count": len(s), "exact": sum(v == 0 for v in s), "mean": round(statistics.fmean(s), 3),
            "min": s[0], "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": s[-1],
            # gap -> samples, for the report's histograms (clipped at +-GAP_CLIP)
            "histogram": {str(k): n for k, n in sorted(hist.items())}}


@dataclass
class AnswerGroup:
    """Tool semantics and token-count gaps of one provider's (or source's) answers, to set beside
    their fidelity: the same rates the gate judges (`CallTally`), over every answered record."""

    tally: CallTally = field(default_factory=CallTally)
    prompt_gaps: list[int] = field(default_factory=list)
    completion_gaps: list[int] = field(default_factory=list)

    def add(self, record: records.Record, result: Sample | Excluded) -> None:
        checks = record.get("checks") or {}
        self.tally.add(bool(checks.get("declared")), bool(checks.get("called")), len(checks.get("calls") or ()),
                       int(checks.get("invalidCalls") or 0), bool(checks.get("leaked")))
        if isinstance(result, Sample):
            if result.prompt_gap is not None:
                self.prompt_gaps.append(result.prompt_gap)
            if result.completion_gap is not None:
                self.completion_gaps.append(result.completion_gap)

    def to_manifest(self) -> dict[str, Any]:
        t = self.tally
        return {"answers": t.answers, "toolCallRate": round(t.call_rate, 6),
                "invalidCallRate": round(t.invalid_rate, 6), "leakRate": round(t.leak_rate, 6),
                "promptTokenGap": _distribution(self.prompt_gaps),
                "completionTokenGap": _distribution(self.completion_gaps)}


def provider_of(record: records.Record) -> str:
    provider = (record.get("response") or {}).get("provider")
    return provider if isinstance(provider, str) and provider else UNKNOWN_PROVIDER


@dataclass
class SamplesSummary:
    """What reconstruction did, for the manifest (`to_manifest`) and the run's report."""

    tokenizer: str
    tokenizer_sha256: str
    tokenizer_files: dict[str, str]
    chat_format: str
    template_sha256: str
    variant: str | None = None  # the format's variant for providers without a choice of their own
    # provider -> variant, sha256, thinking (the reading tried first where nothing says)
    variant_by_provider: dict[str, dict[str, Any]] = field(default_factory=dict)
    mismatched: list[str] = field(default_factory=list)  # providers whose counts fit no variant
    on_mismatch: str = "stop"  # target.onTemplateMismatch: what their samples got (flag | exclude)
    shards: int = 0
    records: int = 0
    samples: int = 0
    tokens: int = 0
    response_tokens: int = 0
    excluded: Counter[str] = field(default_factory=Counter)
    flagged: Counter[str] = field(default_factory=Counter)
    completion_gaps: list[int] = field(default_factory=list, repr=False)
    prompt_gaps: list[int] = field(default_factory=list, repr=False)
    logprobs: Counter[str] = field(default_factory=Counter)
    examples: list[dict[str, str]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    answers: AnswerGroup = field(default_factory=AnswerGroup, repr=False)
    by_provider: dict[str, AnswerGroup] = field(default_factory=dict, repr=False)
    by_source: dict[str, AnswerGroup] = field(default_factory=dict, repr=False)

    def answer(self, record: records.Record, result: Sample | Excluded) -> None:
        """Count one record's answer in its provider's and source's figures (each turn's, when packed)."""
        second = isinstance(result, Excluded) and result.reason == "duplicate"
        if record.get("status") == "ok" and record.get("response") and not second:
            for group in (self.answers, self.by_provider.setdefault(provider_of(record), AnswerGroup()),
                          self.by_source.setdefault(str(record.get("source", "")), AnswerGroup())):
                group.add(record, result)

    def add(self, result: Sample | Excluded) -> None:
        self.records += 1
        if isinstance(result, Excluded):
            self.excluded[result.reason] += 1
            if len(self.examples) < EXAMPLES:
                self.examples.append({"sampleId": result.sample_id, "reason": result.reason,
                                      "message": result.message})
            return
        self.samples += 1
        self.tokens += result.n_tokens
        self.response_tokens += result.n_response
        self.flagged.update(result.flags)
        if result.completion_gap is not None:
            self.completion_gaps.append(result.completion_gap)
        if result.prompt_gap is not None:
            self.prompt_gaps.append(result.prompt_gap)
        if result.logprobs:
            self.logprobs[result.logprobs] += 1

    def to_manifest(self) -> dict[str, Any]:
        return {
            "tokenizer": {"name": self.tokenizer, "sha256": self.tokenizer_sha256, "files": self.tokenizer_files},
            "chatTemplate": {"format": self.chat_format, "sha256": self.template_sha256, "variant": self.variant,
                             "byProvider": self.variant_by_provider, "mismatched": self.mismatched,
                             "onMismatch": self.on_mismatch},
            "samples": {
                "shards": self.shards, "files": self.files, "records": self.records, "kept": self.samples,
                "tokens": self.tokens, "responseTokens": self.response_tokens,
                "excluded": dict(sorted(self.excluded.items())), "flags": dict(sorted(self.flagged.items())),
                # response tokens minus usage.completion_tokens, per kept sample
                "completionTokenGap": _distribution(self.completion_gaps),
                "largeCompletionGaps": self.flagged.get("token_count_gap", 0),
                "promptTokenGap": _distribution(self.prompt_gaps),
                "logprobs": dict(self.logprobs),
                "excludedExamples": self.examples,
                # per provider and source, over every answer (fidelity sets its scores beside these)
                "answers": self.answers.to_manifest(),
                "byProvider": {k: v.to_manifest() for k, v in sorted(self.by_provider.items())},
                "bySource": {k: v.to_manifest() for k, v in sorted(self.by_source.items())},
            },
        }


def samples_table(samples: list[Sample]) -> pa.Table:
    return pa.Table.from_pydict({
        "sample_id": [s.sample_id for s in samples],
        "turn": [s.turn for s in samples],
        "source": [s.source for s in samples],
        "input_ids": [s.input_ids for s in samples],
        "loss_mask": [s.loss_mask for s in samples],
        "n_tokens": [s.n_tokens for s in samples],
        "flags": [list(s.flags) for s in samples],
        "provider": [s.provider for s in samples],
        "segments": [list(s.segments) if s.segments else None for s in samples],
        "fingerprint": [s.fingerprint for s in samples],
    }, schema=SCHEMA)


def _write_shard(store: Store, shard: int, results: Iterator[Sample | Excluded], summary: SamplesSummary) -> None:
    """Stream one shard's samples into a compressed parquet in memory (row group by row group, so
    token lists never pile up), then store it with one atomic put."""
    buf = io.BytesIO()
    with pq.ParquetWriter(buf, SCHEMA, compression="zstd") as writer:
        batch: list[Sample] = []
        for result in results:
            summary.add(result)
            if isinstance(result, Sample):
                batch.append(result)
                if len(batch) == ROW_GROUP:
                    writer.write_table(samples_table(batch))
                    batch = []
        if batch:
            writer.write_table(samples_table(batch))
    key = layout.samples_key(shard)
    store.put(key, buf.getvalue())
    summary.shards += 1
    summary.files.append(key)


class ProviderRebuild:
    """Each record rebuilt with the template variant its provider was found to render over the
    canary (progress.json `templateVariants`), thinking first as its counts showed where nothing
    says; providers without a choice get the default. A provider whose counts fit no variant
    (`mismatch`) has its samples flagged `template_mismatch`, or excluded with that reason under
    `target.onTemplateMismatch: exclude`."""

    def __init__(self, fmt: ChatFormat, tok: LoadedTokenizer, chosen: dict[str, Choice], on_mismatch: str = "stop"):
        self.default = Reconstructor(fmt, tok)
        self.on_mismatch = on_mismatch
        by_reading = {(fmt.variant, self.default.unsaid): self.default}
        self.providers: dict[str, Reconstructor] = {}
        self.known = set(chosen)
        self.mismatched = {p for p, c in chosen.items() if c.how == "mismatch"}
        for provider, c in chosen.items():
            if c.variant not in fmt.variants and c.thinking is None:
                continue  # nothing chosen (a format without variants is its own): the default
            v = c.variant if c.variant in fmt.variants else fmt.variant
            unsaid = self.default.unsaid if c.thinking is None else c.thinking
            if (v, unsaid) not in by_reading:
                by_reading[v, unsaid] = Reconstructor(fmt if v == fmt.variant else fmt.with_variant(v), tok, unsaid)
            self.providers[provider] = by_reading[v, unsaid]

    def __call__(self, record: records.Record) -> Sample | Excluded:
        provider = provider_of(record)
        key = provider if provider in self.known else OTHER_PROVIDERS  # past MAX_PROVIDERS: the shared entry
        result = (self.providers.get(key) or self.default)(record)
        if key not in self.mismatched or isinstance(result, Excluded):
            return result
        if self.on_mismatch == "exclude":
            return Excluded(result.sample_id, result.source, "template_mismatch",
                            f"sample {result.sample_id}: provider {provider}'s prompt counts fit no template variant "
                            "over the canary (target.onTemplateMismatch: exclude)", result.turn)
        return replace(result, flags=(*result.flags, "template_mismatch"))


def _turn_fingerprints(store: Store, shard: int) -> dict[str, dict[int, str | None]]:
    """Per conversation, the fingerprint each turn's answer was bought under (turns: all)."""
    out: dict[str, dict[int, str | None]] = {}
    for record in records.iter_records(store, shard):
        out.setdefault(record.get("sample_id", ""), {})[record.get("turn") or 0] = record.get("fingerprint")
    return out


def _shard_results(rebuild: ProviderRebuild, store: Store, shard: int, summary: SamplesSummary,
                   agentic: bool = False) -> Iterator[Sample | Excluded]:
    """`agentic`: flag a turn MIXED when an earlier turn of its conversation, which its prompt carries,
    was answered under another fingerprint (an accepted change mid-conversation)."""
    seen: set[tuple[str, int]] = set()
    turns = _turn_fingerprints(store, shard) if agentic else {}
    for record in records.iter_records(store, shard):
        key = (record.get("sample_id", ""), record.get("turn") or 0)
        if key in seen:  # one sample per prompt (per turn), whatever was written twice
            yield Excluded(key[0], record.get("source", ""), "duplicate", f"sample {key[0]}: a second record", key[1])
            continue
        result = rebuild(record)
        if isinstance(result, Sample):
            seen.add(key)
            earlier = {fp for t, fp in turns.get(key[0], {}).items() if t < key[1]}
            if earlier - {result.fingerprint}:
                result = dataclasses.replace(result, flags=(*result.flags, MIXED))
        summary.answer(record, result)
        yield result


def pack(turns: list[Sample | Excluded]) -> Sample | Excluded:
    """One conversation's turns (in order) as one sample with every answer in the loss: the last
    turn's tokens, provided each turn's prompt starts with the tokens of the turn before (the
    template rendered the history verbatim). Turns after the first excluded one are left out."""
    kept: list[Sample] = []
    for t in turns:
        if isinstance(t, Excluded) or t.turn != len(kept):
            break
        kept.append(t)
    if not kept:
        first = turns[0]
        return first if isinstance(first, Excluded) else Excluded(
            first.sample_id, first.source, "missing_turn", f"sample {first.sample_id}: turn 0 has no record")
    for prev, cur in itertools.pairwise(kept):
        if cur.input_ids[:len(prev.input_ids)] != prev.input_ids or cur.n_prompt < len(prev.input_ids):
            return Excluded(cur.sample_id, cur.source, "history_not_verbatim",
                            f"sample {cur.sample_id}: turn {cur.turn}'s prompt does not start with turn "
                            f"{prev.turn}'s tokens (the chat template rewrote an earlier turn)")
    last = kept[-1]
    flags = tuple(dict.fromkeys(f for t in kept for f in t.flags))
    if len({t.fingerprint for t in kept}) > 1 and MIXED not in flags:
        flags = (*flags, MIXED)
    return Sample(last.sample_id, last.source, last.input_ids, last.n_prompt, flags, last.completion_gap,
                  last.prompt_gap, last.logprobs, last.turn, tuple((t.n_prompt, t.n_tokens) for t in kept),
                  provider=last.provider, fingerprint=last.fingerprint)  # segments: per answer, none given


def _packed_results(rebuild: ProviderRebuild, store: Store, shard: int, summary: SamplesSummary
                    ) -> Iterator[Sample | Excluded]:
    """Per conversation: its turns rebuilt one by one, then packed. A conversation's records may lie in
    several parts, so the shard's results are grouped first (per-turn samples held until packed)."""
    convs: dict[str, list[Sample | Excluded]] = {}
    for result in _shard_results(rebuild, store, shard, summary, agentic=True):
        if isinstance(result, Excluded) and result.reason == "duplicate":
            yield result
            continue
        convs.setdefault(result.sample_id, []).append(result)
    for turns in convs.values():
        turns.sort(key=lambda t: t.turn)
        yield pack(turns)


def build_samples(spec: DatasetGenerationSpec, store: Store,
                  tokenizer: LoadedTokenizer | None = None) -> SamplesSummary:
    """Rebuild every `samples/shard-*.parquet` from the generation records in `store`."""
    tok = tokenizer or load_tokenizer(spec.target, spec.output.endpoint)
    fmt = resolve_format(spec.target.chat_format, tok, spec.target.template_variant)
    progress = load_progress(store)
    rebuild = ProviderRebuild(fmt, tok, chosen_variants(progress.template_variants if progress else None),
                              spec.target.on_template_mismatch)
    summary = SamplesSummary(tokenizer=tok.name, tokenizer_sha256=tok.sha256, tokenizer_files=dict(tok.files),
                             chat_format=fmt.name, template_sha256=fmt.sha256, variant=fmt.variant,
                             variant_by_provider={p: {"variant": r.fmt.variant or "", "sha256": r.fmt.sha256,
                                                      "thinking": r.unsaid}
                                                  for p, r in sorted(rebuild.providers.items())},
                             mismatched=sorted(rebuild.mismatched), on_mismatch=rebuild.on_mismatch)
    if spec.generation.turns == "all" and spec.samples.multi_turn == "packed":
        refused = packing_refused(fmt)
        if refused:
            raise PackingRefused(f"samples.multiTurn: packed is refused for {fmt.name}: {refused}; use perTurn")
        results = _packed_results
    elif spec.generation.turns == "all":
        results = functools.partial(_shard_results, agentic=True)
    else:
        results = _shard_results
    for shard in records.list_shards(store):
        _write_shard(store, shard, results(rebuild, store, shard, summary), summary)
    shards = {k for k in store.list(layout.SAMPLES) if layout.parse_samples_key(k) is not None}
    for stale in shards - set(summary.files):
        store.delete(stale)  # a shard whose records are gone: rebuilt means rebuilt from what exists
    return summary
