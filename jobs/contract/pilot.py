"""The pilot's verdict (`spec.pilot`, `eyrie pilot`): what the data plane writes to `pilot.json` and the
operator, the report and the CLI read. Torch-free. Its
defaults (MIN_TRAIN, STEPS, TOKENS_PER_STEP, MAX_MARGIN, default_heldout) are the spec's (`jobs/spec.py`: the
spec sits below the contract).

The pilot trains one small drafter per option on a slice of the run (the run's own tools mode, the other
mode, the sources' own answers) and measures each on the target's own structured answers held out. The
verdict says whether the run's own data is no worse than the best alternative beyond `margin` accepted
tokens per step (`passed`), and whether the run goes on (`proceed`: passed, or policy report).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

import orjson
from pydantic import Field

from eyrie.jobs.contract.layout import PILOT
from eyrie.jobs.model import Model
from eyrie.jobs.store import NotFound, Store

FORMAT = "eyrie-pilot/1"
EXIT_FAILED = 10  # `eyrie pilot`'s exit code when the verdict suspends the run (policy require, own data worse)


class Option(StrEnum):
    """What a pilot drafter trains on."""

    STRUCTURED = "structured"  # answers bought with the tools as the API's `tools`
    TEXT = "text"  # answers bought with the tools described in the prompt
    DATASET = "dataset"  # the sources' own answers (generation.answers: dataset): nothing bought

    def describe(self) -> str:
        return {"structured": "answers regenerated with tools structured",
                "text": "answers regenerated with tools as text",
                "dataset": "the sources' own answers"}[self.value]


class Span(Model):
    """A figure and its 95% interval."""

    value: float
    low: float
    high: float


class OptionResult(Model):
    """One option as the pilot measured it."""

    option: Option
    own: bool
    """The run's own data (its tools mode, regenerated)."""
    accepted_length: Span
    """Tokens accepted per step by its drafter on the held-out answers (chain decoding, the target's token included)."""
    minus_own: Span | None = None
    """This option's accepted length minus the run's own (paired over the same held-out answers); None for the own."""
    separated: bool | None = None
    """Whether minusOwn's interval excludes zero."""
    heldout_to_separate: int | None = None
    """About how many held-out prompts would separate a difference of minusOwn's size (None: separated or zero)."""
    projected_usd: str | None = Field(default=None, alias="projectedUSD")
    """What the whole dataset would cost with this option (the pilot's cost per answer x the sources'
    tool-declaring prompts, as the audit projects it); "0" for the sources' own answers."""
    training_samples: int = 0
    """Samples its drafter trained on."""
    switch: str | None = None
    """The spec change that makes this option the run's own, as `kubectl patch --type merge -p` takes it."""


class PilotVerdict(Model):
    """pilot.json: the pilot's decision."""

    format: Literal["eyrie-pilot/1"] = FORMAT
    key: str
    """contract/fingerprint.pilot_key of the spec it decided for: a spec with another key needs the pilot again."""
    policy: Literal["report", "require"]
    margin: float
    passed: bool
    """The run's own drafter accepts no fewer tokens per step than the best alternative's, less margin."""
    proceed: bool
    """Whether the run goes on: passed, or policy report."""
    sentence: str
    """The verdict in words: what was compared, the accepted lengths with intervals, the costs, what to do."""
    own: Option
    best_alternative: Option
    options: list[OptionResult]
    prompts: int
    """Pilot prompts (tool-declaring, seeded)."""
    heldout: int
    """Of them, held out: the target's own structured answers every drafter is measured on."""
    spent_usd: str = Field(alias="spentUSD")
    """What the pilot's answers cost (bought by this pilot or an earlier audit/pilot of the same answers)."""
    adopted: int = 0
    """Pilot answers of the run's own mode kept as the run's samples (never bought again)."""
    evaluation: str
    """Store key of the evaluation document (as `eyrie evaluate` writes it)."""
    patch: str | None = None
    """The command that switches the run to the best alternative and resumes it (when not passed)."""
    created_at: str = ""

    def to_json(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json", by_alias=True, exclude_none=True),
                            option=orjson.OPT_INDENT_2)


def read_verdict(store: Store) -> PilotVerdict | None:
    """pilot.json (None before a pilot decided, or when it is not this format: the pilot runs again)."""
    try:
        doc = orjson.loads(store.get(PILOT))
    except (NotFound, orjson.JSONDecodeError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None
    return PilotVerdict.model_validate(doc)


def write_verdict(store: Store, verdict: PilotVerdict) -> None:
    store.put(PILOT, verdict.to_json())
