"""Every answer scored by the target model, from the extraction forward pass (DESIGN §7).

A backend returns, for each completion token, its log-probability under the model and whether it
is the model's argmax at its position (`TokenScores`); this module turns them into one row per
sample (log-probability, mean NLL, top-1 agreement, first divergence, each per segment), decides
the floor (`extraction.fidelity`), sums rows per (provider, source) for the manifest, and writes
`fidelity/shard-NNNNN.parquet`.

The transformers backend computes the scores with `lm_scores`: the LM head applied to the last
hidden state in chunks of rows, since a [T, V] logits tensor of a 160k vocabulary is ~650 KB per
token in float32 (a 32k-token answer would need 20 GB).
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from eyrie.jobs.contract.fidelity import SEGMENTS, UNKNOWN_PROVIDER, WRITTEN, FidelityTally, Groups

LOGITS_CHUNK_BYTES = 256 << 20  # float32 logits held at once while scoring one sample


@dataclass(frozen=True)
class TokenScores:
    """Scores of the tokens at positions `start`..T-1 of one sample, each predicted from the one before."""

    start: int
    logprob: np.ndarray  # float32 [T - start]: log p(token | everything before it)
    top1: np.ndarray  # bool [T - start]: the token is (one of) the model's argmax there


@dataclass(frozen=True)
class Forward:
    """What a backend's forward gives for one sample: hidden states and, when asked, its scores."""

    aux: torch.Tensor  # [T, kH]
    last: torch.Tensor  # [T, H]
    scores: TokenScores | None = None


def score_start(loss_mask: np.ndarray) -> int | None:
    """The first position to score: the first loss-masked token after position 0 (None: nothing)."""
    hits = np.flatnonzero(loss_mask[1:]) + 1
    return int(hits[0]) if hits.size else None


