"""One output's samples with hidden states, as the evaluation reads them: the target they were
extracted with, each sample's facts for the plan, a fingerprint of what was read, and the tensors of
a sample in SpecForge's offline layout (`aux_hidden_state` [1, T, 3H], `hidden_state` [1, T, H]).

Only the shard indexes and the samples Parquet are read up front (ids and masks, a few bytes a
token); a sample's hidden states are read when a batch needs them (ranged reads), so memory stays
that of one batch whatever the output's size.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eyrie.jobs.contract import layout
from eyrie.jobs.evaluate.plan import EvaluationError, SampleFacts, prompt_key, row_id
from eyrie.jobs.store import Store, open_store


class NoHiddenStates(EvaluationError):
    """The output has no extracted hidden states to train a drafter on."""


class DifferentTargets(EvaluationError):
    """Outputs whose hidden states come from different target models (or layers) cannot be compared."""


@dataclass(frozen=True)
class Target:
    """The model the hidden states were extracted with, as the shard indexes record it."""

    model: str  # the path or id extraction loaded (a builtin's cache folder)
    name: str  # what the spec named it (builtin:tiny-chat), else `model`
    config_sha256: str
    aux_layers: tuple[int, ...]
    hidden_size: int

    def key(self) -> tuple[str, str, tuple[int, ...], int]:
        """What must match for two outputs' states to be comparable: the model (as the spec named it: two
        models of one config, another seed, differ only there), its config, the layers."""
        return self.name, self.config_sha256, self.aux_layers, self.hidden_size

    def describe(self) -> str:
        return f"{self.name} (config {self.config_sha256[:12]}, aux layers {list(self.aux_layers)})"

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.name, "modelConfigSha256": self.config_sha256, "auxLayers": list(self.aux_layers),
                "hiddenSize": self.hidden_size}


@dataclass
class Corpus:
    """One output's samples with hidden states."""

    store: Store
    target: Target
    samples: list[SampleFacts]
    fingerprint: str  # sha256 of the shard indexes and samples files read
    _ids: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)
    _reader: Any = field(default=None, repr=False)

    @property
    def uri(self) -> str:
        return self.store.uri

    def tokens(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids, loss_mask) of sample i."""
        return self._ids[self.samples[i].sample_id]

    def raw(self, i: int) -> dict[str, Any]:
        """Sample i as one SpecForge offline `.ckpt` holds it (what `eyrie export specforge` writes)."""
        import torch

        if self._reader is None:
            from eyrie.jobs.extract.shards import HiddenReader

            self._reader = HiddenReader(self.store)
        got = self._reader.read(self.samples[i].sample_id)
        return {"input_ids": got["input_ids"].to(torch.long), "loss_mask": got["loss_mask"].to(torch.long),
                "hidden_state": got["last_hidden"].unsqueeze(0), "aux_hidden_state": got["aux_hidden"].unsqueeze(0)}


def _target(indexes: list[tuple[str, dict[str, Any]]], manifest: dict[str, Any] | None, uri: str) -> Target:
    first_key, first = indexes[0]
    name = ((manifest or {}).get("extraction") or {}).get("modelName") or first.get("model") or ""
    t = Target(str(first.get("model") or ""), str(name), str(first.get("modelConfigSha256") or ""),
               tuple(int(x) for x in first.get("auxLayers") or ()), int(first.get("hiddenSize") or 0))
    for key, idx in indexes[1:]:
        other = (t.name, str(idx.get("modelConfigSha256") or ""), tuple(int(x) for x in idx.get("auxLayers") or ()),
                 int(idx.get("hiddenSize") or 0))
        if other != t.key():
            raise DifferentTargets(f"{uri}: {key} and {first_key} hold hidden states of different models or layers")
    return t


def open_corpus(uri: str, endpoint: str | None = None) -> Corpus:
    """Read an output's shard indexes and samples; refuse one without hidden states, naming the command."""
    import orjson

    from eyrie.jobs.extract.run import list_sample_shards, read_samples
    from eyrie.jobs.extract.shards import list_indexes, load_index

    store = open_store(uri, endpoint)
    keys = list_indexes(store)
    if not keys:
        raise NoHiddenStates(
            f"{store.uri}: no hidden states (no {layout.HIDDEN}/shard-*.index.json): a drafter trains on the target's "
            "hidden states; extract them with `eyrie extract SPEC` (or `eyrie run SPEC` with extraction.enabled: "
            "true), then evaluate again")
    h = hashlib.sha256()
    indexes = []
    for _shard, key in keys:
        blob = store.get(key)
        h.update(key.encode() + b"\0" + hashlib.sha256(blob).digest())
        indexes.append((key, load_index(store, key)))
    try:
        manifest = orjson.loads(store.get(layout.MANIFEST)) if store.exists(layout.MANIFEST) else None
    except orjson.JSONDecodeError:
        manifest = None
    target = _target(indexes, manifest, store.uri)
    extracted = {sid for _key, idx in indexes for sid in idx["samples"]}
    ids: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for shard in list_sample_shards(store):
        h.update(layout.samples_key(shard).encode() + b"\0" + hashlib.sha256(store.get(layout.samples_key(shard)))
                 .digest())
        for r in read_samples(store, shard):
            if r.sample_id in extracted:
                ids[r.sample_id] = (np.asarray(r.input_ids, dtype=np.int64), np.asarray(r.loss_mask, dtype=np.int64))
    samples = []
    for sid in sorted(ids):
        input_ids, mask = ids[sid]
        loss = int(mask[:-1].sum()) if len(mask) else 0  # SpecForge's normalizer drops the last token's loss
        samples.append(SampleFacts(sid, row_id(sid), prompt_key(input_ids, mask), loss, len(input_ids)))
    if not samples:
        raise NoHiddenStates(f"{store.uri}: the hidden-state indexes list no sample of {layout.SAMPLES}/: "
                             "extract again with `eyrie extract SPEC`")
    return Corpus(store, target, samples, h.hexdigest(), ids)


def check_same_target(reference: Corpus, others: list[Corpus]) -> None:
    """Refuse outputs whose hidden states another model (or other layers) produced."""
    for o in others:
        if o.target.key() != reference.target.key():
            raise DifferentTargets(
                f"{o.uri}: its hidden states come from {o.target.describe()}, {reference.uri}'s from "
                f"{reference.target.describe()}: drafters of different targets cannot be compared on one "
                "held-out set; extract both outputs with the same extraction.model and layers")
