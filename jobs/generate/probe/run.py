"""The provider probe: the same first prompts sent to every endpoint of the target, measured, judged.

Through OpenRouter the question "does the model behave as it does natively?" depends on who serves
it (K2-Vendor-Verifier measured Kimi-K2's tool-call schema accuracy at 83-100% by vendor). The probe
answers it before the money goes: it reads the endpoint listing (`api/endpoints.py`), sends the
first `samples` prompts of the sources to each candidate pinned with `provider.only: [tag]` and
`allow_fallbacks: false`, and judges the records (`verdict.py`); the template variant each endpoint's
`usage.prompt_tokens` fits is decided by `reconstruct.variants`, per endpoint.

What it promises:
- **Inside the budget.** Requests go through the run's ledger (`RunCoordinator`, leases, each
  worker's requests in flight bounded in the store before they are sent): the probe's spend
  counts against `maxUSD` and a kill -9 at any moment cannot let the next attempt spend past it.
- **Durable before release, paid once.** Each answer is in the store (`providers/answers/`, one
  object per group commit) before its slot is freed, keyed by (endpoint, hash of the request as
  sent). A probe run again (killed, resumed, its settings changed) sends only the requests no stored
  answer has: changed thresholds cost nothing, five more samples cost five requests per endpoint.
- **Reused when unchanged.** `providers.json` holds the verdict with the hash of everything that
  decides it; the same hash means no listing call and no request.
- **Kept as samples.** In a run, each probe prompt's answer from the first passing endpoint (in the
  run's routing order) is written into the shard that holds its row, as that row's record: the
  generation skips it, nothing is paid twice. Other endpoints' answers stay measurements.

Bad input (a tag the listing does not have, a reference that is not a candidate, a model the listing
does not know, more samples than the sources hold) fails before anything is paid.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson

from eyrie.jobs import sources
from eyrie.jobs.api.endpoints import Endpoint, Listing, list_endpoints
from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import layout, records
from eyrie.jobs.contract.progress import Outcome, now_iso
from eyrie.jobs.errors import InputError
from eyrie.jobs.generate.adopt import into_shards
from eyrie.jobs.generate.budget.coordinator import RunCoordinator
from eyrie.jobs.generate.budget.pricing import usd
from eyrie.jobs.generate.plan import ShardPlan
from eyrie.jobs.generate.probe.verdict import ProviderVerdict, decide, limits_failure, measure, probe_routing, routing
from eyrie.jobs.generate.sending.journal import Journal
from eyrie.jobs.generate.sending.requests import build_body
from eyrie.jobs.generate.sending.session import Ask, Session
from eyrie.jobs.spec import DatasetGenerationSpec, PricingSpec, ProbeThresholds, ProviderProbeSpec, ProviderSpec
from eyrie.jobs.store import NotFound, Store
from eyrie.jobs.tools import declarations

PROBE_VERSION = 1


class ProbeError(InputError, ValueError):
    """The probe cannot run as asked; nothing was paid. The message names the setting."""


@dataclass(frozen=True)
class ProbeSettings:
    """What the probe does: `spec.api.providerProbe`, or `eyrie providers`' flags over it."""

    samples: int
    providers: tuple[str, ...] | None
    reference: str | None
    thresholds: ProbeThresholds
    where: str = "spec.api.providerProbe"  # how the user names these settings, for messages

    @classmethod
    def from_spec(cls, spec: DatasetGenerationSpec, *, samples: int | None = None,
                  providers: list[str] | None = None, reference: str | None = None) -> ProbeSettings:
        p = spec.api.provider_probe or ProviderProbeSpec()
        flags = samples is not None or providers is not None or reference is not None
        return cls(samples if samples is not None else p.samples,
                   tuple(providers) if providers is not None else tuple(p.providers) if p.providers else None,
                   reference if reference is not None else p.reference, p.thresholds,
                   "--samples/--providers/--reference" if flags else "spec.api.providerProbe")

    def to_json(self) -> dict[str, Any]:
        return {"samples": self.samples, "providers": list(self.providers) if self.providers else None,
                "reference": self.reference, "thresholds": self.thresholds.dump()}


