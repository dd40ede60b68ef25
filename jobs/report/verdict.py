"""The report's verdict: four answers a user wants before any table, each one sentence whose numbers
are printed as the tables print them.

1. tool semantics: were tools declared the way the model expects, and did its calls hold up;
2. reconstruction: are the samples' tokens what the provider counted (prompt and completion);
3. fidelity: did the provider serve the model (left out until extraction scored the answers);
4. money: what it bought: dollars per kept sample and per trained token, on discarded answers, and
   the projected total;
5. the pilot (only with spec.pilot): what the run's own data's drafter accepts per step against the best
   alternative's, whether it passed, and what the run did with it;
6. what the data is worth (only after `eyrie evaluate` or a pilot): the accepted length per step of a drafter
   trained on it, on held-out target answers, and the evaluation's verdict against other outputs.

Pure: `verdict(ReportData)` reads only what `collect` gathered. Each line keeps its figures by name
(`Line.figures`) so the page can mark them and a browser test can read them back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from eyrie.jobs.contract.money import PRICE_PLACES
from eyrie.jobs.contract.progress import Outcome
from eyrie.jobs.report.data import ReportData
from eyrie.jobs.report.text import bracket, dollars, num, rate

OK, WARN, BAD, INFO = "ok", "warn", "bad", "info"
MILLION = Decimal(1_000_000)


@dataclass(frozen=True)
class Line:
    key: str  # tools | reconstruction | fidelity | money
    title: str
    status: str  # ok | warn | bad | info (nothing to judge against)
    text: str  # one sentence, every figure in it as `figures` prints it
    figures: dict[str, str] = field(default_factory=dict)


def _d(v: Any) -> Decimal | None:
    try:
        return Decimal(str(v)) if v is not None else None
    except ArithmeticError:
        return None


def kept_samples(d: ReportData) -> int | None:
    """Samples a drafter trains on: rebuilt by reconstruction, less those extraction left out for low
    fidelity; before reconstruction, the answers done."""
    s = (d.reconstruction or {}).get("samples")
    if s is not None:
        excluded = int(((d.fidelity or {}).get("overall") or {}).get("excluded") or 0)
        return max(0, int(s.get("kept") or 0) - excluded)
    return d.samples.done if d.samples is not None else None


def trained_tokens(d: ReportData) -> int | None:
    """Tokens in the loss mask over the kept samples (reconstruction's `responseTokens`)."""
    s = (d.reconstruction or {}).get("samples")
    return int(s.get("responseTokens") or 0) if s is not None else None


def discarded_usd(d: ReportData) -> Decimal:
    """Paid for answers the tool policy then dropped: progress/manifest `discardedUSD`, else the
    records' own costs."""
    for doc in (d.progress, d.manifest):
        if doc and (v := _d(doc.get("discardedUSD"))) is not None:
            return v
    return d.answers.discarded_usd


def tools_line(d: ReportData) -> Line | None:
    a = d.answers
    t = a.total
    if not a.by_source:
        return None
    modes = ", ".join(f"{m} ({n})" for m, n in sorted(a.modes.items())) or "structured"
    figures = {"callRate": rate(t.call_rate if t.declared else None), "declared": f"{t.declared:,}",
               "invalidRate": rate(t.invalid_rate if t.calls else None), "calls": f"{t.calls:,}",
               "leaks": f"{t.leaked:,}"}
    if not t.declared:
        return Line("tools", "Tool semantics", INFO, f"No prompt declared tools ({t.answers:,} answers, tools "
                    f"mode {modes}).", figures)
    outcome = (d.progress or {}).get("outcome")
    status = BAD if outcome == Outcome.TOOL_SEMANTICS_DRIFT else WARN if t.leaked or t.invalid or not t.called else OK
    text = (f"Tools sent as {modes}: {figures['callRate']} of {figures['declared']} tool-declaring answers called a "
            f"tool; {figures['invalidRate']} of {figures['calls']} calls did not validate; {figures['leaks']} "
            f"answer{'s' * (t.leaked != 1)} leaked call markers.")
    if outcome == Outcome.TOOL_SEMANTICS_DRIFT:
        text += f" The drift gate stopped the run: {(d.progress or {}).get('message', '')}"
    if d.audit and d.audit.get("verdict"):
        text += " The audit below compares tools as text with structured."
    return Line("tools", "Tool semantics", status, text, figures)


def _exact(g: dict[str, Any] | None) -> tuple[int, int] | None:
    return (int(g.get("exact") or 0), int(g["count"])) if g and g.get("count") else None


def reconstruction_line(d: ReportData) -> Line | None:
    s = (d.reconstruction or {}).get("samples")
    if not s:
        return None
    records, kept = int(s.get("records") or 0), int(s.get("kept") or 0)
    excluded = s.get("excluded") or {}
    n_excl = sum(excluded.values())
    why = ", ".join(f"{k} {v}" for k, v in sorted(excluded.items(), key=lambda kv: -kv[1])[:3])
    prompt, completion = _exact(s.get("promptTokenGap")), _exact(s.get("completionTokenGap"))
    figures = {"kept": f"{kept:,}", "records": f"{records:,}", **({"excluded": f"{n_excl:,}"} if n_excl else {})}
    parts = [f"{figures['kept']} of {figures['records']} answers rebuilt into training samples"
             + (f" ({figures['excluded']} excluded: {why})" if n_excl else "")]
    counts = []
    for name, g in (("prompt", prompt), ("completion", completion)):
        if g:
            figures[f"{name}Exact"] = f"{g[0]:,}/{g[1]:,}"
            counts.append(f"{name} tokens on {figures[f'{name}Exact']}")
    if counts:
        parts.append("the provider's usage matches the rebuilt " + " and ".join(counts))
    mismatched = ((d.reconstruction or {}).get("chatTemplate") or {}).get("mismatched") or []
    if mismatched:
        parts.append(f"no known template fits {', '.join(mismatched)}")
    inexact = any(g and g[0] < g[1] for g in (prompt, completion))
    # answers the tool policy dropped or that failed never reached reconstruction: no fault of it
    failed = [k for k in excluded if k != "policy_drop" and not k.startswith("status_")]
    status = BAD if (records and not kept) or mismatched else WARN if failed or inexact else OK
    return Line("reconstruction", "Reconstruction", status, "; ".join(parts) + ".", figures)


def scoring_model(d: ReportData) -> str | None:
    """The model that scored the answers, as the spec names it (`extraction.model`)."""
    e = d.extraction or {}
    return e.get("modelName") or e.get("model")


def written_agreement(g: dict[str, Any]) -> float | None:
    """A fidelity group's agreement on the text the model wrote (what the floor judges); a manifest
    from before it was kept gives its agreement over every answer token."""
    return g.get("writtenTop1Agreement", g.get("top1Agreement"))


def fidelity_line(d: ReportData) -> Line | None:
    fid = d.fidelity
    if not fid:
        return None
    o = fid.get("overall") or {}
    floor, below = fid.get("minTop1Agreement"), list(fid.get("belowFloor") or [])
    figures = {"top1": rate(o.get("top1Agreement")), "written": rate(written_agreement(o)),
               "meanNLL": num(o.get("meanNLL")), "tokens": f"{int(o.get('tokens') or 0):,}",
               "model": str(scoring_model(d) or "the target model")}
    text = (f"Scored by {figures['model']}: top-1 agreement {figures['top1']} over {figures['tokens']} answer tokens "
            f"({figures['written']} on the reasoning and content the model wrote), mean NLL {figures['meanNLL']}")
    by = fid.get("byProvider") or {}
    if len(by) > 1:
        low = min(by, key=lambda p: a if (a := written_agreement(by[p])) is not None else 2)
        text += f"; lowest provider {low} at {rate(written_agreement(by[low]))} on that text"
    if floor is None:
        text += "; no floor set (extraction.fidelity.minTop1Agreement)"
        status = INFO
    else:
        figures["floor"] = rate(float(floor))
        under = f", under it: {', '.join(below)}" if below else ", every provider above it"
        text += f"; floor {figures['floor']} on that text{under}"
        status = BAD if below else OK
    return Line("fidelity", "Fidelity", status, text + ".", figures)


def money_line(d: ReportData) -> Line:
    spent, budget = d.spent, d.budget
    p = d.progress or {}
    figures = {"spent": dollars(spent)}
    text = f"{figures['spent']} spent" + (f" of {dollars(budget)}" if budget else "")
    if budget:
        figures["budget"] = dollars(budget)
    kept, trained = kept_samples(d), trained_tokens(d)
    bought = []
    if kept:
        figures["perSample"] = dollars(spent / kept)
        figures["kept"] = f"{kept:,}"
        bought.append(f"{figures['perSample']} per kept sample ({figures['kept']})")
    if trained:
        figures["perMillionTokens"] = dollars(spent * MILLION / trained, PRICE_PLACES)
        figures["trained"] = f"{trained:,}"
        bought.append(f"{figures['perMillionTokens']} per million trained tokens ({figures['trained']})")
    if bought:
        text += ": " + ", ".join(bought)
    figures["discarded"] = dollars(discarded_usd(d))
    text += f"; {figures['discarded']} on discarded answers"
    forecast = _d(p.get("forecastUSD"))
    if forecast is not None:
        figures["projected"] = dollars(forecast)
        text += f"; projected total {figures['projected']}"
    over = forecast is not None and budget is not None and forecast > budget
    status = BAD if p.get("outcome") in (Outcome.BUDGET_EXHAUSTED, Outcome.INSUFFICIENT_CREDITS) else \
        WARN if over else INFO
    return Line("money", "What the money bought", status, text + ".", figures)


def worth_line(d: ReportData) -> Line | None:
    """`eyrie evaluate`'s answer: what a drafter trained on this output accepts, and against the others."""
    e = d.evaluation
    if not e or not e.get("drafters"):
        return None
    first = e["drafters"][0]
    length = first["acceptance"]["acceptedLength"]
    figures = {"acceptedLength": num(length["value"]), "low": num(length["low"]), "high": num(length["high"]),
               "heldout": f"{e['heldout']['samples']:,}"}
    text = (f"A drafter trained on {first['name']} accepts {figures['acceptedLength']} "
            f"{bracket(figures['low'], figures['high'])} tokens per step on {figures['heldout']} held-out answers")
    against = [x for x in e.get("differences") or [] if x.get("kind") == "against"]
    status = INFO
    if against:
        text += f"; {e['verdict']}"
        if any(x["separates"] and x["minusReference"]["value"] > 0 for x in against):
            status = WARN  # another output's drafter serves this target's traffic better than this one's
        elif all(x["separates"] for x in against):
            status = OK
    else:
        text += "."
    return Line("worth", "What the data is worth", status, text if text.endswith(".") else text + ".", figures)


def pilot_line(d: ReportData) -> Line | None:
    """The pilot's verdict (pilot.json): ok when the run's own data passed, warn when it did not and the run went
    on (policy report), bad when it suspended the run (policy require)."""
    v = d.pilot
    if v is None:
        return None
    by = {o.option: o for o in v.options}
    own, best = by[v.own], by[v.best_alternative]
    figures = {"own": num(own.accepted_length.value), "best": num(best.accepted_length.value),
               "prompts": f"{v.prompts:,}", "heldout": f"{v.heldout:,}", "spent": dollars(Decimal(v.spent_usd))}
    status = OK if v.passed else WARN if v.proceed else BAD
    text = (f"Pilot of {figures['prompts']} prompts ({figures['heldout']} held out), policy {v.policy}: the run's "
            f"own data ({v.own.describe()}) trains a drafter accepting {figures['own']} tokens per step, "
            f"{v.best_alternative.describe()} {figures['best']}; "
            + ("passed" if v.passed else "not passed, the run went on" if v.proceed else "failed, the run suspended")
            + f"; the pilot's answers cost {figures['spent']}.")
    return Line("pilot", "The pilot", status, text, figures)


def verdict(d: ReportData) -> list[Line]:
    """The lines the run has data for, in the order above."""
    lines = [tools_line(d), reconstruction_line(d), fidelity_line(d), money_line(d), pilot_line(d), worth_line(d)]
    return [x for x in lines if x is not None]
