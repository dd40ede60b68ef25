"""`eyrie audit`: the same tool-declaring prompts sent with tools as text and as the API's `tools`.

This is the measurement the project exists for: does the model call tools as often, as validly and
in the same way when they are only described in the system prompt as when they are declared
natively, and what does the difference cost at the size of the whole dataset? The figures and the
verdict come from `generate/audit/stats.py`; this module picks the prompts, buys the answers once and
keeps them.

What it promises:
- **Paid once.** Every answer is durable in the store (`audit/answers/<fingerprint>/`, laid out
  like a run's generations: journal group commits, then parts) before its slot is freed. An audit
  with the same prompts and the same settings (model, sampling, provider: the `fingerprint`) sends
  nothing it already has; `--samples N` larger than before buys only the new prompts; a changed
  setting is a new answer set.
- **The same sample.** The default sample is a seeded random one of the tool-declaring prompts:
  each prompt's priority is a hash of (seed, sample id), and the N lowest are taken, so the sample
  of N+k holds the sample of N, whatever the order or the size of the sources.
- **Paid from the budget.** Requests go through the run's coordinator and in-flight bounds; what
  the audit paid is part of the spend the next run starts from (`contract/audit.audit_spend`), and
  of what `eyrie report` shows as spent and paid per provider, as soon as an answer is durable.
- `--from FILE` reads answers someone already paid for (`from_recorded.py`): the same checks and
  figures, nothing sent; `--rerun N` buys the other mode for N of those prompts. It is written to an
  output of its own (never the dataset's), and what it buys is paid and booked there.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson

from eyrie.jobs import sources
from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import audit as stored
from eyrie.jobs.contract import layout, records
from eyrie.jobs.contract.fingerprint import audit_fingerprint, diff
from eyrie.jobs.contract.progress import Outcome, now_iso
from eyrie.jobs.errors import EyrieError
from eyrie.jobs.generate.audit import stats
from eyrie.jobs.generate.budget.pricing import usd
from eyrie.jobs.generate.preflight import preflight
from eyrie.jobs.generate.sending.journal import Journal, ShardState, compact_shard, scan_shard
from eyrie.jobs.generate.sending.session import Ask, Session
from eyrie.jobs.spec import DatasetGeneration, DatasetGenerationSpec
from eyrie.jobs.store import Store, open_output
from eyrie.jobs.tools import declarations
from eyrie.jobs.tools.validation import ToolValidator

MODES = stats.MODES
DEFAULT_SAMPLES = 50
DEFAULT_SEED = 0
EXAMPLES = 3  # side-by-side answers kept in audit.json for the report
MAX_PROBLEMS = 100  # malformed rows of a --from file named one by one; the rest are counted
EXCERPT = 600  # characters of an answer shown in an example


class AuditError(EyrieError, RuntimeError):
    """The audit could not run (no tool-declaring prompts, budget already spent)."""


# ------------------------------------------------------------------------------ the sample


def priority(seed: int, sample_id: str) -> int:
    """A prompt's place in the seeded random order of the audit's sample."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{sample_id}".encode()).digest()[:8], "big")


@dataclass
class Picked:
    """The audit's sample, in priority order, and the dataset it is drawn from."""

    prompts: list[tuple[str, sources.Prompt]]
    declared: dict[str, frozenset[str]]  # sample id -> the function names its prompt declares
    population: dict[str, Any]  # prompts, declaredPrompts, unparsable, bySource
    references: dict[str, frozenset[str] | None] = field(default_factory=dict)


class Lowest:
    """The n items of lowest priority seen so far (a bounded max-heap)."""

    def __init__(self, n: int):
        self.n = n
        self._heap: list[tuple[int, int, Any]] = []
        self._i = 0

    def offer(self, pri: int, item: Any) -> None:
        if self.n <= 0:
            return
        self._i += 1
        entry = (-pri, self._i, item)
        if len(self._heap) < self.n:
            heapq.heappush(self._heap, entry)
        elif -self._heap[0][0] > pri:
            heapq.heapreplace(self._heap, entry)

    def entries(self) -> list[tuple[int, Any]]:
        """(priority, item), lowest priority first."""
        return [(-p, item) for p, _i, item in sorted(self._heap, key=lambda e: (-e[0], e[1]))]

    def items(self) -> list[Any]:
        return [item for _p, item in self.entries()]