def probe_hash(spec: DatasetGenerationSpec, settings: ProbeSettings) -> str:
    """Everything the verdict depends on; a stored verdict with the same hash is reused as it is."""
    api = spec.api
    doc = {"version": PROBE_VERSION, "settings": settings.to_json(), "target": spec.target.dump(),
           "baseUrl": api.base_url, "sampling": api.sampling.dump(),
           "provider": api.provider.dump() if api.provider else None,
           "simulator": api.simulator.dump() if api.simulator else None,
           "sources": [s.dump() for s in spec.sources], "turns": spec.generation.turns}
    return hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()


def request_key(body: Mapping[str, Any]) -> str:
    """The identity of one probe request: a hash of its body as sent (prompt, tools, sampling, routing)."""
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


# --------------------------------------------------------------------------------- what to send


def pick_prompts(spec: DatasetGenerationSpec, n: int, where: str = "spec.api.providerProbe") -> list[
        tuple[str, sources.Prompt]]:
    """The first `n` prompts of the sources, in order, that can be sent (bad rows and declarations
    that do not parse are skipped, as generation rejects them); fewer is an error before anything
    is paid."""
    picked: list[tuple[str, sources.Prompt]] = []
    for src in spec.sources:
        for item in sources.iter_source(src, spec.output.endpoint):
            if isinstance(item, sources.BadRow):
                continue
            if isinstance(declarations.prepare_prompt(item, "structured"), declarations.Rejected):
                continue
            picked.append((item.sample_id(), item))
            if len(picked) == n:
                return picked
    raise ProbeError(f"{where}.samples: {n} prompts asked, the sources hold {len(picked)} that can be sent; "
                     "lower samples or add prompts")


def _matches(tag: str, slugs: Iterable[str]) -> bool:
    """OpenRouter's base-slug matching: "deepinfra" names deepinfra and deepinfra/turbo."""
    return any(tag == s or tag.startswith(s + "/") for s in slugs)


def choose_candidates(listing: Listing, settings: ProbeSettings, base: ProviderSpec | None,
                      model: str) -> tuple[list[Endpoint], str | None]:
    """The endpoints to probe and the reference tag. Named tags must be listed and the reference
    must be a candidate; unnamed: every listed endpoint within api.provider's only/ignore/quantizations,
    the reference the model author's own endpoint when it is listed."""
    tags = listing.tags()
    if settings.providers is not None and not listing.listed:
        raise ProbeError(f"{settings.where}.providers: the API at {listing.endpoints[0].name} has no endpoint "
                         "listing: it is one endpoint, and nothing can be routed; leave providers unset")
    if settings.providers is not None:
        unknown = [t for t in settings.providers if t not in tags]
        if unknown:
            raise ProbeError(f"{settings.where}.providers: {', '.join(unknown)} not in the endpoint listing of "
                             f"{model} (listed: {', '.join(tags) or 'none'})")
        cands = [listing.get(t) for t in settings.providers]
    else:
        cands = list(listing.endpoints)
        if base is not None and listing.listed:
            if base.only:
                cands = [e for e in cands if _matches(e.tag, base.only)]
            if base.ignore:
                cands = [e for e in cands if not _matches(e.tag, base.ignore)]
            if base.quantizations:
                cands = [e for e in cands if e.quantization is None or e.quantization in base.quantizations]
    endpoints = [e for e in cands if e is not None]
    if not endpoints:
        raise ProbeError(f"{settings.where}: no endpoint of {model} to probe (listed: {', '.join(tags) or 'none'}; "
                         "api.provider only/ignore/quantizations leave none)")
    names = [e.tag for e in endpoints]
    reference = settings.reference
    if reference is not None:
        if reference not in names:
            raise ProbeError(f"{settings.where}.reference: {reference} is not among the candidates "
                             f"({', '.join(names)})")
    else:
        author = model.partition("/")[0].lower()
        own = [t for t in names if t.lower() == author] or [t for t in names if t.lower().partition("/")[0] == author]
        reference = own[0] if own else None
    return endpoints, reference


# --------------------------------------------------------------------------------- the result


