"""Fidelity: how well the API's answers agree with the target model itself, summed for the manifest.

Torch-free and pyarrow-free on purpose: extraction pods sum their samples' scores per (provider,
source) into `FidelityTally`s that travel in the shard index and the pod summary (JSON); the
manifest (written by the operator too) merges them and sets them beside the tool and token-gap
figures reconstruction measured on the same answers. Per-sample scores live in
`fidelity/shard-NNNNN.parquet` (written by `eyrie.jobs.extract.fidelity`).

Agreement and NLL are token-weighted: a provider's `top1Agreement` is the share of all its
completion tokens that are the target model's argmax at their position, `meanNLL` the mean
negative log-probability per completion token.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# A completion's tokens in order: reasoning, then content, then tool calls. The samples Parquet's
# `segments` column holds the token position where each starts (see reconstruct/segments.py).
SEGMENTS = ("reasoning", "content", "tool_calls")
# What the floor judges: the text the model wrote, as the provider returned it. A tool call's tokens are
# rebuilt by eyrie from the parsed call through the chat template (its markers, its JSON layout), so
# they agree with any model of the family more easily: the quickstart's impostor agrees on 93.6% of
# its tool-call tokens and on 85.6% of its reasoning and content (docs/operating.md).
WRITTEN = ("reasoning", "content")
UNKNOWN_PROVIDER = "(unknown)"  # an answer whose response named no provider


def _rate(num: float, den: float) -> float | None:
    return round(num / den, 6) if den else None


@dataclass
class SegmentTally:
    tokens: int = 0
    nll: float = 0.0  # sum of -log p over the tokens
    agree: int = 0  # tokens equal to the target's argmax

    def add(self, tokens: int, nll: float, agree: int) -> None:
        self.tokens += tokens
        self.nll += nll
        self.agree += agree

    def merge(self, other: SegmentTally) -> None:
        self.add(other.tokens, other.nll, other.agree)

    def summary(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "top1Agreement": _rate(self.agree, self.tokens),
                "meanNLL": _rate(self.nll, self.tokens)}

    def dump(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "nll": self.nll, "agree": self.agree}

    @classmethod
    def load(cls, d: Mapping[str, Any]) -> SegmentTally:
        return cls(int(d["tokens"]), float(d["nll"]), int(d["agree"]))


@dataclass
class FidelityTally:
    """Sums over scored samples; `low` counts samples under the floor, `excluded` those kept out."""

    samples: int = 0
    low: int = 0
    excluded: int = 0
    total: SegmentTally = field(default_factory=SegmentTally)
    segments: dict[str, SegmentTally] = field(default_factory=dict)

    def add_sample(self, total: tuple[int, float, int], segments: Mapping[str, tuple[int, float, int]],
                   low: bool, excluded: bool) -> None:
        """One sample: (tokens, nll sum, agreeing tokens) overall and per segment."""
        self.samples += 1
        self.low += low
        self.excluded += excluded
        self.total.add(*total)
        for name, t in segments.items():
            self.segments.setdefault(name, SegmentTally()).add(*t)

    def merge(self, other: FidelityTally) -> None:
        self.samples += other.samples
        self.low += other.low
        self.excluded += other.excluded
        self.total.merge(other.total)
        for name, t in other.segments.items():
            self.segments.setdefault(name, SegmentTally()).merge(t)

    @property
    def top1_agreement(self) -> float | None:
        return _rate(self.total.agree, self.total.tokens)

    @property
    def written(self) -> SegmentTally:
        """The reasoning and content tokens together (`WRITTEN`)."""
        out = SegmentTally()
        for name in WRITTEN:
            if name in self.segments:
                out.merge(self.segments[name])
        return out

    @property
    def floor_agreement(self) -> float | None:
        """What the floor is judged on: top-1 agreement over the text the model wrote; over every
        answer token where no segment is known (samples without segment bounds)."""
        w = self.written
        return _rate(w.agree, w.tokens) if w.tokens else self.top1_agreement

    def summary(self) -> dict[str, Any]:
        """The manifest's figures for one group."""
        return {"samples": self.samples, "tokens": self.total.tokens, "top1Agreement": self.top1_agreement,
                "writtenTop1Agreement": self.floor_agreement,
                "meanNLL": _rate(self.total.nll, self.total.tokens), "lowSamples": self.low,
                "excluded": self.excluded,
                "segments": {s: self.segments[s].summary() for s in SEGMENTS if s in self.segments}}

    def dump(self) -> dict[str, Any]:
        return {"samples": self.samples, "low": self.low, "excluded": self.excluded, **self.total.dump(),
                "segments": {k: v.dump() for k, v in self.segments.items()}}

    @classmethod
    def load(cls, d: Mapping[str, Any]) -> FidelityTally:
        return cls(int(d["samples"]), int(d["low"]), int(d["excluded"]), SegmentTally.load(d),
                   {k: SegmentTally.load(v) for k, v in (d.get("segments") or {}).items()})