def names_of(tools: Iterable[dict[str, Any]]) -> frozenset[str]:
    return frozenset(t["function"]["name"] for t in tools)


@dataclass(frozen=True)
class Declared:
    """A prompt's declarations as its answers are judged: what `prepare_prompt` made of them, their
    validator, and the function names they declare."""

    prepared: declarations.Prepared
    validator: ToolValidator
    names: frozenset[str]

    @property
    def shapes(self) -> tuple[declarations.DeclarationShape, ...]:
        """The shapes its declarations were written in (none when it declares nothing)."""
        return self.prepared.shapes if self.names else ()

    @classmethod
    def of(cls, prepared: declarations.Prepared | declarations.Rejected) -> Declared | declarations.Rejected:
        if isinstance(prepared, declarations.Rejected):
            return prepared
        return cls(prepared, ToolValidator.for_tools(prepared.declared_tools), names_of(prepared.declared_tools))


_DECLARED: OrderedDict[bytes, Declared | declarations.Rejected] = OrderedDict()
DECLARED_CACHE = 4096  # distinct declaration sets remembered per process (recorded files repeat a few)


def declarations_of(prompt: sources.Prompt, mode: str) -> Declared | declarations.Rejected:
    """The prompt's declarations, as `prepare_prompt` reads them, for picking it and checking its
    answer, not for sending it (the result's `messages` are not the row's): they do not depend on
    the last user turn, so rows that differ only there (a dataset's usual case) share one reading,
    one validator and one set of names."""
    head = prompt.messages[:-1] if prompt.messages and prompt.messages[-1].get("role") == "user" else None
    if head is not None and not any(m.get("role") == "user" for m in head) \
            and declarations.may_declare(str(prompt.messages[-1].get("content"))):
        head = None  # the last user turn is the first, which may hold the declarations itself
    if head is None:
        return Declared.of(declarations.prepare_prompt(prompt, mode))  # type: ignore[arg-type]
    key = orjson.dumps([mode, head, prompt.tools])
    if len(key) > declarations.CACHE_MAX_KEY_BYTES:
        return Declared.of(declarations.prepare_prompt(prompt, mode))  # type: ignore[arg-type]
    got = _DECLARED.get(key)
    if got is None:
        bare = sources.Prompt(prompt.source, prompt.row, [*head, {"role": "user", "content": ""}], prompt.tools,
                              prompt.fmt)
        got = _DECLARED[key] = Declared.of(declarations.prepare_prompt(bare, mode))  # type: ignore[arg-type]
        if len(_DECLARED) > DECLARED_CACHE:
            _DECLARED.popitem(last=False)
    else:
        _DECLARED.move_to_end(key)
    return got


def pick_prompts(dg: DatasetGeneration, n: int, seed: int = DEFAULT_SEED, *, answers: bool = False) -> Picked:
    """A seeded random sample of n tool-declaring prompts from the spec's sources (one streaming
    pass, O(n) memory), with the counts the costs are projected to. `answers`: each prompt also carries
    its row's own answer (the pilot's `datasetAnswers`)."""
    lowest = Lowest(n)
    declared: dict[str, frozenset[str]] = {}
    pop: dict[str, Any] = {"prompts": 0, "declaredPrompts": 0, "unparsable": 0, "bySource": {}}
    for src in dg.spec.sources:
        counts = pop["bySource"].setdefault(src.name, {"prompts": 0, "declaredPrompts": 0,
                                                       "declarationShapes": {}})
        for item in sources.iter_source(src, dg.spec.output.endpoint, answers=answers):
            if isinstance(item, sources.BadRow):
                continue
            pop["prompts"] += 1
            counts["prompts"] += 1
            got = declarations_of(item, "structured")
            stats.count_shapes(counts["declarationShapes"], None if isinstance(got, declarations.Rejected)
                               else got.shapes)
            if isinstance(got, declarations.Rejected):
                pop["unparsable"] += 1
                continue
            if got.names:
                pop["declaredPrompts"] += 1
                counts["declaredPrompts"] += 1
                sid = item.sample_id()
                lowest.offer(priority(seed, sid), (sid, item, got.names))
    chosen = lowest.items()
    for sid, _p, names in chosen:
        declared[sid] = names
    picked = Picked([(sid, p) for sid, p, _n in chosen], declared, pop)
    picked.references = _references(dg, picked.prompts)
    return picked


