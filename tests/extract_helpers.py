"""Shared by the extraction tests and benchmarks: samples parquet files, specs, a reference forward."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from eyrie.jobs.contract import layout
from eyrie.jobs.reconstruct.samples import SCHEMA as SAMPLES_SCHEMA
from eyrie.jobs.spec import DatasetGenerationSpec, parse_spec
from eyrie.jobs.store import Store


def samples_parquet(rows: Sequence[tuple[str, list[int], list[int]]], turns: Sequence[int] | None = None) -> bytes:
    """(sample_id, input_ids, loss_mask) rows in the samples/ schema the reconstruction stage writes;
    `turns`: each row's turn (agentic conversations), else 0."""
    table = pa.table({
        "sample_id": [r[0] for r in rows], "turn": list(turns) if turns is not None else [0] * len(rows),
        "source": ["src"] * len(rows),
        "input_ids": [r[1] for r in rows], "loss_mask": [r[2] for r in rows],
        "n_tokens": [len(r[1]) for r in rows], "flags": [[] for _ in rows],
        "provider": [None] * len(rows), "segments": [None] * len(rows), "fingerprint": [None] * len(rows),
    }, schema=SAMPLES_SCHEMA)
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def random_rows(shard: int, n: int, vocab: int, seed: int, min_len: int = 3, max_len: int = 40
                ) -> list[tuple[str, list[int], list[int]]]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        t = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        ids = torch.randint(0, vocab, (t,), generator=g).tolist()
        cut = t // 2
        rows.append((layout.sample_id(f"src{shard}", i, ids), ids, [0] * cut + [1] * (t - cut)))
    return rows


def put_samples(store: Store, shard: int, rows: Sequence[tuple[str, list[int], list[int]]],
                turns: Sequence[int] | None = None) -> None:
    store.put(layout.samples_key(shard), samples_parquet(rows, turns))


def make_spec(output: str, model: str | Path, **extraction: Any) -> DatasetGenerationSpec:
    doc = {
        "sources": [{"name": "src", "uri": "file:///dev/null"}],
        "target": {"model": "m", "tokenizer": str(model)},
        "api": {"baseUrl": "simulated"},
        "budget": {"maxUSD": "1"},
        "generation": {"shards": 4},
        "extraction": {"enabled": True, "engine": "transformers", "model": str(model), "device": "cpu",
                       **extraction},
        "output": {"uri": output},
    }
    return parse_spec(doc).spec


def reference(model: torch.nn.Module, ids: Sequence[int], layers: Sequence[int]
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """A direct forward of one sample: (aux [T, kH], last [T, H]) from output_hidden_states."""
    with torch.inference_mode():
        hs = model(torch.tensor([list(ids)]), output_hidden_states=True).hidden_states
    return torch.cat([hs[i][0] for i in layers], dim=-1), hs[-1][0]


# A forward summed in another order (another thread count, batch shape or CPU's kernels) moves each
# value by a few float32 eps of its tensor's largest magnitude: measured on the tiny test model, 1.9 eps
# between one thread and two. 64 eps allows that with margin, and nothing another model, layer or
# token would give (bfloat16 storage alone rounds by 2^-8, 32,768 eps).
ROUNDING_EPS = 64


def assert_float32_rounding(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """`got` is `want` recomputed by the same model in float32, up to the order of its sums."""
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype, want.dtype)
    scale = float(want.abs().max())
    err = float((got - want).abs().max())
    bound = ROUNDING_EPS * torch.finfo(torch.float32).eps * scale
    assert err <= bound, f"{what}: max |diff| {err:.3g} over {bound:.3g} ({ROUNDING_EPS} eps of max |x| {scale:.3g})"
