"""The audit's figures: tools as text vs structured, per prompt set and per tool, each with its 95%
interval and sample size, and the verdict that says it in one paragraph. Pure: no I/O.

Input is one `AnswerFact` per answer, read from a generation record (`fact_from_record`: the
record's `checks`, as `tools.checks.check_response` wrote them, with each call's `format` and parsed
`arguments`). What each figure counts:

- call rate: answers with at least one tool call, of the answers (every audited prompt declares
  tools); with the dataset's own answer known, also of the prompts whose dataset answer calls a tool
  ("needed one") and of those whose answer does not ("called when not needed");
- calls per answer: the mean number of calls;
- valid-call rate: calls whose name is declared and whose arguments parse and validate, of the calls;
- hallucinated-function rate: calls naming a function the prompt did not declare, of the calls;
- wrong-function rate: calls to a declared function the dataset's answer did not call, of the calls
  in answers to prompts whose dataset answer calls one (n/a without dataset answers);
- formats: each answer in one category: the format its calls came in (one of `FORMATS`, `mixed`
  when several), `prose only` (a declared function described, none called), or `no call`;
- argument agreement: of the prompts where both modes called, those where they made the same calls
  (same functions, same arguments as JSON values, order aside); function agreement: same functions;
- output tokens and dollars per answer, and the projection to the spec's prompts;
- the difference (structured minus text) of each, over the prompts answered in both modes.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

import orjson

from eyrie.jobs.intervals import Estimate, bootstrap_ratio, bracket, paired_difference, wilson
from eyrie.jobs.tools.declarations import SHAPE_TEXT, DeclarationShape
from eyrie.jobs.tools.textcalls import TEXT_FORMATS, CallFormat

if TYPE_CHECKING:
    from eyrie.jobs.tools.checks import ResponseCheck

MODES = ("text", "structured")
FORMATS = (CallFormat.STRUCTURED.value, *(f.value for f in TEXT_FORMATS))  # its rows: tools/textcalls.py's registry
MIXED, PROSE, NO_CALL = "mixed", "prose only", "no call"
CATEGORIES = (*FORMATS, MIXED, PROSE, NO_CALL)
MAX_GROUPS = 30  # sources or tools shown one by one; the rest are summed as OTHER
OTHER = "(other)"
UNDECLARED = "(not declared)"
LARGE = 20_000  # above this many answers a bootstrap draws fewer resamples (never under 400)


# Why a call did not validate, from its first error's message (the validator's, jsonschema's): what
# the audit counts on screen ("missing required 4, undeclared function 1, ...").
_REASONS = (("was not declared", "undeclared function"), ("is never closed", "never closed"),
            ("is a required property", "missing required"), ("is not of type", "wrong type"),
            ("is not one of", "not in enum"), ("Additional properties", "extra argument"),
            ("not valid JSON", "not JSON"), ("not JSON values", "not JSON"), ("neither JSON nor", "not JSON"),
            ("must be a JSON", "not JSON"), ("no function name", "no function name"),
            ("holds no call", "no call in it"))
OTHER_REASON = "other"


def invalid_reason(errors: Any) -> str:
    """The reason a call is invalid, in a word or two, from its first error (`OTHER_REASON` if none fits)."""
    first = errors[0] if isinstance(errors, list) and errors else None
    message = str(first.get("message", "")) if isinstance(first, dict) else str(first or "")
    return next((reason for needle, reason in _REASONS if needle in message), OTHER_REASON)


@dataclass(frozen=True, slots=True)
class CallFact:
    name: str | None
    valid: bool
    format: str
    arguments: int | None  # a hash of the arguments' canonical JSON (None: they did not parse)
    declared: bool
    reason: str | None = None  # why it is invalid (`invalid_reason`); None when valid

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return CallFact, (self.name, self.valid, self.format, self.arguments, self.declared, self.reason)


@dataclass(slots=True)
class AnswerFact:
    """One answer, as the figures need it. `status`: ok | failed | unparsable (its prompt's
    declarations could not be parsed: never sent, or in a recorded file, not judged)."""

    sample_id: str
    source: str
    mode: str
    status: str
    declared: frozenset[str] = frozenset()
    calls: tuple[CallFact, ...] = ()
    prose: bool = False
    leaked: bool = False
    output_tokens: int | None = None
    cost: float | None = None  # USD; None: nothing says what it cost
    reference: frozenset[str] | None = None  # functions the dataset's own answer calls; None: unknown

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Positional: a `--from` file's facts cross from its checking processes, and a slots
        dataclass's own pickling (field by field, through `dataclasses.fields`) costs 3x this."""
        return AnswerFact, (self.sample_id, self.source, self.mode, self.status, self.declared, self.calls, self.prose,
                            self.leaked, self.output_tokens, self.cost, self.reference)

    @property
    def called(self) -> bool:
        return bool(self.calls)

    @property
    def category(self) -> str:
        if self.calls:
            kinds = {c.format for c in self.calls}
            return next(iter(kinds)) if len(kinds) == 1 else MIXED
        return PROSE if self.prose else NO_CALL

    def call_key(self, with_arguments: bool) -> tuple:
        """The answer's calls, order aside: what agreement between the modes compares."""
        return tuple(sorted(((c.name or ""), c.arguments if with_arguments else 0) for c in self.calls))


