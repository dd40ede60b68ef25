"""Export to the per-sample layout SpecForge's offline EAGLE-3 training reads.

SpecForge (`scripts/prepare_hidden_states.py` writes, `OfflineEagle3Dataset` reads) expects one
`torch.load`-able dict per sample, in `.ckpt` files found recursively under a folder
(`rows_{start}-{end}/data_{i}.ckpt`, 5000 per folder), with keys
`input_ids` [T], `loss_mask` [T], `hidden_state` [1, T, H] (the last hidden state, after the final
norm: its training target) and `aux_hidden_state` [1, T, 3H] (the concatenated auxiliary layers).
float8 storage is dequantized and written as bfloat16, the precision SpecForge trains in.
`sample_ids.jsonl` beside the folders maps each data_{i} back to its eyrie sample id. Only samples
in the shard index are exported: one excluded for low fidelity stays in its part, unread.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import safetensors.torch
import torch

from eyrie.jobs.extract.codec import decode
from eyrie.jobs.extract.shards import ShardError, layout_of, list_indexes, load_index, parse_header
from eyrie.jobs.store import NotFound, Store

ROWS_PER_FOLDER = 5000


def _save_atomic(obj: dict[str, torch.Tensor], path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def export_specforge(store: Store, out_dir: str | Path) -> int:
    """Write every extracted sample as SpecForge `.ckpt` files; returns how many were written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    indexes = list_indexes(store)
    if not indexes:
        raise ShardError(f"{store.url('hidden')}: no hidden states to export (no shard index files)")
    n = 0
    with (out / ".sample_ids.jsonl.tmp").open("w") as ids_file:
        for _shard, key in indexes:
            idx = load_index(store, key)
            layout = layout_of(idx)
            by_file: dict[int, list[str]] = {}
            for sid, row in idx["samples"].items():
                by_file.setdefault(row[0], []).append(sid)
            for file_no, part in enumerate(idx["files"]):
                try:
                    blob = store.get(part)
                except NotFound:
                    raise ShardError(f"{store.url(part)}: hidden shard is missing") from None
                try:
                    tensors = safetensors.torch.load(blob)
                except Exception as e:
                    raise ShardError(f"{store.url(part)}: corrupt safetensors file: {e}") from None
                header, _ = parse_header(blob, store.url(part))
                sids = json.loads(header["__metadata__"]["sample_ids"])
                listed = set(by_file.get(file_no, []))
                for slot, sid in enumerate(sids):
                    if sid not in listed:  # excluded after the part was written (extraction.fidelity)
                        continue
                    p = f"s{slot:06d}."
                    cols = {k[len(p):]: v for k, v in tensors.items() if k.startswith(p)}
                    aux, last = decode(cols, layout)
                    if layout.quantized:
                        aux, last = aux.to(torch.bfloat16), last.to(torch.bfloat16)
                    start = (n // ROWS_PER_FOLDER) * ROWS_PER_FOLDER
                    folder = out / f"rows_{start}-{start + ROWS_PER_FOLDER}"
                    folder.mkdir(exist_ok=True)
                    _save_atomic({
                        "input_ids": cols["input_ids"].to(torch.long),
                        "loss_mask": cols["loss_mask"].to(torch.long),
                        "hidden_state": last.unsqueeze(0).contiguous(),
                        "aux_hidden_state": aux.unsqueeze(0).contiguous(),
                    }, folder / f"data_{n}.ckpt")
                    ids_file.write(json.dumps({"index": n, "sampleId": sid}) + "\n")
                    n += 1
                left_out = {s["sampleId"] for s in idx["skipped"]}
                if not listed <= set(sids) or not set(sids) - listed <= left_out:
                    raise ShardError(f"{store.url(part)}: its samples differ from {store.url(key)}")
    os.replace(out / ".sample_ids.jsonl.tmp", out / "sample_ids.jsonl")
    return n