def reference_calls(prompt_messages: list[dict[str, Any]], whole: list[dict[str, Any]]) -> frozenset[str] | None:
    """The functions the dataset's own answer to the prompt calls (empty: it answered without a
    call); None when the row holds no answer to it. The answer is the first assistant turn after the
    prompt's last user turn, counted in the whole conversation."""
    users = sum(m.get("role") == "user" for m in prompt_messages)
    seen = 0
    for i, m in enumerate(whole):
        if m.get("role") == "user":
            seen += 1
            if seen == users:
                nxt = whole[i + 1] if i + 1 < len(whole) else None
                if nxt is None or nxt.get("role") != "assistant":
                    return None
                return frozenset(str((c.get("function") or {}).get("name")) for c in nxt.get("tool_calls") or ()
                                 if isinstance(c, dict))
    return None


def _references(dg: DatasetGeneration, picked: list[tuple[str, sources.Prompt]]) -> dict[str, frozenset[str] | None]:
    """The dataset's own answers to the picked prompts (a second pass, over the sources they come from)."""
    want: dict[tuple[str, int], tuple[str, sources.Prompt]] = {(p.source, p.row): (sid, p) for sid, p in picked}
    refs: dict[str, frozenset[str] | None] = {sid: None for sid, _ in picked}
    for src in dg.spec.sources:
        left = sum(1 for s, _r in want if s == src.name)
        if not left:
            continue
        for item in sources.iter_source(src, dg.spec.output.endpoint, whole=True):
            hit = want.get((item.source, item.row))
            if hit is None:
                continue
            if isinstance(item, sources.Prompt):
                refs[hit[0]] = reference_calls(hit[1].messages, item.messages)
            left -= 1
            if not left:
                break
    return refs


# ------------------------------------------------------------------------ the answer set


class AnswerSet:
    """The answers bought under one audit fingerprint (`contract/fingerprint.audit_fingerprint`: the
    model, routing, sampling, reasoning, simulator, ... that shape an answer): shard
    `AUDIT_SHARDS[mode]` of a store of its own."""

    def __init__(self, store: Store, spec: DatasetGenerationSpec):
        self.fingerprint = audit_fingerprint(spec)
        self.root = store  # the output the answers are kept and paid in
        self.store = stored.answer_store(store, self.fingerprint.id)
        self.states: dict[str, ShardState] = {m: scan_shard(self.store, layout.AUDIT_SHARDS[m]) for m in MODES}

    def have(self, mode: str) -> set[str]:
        return self.states[mode].done

    def write_settings(self) -> None:
        if not self.store.exists(layout.AUDIT_SETTINGS):
            self.store.put(layout.AUDIT_SETTINGS, orjson.dumps(self.fingerprint.to_json(), option=orjson.OPT_INDENT_2))

    def changed_since(self, previous: dict[str, Any] | None) -> list[str]:
        """What differs from the fingerprint of the audit before (its answers are kept, not reused)."""
        old = (previous or {}).get("fingerprint")
        if not isinstance(old, dict) or old.get("id") == self.fingerprint.id or "fields" not in old:
            return []
        return [c.describe() for c in diff(old["fields"], self.fingerprint.fields)]

    def compact(self, part_records: int) -> None:
        """Journal objects left by this audit (or a killed one) become parts."""
        for mode in MODES:
            shard = layout.AUDIT_SHARDS[mode]
            if records.list_journal(self.store, shard):
                compact_shard(self.store, shard, self.states[mode], part_records)

    def load(self, sids: set[str]) -> dict[str, dict[str, records.Record]]:
        """mode -> sample id -> record, of the wanted samples."""
        out: dict[str, dict[str, records.Record]] = {m: {} for m in MODES}
        for mode in MODES:
            for rec in records.iter_records(self.store, layout.AUDIT_SHARDS[mode]):
                if rec["sample_id"] in sids:
                    out[mode][rec["sample_id"]] = rec
        return out


