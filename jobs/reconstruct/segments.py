"""Which response tokens are reasoning, content and tool calls: the segments fidelity is split by.

A response is reasoning (up to and including its end marker `</think>`), then content, then the
tool calls (their markers, names, ids and arguments, and the end of turn after them); a plain answer
ends in content. Boundaries are found as characters of the response text from the pieces the
format rendered, then mapped to tokens by the bytes each token decodes to: a token belongs to the
segment its first byte is in.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence

from eyrie.jobs.reconstruct.base import THINK, THINK_END


def _find(text: str, piece: str, start: int) -> tuple[int, int] | None:
    """(begin, end) of `piece` in `text` from `start`, or of the piece stripped (a trimming template)."""
    for p in (piece, piece.strip()):
        if p and (i := text.find(p, start)) >= 0:
            return i, i + len(p)
    return None


def segment_chars(response: str, pieces: Sequence[tuple[str, str]], has_calls: bool) -> tuple[int, int]:
    """Character offsets in `response` where the content and the tool calls start."""
    labels = dict(pieces)
    pos = 0
    if reasoning := labels.get("reasoning", ""):
        found = _find(response, reasoning, 0)
        pos = found[1] if found else 0
    end = response.find(THINK_END, pos)
    if end >= 0 and response[pos:end].strip() in ("", THINK):
        pos = end + len(THINK_END)
    content_start = pos
    if not has_calls:
        return content_start, len(response)
    if content := labels.get("content", ""):
        found = _find(response, content, content_start)
        if found:
            return content_start, found[1]
    return content_start, content_start


def token_starts(response: str, token_bytes: Sequence[bytes], decode: Callable[[Sequence[int]], str],
                 ids: Sequence[int], chars: Sequence[int]) -> list[int]:
    """The index of the first token at or after each character offset in `chars`.

    Uses each token's bytes when they add up to the response (byte-level vocabularies); otherwise
    decodes prefixes (a binary search per boundary).
    """
    text_bytes = response.encode()
    if sum(len(b) for b in token_bytes) == len(text_bytes):
        starts = list(itertools.accumulate((len(b) for b in token_bytes), initial=0))[:-1]
        return [bisect.bisect_left(starts, len(response[:c].encode())) for c in chars]
    out = []
    for c in chars:
        lo, hi = 0, len(ids)
        while lo < hi:  # the first k whose prefix of k tokens covers c characters
            mid = (lo + hi) // 2
            if len(decode(ids[:mid])) >= c:
                hi = mid
            else:
                lo = mid + 1
        out.append(lo)
    return out


def segment_starts(response: str, pieces: Sequence[tuple[str, str]], has_calls: bool, n_prompt: int,
                   ids: Sequence[int], token_bytes: Sequence[bytes],
                   decode: Callable[[Sequence[int]], str]) -> tuple[int, int, int]:
    """Absolute token positions where reasoning, content and tool calls start (`SEGMENTS` order)."""
    content, calls = segment_chars(response, pieces, has_calls)
    c_tok, k_tok = token_starts(response, token_bytes, decode, ids, (content, calls))
    return n_prompt, n_prompt + c_tok, n_prompt + max(c_tok, k_tok)
