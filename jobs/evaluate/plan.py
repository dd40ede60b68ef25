"""Which samples each drafter trains on and which are the serving traffic, and what each training step
holds. Pure: sample facts in, index lists out.

The promises, each checked by `tests/evaluate/test_evaluate.py`:
- the held-out set is a seeded choice of the reference output's samples (a sample's place is a hash of
  the seed and its id, the N lowest kept), so a larger held-out set holds the smaller one;
- no drafter trains on a held-out prompt: a training sample is left out when its id (the turn-less
  id of an agentic turn) or its prompt's tokens equal a held-out sample's, whatever output it comes
  from (the same dataset row answered by another provider or in another tools mode is the same
  prompt); `check_disjoint` is asked again right before a drafter trains, on what it is handed;
- every drafter gets the same budget: the same number of steps and exactly the same number of loss
  tokens per step (the last sample of a step has its loss cut at the budget), drawn in a seeded order
  (a new permutation per pass over the data, the same seed for every drafter).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from eyrie.jobs.errors import EyrieError

SPECFORGE_VERSION = "0.2.0"  # the SpecForge whose code trains and measures the drafters (drafter.py)


class EvaluationError(EyrieError):
    """`eyrie evaluate` cannot measure what it was asked; the message says what to run or change."""

    exit_code = 2


class Leakage(EvaluationError):
    """A drafter was about to train on a held-out prompt."""

    exit_code = 1


class TooFewSamples(EvaluationError):
    """The output has fewer samples with hidden states than the held-out set and training need."""


@dataclass(frozen=True)
class SampleFacts:
    """What the plan needs of one sample: its id, the id of the row it answers, a hash of its prompt's
    tokens and its loss tokens (as SpecForge counts them: the last token has none after it)."""

    sample_id: str
    row_id: str
    prompt_key: str
    loss_tokens: int
    tokens: int = 0  # the whole sequence (what a batch pads to)


def row_id(sample_id: str) -> str:
    """The id of the dataset row a sample answers: an agentic turn's key `<id>.t<turn>` less its turn."""
    head, sep, tail = sample_id.rpartition(".t")
    return head if sep and tail.isdigit() else sample_id


def prompt_key(input_ids: Sequence[int] | np.ndarray, loss_mask: Sequence[int] | np.ndarray) -> str:
    """A hash of the tokens before the first trained one (the prompt as the target saw it)."""
    mask = np.asarray(loss_mask)
    first = int(np.argmax(mask != 0)) if mask.any() else len(mask)
    ids = np.asarray(input_ids[:first], dtype=np.int64)
    return hashlib.sha256(ids.tobytes()).hexdigest()[:24]


def _rank(seed: int, sample_id: str) -> str:
    return hashlib.sha256(f"{seed}\0{sample_id}".encode()).hexdigest()


def choose_heldout(samples: Sequence[SampleFacts], n: int, seed: int, min_train: int) -> list[int]:
    """The indices of the `n` held-out samples (seeded), refusing sizes that leave fewer than
    `min_train` samples to train the reference drafter on."""
    if n < 1:
        raise TooFewSamples("--heldout must be at least 1")
    usable = [i for i, s in enumerate(samples) if s.loss_tokens > 0]
    if len(usable) < n + min_train:
        raise TooFewSamples(
            f"{len(usable):,} samples with hidden states and answer tokens; --heldout {n:,} needs at least "
            f"{n + min_train:,} ({n:,} held out plus {min_train:,} to train on): generate and extract more, "
            f"or lower --heldout to {max(0, len(usable) - min_train):,} or less")
    return sorted(sorted(usable, key=lambda i: _rank(seed, samples[i].sample_id))[:n])


@dataclass(frozen=True)
class Heldout:
    ids: frozenset[str]
    rows: frozenset[str]
    prompts: frozenset[str]

    @classmethod
    def of(cls, samples: Iterable[SampleFacts]) -> Heldout:
        s = list(samples)
        return cls(frozenset(x.sample_id for x in s), frozenset(x.row_id for x in s),
                   frozenset(x.prompt_key for x in s))

    def touches(self, s: SampleFacts) -> bool:
        return s.sample_id in self.ids or s.row_id in self.rows or s.prompt_key in self.prompts


def training_set(samples: Sequence[SampleFacts], heldout: Heldout) -> tuple[list[int], int]:
    """(indices of the samples a drafter may train on, how many were left out as held-out prompts)."""
    keep = [i for i, s in enumerate(samples) if s.loss_tokens > 0 and not heldout.touches(s)]
    left = sum(1 for s in samples if s.loss_tokens > 0 and heldout.touches(s))
    return keep, left


def check_disjoint(train: Iterable[SampleFacts], heldout: Heldout, what: str) -> None:
    """Refuse to train on a held-out prompt (`what` names the drafter in the message)."""
    bad = [s for s in train if heldout.touches(s)]
    if bad:
        raise Leakage(f"{what}: {len(bad):,} training samples are held-out prompts (e.g. {bad[0].sample_id}): "
                      "a drafter evaluated on what it trained on would look better than it is")


@dataclass(frozen=True)
class Take:
    """One sample in a step: its index, and how many of its loss tokens count (None: all)."""

    index: int
    loss_cap: int | None = None


GROUP = 64  # samples sorted by length together: a batch pads to its longest, so neighbours in length pad least


def steps_plan(loss_tokens: Sequence[int], train: Sequence[int], steps: int, tokens_per_step: int,
               seed: int, lengths: Sequence[int] | None = None) -> list[list[Take]]:
    """`steps` batches of exactly `tokens_per_step` loss tokens each from the samples `train`
    (indices into `loss_tokens`), in a seeded order that is reshuffled at every pass over them (with
    `lengths`, each run of GROUP samples of that order sorted by length). A sample with more loss
    tokens than a whole step is cut to the step."""
    if steps < 1 or tokens_per_step < 1:
        raise EvaluationError("--steps and the tokens per step must be at least 1")
    pool = [i for i in train if loss_tokens[i] > 0]
    if not pool:
        raise TooFewSamples("no training sample has a loss token")
    rng = np.random.default_rng(seed)
    order: list[int] = []
    out: list[list[Take]] = []
    for _ in range(steps):
        batch: list[Take] = []
        room = tokens_per_step
        while room > 0:
            if not order:
                order = [pool[j] for j in rng.permutation(len(pool))]
                if lengths is not None:
                    order = [i for g in range(0, len(order), GROUP)
                             for i in sorted(order[g:g + GROUP], key=lambda i: -lengths[i])]
            i = order.pop()
            n = loss_tokens[i]
            batch.append(Take(i) if n <= room else Take(i, room))
            room -= min(n, room)
        out.append(batch)
    return out


def passes(plan: Sequence[Sequence[Take]], loss_tokens: Sequence[int], train: Sequence[int]) -> float:
    """How many times the plan goes over the training samples' loss tokens (epochs)."""
    total = sum(loss_tokens[i] for i in train)
    used = sum(t.loss_cap if t.loss_cap is not None else loss_tokens[t.index] for b in plan for t in b)
    return used / total if total else 0.0
