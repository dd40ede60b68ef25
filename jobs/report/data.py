"""What the report shows, read from a run's store: the documents the stages wrote, plus one pass
over the generation records for what no document holds (tool semantics per source, provider and
tool; prompt and completion token distributions).

Reading is the only I/O; `Answers` aggregates in bounded memory (capped key sets, reservoir-sampled
token counts), so a report over millions of records costs one streaming read of them.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import orjson

from eyrie.jobs.contract import audit, layout, records, timeseries
from eyrie.jobs.contract.calltally import CallTally
from eyrie.jobs.contract.extraction import summarize as summarize_extraction
from eyrie.jobs.contract.manifest import read_json
from eyrie.jobs.contract.pilot import PilotVerdict, read_verdict
from eyrie.jobs.contract.progress import load_progress
from eyrie.jobs.contract.tally import cost_of
from eyrie.jobs.status import SampleCounts
from eyrie.jobs.store import Store
from eyrie.jobs.tools.gate import OTHER_TOOLS

MAX_KEYS = 100  # sources, providers or tool names shown one by one; the rest count as OTHER
OTHER = "(other)"
RESERVOIR = 20_000  # token counts (and fidelity scores) kept for histograms: exact below, uniform above


@dataclass
class Reservoir:
    """A uniform sample of at most `size` values of a stream (Vitter's algorithm R), seeded so a
    report of the same store is the same page."""

    size: int = RESERVOIR
    values: list[float] = field(default_factory=list)
    seen: int = 0
    _rng: random.Random = field(default_factory=lambda: random.Random(0), repr=False)

    def add(self, v: float) -> None:
        self.seen += 1
        if len(self.values) < self.size:
            self.values.append(v)
            return
        j = self._rng.randrange(self.seen)
        if j < self.size:
            self.values[j] = v


def _bounded(d: dict[str, Any], key: str, factory: Any) -> Any:
    """d[key], created with `factory`; past MAX_KEYS distinct keys, new ones share OTHER."""
    if key not in d and len(d) >= MAX_KEYS:
        key = OTHER
    if key not in d:
        d[key] = factory()
    return d[key]


@dataclass
class Money:
    """A running sum of dollars (a mutable value for `_bounded`)."""

    usd: Decimal = Decimal(0)


@dataclass
class ToolCounts:
    """One tool name: answers to prompts that declared it, those that called it, its calls."""

    declared: int = 0
    called: int = 0
    calls: int = 0
    invalid: int = 0

    @property
    def call_rate(self) -> float | None:
        """None when no prompt declared it structurally (text-mode declarations are not parsed here)."""
        return self.called / self.declared if self.declared else None

    @property
    def invalid_rate(self) -> float:
        return self.invalid / self.calls if self.calls else 0.0


@dataclass
class Answers:
    """Tool semantics and token counts of the persisted answers (one generation record each)."""

    status: dict[str, int] = field(default_factory=dict)  # ok / failed / rejected
    policy: dict[str, int] = field(default_factory=dict)  # keep / drop / flag of the answered ones
    by_source: dict[str, CallTally] = field(default_factory=dict)
    by_provider: dict[str, CallTally] = field(default_factory=dict)
    by_tool: dict[str, ToolCounts] = field(default_factory=dict)
    cost_by_provider: dict[str, Money] = field(default_factory=dict)
    discarded_usd: Decimal = Decimal(0)  # paid answers the tool policy dropped (`policy: drop`)
    modes: dict[str, int] = field(default_factory=dict)  # answers by tools mode (structured / text)
    prompt_tokens: Reservoir = field(default_factory=Reservoir)
    completion_tokens: Reservoir = field(default_factory=Reservoir)

    @property
    def total(self) -> CallTally:
        """Every answer's tool figures together (the sources' tallies summed)."""
        out = CallTally()
        for t in self.by_source.values():
            for k in ("answers", "declared", "called", "calls", "invalid", "leaked"):
                setattr(out, k, getattr(out, k) + getattr(t, k))
        return out

    def add_paid(self, r: records.Record) -> str:
        """Count what an answer cost against its provider (also the audit's answers); its provider."""
        provider = str((r.get("response") or {}).get("provider") or "(unknown)")
        if records.ADOPTED_FROM_AUDIT not in r:  # an adopted pilot answer: counted in its audit answer set (collect)
            _bounded(self.cost_by_provider, provider, Money).usd += cost_of(r)
        return provider

    def add(self, r: records.Record) -> None:
        status = str(r.get("status", "?"))
        self.status[status] = self.status.get(status, 0) + 1
        if status != "ok":
            return
        provider = self.add_paid(r)
        pol = str(r.get("policy", "keep"))
        self.policy[pol] = self.policy.get(pol, 0) + 1
        if pol == "drop":
            self.discarded_usd += cost_of(r)
        mode = str(r.get("toolsMode") or "structured")
        self.modes[mode] = self.modes.get(mode, 0) + 1
        usage = r.get("usage") or {}
        for name, res in (("prompt_tokens", self.prompt_tokens), ("completion_tokens", self.completion_tokens)):
            v = usage.get(name)
            if isinstance(v, int) and not isinstance(v, bool):
                res.add(v)
        checks = r.get("checks")
        if not checks:
            return
        calls = checks.get("calls") or []
        entry = (bool(checks.get("declared")), bool(checks.get("called")), len(calls),
                 int(checks.get("invalidCalls", 0)), bool(checks.get("leaked")))
        _bounded(self.by_source, str(r.get("source", "")), CallTally).add(*entry)
        _bounded(self.by_provider, provider, CallTally).add(*entry)
        declared = {t.get("function", {}).get("name") for t in (r.get("request") or {}).get("tools") or []
                    if isinstance(t, dict)}
        called = set()
        for c in calls:
            name = c.get("name") or OTHER_TOOLS
            t = _bounded(self.by_tool, name, ToolCounts)
            t.calls += 1
            t.invalid += not c.get("valid", False)
            called.add(name)
        for name in declared:
            if isinstance(name, str):
                t = _bounded(self.by_tool, name, ToolCounts)
                t.declared += 1
                t.called += name in called


SHOWCASE_IDS = 10_000  # sample keys kept per kind of answer for choosing the page's sample


def _leaves(value: Any) -> list[str]:
    """The values a tool call's arguments hold, as a prompt would write them: strings, and numbers
    without a trailing ".0" (booleans and nulls say nothing about the prompt)."""
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int | float):
        return [f"{value:g}"]
    return [str(value).strip()] if str(value).strip() else []