@torch.inference_mode()
def lm_scores(head: torch.nn.Module, last: torch.Tensor, ids: torch.Tensor, start: int,
              softcap: float | None = None, chunk_bytes: int = LOGITS_CHUNK_BYTES) -> TokenScores:
    """Scores of ids[start:] from the last hidden states `last` [T, H] of the same forward.

    The logits at position p predict token p + 1, so rows start-1..T-2 are projected, a chunk of rows
    at a time. A token tied with the argmax counts as agreeing (ties are the model's indifference).
    """
    vocab = int(getattr(head, "out_features", 0) or head.weight.shape[0])
    rows = max(1, chunk_bytes // (4 * vocab))
    targets = ids[start:].to(last.device, torch.long)
    logprob = torch.empty(targets.shape[0], dtype=torch.float32)
    top1 = torch.empty(targets.shape[0], dtype=torch.bool)
    for a in range(0, targets.shape[0], rows):
        b = min(a + rows, targets.shape[0])
        logits = head(last[start - 1 + a:start - 1 + b]).float()
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        t = targets[a:b, None]
        chosen = logits.gather(1, t)
        logprob[a:b] = (chosen - torch.logsumexp(logits, dim=-1, keepdim=True))[:, 0].cpu()
        top1[a:b] = (chosen >= logits.max(dim=-1, keepdim=True).values)[:, 0].cpu()
    return TokenScores(start, logprob.numpy(), top1.numpy())


# ------------------------------------------------------------------------------ one sample's row


SCHEMA = pa.schema([
    ("sample_id", pa.string()),
    ("source", pa.string()),
    ("provider", pa.string()),
    ("n_completion_tokens", pa.int32()),
    ("logprob", pa.float64()),  # sum over the completion tokens
    ("mean_nll", pa.float64()),
    ("top1_agreement", pa.float64()),
    ("first_divergence", pa.int32()),  # index within the completion of the first non-argmax token; null: none
    *((f"{s}_{col}", t) for s in SEGMENTS for col, t in (
        ("tokens", pa.int32()), ("mean_nll", pa.float64()), ("top1_agreement", pa.float64()))),
    ("below_floor", pa.bool_()),  # under extraction.fidelity.minTop1Agreement (null: no floor)
    ("excluded", pa.bool_()),  # kept out of the hidden-state index (onLow: exclude)
])


def _mean(x: np.ndarray) -> float | None:
    return float(x.mean()) if x.size else None


def fidelity_row(sample_id: str, source: str, provider: str | None, loss_mask: np.ndarray,
                 segments: Sequence[int] | None, scores: TokenScores) -> dict[str, Any]:
    """One sample's row: scores of its loss-masked tokens, overall and per segment (policy columns unset)."""
    positions = np.flatnonzero(loss_mask[scores.start:]) + scores.start
    lp = scores.logprob[positions - scores.start].astype(np.float64)
    agree = scores.top1[positions - scores.start]
    miss = np.flatnonzero(~agree)
    row: dict[str, Any] = {
        "sample_id": sample_id, "source": source, "provider": provider or UNKNOWN_PROVIDER,
        "n_completion_tokens": int(positions.size), "logprob": float(lp.sum()),
        "mean_nll": _mean(-lp), "top1_agreement": _mean(agree.astype(np.float64)),
        "first_divergence": int(miss[0]) if miss.size else None,
    }
    bounds = list(segments or ())
    for i, name in enumerate(SEGMENTS):
        if len(bounds) != len(SEGMENTS):
            row.update({f"{name}_tokens": None, f"{name}_mean_nll": None, f"{name}_top1_agreement": None})
            continue
        end = bounds[i + 1] if i + 1 < len(bounds) else len(loss_mask)
        sel = (positions >= bounds[i]) & (positions < end)
        row.update({f"{name}_tokens": int(sel.sum()), f"{name}_mean_nll": _mean(-lp[sel]),
                    f"{name}_top1_agreement": _mean(agree[sel].astype(np.float64))})
    row["below_floor"] = None
    row["excluded"] = False
    return row


def floor_agreement(row: dict[str, Any]) -> float | None:
    """A sample's top-1 agreement on the text the model wrote (`contract.fidelity.WRITTEN`: reasoning
    and content), over all its answer tokens when it wrote none or its segments are unknown."""
    tokens = sum(row.get(f"{s}_tokens") or 0 for s in WRITTEN)
    if not tokens:
        return row["top1_agreement"]
    return sum((row.get(f"{s}_top1_agreement") or 0.0) * (row.get(f"{s}_tokens") or 0) for s in WRITTEN) / tokens


def apply_floor(row: dict[str, Any], floor: float | None, on_low: str) -> None:
    """Mark a row under the floor (judged on `floor_agreement`); with `exclude` it is kept out of what
    training reads."""
    agreement = floor_agreement(row)
    if floor is None or agreement is None:
        return
    row["below_floor"] = agreement < floor
    row["excluded"] = row["below_floor"] and on_low == "exclude"


def tally_rows(rows: Sequence[dict[str, Any]]) -> Groups:
    """Per (provider, source) sums of rows, for the index, the pod summary and the manifest."""
    groups: Groups = {}
    for r in rows:
        n = r["n_completion_tokens"]
        if not n:
            continue

        def sums(tokens: int, mean_nll: float | None, agreement: float | None) -> tuple[int, float, int]:
            return tokens, (mean_nll or 0.0) * tokens, round((agreement or 0.0) * tokens)

        segs = {s: sums(r[f"{s}_tokens"], r[f"{s}_mean_nll"], r[f"{s}_top1_agreement"])
                for s in SEGMENTS if r.get(f"{s}_tokens")}
        groups.setdefault((r["provider"], r["source"]), FidelityTally()).add_sample(
            sums(n, r["mean_nll"], r["top1_agreement"]), segs, bool(r["below_floor"]), bool(r["excluded"]))
    return groups


def encode_rows(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as JSON for a hidden part's metadata: a resumed part brings its scores back with it."""
    return json.dumps(list(rows), separators=(",", ":"))


def decode_rows(raw: str) -> list[dict[str, Any]]:
    return list(json.loads(raw))


def fidelity_parquet(rows: Sequence[dict[str, Any]]) -> bytes:
    table = pa.Table.from_pylist([{k: r.get(k) for k in SCHEMA.names} for r in rows], schema=SCHEMA)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()
