"""Which samples share a forward, and in what shape (pure: lengths in, batches out; no torch).

A forward costs what its tokens cost, and padding costs as much as a real token: the issue's
measurement on an H200 lost a quarter of the GPU to 37% padding. So batches are sized by tokens,
not by count, and take one of three shapes:

- `UNIFORM`: every sample has the same length, a [B, T] batch with no mask (plain causal attention);
  a single sample is uniform;
- `PACKED`: samples of several lengths laid end to end in one [1, N] row, each attending only to
  itself (a varlen attention: `varlen.py`), no padding at all;
- `PADDED`: right-padded [B, T] with an attention mask, for a model whose attention cannot be packed
  (sliding windows, softcapping: `varlen.packable`) and for comparison with what eyrie did before.

Samples are bucketed by length (longest first, ties in input order) before they are grouped, so
equal lengths meet in uniform batches and a padded batch holds similar lengths. A batch lists the
positions of its samples in the input; callers put results back by position, so the output's order
never depends on the batching (tests/extract/test_extract_batching.py breaks this on purpose).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

CPU_BUDGET = 8192
"""Tokens per forward on the CPU: past a few thousand tokens the matmuls are as efficient as they get
there, and float32 activations of a larger batch only cost memory (measured: benchmarks/gpu_extraction_hf.py)."""
MIN_BUDGET = 2048
MAX_BUDGET = 32768
"""On a GPU: an 8B model's forward reaches most of the matmul's speed at ~16k tokens (issue 42's
measurement); twice that keeps per-batch overhead small, and a larger batch only grows the states
that wait to leave the device (32 KB a token for an 8B model: 1 GiB at 32k)."""
BUDGET_SHARE_OF_FREE_MEMORY = 0.25
"""Of the device memory left after the weights: activations of the forward in flight, the states of
the batches whose copy to the host is pending, the allocator's slack."""


class Shape(enum.Enum):
    UNIFORM = "uniform"
    PACKED = "packed"
    PADDED = "padded"


@dataclass(frozen=True)
class Batch:
    """Positions (into the caller's list) of the samples run together, their lengths, and the shape."""

    positions: tuple[int, ...]
    lengths: tuple[int, ...]
    shape: Shape

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def computed(self) -> int:
        """Tokens the forward computes, padding included."""
        if self.shape is Shape.PADDED:
            return len(self.lengths) * max(self.lengths)
        return self.tokens


def plan_batches(lengths: Sequence[int], budget: int, packed: bool) -> list[Batch]:
    """Group sample positions into batches of at most `budget` computed tokens (longest first).

    `packed`: a batch of mixed lengths is PACKED (real tokens count against the budget), else PADDED
    (padded tokens count); a batch of one length is UNIFORM either way. A sample longer than the
    budget runs alone. Every position appears in exactly one batch.
    """
    if budget < 1:
        raise ValueError(f"token budget must be >= 1, got {budget}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[Batch] = []
    cur: list[int] = []
    tokens = 0  # real tokens of `cur`
    for i in order:
        # sorted longest first: cur[0] is the widest, so a padded batch computes len x lengths[cur[0]]
        cost = tokens + lengths[i] if packed else (len(cur) + 1) * lengths[cur[0]] if cur else 0
        if cur and cost > budget:
            batches.append(_batch(lengths, cur, packed))
            cur, tokens = [], 0
        cur.append(i)
        tokens += lengths[i]
    if cur:
        batches.append(_batch(lengths, cur, packed))
    return batches


def _batch(lengths: Sequence[int], members: list[int], packed: bool) -> Batch:
    lens = tuple(lengths[i] for i in members)
    shape = Shape.UNIFORM if min(lens) == max(lens) else Shape.PACKED if packed else Shape.PADDED
    return Batch(tuple(members), lens, shape)


def default_budget(device: str, free_bytes: int | None, bytes_per_token: int) -> int:
    """Tokens per forward when the spec sets none: `CPU_BUDGET` on the CPU; on a GPU a share of the
    memory free after loading the weights over what one token needs in flight (`bytes_per_token`:
    `activation_bytes_per_token`), between `MIN_BUDGET` and `MAX_BUDGET`, a multiple of 1024."""
    if not device.startswith("cuda") or free_bytes is None:
        return CPU_BUDGET
    fit = int(free_bytes * BUDGET_SHARE_OF_FREE_MEMORY) // max(1, bytes_per_token)
    return max(MIN_BUDGET, min(MAX_BUDGET, fit // 1024 * 1024))


def activation_bytes_per_token(hidden: int, intermediate: int, aux_layers: int, element_bytes: int,
                               staged_batches: int) -> int:
    """Device bytes one token holds during extraction: the residual stream and a layer's largest
    temporaries (q, k, v, o and the MLP's gate, up and product: ~4 H + 3 I), the captured states
    ((aux + 1) H) of the batch in the forward and of each batch whose copy is pending."""
    return element_bytes * (4 * hidden + 3 * intermediate + (aux_layers + 1) * hidden * (1 + staged_batches))