async def _send(session: Session, todo: dict[str, list[tuple[str, sources.Prompt]]], answers: AnswerSet) -> int:
    """Send each mode's prompts, one sender per mode sharing the provider's limits (the session's pacer);
    each answer durable before its slot is freed. Returns requests sent."""
    journal = Journal(answers.store)
    asks = []
    for mode, items in todo.items():
        mspec = session.spec.model_copy(deep=True)
        mspec.tools.mode = mode
        sender = session.sender(f"audit-{mode}", mspec, journal)
        asks += [Ask(sender, layout.AUDIT_SHARDS[mode], sid, p) for sid, p in items]
    recs = await session.answer_all(asks)
    return sum(rec["status"] != "rejected" for rec in recs)


def buy(dg: DatasetGeneration, ctx: RunContext, base_url: str | None, answers: AnswerSet,
        todo: dict[str, list[tuple[str, sources.Prompt]]]) -> tuple[int, Decimal, str, str]:
    """Send what the answer set lacks, paid from the budget of the store the answer set is in (the
    dataset's output, or a `--from` audit's own): (requests sent, spent, outcome, message)."""
    spec = dg.spec
    store = answers.root
    todo = {m: items for m, items in todo.items() if items}
    count = sum(len(v) for v in todo.values())
    if not count:
        answers.compact(spec.generation.part_records)
        return 0, Decimal(0), Outcome.DONE, ""
    if base_url is None:
        raise AuditError("this audit needs answers it does not have, and no provider was given")
    asyncio.run(preflight(spec, base_url, store, ctx.api_key))
    answers.write_settings()
    # crash-safe like the run: what a kill left in flight is booked first (the session), and each sender
    # keeps its requests in flight bounded in the store, so a kill -9 mid-audit cannot let the next run
    # spend past maxUSD
    session = Session.for_requests(spec, store, ctx, base_url, requests=count, senders=len(todo), attempt="audit")
    sent = asyncio.run(_send(session, todo, answers))
    answers.compact(spec.generation.part_records)
    coord = session.coordinator
    outcome = coord.outcome if coord.outcome != Outcome.RUNNING else Outcome.DONE
    assert session.checkpoint is not None
    return sent, coord.book.spent - session.checkpoint.spent, outcome, coord.message


# --------------------------------------------------------------------------- the document


def _call_text(rec: records.Record, c: dict[str, Any]) -> str:
    args = c.get("arguments") if "arguments" in c else stats.structured_arguments(rec, c.get("index"))
    shown = orjson.dumps(args).decode() if args is not None else "(arguments do not parse)"
    mark = "" if c.get("valid") else " INVALID"
    return f"{c.get('name')}({shown[:200]}){mark} [{c.get('format') or 'structured'}]"