@dataclass
class ProbeOutcome:
    """What the probe found; `stop` is (outcome, message) when the run must not generate."""

    doc: dict[str, Any] | None  # providers.json (None when the probe did not finish)
    stop: tuple[Outcome, str] | None = None
    spent_now: Decimal = Decimal(0)  # what this call paid
    sent_now: int = 0  # requests this call sent
    reused: bool = False  # the stored verdict was reused as it is
    records: list[records.Record] = field(default_factory=list)

    @property
    def passing(self) -> list[str]:
        return list((self.doc or {}).get("passing") or [])

    def routed(self, spec: DatasetGenerationSpec) -> DatasetGenerationSpec:
        """The spec generation runs with: requests only to passing endpoints, cheapest first."""
        if not self.doc or not self.doc.get("listed") or not self.doc.get("provider"):
            return spec
        out = spec.model_copy(deep=True)
        out.api.provider = ProviderSpec.model_validate(self.doc["provider"])
        listed = {e["tag"]: Endpoint.from_json(e) for e in self.doc.get("listing") or []}
        out.budget.pricing = reserve_prices(spec, [listed[t] for t in self.passing if t in listed])
        return out

    def progress(self) -> dict[str, Any]:
        """The probe's lines in progress.json: what the operator shows as status.providers."""
        if not self.doc:
            return {}
        return {"providers": progress_section(self.doc)}