def _prompt_text(r: records.Record) -> str:
    """What the user side of the conversation said (system prompts left out: they declare the tools,
    and an enum there would ground any call)."""
    out = []
    for m in (r.get("request") or {}).get("messages") or []:
        if not isinstance(m, dict) or m.get("role") == "system":
            continue
        c = m.get("content")
        out += [c] if isinstance(c, str) else [p.get("text", "") for p in c or [] if isinstance(p, dict)]
    return "\n".join(out).casefold()


def grounded(r: records.Record) -> bool:
    """An answer whose structured tool calls are valid and take every argument from its prompt (the
    user asks about Lagos, the call says Lagos): what a reader can check by eye."""
    calls = (r.get("response") or {}).get("tool_calls") or []
    checks = r.get("checks") or {}
    if not calls or checks.get("invalidCalls") or checks.get("leaked"):
        return False
    prompt = _prompt_text(r)
    for c in calls:
        try:
            args = orjson.loads(((c or {}).get("function") or {}).get("arguments") or "{}")
        except orjson.JSONDecodeError:
            return False
        leaves = _leaves(args)
        if not leaves or any(x.casefold() not in prompt for x in leaves):
            return False
    return True


@dataclass
class Showcase:
    """Which answers the page's sample may be (`_pick_sample`): those whose tool calls take their
    arguments from the prompt, and plain answers without a call or a leak (bounded sets of keys)."""

    grounded: set[tuple[str, int]] = field(default_factory=set)
    plain: set[tuple[str, int]] = field(default_factory=set)

    def add(self, r: records.Record) -> None:
        if r.get("status") != "ok" or r.get("policy", "keep") == "drop":
            return
        key = (str(r.get("sample_id", "")), int(r.get("turn") or 0))
        checks = r.get("checks") or {}
        if grounded(r):
            if len(self.grounded) < SHOWCASE_IDS:
                self.grounded.add(key)
        elif not checks.get("called") and not checks.get("leaked") and len(self.plain) < SHOWCASE_IDS:
            self.plain.add(key)