def _side(rec: records.Record | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    resp = rec.get("response") or {}
    chks = rec.get("checks") or {}
    return {"status": rec.get("status"), "content": (resp.get("content") or "")[:EXCERPT],
            "calls": [_call_text(rec, c) for c in chks.get("calls") or ()], "prose": bool(chks.get("prose")),
            "costUSD": rec.get("costUSD")}


def _last_user(prompt: sources.Prompt) -> str:
    for m in reversed(prompt.messages):
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            return m["content"][:EXCERPT]
    return ""


def examples(prompts: dict[str, sources.Prompt], pairs: dict[str, dict[str, records.Record]],
             facts: dict[str, dict[str, stats.AnswerFact]]) -> list[dict[str, Any]]:
    """A few prompts with both modes' answers side by side: where the modes differ first (one
    called and the other did not, then different calls), then one where they agree."""
    def kind(sid: str) -> int:
        t, s = facts["text"].get(sid), facts["structured"].get(sid)
        if t is None or s is None:
            return 9
        if t.called != s.called:
            return 0
        if t.called and t.call_key(True) != s.call_key(True):
            return 1
        return 2 if t.called else 3

    sids = sorted((sid for sid in prompts if sid in pairs["text"] or sid in pairs["structured"]),
                  key=lambda sid: (kind(sid), sid))
    chosen, kinds = [], set()
    for sid in sids:  # one of each kind first, then whatever is left
        if kind(sid) not in kinds:
            kinds.add(kind(sid))
            chosen.append(sid)
    chosen += [sid for sid in sids if sid not in chosen]
    return [{"sampleId": sid, "source": prompts[sid].source, "user": _last_user(prompts[sid]),
             "text": _side(pairs["text"].get(sid)), "structured": _side(pairs["structured"].get(sid))}
            for sid in chosen[:EXAMPLES]]


def _facts(pairs: dict[str, dict[str, records.Record]], declared: dict[str, frozenset[str]],
           references: dict[str, frozenset[str] | None]) -> dict[str, dict[str, stats.AnswerFact]]:
    return {m: {sid: stats.fact_from_record(rec, declared.get(sid, ()), reference=references.get(sid))
                for sid, rec in pairs[m].items()} for m in MODES}


def answer_row(rec: records.Record, base: dict[str, Any]) -> bytes:
    """`audit/rows.jsonl`'s line of an answer the audit bought (its record); `base` says where its prompt
    is (row, 1-based, sampleId, source, mode, model)."""
    status = {"ok": stored.RowStatus.OK, "rejected": stored.RowStatus.UNPARSABLE}.get(str(rec.get("status")),
                                                                                   stored.RowStatus.FAILED)
    error = rec.get("error")
    why = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else None
    entry = stored.row_entry({**base, "costUSD": rec.get("costUSD")}, status, rec.get("checks"), why)
    return orjson.dumps(entry) + b"\n"


def finish(store: Store | None, entry: dict[str, Any]) -> dict[str, Any]:
    """Make `entry` the latest audit in audit.json (history kept), unless it repeats the latest
    exactly (nothing bought, the same sample): then the stored document is the answer."""
    if store is None:
        return {"version": stored.VERSION, **entry}
    prev = stored.read_audit(store)
    same = ("fingerprint", "kind", "seed", "sampleIds", "from")
    if prev and entry.get("sent") == 0 and all(prev.get(k) == entry.get(k) for k in same):
        return {**prev, **{k: entry[k] for k in ("sent", "reused", "spentUSD", "outcome", "message", "verdict")}}
    doc = stored.with_entry(prev, entry, stored.audit_spend(store))
    stored.write_audit(store, doc)
    return doc


def run_audit(dg: DatasetGeneration, samples: int, ctx: RunContext, base_url: str | None,
              seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """Both modes' answers to a seeded sample of `samples` tool-declaring prompts, bought once and
    paid from the run's budget; returns audit.json as written."""
    spec = dg.spec
    store = open_output(spec)
    picked = pick_prompts(dg, samples, seed)
    if not picked.prompts:
        raise AuditError("no prompt in the sources declares tools: nothing to compare")
    answers = AnswerSet(store, spec)
    todo = {m: [(sid, p) for sid, p in picked.prompts if sid not in answers.have(m)] for m in MODES}
    wanted = sum(len(v) for v in todo.values())
    sent, spent, outcome, message = buy(dg, ctx, base_url, answers, todo)
    sids = {sid for sid, _ in picked.prompts}
    pairs = answers.load(sids)
    facts = _facts(pairs, picked.declared, picked.references)
    stored.write_rows(store, (answer_row(pairs[m][sid], {"row": p.row + 1, "sampleId": sid, "source": p.source,
                                                         "mode": m, "model": spec.target.model})
                              for sid, p in picked.prompts for m in MODES if sid in pairs[m]))
    figures = stats.summarize([f for m in MODES for f in facts[m].values()], picked.population)
    entry = {
        "kind": "prompts", "at": now_iso(), "samples": len(picked.prompts), "seed": seed,
        "model": spec.target.model, "fingerprint": answers.fingerprint.to_json(),
        "changedSince": answers.changed_since(stored.read_audit(store)),
        "outcome": outcome, "message": message, "spentUSD": usd(spent), "sent": sent,
        "reused": 2 * len(picked.prompts) - wanted, "population": picked.population,
        "figures": figures,
        "verdict": stats.verdict(figures, shapes={k: v["declarationShapes"]
                                                  for k, v in picked.population["bySource"].items()}),
        "examples": examples(dict(picked.prompts), pairs, facts),
        "sampleIds": [sid for sid, _ in picked.prompts],
    }
    return finish(store, entry)