def _canonical(value: Any) -> Any:
    """JSON values as compared: integral floats as integers (70.0 is the 70 the other mode wrote)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


# Where orjson writes a float that `_canonical` would make an integer (70.0, 1e16): only then is the
# value rebuilt before hashing (a string holding such text is rebuilt too, harmlessly).
_INTEGRAL_FLOAT = re.compile(rb"\d\.0(?![0-9])|\de")


def arguments_key(value: Any) -> int | None:
    """Hash of a call's parsed arguments as canonical JSON; None for arguments that did not parse."""
    if value is None:
        return None
    try:
        dumped = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        if _INTEGRAL_FLOAT.search(dumped):
            dumped = orjson.dumps(_canonical(value), option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        return None
    # a stable hash (not hash(): that differs between the processes a large --from file is read by)
    return int.from_bytes(hashlib.blake2b(dumped, digest_size=8).digest(), "big")


def structured_arguments(record: dict[str, Any], index: Any) -> Any:
    """A structured call's arguments parsed from the response, for records without `arguments`."""
    calls = (record.get("response") or {}).get("tool_calls") or []
    if not isinstance(index, int) or not 0 <= index < len(calls):
        return None
    raw = (calls[index].get("function") or {}).get("arguments") if isinstance(calls[index], dict) else None
    if isinstance(raw, dict):
        return raw
    try:
        return orjson.loads(raw) if isinstance(raw, str) else None
    except orjson.JSONDecodeError:
        return None


def _float(value: Any) -> float | None:
    try:
        return float(Decimal(str(value))) if value is not None else None
    except (InvalidOperation, ValueError):
        return None


def fact_from_record(record: dict[str, Any], declared: Iterable[str], *, reference: frozenset[str] | None = None,
                     cost: float | None = None) -> AnswerFact:
    """An answer's facts from its generation record; `declared`: the function names its prompt
    declared (as text or structurally); `cost` overrides the record's `costUSD`."""
    names = frozenset(declared)
    status = str(record.get("status"))
    if status == "rejected":
        status = "unparsable"
    checks = record.get("checks") or {}
    calls = []
    for c in checks.get("calls") or ():
        name = c.get("name")
        args = c["arguments"] if "arguments" in c else structured_arguments(record, c.get("index"))
        valid = bool(c.get("valid"))
        calls.append(CallFact(name, valid, str(c.get("format") or "structured"), arguments_key(args),
                              name in names, None if valid else invalid_reason(c.get("errors"))))
    return AnswerFact(
        sample_id=str(record.get("sample_id")), source=str(record.get("source", "")),
        mode=str(record.get("toolsMode") or "structured"), status=status, declared=names, calls=tuple(calls),
        prose=bool(checks.get("prose")), leaked=bool(checks.get("leaked")),
        output_tokens=_output_tokens(record.get("usage")),
        cost=cost if cost is not None else (_float(record.get("costUSD")) if status != "unparsable" else None),
        reference=reference)


def fact_from_check(sample_id: str, source: str, mode: str, check: ResponseCheck | None, declared: frozenset[str],
                    usage: dict[str, Any] | None, cost: float | None) -> AnswerFact:
    """The fact `fact_from_record` reads from the record of an answer, made straight from the answer's
    checks (`check_response`; None: the request failed), for a reader that judges answers itself and
    keeps no record (`eyrie audit --from`)."""
    if check is None:
        return AnswerFact(sample_id, source, mode, "failed", declared, output_tokens=_output_tokens(usage), cost=cost)
    calls = tuple(CallFact(v.name, v.valid, v.format, arguments_key(v.arguments), v.name in declared,
                           None if v.valid else invalid_reason(v.errors)) for v in check.calls)
    return AnswerFact(sample_id, source, mode, "ok", declared, calls, check.prose, check.leaked,
                      _output_tokens(usage), cost)


def _output_tokens(usage: dict[str, Any] | None) -> int | None:
    tokens = (usage or {}).get("completion_tokens")
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None


# ------------------------------------------------------------------------ declaration shapes

NO_DECLARATIONS, NOT_PARSABLE = "none", "unparsable"  # keys beside the DeclarationShape values


def count_shapes(counts: dict[str, int], shapes: Sequence[DeclarationShape] | None) -> None:
    """Count a prompt's declarations by shape; `shapes` None: they did not parse, empty: there were none."""
    keys = (NOT_PARSABLE,) if shapes is None else [str(k) for k in shapes] or [NO_DECLARATIONS]
    for k in keys:
        counts[k] = counts.get(k, 0) + 1


def merge_shapes(into: dict[str, dict[str, int]], other: dict[str, dict[str, int]]) -> None:
    for source, counts in other.items():
        mine = into.setdefault(source, {})
        for k, v in counts.items():
            mine[k] = mine.get(k, 0) + v


def shapes_phrase(by_source: dict[str, dict[str, int]]) -> str:
    """Which declaration shapes each source's prompts used, in words (the verdict's last sentence)."""
    parts = []
    for source, counts in sorted(by_source.items())[:MAX_GROUPS]:
        found = [f"{SHAPE_TEXT[DeclarationShape(k)]} {v:,}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])
                 if k not in (NO_DECLARATIONS, NOT_PARSABLE)]
        if counts.get(NOT_PARSABLE):
            found.append(f"not parsable {counts[NOT_PARSABLE]:,}")
        if counts.get(NO_DECLARATIONS):
            found.append(f"no declaration {counts[NO_DECLARATIONS]:,}")
        parts.append(f"{source}: {', '.join(found)}")
    if not parts:
        return ""
    if not any(k not in (NO_DECLARATIONS, NOT_PARSABLE) for c in by_source.values() for k in c):
        return (f"No prompt declared functions in a shape eyrie reads ({'; '.join(parts)}): see docs/operating.md, "
                "Tool declarations eyrie reads.")
    return f"Prompts by how they declared functions: {'; '.join(parts)}."


# ------------------------------------------------------------------------------------ figures


def _resamples(n: int) -> int:
    return 2000 if n <= LARGE else max(400, 2000 * LARGE // n)


def _mean(values: Sequence[float]) -> Estimate:
    return bootstrap_ratio(values, resamples=_resamples(len(values)))


def _usd_sum(values: Iterable[float | None]) -> str:
    total = sum((Decimal(repr(v)) for v in values if v is not None), Decimal(0))
    return str(total.quantize(Decimal("0.000001")).normalize()) if total else "0"


@dataclass
class _Group:
    """The answers of one mode in one group (all, a source)."""

    answers: list[AnswerFact] = field(default_factory=list)
    failed: int = 0
    unparsable: int = 0
    failed_cost: list[float | None] = field(default_factory=list)

    def add(self, f: AnswerFact) -> None:
        if f.status == "ok":
            self.answers.append(f)
        elif f.status == "unparsable":
            self.unparsable += 1
        else:
            self.failed += 1
            self.failed_cost.append(f.cost)

    def figures(self) -> dict[str, Any]:
        ok = self.answers
        n = len(ok)
        calls = [c for f in ok for c in f.calls]
        with_ref = [f for f in ok if f.reference]
        ref_calls = [(f, c) for f in with_ref for c in f.calls]
        without_ref = [f for f in ok if f.reference is not None and not f.reference]
        tokens = [f.output_tokens for f in ok if f.output_tokens is not None]
        costs = [f.cost for f in ok if f.cost is not None]
        cats = Counter(f.category for f in ok)
        valid = sum(c.valid for c in calls)
        return {
            "answers": n, "failed": self.failed, "unparsable": self.unparsable, "calls": len(calls),
            "callRate": wilson(sum(f.called for f in ok), n).to_dict(),
            "neededCallRate": wilson(sum(f.called for f in with_ref), len(with_ref)).to_dict(),
            "unneededCallRate": wilson(sum(f.called for f in without_ref), len(without_ref)).to_dict(),
            "callsPerAnswer": _mean([len(f.calls) for f in ok]).to_dict(),
            "validRate": wilson(valid, len(calls)).to_dict(),
            "invalidRate": wilson(len(calls) - valid, len(calls)).to_dict(),
            "invalidReasons": dict(Counter(c.reason or OTHER_REASON for c in calls if not c.valid).most_common()),
            "hallucinatedRate": wilson(sum(not c.declared for c in calls), len(calls)).to_dict(),
            "wrongFunctionRate": wilson(sum(c.declared and c.name not in f.reference for f, c in ref_calls),
                                        len(ref_calls)).to_dict(),
            "leakRate": wilson(sum(f.leaked for f in ok), n).to_dict(),
            "outputTokens": _mean(tokens).to_dict(),
            "costPerAnswer": _mean(costs).to_dict(),
            "costUSD": _usd_sum([*costs, *self.failed_cost]),
            "unpriced": n - len(costs),
            "formats": {c: {"count": cats[c], **wilson(cats[c], n).to_dict()} for c in CATEGORIES if cats[c]},
            "callsByFormat": dict(sorted(Counter(c.format for c in calls).items())),
        }


def _paired(text: dict[str, AnswerFact], structured: dict[str, AnswerFact]) -> dict[str, Any]:
    """Figures over the prompts answered (ok) in both modes: agreement and each difference."""
    sids = sorted(set(text) & set(structured))
    t = [text[s] for s in sids]
    s = [structured[s] for s in sids]
    both = [(a, b) for a, b in zip(t, s, strict=True) if a.called and b.called]
    n = len(sids)

    def diff(num: Any, den: Any = None) -> dict[str, Any]:
        return paired_difference([num(a) for a in t], None if den is None else [den(a) for a in t],
                                 [num(b) for b in s], None if den is None else [den(b) for b in s],
                                 resamples=_resamples(n)).to_dict()

    return {
        "prompts": n, "bothCalled": len(both),
        "argumentAgreement": wilson(sum(a.call_key(True) == b.call_key(True) for a, b in both), len(both)).to_dict(),
        "functionAgreement": wilson(sum(a.call_key(False) == b.call_key(False) for a, b in both),
                                    len(both)).to_dict(),
        "difference": {
            "callRate": diff(lambda f: float(f.called)),
            "callsPerAnswer": diff(lambda f: float(len(f.calls))),
            "validRate": diff(lambda f: float(sum(c.valid for c in f.calls)), lambda f: float(len(f.calls))),
            "outputTokens": diff(lambda f: float(f.output_tokens or 0), lambda f: float(f.output_tokens is not None)),
            "costPerAnswer": diff(lambda f: f.cost or 0.0, lambda f: float(f.cost is not None)),
        },
    }


def _tool_figures(answers: Sequence[AnswerFact]) -> dict[str, dict[str, Any]]:
    """Per declared tool (and UNDECLARED for invented names): answers to prompts declaring it,
    how often they called it, its calls and how many validated."""
    declared: Counter[str] = Counter()
    called: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    valid: Counter[str] = Counter()
    for f in answers:
        names = {c.name for c in f.calls}
        for d in f.declared:
            declared[d] += 1
            called[d] += d in names
        for c in f.calls:
            key = c.name if c.declared and c.name is not None else UNDECLARED
            calls[key] += 1
            valid[key] += c.valid
    return {name: {"declaredIn": declared[name], "callRate": wilson(called[name], declared[name]).to_dict(),
                   "calls": calls[name], "validRate": wilson(valid[name], calls[name]).to_dict()}
            for name in set(declared) | set(calls)}


def _top(counts: Counter[str], limit: int = MAX_GROUPS) -> set[str]:
    return {k for k, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]}


def summarize(facts: Iterable[AnswerFact], population: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every figure of the audit. `population`: {"prompts", "declaredPrompts"} of the dataset the
    costs are projected to (the spec's sources, or a recorded file's rows)."""
    overall = {m: _Group() for m in MODES}
    by_source: dict[str, dict[str, _Group]] = {}
    ok_by_mode: dict[str, dict[str, AnswerFact]] = {m: {} for m in MODES}
    source_counts: Counter[str] = Counter()
    all_facts = []
    for f in facts:
        if f.mode not in overall:
            continue
        all_facts.append(f)
        source_counts[f.source] += 1
    keep_sources = _top(source_counts)
    for f in all_facts:
        overall[f.mode].add(f)
        src = f.source if f.source in keep_sources else OTHER
        groups = by_source.get(src)
        if groups is None:
            groups = by_source[src] = {m: _Group() for m in MODES}
        groups[f.mode].add(f)
        if f.status == "ok":
            ok_by_mode[f.mode][f.sample_id] = f
    modes = [m for m in MODES if overall[m].answers or overall[m].failed or overall[m].unparsable]
    out: dict[str, Any] = {"modes": {m: overall[m].figures() for m in modes}}
    if len(modes) == 2:
        out["paired"] = _paired(ok_by_mode["text"], ok_by_mode["structured"])
    if len(by_source) > 1:
        out["bySource"] = {}
        for src, groups in sorted(by_source.items()):
            entry: dict[str, Any] = {m: groups[m].figures() for m in modes}
            if len(modes) == 2:
                entry["paired"] = _paired({f.sample_id: f for f in groups["text"].answers},
                                          {f.sample_id: f for f in groups["structured"].answers})
            out["bySource"][src] = entry
    tools = {m: _tool_figures(overall[m].answers) for m in modes}
    weight: Counter[str] = Counter()
    for m in modes:
        for name, t in tools[m].items():
            weight[name] += t["declaredIn"] + t["calls"]
    keep = _top(weight)
    out["byTool"] = {name: {m: tools[m].get(name) for m in modes} for name in sorted(keep)}
    if len(weight) > len(keep):
        out["toolsLeftOut"] = len(weight) - len(keep)
    if population:
        out["projection"] = _projection(out, population)
    return out


def _projection(figs: dict[str, Any], population: dict[str, Any]) -> dict[str, Any]:
    """Per-answer dollars times the dataset's tool-declaring prompts (the modes differ only there)."""
    declared = int(population.get("declaredPrompts") or 0)
    out: dict[str, Any] = {"prompts": int(population.get("prompts") or 0), "declaredPrompts": declared}
    for m, f in figs["modes"].items():
        out[f"{m}USD"] = _scale(f["costPerAnswer"], declared)
    if "paired" in figs:
        out["differenceUSD"] = _scale(figs["paired"]["difference"]["costPerAnswer"], declared)
    return out


def _scale(e: dict[str, Any], factor: float) -> dict[str, Any]:
    return Estimate(e["value"], e["low"], e["high"], e["n"]).scaled(factor).to_dict()


# ------------------------------------------------------------------------------ in plain words


def _ends(low: float, high: float, spec: str) -> str:
    """An interval's ends written with one format spec, in the one form (`intervals.bracket`)."""
    return bracket(format(low, spec), format(high, spec))


def fmt_rate(e: dict[str, Any] | None) -> str:
    """61% [48, 72]: the share and its interval, in percent (one decimal below 10%)."""
    if not e or e.get("value") is None:
        return "n/a"
    d = 1 if max(e["value"], e["high"] or 0) < 0.1 else 0
    return f"{100 * e['value']:.{d}f}% {_ends(100 * e['low'], 100 * e['high'], f'.{d}f')}"


def _money(x: float, ref: float) -> str:
    ref = abs(ref)
    if ref >= 100:
        return f"{x:,.0f}"
    if ref >= 1:
        return f"{x:,.2f}"
    if ref >= 0.01:
        return f"{x:.4f}"
    return f"{x:.6f}"


def fmt_usd(e: dict[str, Any] | None) -> str:
    """$12.30 [8.10, 16.40]: dollars and their interval (signed where the interval crosses zero)."""
    if not e or e.get("value") is None:
        return "n/a"
    ref = max(abs(e["value"]), abs(e["low"] or 0), abs(e["high"] or 0))
    if e["low"] is None:
        return f"${_money(e['value'], ref)}"
    return f"${_money(e['value'], ref)} {bracket(_money(e['low'], ref), _money(e['high'], ref))}"


def fmt_num(e: dict[str, Any] | None, digits: int = 2) -> str:
    if not e or e.get("value") is None:
        return "n/a"
    if e["low"] is None:
        return f"{e['value']:.{digits}f}"
    return f"{e['value']:.{digits}f} {_ends(e['low'], e['high'], f'.{digits}f')}"


def fmt_diff(e: dict[str, Any] | None, kind: str) -> str:
    """A difference with an explicit sign: rates in points, dollars and tokens as numbers."""
    if not e or e.get("value") is None:
        return "n/a"
    if kind == "rate":
        return f"{100 * e['value']:+.0f} pts {_ends(100 * e['low'], 100 * e['high'], '+.0f')}"
    if kind == "usd":
        ref = max(abs(e["value"]), abs(e["low"]), abs(e["high"]))

        def signed(x: float) -> str:
            return ("+" if x >= 0 else "-") + "$" + _money(abs(x), ref)

        return f"{signed(e['value'])} {bracket(signed(e['low']), signed(e['high']))}"
    d = 2 if kind == "calls" else 0
    return f"{e['value']:+.{d}f} {_ends(e['low'], e['high'], f'+.{d}f')}"


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def reasons_phrase(f: dict[str, Any]) -> str:
    """"missing required 4, undeclared function 1": why a mode's calls did not validate, most first."""
    return ", ".join(f"{reason} {n:,}" for reason, n in (f.get("invalidReasons") or {}).items())


def _invalid_phrase(f: dict[str, Any], mode: str, short: bool = False) -> str:
    """"9% [4-18] of its 40 text calls would not validate (missing required 3, ...)"; short: "2% [0-9] of
    38 structured"."""
    if not f["calls"]:
        return f"no {mode} call" if short else f"it made no {mode} call"
    if short:
        return f"{fmt_rate(f['invalidRate'])} of {f['calls']} {mode}"
    why = reasons_phrase(f)
    return (f"{fmt_rate(f['invalidRate'])} of its {_n(f['calls'], f'{mode} call')} would not validate"
            + (f" ({why})" if why else ""))


def _formats_phrase(formats: dict[str, Any]) -> str:
    called = [(c, f) for c, f in formats.items() if c not in (PROSE, NO_CALL)]
    parts = [f"{c} {fmt_rate(f)}" for c, f in sorted(called, key=lambda cf: -cf[1]["count"])]
    phrase = ", ".join(parts) if parts else "no call in any format"
    if PROSE in formats:
        prose = formats[PROSE]
        phrase += f"; {_n(prose['count'], 'answer')} ({fmt_rate(prose)}) only described a call in prose"
    return phrase


def _cost_phrase(proj: dict[str, Any]) -> str:
    e = proj.get("differenceUSD")
    at = f"At your {proj['prompts']:,} prompts ({proj['declaredPrompts']:,} declare tools)"
    if not e or e.get("value") is None:
        return ""
    ref = max(abs(e["value"]), abs(e["low"]), abs(e["high"]))
    if e["low"] <= 0 <= e["high"]:
        return (f"{at} the two runs cost about the same: structured minus text {fmt_diff(e, 'usd')}, an interval "
                "that includes zero.")
    word = "more" if e["value"] > 0 else "less"
    lo, hi = sorted((abs(e["low"]), abs(e["high"])))
    span = bracket(_money(lo, ref), _money(hi, ref))
    return f"{at} the structured run costs ${_money(abs(e['value']), ref)} {span} {word} than the text run."


INVALID_OK = 0.02  # invalid calls at or below this share need no regeneration (the gate's default maxInvalidCallRate)
RERUN_SUGGESTED = 50  # prompts a first --rerun buys: enough to see a large difference, cheap next to the whole


def verdict(figs: dict[str, Any], *, recorded: str | None = None,
            shapes: dict[str, dict[str, int]] | None = None, bought: tuple[str, int, int] | None = None,
            regenerate: dict[str, Any] | None = None) -> str:
    """The audit in one paragraph, every number taken from `figs` and printed as the tables print
    it, ending with what to do. `recorded`: the name of a `--from` file whose answers the text side
    (or both) came from; `shapes`: per source, the prompts by declaration shape (`count_shapes`);
    `bought`: with `--rerun`, (the bought mode, requests sent, answers reused); `regenerate`: what
    buying the file's judged rows again would cost (`from_recorded.regeneration`)."""
    phrase = shapes_phrase(shapes or {})
    todo = what_to_do(figs, recorded, regenerate)
    return " ".join(p for p in (_verdict(figs, recorded, bought), phrase, todo) if p)


def _regen_cost(regenerate: dict[str, Any] | None, rows: int | None = None) -> str | None:
    """"about $1.23" for `rows` of the file's rows (all by default); None when nothing prices them."""
    if not regenerate or not regenerate.get("rows") or regenerate.get("usd") is None:
        return None
    share = float(Decimal(str(regenerate["usd"])) * (rows if rows is not None else regenerate["rows"])
                  / regenerate["rows"])
    return f"about ${_money(share, share)}"


def _unpriced(regenerate: dict[str, Any] | None) -> str:
    """What an estimate of regenerating's cost needs, when there is none."""
    if not regenerate or not regenerate.get("rows") or regenerate.get("usd") is not None:
        return ""
    if regenerate.get("rowsWithUsage"):
        return (" A SPEC's budget.pricing prices the rows' own token counts: `eyrie audit SPEC --from FILE` says "
                "what regenerating would cost.")
    return " No row gives its usage (prompt_tokens, completion_tokens): nothing estimates what regenerating costs."


def what_to_do(figs: dict[str, Any], recorded: str | None, regenerate: dict[str, Any] | None) -> str:
    """One sentence: regenerate (in which mode), buy the comparison first, or keep what there is."""
    modes = figs.get("modes") or {}
    paired = figs.get("paired")
    if paired and paired.get("prompts"):
        d = paired["difference"]["validRate"]
        n = paired["prompts"]
        if d.get("value") is None or d.get("low") is None:
            return ""
        cost = _regen_cost(regenerate)
        again = f" (regenerating the file's {regenerate['rows']:,} rows: {cost})" if cost and regenerate else ""
        if d["low"] > 0:
            return (f"What to do: send tools structured (tools.mode: structured): on the {_n(n, 'prompt')} answered "
                    f"both ways its calls validate more often ({fmt_diff(d, 'rate')}){again}.")
        if d["high"] < 0:
            return (f"What to do: keep tools as text: on the {_n(n, 'prompt')} answered both ways structured calls "
                    f"validate less often ({fmt_diff(d, 'rate')}).")
        return (f"What to do: nothing yet: on the {_n(n, 'prompt')} answered both ways the modes' valid-call rates "
                f"do not differ beyond chance ({fmt_diff(d, 'rate')}); more prompts (--rerun N, --samples N) "
                "narrow it.")
    if not recorded or len(modes) != 1:
        return ""
    mode, f = next(iter(modes.items()))
    if not f["calls"] or f["invalidRate"]["value"] is None:
        return ""
    other = "structured" if mode == "text" else "text"
    rows = regenerate.get("rows", 0) if regenerate else f["answers"]
    if f["invalidRate"]["value"] <= INVALID_OK:
        return (f"What to do: keep these answers: {fmt_rate(f['invalidRate'])} of their calls would not validate, "
                f"within the {100 * INVALID_OK:.0f}% a run's gate allows; whether {other} tools would call more "
                f"often than these {fmt_rate(f['callRate'])} is what `--rerun N` measures.")
    n = min(RERUN_SUGGESTED, rows) if rows else RERUN_SUGGESTED
    whole, part = _regen_cost(regenerate), _regen_cost(regenerate, n)
    return (f"What to do: before regenerating all {rows:,} rows{f' ({whole})' if whole else ''}, buy the {other} "
            f"side for {n} of them with `eyrie audit SPEC --from {recorded} --rerun {n}`"
            f"{f' ({part})' if part else ''} and regenerate in {other} mode only if its calls validate more often; "
            "meanwhile answers with invalid calls are dropped from training (tools.onInvalidCall: drop)."
            + _unpriced(regenerate))


def _lead(modes: dict[str, Any], recorded: str | None, bought: tuple[str, int, int] | None) -> str:
    """Where the two sides' answers came from: both bought, both recorded, or one recorded and one bought
    (its count is the requests sent now plus the answers reused from an earlier audit)."""
    if not recorded:
        return ""
    if bought is None:
        return (f"In the {modes['text']['answers']} text and {modes['structured']['answers']} structured answers "
                f"recorded in {recorded}, ")
    mode, sent, reused = bought
    other = "structured" if mode == "text" else "text"
    b = modes[mode]
    got = b["answers"] + b["failed"] + b["unparsable"]
    failed = f", {b['failed']} of them failed" if b["failed"] else ""
    return (f"In the {modes[other]['answers']} answers recorded in {recorded} ({other}) and the {got} bought {mode} "
            f"({sent} requests sent now, {reused} answers reused{failed}), ")


def _verdict(figs: dict[str, Any], recorded: str | None, bought: tuple[str, int, int] | None) -> str:
    modes = figs.get("modes") or {}
    t, s = modes.get("text"), modes.get("structured")
    out = []
    if t and s:
        lead = _lead(modes, recorded, bought)
        out.append(f"{lead}{'as' if lead else 'As'} text, the model called a tool on {fmt_rate(t['callRate'])} of "
                   f"{t['answers']} prompts that declare tools vs {fmt_rate(s['callRate'])} of {s['answers']} "
                   "structured")
        if t["neededCallRate"]["n"] or s["neededCallRate"]["n"]:
            out[-1] += (f" ({fmt_rate(t['neededCallRate'])} vs {fmt_rate(s['neededCallRate'])} where the dataset's "
                        "own answer calls one)")
        paired = figs.get("paired")
        if paired and paired["prompts"] and (paired["prompts"], paired["prompts"]) != (t["answers"], s["answers"]):
            # the rates are over each mode's own answers; their difference only over the prompts in both
            out[-1] += (f" (on the {_n(paired['prompts'], 'prompt')} answered both ways, structured minus text: "
                        f"{fmt_diff(paired['difference']['callRate'], 'rate')})")
        out[-1] += f"; {_invalid_phrase(t, 'text')} ({_invalid_phrase(s, 'structured', short=True)})."
    else:
        mode, f = ("text", t) if t else ("structured", s)
        if not f:
            return "No answer to compare: every request failed or no prompt could be judged."
        where = f"In the {f['answers']} answers recorded in {recorded}" if recorded else f"In {f['answers']} answers"
        out.append(f"{where} ({mode} mode), the model called a tool on {fmt_rate(f['callRate'])} of prompts that "
                   f"declare tools; {_invalid_phrase(f, mode)}.")
    if t:
        out.append(f"Its text answers came as {_formats_phrase(t['formats'])}.")
    paired = figs.get("paired")
    if paired and paired["bothCalled"]:
        out.append(f"Where both modes called ({_n(paired['bothCalled'], 'prompt')}), they made the same calls with "
                   f"the same arguments on {fmt_rate(paired['argumentAgreement'])}.")
    proj = figs.get("projection") or {}
    if paired and proj:
        out.append(_cost_phrase(proj))
    elif proj:
        f = t or s
        if recorded and f["costPerAnswer"].get("value") is not None:  # what to do says how to compare
            out.append(f"These answers cost {fmt_usd(f['costPerAnswer'])} each.")
    unparsable = sum(m.get("unparsable", 0) for m in modes.values())
    if unparsable:
        out.append(f"{unparsable} prompt{'s' if unparsable > 1 else ''} declared functions that could not be parsed: "
                   "counted as such, not as answers without a call.")
    return " ".join(p for p in out if p)