@dataclass(frozen=True)
class Piece:
    """A run of the shown sample's tokens that decodes to whole characters."""

    text: str
    trained: bool  # in the loss mask
    segment: str  # prompt | reasoning | content | tool_calls
    special: bool  # an added/special token (a template marker)
    tokens: int


@dataclass(frozen=True)
class ShownSample:
    """One sample as the model reads it, token runs marked with the loss mask (the page's sample)."""

    sample_id: str
    source: str
    provider: str | None
    turn: int
    tokens: int
    trained: int  # tokens in the loss
    pieces: tuple[Piece, ...]
    hidden: int = 0  # prompt tokens left out of `pieces` (a long prompt shows its head and tail)
    gap_at: int = 0  # where in `pieces` they are left out
    why: str = ""  # why this sample was chosen (`_pick_sample`'s rule), as the page says it


PROMPT_HEAD, PROMPT_TAIL = 48, 144  # prompt tokens shown of a long prompt: its start, and what leads to the answer
SHOWN_TRAINED = 2048  # answer tokens shown at most
SAMPLE_SHARDS = 4  # samples shards the page's sample is chosen from
SHOWN_MAX_TOKENS = 4096  # a longer sample is not the page's: it would be mostly cut


@dataclass
class ReportData:
    """Everything one report shows; a section whose data is None is left out."""

    uri: str
    progress: dict[str, Any] | None
    manifest: dict[str, Any] | None
    audit: dict[str, Any] | None
    reconstruction: dict[str, Any] | None  # samples/summary.json
    extraction: dict[str, Any] | None
    series: list[dict[str, Any]]
    answers: Answers
    fidelity: dict[str, Any] | None  # the manifest's `fidelity` section
    fidelity_scores: dict[str, Reservoir] | None  # per-sample columns of fidelity/*.parquet
    agentic: dict[str, Any] | None
    audit_spent: Decimal = Decimal(0)  # what every audit paid, as its kept answers say (contract/audit.py)
    providers: dict[str, Any] | None = None  # providers.json: the provider probe's verdict
    sample: ShownSample | None = None  # one sample rendered with its loss mask (needs the tokenizer)
    specforge_online: dict[str, Any] | None = None  # `eyrie export specforge-online`'s summary
    evaluation: dict[str, Any] | None = None  # `eyrie evaluate`'s evaluation.json: drafters and their acceptance
    pilot: PilotVerdict | None = None  # the pilot's verdict (pilot.json)

    @property
    def samples(self) -> SampleCounts | None:
        """What became of the prompts: progress.json's, else the manifest's (the same counts, kept)."""
        s = (self.progress or {}).get("samples") or (self.manifest or {}).get("samples")
        return SampleCounts.model_validate(s) if s else None

    @property
    def budget(self) -> Decimal | None:
        v = (self.progress or {}).get("maxUSD")
        return Decimal(str(v)) if v is not None else None

    @property
    def spent(self) -> Decimal:
        """The run's spend, with what audits paid since the run last wrote its progress."""
        src = self.progress or self.manifest or {}
        spent = Decimal(str(src.get("spentUSD") or "0"))
        counted = Decimal(str((self.progress or {}).get("auditUSD") or "0"))
        return spent + max(Decimal(0), self.audit_spent - counted)


FIDELITY_COLUMNS = ("top1_agreement", "mean_nll")


