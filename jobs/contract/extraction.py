"""What extraction records for the manifest, and the merge of every pod's share.

Torch-free on purpose: the operator and `finalize_manifest` read pod summaries without loading the
model stack.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from eyrie.jobs.contract import layout
from eyrie.jobs.contract.fidelity import Groups, dump_groups, load_groups, merge_groups
from eyrie.jobs.errors import EyrieError
from eyrie.jobs.store import Store


class ExtractionError(EyrieError, RuntimeError):
    """Extraction cannot go on; the message names the shard, sample or setting at fault."""


@dataclass
class ShardResult:
    shard: int
    index: str
    files: list[str]
    bytes: int
    samples: int
    tokens: int
    skipped: dict[str, int]
    resumed: bool = False
    fidelity: Groups | None = None  # per (provider, source) scores; None when the shard was not scored

    @classmethod
    def from_index(cls, doc: dict[str, Any], key: str, resumed: bool) -> ShardResult:
        fid = doc.get("fidelity")
        return cls(shard=int(doc["shard"]), index=key, files=list(doc["files"]), bytes=sum(doc["fileBytes"]),
                   samples=len(doc["samples"]), tokens=int(doc["tokens"]),
                   skipped=dict(Counter(s["reason"] for s in doc["skipped"])), resumed=resumed,
                   fidelity=load_groups(fid) if fid is not None else None)


@dataclass
class ExtractionSummary:
    """What the manifest's `extraction` section records about this run (or one pod's share)."""

    engine: str
    model: str
    aux_layers: list[int]
    layer_convention: str
    hidden_size: int
    num_layers: int
    dtype: str
    model_config_sha256: str
    bytes_per_token: int
    shards: list[ShardResult] = field(default_factory=list)
    model_name: str | None = None  # `extraction.model` as the spec names it (`model` is where it was loaded from)

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def fidelity(self) -> Groups | None:
        """Scores of every scored shard, merged per (provider, source); None when none was scored."""
        scored = [s.fidelity for s in self.shards if s.fidelity is not None]
        if not scored:
            return None
        out: Groups = {}
        for g in scored:
            merge_groups(out, g)
        return out

    @property
    def skipped(self) -> dict[str, int]:
        c: Counter[str] = Counter()
        for s in self.shards:
            c.update(s.skipped)
        return dict(sorted(c.items()))

    def to_manifest(self) -> dict[str, Any]:
        return {
            "engine": self.engine, "model": self.model, **({"modelName": self.model_name} if self.model_name else {}),
            "auxLayers": self.aux_layers,
            "layerConvention": self.layer_convention, "hiddenSize": self.hidden_size,
            "numLayers": self.num_layers, "dtype": self.dtype, "modelConfigSha256": self.model_config_sha256,
            "bytesPerToken": self.bytes_per_token, "shardsDone": len(self.shards),
            "samples": self.samples, "tokens": self.tokens, "bytes": self.bytes, "skipped": self.skipped,
            "shards": [{"shard": s.shard, "index": s.index, "files": s.files, "samples": s.samples,
                        "tokens": s.tokens, "bytes": s.bytes, "skipped": s.skipped,
                        **({"fidelity": dump_groups(s.fidelity)} if s.fidelity is not None else {})}
                       for s in self.shards],
        }

    @classmethod
    def from_manifest(cls, d: dict[str, Any]) -> ExtractionSummary:
        shards = [ShardResult(shard=s["shard"], index=s["index"], files=s["files"], bytes=s["bytes"],
                              samples=s["samples"], tokens=s["tokens"], skipped=s["skipped"],
                              fidelity=load_groups(s["fidelity"]) if "fidelity" in s else None)
                  for s in d["shards"]]
        return cls(d["engine"], d["model"], list(d["auxLayers"]), d["layerConvention"], d["hiddenSize"],
                   d["numLayers"], d["dtype"], d["modelConfigSha256"], d["bytesPerToken"], shards, d.get("modelName"))


def summarize(store: Store) -> ExtractionSummary | None:
    """Merge every pod's `hidden/summary-*` into one summary (for the manifest); None if none ran.

    Shards are keyed by number, so summaries left by an earlier attempt with another pod count
    never count a shard twice.
    """
    docs = [json.loads(store.get(k)) for k in store.list(layout.HIDDEN)
            if k.startswith(f"{layout.HIDDEN}/summary-") and k.endswith(".json")]
    if not docs:
        return None
    merged = ExtractionSummary.from_manifest(docs[0])
    by_shard = {}
    for d in docs:
        s = ExtractionSummary.from_manifest(d)
        if (s.aux_layers, s.dtype, s.model_config_sha256) != (merged.aux_layers, merged.dtype,
                                                                merged.model_config_sha256):
            raise ExtractionError(
                f"{store.url(layout.HIDDEN)}: pod summaries disagree on layers/dtype/model (written by "
                "different specs); delete hidden/ and extract again")
        by_shard.update({r.shard: r for r in s.shards})
    merged.shards = [by_shard[k] for k in sorted(by_shard)]
    return merged
