"""Which template variant each provider renders, told by its own prompt-token counts. Pure.

A chat format declares its variants (template revisions, tool-declaration styles); only the
provider knows which it serves. For the canary's answers the worker renders the prompt with every
variant (`prompt_lengths`) and reports the lengths with the provider's `usage.prompt_tokens`; this
module decides, per provider, once that provider has `canary` answers: the variant whose length
equals the provider's count on at least `FIT_SHARE` of them (the format's default first when
several do), or a `TemplateStop` naming the gap distribution of every variant when none does
(`target.onTemplateMismatch: flag | exclude` records the mismatch and goes on instead).
Where neither the answer nor the request says whether the model was thinking, each variant is
rendered under both readings the sample rebuilder may take (`thinking_readings`, the one function
both use); an answer fits under either, and the reading the provider's counts fit is recorded
(`thinking`) and tried first by the rebuilder. A pinned variant (`target.templateVariant`) is
used whatever the counts say (they are still reported); a provider that reports no
`prompt_tokens` keeps the pinned or default variant, flagged `unreported`. After its decision a
provider's answers are not rendered again: the cost is the canary's.

Limits: per provider at most `canary` gaps per variant and reading are kept; providers beyond `MAX_PROVIDERS`
share one entry (a router naming a new provider per answer cannot grow this without bound).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eyrie.jobs.contract.fidelity import UNKNOWN_PROVIDER
from eyrie.jobs.contract.progress import TemplateVariants, VariantChoice
from eyrie.jobs.reconstruct.base import ChatFormat, FormatError, Message
from eyrie.jobs.reconstruct.formats import resolve_format, variant_names
from eyrie.jobs.reconstruct.reconstructor import thinking_readings, turn_of
from eyrie.jobs.reconstruct.tokenizers import LoadedTokenizer
from eyrie.jobs.spec import DatasetGenerationSpec

FIT_SHARE = 0.95  # a variant fits a provider when its prompt length is exact on this share of answers
MAX_PROVIDERS = 64
OTHER_PROVIDERS = "(other)"


def candidates(fmt: ChatFormat) -> dict[str, ChatFormat]:
    """The format rendering each of its variants; a format without variants is its own one."""
    if not fmt.variants:
        return {fmt.name: fmt}
    return {v: fmt if v == fmt.variant else fmt.with_variant(v) for v in fmt.variants}


Lengths = Mapping[str, Mapping[bool, int]]  # variant -> thinking reading -> prompt tokens, first reading first


def prompt_lengths(formats: Mapping[str, ChatFormat], tok: LoadedTokenizer, request: dict[str, Any],
                   response: dict[str, Any], usage: dict[str, Any]) -> dict[str, dict[bool, int]]:
    """Token count of the prompt each variant renders for this request, under every thinking reading
    the rebuilder may take for it (`thinking_readings`: one when the answer or request says, both
    when nothing does, the format's default first). A variant or reading that cannot render it is
    left out: it cannot be what the provider rendered."""
    messages: list[Message] = request.get("messages") or []
    tools = request.get("tools") or None
    out: dict[str, dict[bool, int]] = {}
    try:
        turn = turn_of(response)
    except FormatError:
        return out
    for name, fmt in formats.items():
        by_reading: dict[bool, int] = {}
        for thinking in thinking_readings(request, usage, turn, fmt.default_thinking):
            try:
                prompt = fmt.render(messages, tools, turn, thinking).prompt
            except FormatError:
                continue
            by_reading[thinking] = len(tok.encode(prompt))
        if by_reading:
            out[name] = by_reading
    return out


@dataclass(frozen=True)
class Choice:
    """The variant used for one provider's answers and how it was chosen."""

    variant: str
    how: str  # detected | pinned | unreported (no prompt_tokens) | mismatch | undecided (still in the canary)
    answers: int  # answers with prompt_tokens that were judged
    fits: tuple[str, ...]  # variants exact on at least FIT_SHARE of them
    # Whether the model thought on the judged answers where neither answer nor request said (`unsaid`
    # of them): the reading their counts fit under `variant` (the format's default on a tie or when
    # none fits); None when every judged answer said.
    thinking: bool | None = None
    unsaid: int = 0
    message: str | None = None  # how = mismatch: each variant's gaps (the stop message)

    def progress(self, final: bool) -> VariantChoice:
        """As progress.json and the manifest keep it; `final` once its provider's canary is measured."""
        return VariantChoice(variant=self.variant, how=self.how, answers=self.answers, fits=list(self.fits),
                             thinking=self.thinking, unsaid=self.unsaid, message=self.message or None, final=final)

    @classmethod
    def of(cls, c: VariantChoice) -> Choice:
        return cls(c.variant, c.how, c.answers, tuple(c.fits), c.thinking, c.unsaid, c.message)


@dataclass(frozen=True)
class TemplateStop:
    """No variant fits a provider; `message` names the gap distribution of each variant."""

    provider: str
    message: str


def _gap_summary(gaps: Sequence[int]) -> str:
    s = sorted(gaps)
    exact = sum(g == 0 for g in s)
    return (f"exact {exact}/{len(s)}, gap (ours - provider's) min {s[0]} p50 {s[len(s) // 2]} max {s[-1]}"
            if s else "never rendered")


def _on_off(thinking: bool) -> str:
    return "on" if thinking else "off"


@dataclass
class _Provider:
    answers: int = 0  # every answer seen while undecided
    reported: int = 0  # answers with prompt_tokens
    unsaid: int = 0  # of those, answers where neither the answer nor the request said whether it thought
    default: bool | None = None  # the format's reading when nothing says (the first of such an answer)
    exact: Counter[str] = field(default_factory=Counter)  # per variant: answers exact under a reading they allow
    gaps: dict[str, dict[bool, list[int]]] = field(default_factory=dict)  # per variant and reading
    readings: dict[str, Counter[bool]] = field(default_factory=dict)  # per variant: the reading unsaid answers fit


class VariantDetector:
    """Accumulates (provider, prompt_tokens, lengths per variant and thinking reading) over the
    canary and decides. An answer fits a variant when the provider's count equals the length under
    one of the thinking readings the rebuilder may take for it (the rule the rebuilder keeps a
    sample by); for answers that did not say, the reading they fit is counted, and the provider's
    reading (the majority) is recorded and used first by the rebuilder."""

    def __init__(self, format_name: str, variants: Sequence[str], canary: int, pinned: str | None = None,
                 on_mismatch: str = "stop"):
        self.format_name = format_name
        self.variants = tuple(variants)
        self.default = pinned or self.variants[0]
        self.pinned = pinned
        self.on_mismatch = on_mismatch  # target.onTemplateMismatch: stop | flag | exclude
        self.canary = max(1, canary)
        self._open: dict[str, _Provider] = {}
        self.chosen: dict[str, Choice] = {}
        self.stopped: TemplateStop | None = None

    def _key(self, provider: str | None) -> str:
        p = provider or UNKNOWN_PROVIDER
        if p in self.chosen or p in self._open or len(self.chosen) + len(self._open) < MAX_PROVIDERS:
            return p
        return OTHER_PROVIDERS

    def wants(self, provider: str | None) -> bool:
        """Should this provider's next answer be rendered (is it still undecided)?"""
        return self._key(provider) not in self.chosen

    def observe(self, provider: str | None, prompt_tokens: int | None, lengths: Lengths) -> TemplateStop | None:
        """Count one answer; returns a TemplateStop the first time a provider fits no variant."""
        key = self._key(provider)
        if key in self.chosen:
            return None
        p = self._open.setdefault(key, _Provider())
        p.answers += 1
        if prompt_tokens is not None:
            p.reported += 1
            unsaid = any(len(by) > 1 for by in lengths.values())
            p.unsaid += unsaid
            for v in self.variants:
                by = lengths.get(v) or {}
                gaps = {t: n - prompt_tokens for t, n in by.items()}
                for t, g in gaps.items():
                    p.gaps.setdefault(v, {}).setdefault(t, []).append(g)
                fit = next((t for t, g in gaps.items() if g == 0), None)
                if fit is None:
                    continue
                p.exact[v] += 1
                if len(by) > 1:
                    p.default = next(iter(by)) if p.default is None else p.default
                    p.readings.setdefault(v, Counter())[fit] += 1
        if p.answers < self.canary:
            return None
        return self._decide(key)

    def _reading(self, p: _Provider, variant: str) -> bool | None:
        """The thinking reading the provider's unsaid answers fit under `variant` (its default on a tie)."""
        if not p.unsaid:
            return None
        counts = p.readings.get(variant) or Counter()
        default = True if p.default is None else p.default
        return (not default) if counts[not default] > counts[default] else default

    def _judge(self, key: str, p: _Provider) -> tuple[Choice, str | None]:
        """The choice for a provider on what it gave, and the stop message when nothing fits."""
        n = p.reported
        fits = tuple(v for v in self.variants if n and p.exact[v] >= FIT_SHARE * n)
        if self.pinned:
            return Choice(self.pinned, "pinned", n, fits, self._reading(p, self.pinned), p.unsaid), None
        if not n:
            return Choice(self.default, "unreported", 0, ()), None
        if fits:
            v = self.default if self.default in fits else fits[0]
            return Choice(v, "detected", n, fits, self._reading(p, v), p.unsaid), None
        detail = "; ".join(self._variant_gaps(p, v) for v in self.variants)
        unsaid = (f" ({p.unsaid} of them did not say whether the model was thinking: both readings tried)"
                  if p.unsaid else "")
        what = (f"no template variant of {self.format_name} gives" if len(self.variants) > 1
                else f"chat format {self.format_name} does not give")
        pin = ", pin target.templateVariant knowingly" if len(self.variants) > 1 else ""
        message = (
            f"provider {key}: {what} the prompt length it counted (usage.prompt_tokens) on {FIT_SHARE:.0%} of {n} "
            f"answers{unsaid}: {detail}. It renders a template eyrie does not know (or counts tokens it does not "
            f"show, a BOS or an injected system prompt); route to another provider, set target.chatFormat to the "
            f"model's family{pin}, or go on knowingly with target.onTemplateMismatch (stop | flag | exclude; "
            f"now {self.on_mismatch}): flag keeps its samples flagged template_mismatch, exclude leaves them out")
        return Choice(self.default, "mismatch", n, (), self._reading(p, self.default), p.unsaid, message), message

    def _variant_gaps(self, p: _Provider, variant: str) -> str:
        by = p.gaps.get(variant) or {}
        if not p.unsaid:
            return f"{variant}: {_gap_summary([g for gaps in by.values() for g in gaps])}"
        per = ", ".join(f"thinking {_on_off(t)} {_gap_summary(g)}" for t, g in by.items())
        return f"{variant}: exact {p.exact[variant]}/{p.reported} under either reading ({per or 'never rendered'})"

    def _decide(self, key: str) -> TemplateStop | None:
        choice, message = self._judge(key, self._open.pop(key))
        self.chosen[key] = choice
        if message is None or self.on_mismatch != "stop":
            return None  # flag | exclude: the samples stage marks or leaves out this provider's samples
        stop = TemplateStop(key, message)
        self.stopped = self.stopped or stop
        return stop

    def summary(self) -> TemplateVariants:
        """For progress.json and the manifest: the format, the pin, the choice per provider (a provider
        that has not reached the canary is judged on what it gave so far, marked `final: false`)."""
        by = {k: c.progress(final=True) for k, c in self.chosen.items()}
        by.update({k: self._judge(k, p)[0].progress(final=False) for k, p in self._open.items()})
        return TemplateVariants(format=self.format_name, variants=list(self.variants), pinned=self.pinned,
                                canary=self.canary, on_mismatch=self.on_mismatch, by_provider=dict(sorted(by.items())))


def detector_for(spec: DatasetGenerationSpec) -> VariantDetector | None:
    """The run's detector (None without target.tokenizer: nothing can be rendered then)."""
    if not spec.target.tokenizer:
        return None
    t = spec.target
    return VariantDetector(t.chat_format, variant_names(t.chat_format), spec.tools.gate.canary_samples,
                           t.template_variant, t.on_template_mismatch)


class TemplateCanary:
    """A worker's side of template detection: the prompt length under every variant for the first
    `per_provider` answers of each provider it sees, then nothing (None), so the cost stays the canary's."""

    def __init__(self, spec: DatasetGenerationSpec, tokenizer: Callable[[], LoadedTokenizer | None]):
        self.spec = spec
        self.per_provider = max(1, spec.tools.gate.canary_samples)
        self._tokenizer = tokenizer
        self._formats: dict[str, ChatFormat] | None = None
        self._seen: Counter[str] = Counter()

    def _provider(self, response: dict[str, Any]) -> str:
        provider = str(response.get("provider") or UNKNOWN_PROVIDER)
        return provider if provider in self._seen or len(self._seen) < MAX_PROVIDERS else OTHER_PROVIDERS

    def wants(self, response: dict[str, Any]) -> bool:
        """Is this answer one of its provider's canary (cheap: checked for every answer)?"""
        return bool(self.spec.target.tokenizer) and self._seen[self._provider(response)] < self.per_provider

    def lengths(self, request: dict[str, Any], response: dict[str, Any],
                usage: dict[str, Any]) -> dict[str, dict[bool, int]] | None:
        """The prompt length per variant and thinking reading for a canary answer, None past the canary."""
        if not self.wants(response):
            return None
        tok = self._tokenizer()
        if tok is None:
            return None
        if self._formats is None:
            t = self.spec.target
            self._formats = candidates(resolve_format(t.chat_format, tok, t.template_variant))
        self._seen[self._provider(response)] += 1
        return prompt_lengths(self._formats, tok, request, response, usage)


def chosen_variants(summary: TemplateVariants | None) -> dict[str, Choice]:
    """provider -> its Choice from a `summary()` (as stored in progress.json)."""
    return {p: Choice.of(c) for p, c in (summary.by_provider if summary else {}).items()}