def progress_section(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {"passing": list(doc.get("passing") or []), "reference": doc.get("reference"),
            "spentUSD": doc.get("spentUSD"),
            "endpoints": [{"tag": c["tag"], "name": c.get("name"), "passed": c["passed"],
                           "reason": "; ".join(f["message"] for f in c.get("failures") or []),
                           "costPerAnswerUSD": c.get("costPerAnswerUSD")} for c in doc.get("candidates") or []]}


def read_stored(store: Store) -> dict[str, Any] | None:
    try:
        return orjson.loads(store.get(layout.PROVIDERS))
    except NotFound:
        return None


def stored_routing_matches(doc: Mapping[str, Any], h: str) -> bool:
    return doc.get("probeHash") == h and doc.get("version") == PROBE_VERSION


# ------------------------------------------------------------------------------------ sending


def reserve_prices(spec: DatasetGenerationSpec, endpoints: Iterable[Endpoint]) -> PricingSpec:
    """The prices reservations use for requests to `endpoints`: budget.pricing, raised to the
    highest price the listing names for any of them (a candidate the user never priced must not
    be paid above what was reserved for it)."""
    p = spec.effective_pricing()
    inp, out = p.input_per_million, p.output_per_million
    for e in endpoints:
        inp = max(inp, e.prompt_per_million or inp)
        out = max(out, e.completion_per_million or out)
    return PricingSpec(input_per_million=inp, output_per_million=out)


def _probe_spec(spec: DatasetGenerationSpec, endpoint: Endpoint, listing: Listing) -> DatasetGenerationSpec:
    """The spec one endpoint's probe requests are built from: tools structural, pinned to it,
    reserved at its listed prices when they are above budget.pricing."""
    out = spec.model_copy(deep=True)
    out.tools.mode = "structured"
    out.budget.pricing = reserve_prices(spec, [endpoint])
    if listing.listed:
        out.api.provider = probe_routing(spec.api.provider, endpoint.tag, listing.tags())
    return out


@dataclass
class _Job:
    endpoint: Endpoint
    spec: DatasetGenerationSpec
    todo: list[tuple[str, sources.Prompt, str]]  # (sample id, prompt, request key)


def _plan_jobs(spec: DatasetGenerationSpec, listing: Listing, endpoints: list[Endpoint],
               prompts: list[tuple[str, sources.Prompt]], stored: Mapping[tuple[str, str], records.Record],
               skip: set[str]) -> tuple[list[_Job], dict[str, list[records.Record]]]:
    """Per endpoint: the requests no stored answer has, and the stored answers that count."""
    jobs, have = [], {}
    for ep in endpoints:
        pspec = _probe_spec(spec, ep, listing)
        have[ep.tag] = []
        todo = []
        for sid, prompt in prompts:
            prepared = declarations.prepare_prompt(prompt, "structured")
            assert isinstance(prepared, declarations.Prepared)  # pick_prompts keeps only these
            key = request_key(build_body(pspec, prepared.messages, prepared.tools))
            if (ep.tag, key) in stored:
                have[ep.tag].append(stored[(ep.tag, key)])
            elif ep.tag not in skip:
                todo.append((sid, prompt, key))
        jobs.append(_Job(ep, pspec, todo))
    return jobs, have


async def _send(jobs: list[_Job], session: Session, progress: _Progress | None = None) -> list[records.Record]:
    """Every job's requests, endpoints side by side (one sender each, sharing the provider's limits); each
    answer durable before its slot is freed. `progress` is written every `progress.every` seconds from the
    answers durable so far."""
    journal = Journal.probe(session.store)
    asks = []
    for i, job in enumerate(j for j in jobs if j.todo):
        sender = session.sender(f"probe-{i}", job.spec, journal)
        sender.canary.per_provider = 0  # template fit is judged per endpoint here, not per answer's provider name
        asks += [Ask(sender, 0, sid, prompt, _labeller(job.endpoint.tag, key)) for sid, prompt, key in job.todo]
    sent = asyncio.Event()
    out: list[records.Record] = []

    async def reporting(progress: _Progress) -> None:
        # not cancelled, but told to end: a write in its thread finishes before the final one
        while not sent.is_set():
            try:
                await asyncio.wait_for(sent.wait(), progress.every)
            except TimeoutError:
                await asyncio.to_thread(progress.write, progress.section(list(out)))

    async with asyncio.TaskGroup() as outer:
        if progress is not None:
            outer.create_task(reporting(progress))
        try:
            await session.answer_all(asks, out)
        finally:
            sent.set()
    return out


def _labeller(tag: str, key: str) -> Callable[[records.Record], None]:
    """The probe's fields of a record, once its request is checked to be the body planned."""

    def label(rec: records.Record) -> None:
        if request_key(rec["request"]) != key:  # the body is built by the one code that sends it
            raise RuntimeError(f"probe request for {tag} was not the body planned")
        rec["probe"] = {"endpoint": tag, "key": key}

    return label


@dataclass
class _Progress:
    """progress.json while the probe sends (stage probe): `write` (the driver's) takes `section`'s
    figures: the run's spend (at least the ledger's, at least what was stored before plus the answers
    durable since), the answers durable of those the verdict needs, what the probe has cost."""

    write: Callable[[dict[str, Any]], None]
    coord: RunCoordinator
    spec: DatasetGenerationSpec
    endpoints: list[str]
    reused: int  # stored answers the verdict counts
    planned: int  # all the answers it counts
    stored_usd: Decimal  # every stored probe answer's cost (paid by earlier calls)
    spent_before: Decimal  # the run's spend when the probe began (read_checkpoint), the audit's included
    audit_usd: Decimal
    every: float

    def section(self, new: list[records.Record]) -> dict[str, Any]:
        paid = sum((Decimal(r.get("costUSD") or "0") for r in new), Decimal(0))
        answers = self.reused + len(new)
        book = self.coord.book
        return {"outcome": Outcome.RUNNING, "spentUSD": usd(max(book.spent, self.spent_before + paid)),
                "reservedUSD": usd(book.leased), "maxUSD": usd(self.spec.budget.max_usd),
                "auditUSD": usd(self.audit_usd),
                "message": f"provider probe: {answers} of {self.planned} answers from {len(self.endpoints)} "
                           f"endpoints of {self.spec.target.model}",
                "probe": {"endpoints": self.endpoints, "answers": answers, "answersPlanned": self.planned,
                          "requests": len(new), "spentUSD": usd(self.stored_usd + paid)}}


# ----------------------------------------------------------------------------------- judging


def template_choices(spec: DatasetGenerationSpec, by_tag: Mapping[str, list[records.Record]]) -> dict[
        str, dict[str, Any]]:
    """Per endpoint, the template variant its usage.prompt_tokens fit (reconstruct.variants decides,
    over all its answers); empty without target.tokenizer (not measured)."""
    t = spec.target
    if not t.tokenizer:
        return {}
    from eyrie.jobs.reconstruct.formats import resolve_format, variant_names
    from eyrie.jobs.reconstruct.tokenizers import load_tokenizer
    from eyrie.jobs.reconstruct.variants import VariantDetector, candidates, prompt_lengths

    tok = load_tokenizer(t, spec.output.endpoint)
    formats = candidates(resolve_format(t.chat_format, tok, t.template_variant))
    out: dict[str, dict[str, Any]] = {}
    for tag, recs in by_tag.items():
        ok = [r for r in recs if r.get("status") == "ok"]
        if not ok:
            continue
        det = VariantDetector(t.chat_format, variant_names(t.chat_format), len(ok), t.template_variant)
        for r in ok:
            usage = r.get("usage") or {}
            reported = usage.get("prompt_tokens")
            det.observe(tag, reported if isinstance(reported, int) else None,
                        prompt_lengths(formats, tok, r["request"], r["response"], usage))
        choice = det.summary().by_provider.get(tag)
        if choice is not None:
            out[tag] = {k: v for k, v in choice.dump().items() if k != "final"}
    return out


def _document(spec: DatasetGenerationSpec, settings: ProbeSettings, h: str, listing: Listing,
              verdict: ProviderVerdict, prompts: list[tuple[str, sources.Prompt]], spent: Decimal) -> dict[str, Any]:
    passing = verdict.passing
    block = routing(spec.api.provider, passing, listing.tags()).dump() if listing.listed and passing else None
    return {"version": PROBE_VERSION, "probeHash": h, "model": spec.target.model, "listed": listing.listed,
            "settings": settings.to_json(), "reference": verdict.reference,
            "listing": [e.to_json() for e in listing.endpoints], "sampleIds": [sid for sid, _ in prompts],
            "candidates": [m.to_json() for m in verdict.measures], "passing": passing, "provider": block,
            "spentUSD": usd(spent), "updatedAt": now_iso()}


def _records_by_tag(endpoints: list[Endpoint], have: Mapping[str, list[records.Record]],
                    new: list[records.Record], sample_ids: set[str]) -> dict[str, list[records.Record]]:
    out = {ep.tag: [r for r in have.get(ep.tag, []) if r["sample_id"] in sample_ids] for ep in endpoints}
    for r in new:
        out.setdefault(r["probe"]["endpoint"], []).append(r)
    return out


# ------------------------------------------------------------------------------------- the probe


def run_probe(spec: DatasetGenerationSpec, store: Store, ctx: RunContext, base_url: str, settings: ProbeSettings,
              *, notify: Callable[[str], None] = lambda _m: None,
              on_progress: Callable[[dict[str, Any]], None] | None = None,
              progress_every: float = 2.0) -> ProbeOutcome:
    """Probe every candidate (reusing whatever the store holds), store and return the verdict.
    `on_progress` (a run's progress.json writer) gets the probe's figures when it starts sending,
    every `progress_every` seconds while it sends, and when the last answer is in."""
    h = probe_hash(spec, settings)
    stored_doc = read_stored(store)
    if stored_doc is not None and stored_routing_matches(stored_doc, h):
        notify(f"provider probe: reusing the stored verdict ({len(stored_doc.get('passing') or [])} of "
               f"{len(stored_doc.get('candidates') or [])} endpoints pass)")
        used = {tuple(a) for a in stored_doc.get("answers") or []}
        kept = [r for r in records.iter_probe_records(store) if (r["probe"]["endpoint"], r["probe"]["key"]) in used]
        return _with_stop(ProbeOutcome(stored_doc, reused=True, records=kept))
    started = time.monotonic()
    listing = asyncio.run(_listing(spec, base_url, ctx.api_key))
    endpoints, reference = choose_candidates(listing, settings, spec.api.provider, spec.target.model)
    prompts = pick_prompts(spec, settings.samples, settings.where)
    stored = {(r["probe"]["endpoint"], r["probe"]["key"]): r for r in records.iter_probe_records(store)}
    pre_failed = {ep.tag: f for ep in endpoints
                  if (f := limits_failure(ep, spec.api.sampling.max_tokens)) is not None}
    jobs, have = _plan_jobs(spec, listing, endpoints, prompts, stored, set(pre_failed))
    todo = sum(len(j.todo) for j in jobs)
    new: list[records.Record] = []
    coord = None
    if todo:
        notify(f"provider probe: {len(prompts)} prompts to {len(jobs) - len(pre_failed)} endpoints of "
               f"{spec.target.model} ({todo} requests; {sum(len(v) for v in have.values())} answers reused)")
        # what a kill left in flight booked before anything is sent (the session)
        session = Session.for_requests(spec, store, ctx, base_url, requests=todo,
                                       senders=sum(1 for j in jobs if j.todo))
        coord, ckpt = session.coordinator, session.checkpoint
        assert ckpt is not None
        progress = None
        if on_progress is not None:
            reused = sum(len(v) for v in have.values())
            progress = _Progress(on_progress, coord, spec, [ep.tag for ep in endpoints], reused, reused + todo,
                                 sum((Decimal(r.get("costUSD") or "0") for r in stored.values()), Decimal(0)),
                                 ckpt.spent, ckpt.audit, progress_every)
            on_progress(progress.section([]))
        new = asyncio.run(_send(jobs, session, progress))
        if progress is not None:
            on_progress(progress.section(new))
    spent_now = sum((Decimal(r.get("costUSD") or "0") for r in new), Decimal(0))
    if coord is not None and coord.outcome != Outcome.RUNNING:
        return ProbeOutcome(None, (Outcome(coord.outcome), f"the provider probe stopped: {coord.message}"),
                            spent_now, len(new), records=new)
    ids = {sid for sid, _ in prompts}
    by_tag = _records_by_tag(endpoints, have, new, ids)
    verdict = decide([measure(ep, by_tag.get(ep.tag, [])) for ep in endpoints], reference, settings.thresholds,
                     template_choices(spec, by_tag), pre_failed)
    total = sum((Decimal(r.get("costUSD") or "0") for r in records.iter_probe_records(store)), Decimal(0))
    all_recs = [r for recs in by_tag.values() for r in recs]
    doc = _document(spec, settings, h, listing, verdict, prompts, total)
    # the answers this verdict was judged on: what a reuse of it keeps as samples
    doc["answers"] = sorted([r["probe"]["endpoint"], r["probe"]["key"]] for r in all_recs)
    doc["elapsedSeconds"] = round(time.monotonic() - started, 3)  # this call: listing, requests, judging
    store.put(layout.PROVIDERS, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return _with_stop(ProbeOutcome(doc, spent_now=spent_now, sent_now=len(new), records=all_recs))


def _with_stop(out: ProbeOutcome) -> ProbeOutcome:
    doc = out.doc or {}
    if not doc.get("passing"):
        why = "; ".join(f"{c['tag']}: " + "; ".join(f["message"] for f in c.get("failures") or [])
                        for c in doc.get("candidates") or [])
        out.stop = (Outcome.NO_PROVIDER_PASSES, f"no provider passes the probe: {why}")
    return out


async def _listing(spec: DatasetGenerationSpec, base_url: str, api_key: str | None) -> Listing:
    from eyrie.jobs.api import ChatClient

    async with ChatClient.unpaid(base_url, api_key, timeout=spec.api.request_timeout_seconds,
                                 headers=spec.api.headers) as client:
        return await list_endpoints(client, spec.target.model)


# -------------------------------------------------------------------------------------- adoption


def adopt(store: Store, plan: ShardPlan, outcome: ProbeOutcome, fingerprint: str | None = None) -> list[records.Record]:
    """Write each probe prompt's answer from the first passing endpoint (routing order) into the
    shard holding its row (`generate/adopt.into_shards`: unless that row already has a record there;
    idempotent); returns the records written. `fingerprint`: the run's (contract/fingerprint.py), which the
    adopted records carry as generation's do."""
    first: dict[str, records.Record] = {}
    rank = {tag: i for i, tag in enumerate(outcome.passing)}
    for r in sorted((r for r in outcome.records if r.get("status") == "ok" and r["probe"]["endpoint"] in rank),
                    key=lambda r: rank[r["probe"]["endpoint"]]):
        first.setdefault(r["sample_id"], r)
    return into_shards(store, plan, first.values(), fingerprint)


def seed_variants(spec: DatasetGenerationSpec, detector: Any, kept: list[records.Record]) -> str | None:
    """Count the answers kept as samples in the run's template-variant detector, as a worker counts
    the canary's (`TemplateCanary`): they are answers of their provider like any other. Returns the
    detector's stop message if one fits no variant (the probe judged them fitting: a change between
    the probe and the run)."""
    if detector is None or not kept:
        return None
    from eyrie.jobs.reconstruct.tokenizers import load_tokenizer
    from eyrie.jobs.reconstruct.variants import TemplateCanary

    canary = TemplateCanary(spec, lambda: load_tokenizer(spec.target, spec.output.endpoint))
    for r in kept:
        response, usage = r["response"] or {}, r.get("usage") or {}
        lengths = canary.lengths(r["request"], response, usage)
        if lengths is not None:
            reported = usage.get("prompt_tokens")
            stop = detector.observe(response.get("provider"), reported if isinstance(reported, int) else None,
                                    lengths)
            if stop is not None:
                return stop.message
    return None