Groups = dict[tuple[str, str], FidelityTally]  # (provider, source) -> tally


def dump_groups(groups: Groups) -> list[dict[str, Any]]:
    return [{"provider": p, "source": s, **t.dump()} for (p, s), t in sorted(groups.items())]


def load_groups(rows: Iterable[Mapping[str, Any]]) -> Groups:
    return {(str(r["provider"]), str(r["source"])): FidelityTally.load(r) for r in rows}


def merge_groups(into: Groups, more: Groups) -> None:
    for key, t in more.items():
        into.setdefault(key, FidelityTally()).merge(t)


def rollup(groups: Groups) -> tuple[FidelityTally, dict[str, FidelityTally], dict[str, FidelityTally]]:
    """(overall, by provider, by source) of per-(provider, source) tallies."""
    overall = FidelityTally()
    by_provider: dict[str, FidelityTally] = {}
    by_source: dict[str, FidelityTally] = {}
    for (provider, source), t in sorted(groups.items()):
        overall.merge(t)
        by_provider.setdefault(provider, FidelityTally()).merge(t)
        by_source.setdefault(source, FidelityTally()).merge(t)
    return overall, by_provider, by_source


def below_floor(by_provider: Mapping[str, FidelityTally], floor: float | None) -> list[str]:
    """Providers whose token-weighted top-1 agreement on the text the model wrote (`floor_agreement`)
    is under `floor` (none without a floor)."""
    if floor is None:
        return []
    return sorted(p for p, t in by_provider.items() if (a := t.floor_agreement) is not None and a < floor)


def fidelity_section(groups: Groups, answers: Mapping[str, Any] | None, floor: float | None,
                     on_low: str) -> dict[str, Any]:
    """The manifest's `fidelity`: scores per provider and source beside the tool and gap figures of
    the same answers (`answers` is the reconstruction summary's `samples` section, or None)."""
    overall, by_provider, by_source = rollup(groups)
    answers = answers or {}

    def side(kind: str, name: str | None) -> dict[str, Any]:
        if name is None:
            return dict(answers.get("answers") or {})
        return dict((answers.get(kind) or {}).get(name) or {})

    def section(t: FidelityTally, extra: dict[str, Any]) -> dict[str, Any]:
        return {**t.summary(), **extra}

    names_p = sorted(set(by_provider) | set(answers.get("byProvider") or {}))
    names_s = sorted(set(by_source) | set(answers.get("bySource") or {}))
    return {
        "minTop1Agreement": floor,
        "onLow": on_low,
        "overall": section(overall, side("", None)),
        "byProvider": {p: section(by_provider.get(p, FidelityTally()), side("byProvider", p)) for p in names_p},
        "bySource": {s: section(by_source.get(s, FidelityTally()), side("bySource", s)) for s in names_s},
        "belowFloor": below_floor(by_provider, floor),
    }


def status_fidelity(section: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The short form the operator shows in status: overall agreement and NLL, agreement per provider."""
    if not section:
        return None
    overall = section.get("overall") or {}
    return {"samples": int(overall.get("samples") or 0), "top1Agreement": overall.get("top1Agreement"),
            "meanNLL": overall.get("meanNLL"),
            "byProvider": {p: v.get("top1Agreement") for p, v in (section.get("byProvider") or {}).items()},
            "belowFloor": list(section.get("belowFloor") or [])}