def _fidelity_scores(store: Store) -> dict[str, Reservoir] | None:
    """Per-sample fidelity columns for the histograms (issue 15's fidelity/shard-*.parquet)."""
    keys = [k for k in store.list(layout.FIDELITY) if k.endswith(".parquet")]
    if not keys:
        return None
    import io

    import pyarrow.parquet as pq

    out = {c: Reservoir() for c in FIDELITY_COLUMNS}
    for key in sorted(keys):
        table = pq.read_table(io.BytesIO(store.get(key)))
        for col in FIDELITY_COLUMNS:
            if col in table.column_names:
                for v in table.column(col).to_pylist():
                    if v is not None:
                        out[col].add(float(v))
    return {c: r for c, r in out.items() if r.seen} or None


def _segment_of(i: int, starts: list[int | None], n_prompt: int) -> str:
    if i < n_prompt:
        return "prompt"
    seg = "reasoning"
    for name, start in zip(("reasoning", "content", "tool_calls"), starts, strict=False):
        if start is not None and i >= start:
            seg = name
    return seg


def _complete(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def shown_sample(row: dict[str, Any], tok: Any) -> ShownSample:
    """Decode one samples-Parquet row into pieces, one per token (a token that ends inside a
    character joins the next ones until the character is whole), each marked trained or not, its
    segment and whether it is a template marker. Pure, given the tokenizer."""
    ids, mask = list(row["input_ids"]), list(row["loss_mask"])
    n_prompt = next((i for i, m in enumerate(mask) if m), len(ids))
    starts = list(row.get("segments") or [])
    special = {t.id for t in getattr(tok, "added", {}).values()}
    keep = list(range(len(ids)))
    hidden = 0
    if n_prompt > PROMPT_HEAD + PROMPT_TAIL:  # a long prompt: its head and its tail
        hidden = n_prompt - PROMPT_HEAD - PROMPT_TAIL
        keep = [i for i in keep if i < PROMPT_HEAD or i >= n_prompt - PROMPT_TAIL]
    keep = [i for i in keep if i < n_prompt + SHOWN_TRAINED]
    pieces: list[Piece] = []
    run: list[int] = []
    buf = b""
    gap_at = 0
    for i in [*keep, None]:
        if run and (i is None or i != run[-1] + 1 or _complete(buf) or ids[i] in special
                    or bool(mask[i]) != bool(mask[run[0]])):
            f = run[0]
            pieces.append(Piece(buf.decode("utf-8", errors="replace"), bool(mask[f]), _segment_of(f, starts, n_prompt),
                                ids[f] in special, len(run)))
            if i is not None and i != run[-1] + 1:
                gap_at = len(pieces)
            run, buf = [], b""
        if i is not None:
            run.append(i)
            buf += tok.token_bytes(ids[i])
    return ShownSample(str(row.get("sample_id", "")), str(row.get("source", "")), row.get("provider"),
                       int(row.get("turn") or 0), len(ids), sum(1 for m in mask if m), tuple(pieces), hidden,
                       gap_at)


SHOWN_WHY = {
    "grounded": "of the answers whose tool calls take every argument from the prompt, the one of median length",
    "plain": "no answer's tool calls take all their arguments from the prompt; of the answers without a tool "
             "call, the one of median length",
    "any": "of the samples, the one of median length",
}


def _median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The row whose length is the median's (the shorter of two as near): typical, not the extreme."""
    mid = statistics.median_low(r["n_tokens"] for r in rows)
    return min(rows, key=lambda r: (abs(r["n_tokens"] - mid), r["n_tokens"], str(r.get("sample_id"))))


def choose_sample(rows: list[dict[str, Any]], showcase: Showcase) -> tuple[dict[str, Any], str] | None:
    """The page's sample and why (`SHOWN_WHY`): representative (of median length among its kind, never
    flagged, at most 4,096 tokens) and coherent where that can be told: an answer whose tool calls
    take every argument from its prompt, else an answer without a call, else any sample. `rows`:
    sample_id, turn, n_tokens, flags of each candidate. Pure."""
    fit = [r for r in rows if not r.get("flags") and r["n_tokens"] <= SHOWN_MAX_TOKENS]
    for kind, keys in (("grounded", showcase.grounded), ("plain", showcase.plain), ("any", None)):
        pool = [r for r in fit if keys is None or (str(r.get("sample_id")), int(r.get("turn") or 0)) in keys]
        if pool:
            return _median_row(pool), kind
    return None


def _pick_sample(store: Store, manifest: dict[str, Any] | None, summary: dict[str, Any] | None,
                 showcase: Showcase) -> ShownSample | None:
    """One sample of the first samples shards (`choose_sample`), decoded with the run's tokenizer;
    None when there is no sample or the tokenizer cannot be loaded here."""
    tokenizer = ((summary or {}).get("tokenizer") or ((manifest or {}).get("reconstruction") or {}).get(
        "tokenizer") or {}).get("name")
    keys = sorted(k for k in store.list(layout.SAMPLES) if k.endswith(".parquet"))
    if not tokenizer or not keys:
        return None
    import io

    import pyarrow.parquet as pq

    from eyrie.jobs.errors import EyrieError
    from eyrie.jobs.reconstruct.tokenizers import load_tokenizer
    from eyrie.jobs.spec import TargetSpec

    rows = []  # what the choice reads of each row: never the token ids of a whole shard
    for key in keys[:SAMPLE_SHARDS]:
        pf = pq.ParquetFile(io.BytesIO(store.get(key)))
        cols = [c for c in ("sample_id", "turn", "n_tokens", "flags") if c in pf.schema_arrow.names]
        rows += [{**r, "key": key, "index": i} for i, r in enumerate(pf.read(columns=cols).to_pylist())]
    chosen = choose_sample(rows, showcase)
    if chosen is None:
        return None
    row, kind = chosen
    whole = pq.read_table(io.BytesIO(store.get(row["key"]))).slice(row["index"], 1).to_pylist()[0]
    try:
        tok = load_tokenizer(TargetSpec(model="report", tokenizer=tokenizer))
    except (EyrieError, OSError, ValueError):
        return None  # e.g. a hub id this machine cannot reach: the page goes without its sample
    return replace(shown_sample(whole, tok), why=SHOWN_WHY[kind])


def _scored(fidelity: dict[str, Any] | None) -> dict[str, Any] | None:
    """The manifest's fidelity, when extraction scored any answer (else reconstruction's tool and gap
    figures alone: not a fidelity section)."""
    return fidelity if fidelity and ((fidelity.get("overall") or {}).get("samples") or 0) > 0 else None


def collect(store: Store) -> ReportData:
    """Read what the run left in `store`; documents a run has not written yet are None."""
    typed = load_progress(store)
    progress = typed.to_json() if typed else None
    manifest = read_json(store, layout.MANIFEST)
    answers, showcase = Answers(), Showcase()
    for r in records.iter_records(store):
        answers.add(r)
        showcase.add(r)
    for r in audit.iter_audit_records(store):  # paid like the run's own answers
        answers.add_paid(r)
    summary = read_json(store, layout.SAMPLES_SUMMARY)
    extraction = (manifest or {}).get("extraction")
    if extraction is None:
        pods = summarize_extraction(store)
        extraction = pods.to_manifest() if pods else None
    return ReportData(
        uri=store.uri, progress=progress, manifest=manifest, audit=audit.read_audit(store),
        reconstruction=summary, extraction=extraction,
        series=timeseries.read_timeseries(store), answers=answers,
        fidelity=_scored((manifest or {}).get("fidelity")), fidelity_scores=_fidelity_scores(store),
        agentic=(manifest or {}).get("agentic") or (progress or {}).get("agentic"),
        audit_spent=audit.audit_spend(store),
        providers=read_json(store, layout.PROVIDERS),
        sample=_pick_sample(store, manifest, summary, showcase),
        specforge_online=read_json(store, layout.SPECFORGE_ONLINE),
        evaluation=read_json(store, layout.EVALUATION),
        pilot=read_verdict(store),
    )
