"""How SpecForge's re-tokenization of a sample differs from eyrie's: pure comparison, no SpecForge.

SpecForge's online path (`is_preformatted: true`) is given the sample's text and rebuilds the ids by
tokenizing it again and the loss mask from the chat template's assistant header and end-of-turn
token. eyrie knows the ids the model saw and the tokens it generated, so each row is compared and,
when it differs, given one cause (the first that applies, in this order):

- `retokenized`: the ids differ (the text does not tokenize back to the ids the model saw);
- `no_answer_span`: SpecForge finds no assistant span at all (the template's header is not in the text),
  so it drops the row (it trains only on rows with a trainable token);
- `mask_tool_turn`: SpecForge's loss covers none of the answer's tokens: it masked another assistant
  turn (an answer that follows a tool result without an assistant header, as DeepSeek's does);
- `mask_history`: SpecForge's loss reaches tokens of earlier turns (their answers, their reasoning);
- `mask_boundary`: the loss differs only next to an edge of the answer: the header's last token (a
  `<think>` the prompt ends with, never generated) or the end-of-turn token;
- `mask_inside`: SpecForge leaves tokens inside the answer out of its loss (an ignore token);
- `mask_other`: anything else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

BOUNDARY = 2  # tokens next to an edge of the answer that count as "the boundary"
WINDOW = 6  # tokens shown on each side of a difference
CAUSES = ("retokenized", "no_answer_span", "mask_tool_turn", "mask_history", "mask_boundary", "mask_inside",
          "mask_other")
# what each cause means, for the summary and the report
CAUSE_TEXT = {
    "retokenized": "re-tokenization differs: the text does not tokenize back to the ids the model saw",
    "no_answer_span": "SpecForge finds no assistant span (the template's assistant header is not in the text): "
                      "it drops the row",
    "mask_tool_turn": "mask differs: SpecForge's loss misses the answer and covers another assistant turn (an "
                      "answer after a tool result has no assistant header)",
    "mask_history": "mask differs: SpecForge's loss covers earlier turns (history answers or their reasoning)",
    "mask_boundary": "mask differs at the answer's edge: the boundary token (e.g. a <think> the prompt ends "
                     "with, which the model never generated)",
    "mask_inside": "mask differs inside the answer: SpecForge leaves some of its tokens out (an ignore token)",
    "mask_other": "mask differs",
    "over_max_length": "longer than max_length: SpecForge cuts it (pass a larger --max-length, or --truncate)",
}


@dataclass(frozen=True)
class Difference:
    cause: str
    position: int  # the first token where ids (or masks) differ
    ours: str  # the tokens around it as eyrie has them, loss marked ⟦...⟧
    theirs: str  # ... as SpecForge rebuilt them

    def to_json(self) -> dict[str, object]:
        return {"cause": self.cause, "position": self.position, "eyrie": self.ours, "specforge": self.theirs}


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """The [start, end) runs of ones in a 0/1 mask."""
    m = np.concatenate(([0], np.asarray(mask, dtype=np.int8), [0]))
    edges = np.flatnonzero(np.diff(m))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def _cause(ours: np.ndarray, theirs: np.ndarray) -> str:
    spans = runs(ours)
    extra = np.flatnonzero((theirs == 1) & (ours == 0))
    missing = np.flatnonzero((ours == 1) & (theirs == 0))
    if spans and not np.any((ours == 1) & (theirs == 1)) and np.any(theirs == 1):
        return "mask_tool_turn"

    def near_edge(i: int) -> bool:
        return any(s - BOUNDARY <= i < s + BOUNDARY or e - BOUNDARY <= i < e + BOUNDARY for s, e in spans)

    first = spans[0][0] if spans else len(ours)
    if any(i < first - BOUNDARY for i in extra.tolist()):
        return "mask_history"
    if all(near_edge(i) for i in (*extra.tolist(), *missing.tolist())):
        return "mask_boundary"
    if missing.size and all(any(s <= i < e for s, e in spans) for i in missing.tolist()):
        return "mask_inside"
    return "mask_other"


def show(decode: Callable[[Sequence[int]], str], ids: Sequence[int], mask: np.ndarray, at: int) -> str:
    """The tokens around `at`, each decoded, those in the loss inside ⟦ ⟧."""
    lo, hi = max(0, at - WINDOW), min(len(ids), at + WINDOW + 1)
    out, inside = [], False
    for i in range(lo, hi):
        on = bool(mask[i]) if i < len(mask) else False
        if on != inside:
            out.append("⟦" if on else "⟧")
            inside = on
        out.append(decode([int(ids[i])]))
    if inside:
        out.append("⟧")
    return ("…" if lo else "") + "".join(out) + ("…" if hi < len(ids) else "")


def compare(ours_ids: np.ndarray, ours_mask: np.ndarray, theirs_ids: np.ndarray, theirs_mask: np.ndarray,
            decode: Callable[[Sequence[int]], str]) -> Difference | None:
    """None when SpecForge rebuilt exactly eyrie's ids and loss mask; else the first difference."""
    ours_ids, theirs_ids = np.asarray(ours_ids), np.asarray(theirs_ids)
    ours_mask = np.asarray(ours_mask, dtype=np.int8)
    theirs_mask = np.asarray(theirs_mask, dtype=np.int8)
    n = min(len(ours_ids), len(theirs_ids))
    if len(ours_ids) != len(theirs_ids) or not np.array_equal(ours_ids[:n], theirs_ids[:n]):
        diff = np.flatnonzero(ours_ids[:n] != theirs_ids[:n])
        at = int(diff[0]) if diff.size else n
        return Difference("retokenized", at, show(decode, ours_ids, ours_mask, at),
                          show(decode, theirs_ids, theirs_mask, at))
    if np.array_equal(ours_mask, theirs_mask):
        return None
    at = int(np.flatnonzero(ours_mask != theirs_mask)[0])
    cause = "no_answer_span" if not theirs_mask.any() else _cause(ours_mask, theirs_mask)
    return Difference(cause, at, show(decode, ours_ids, ours_mask, at),
                      show(decode, theirs_ids, theirs_mask, at))
