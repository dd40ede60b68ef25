"""The extraction stage: samples/shard-N.parquet -> hidden/shard-N-*.safetensors + index, per pod.

Work is split by input shard (`shard % count == index`), so pods never share a shard. Within a
shard, parts are planned from token counts alone; a part already in the store is verified and
kept, and the shard's index is written last, so a killed run resumes where it stopped and a
finished shard is skipped. Samples that cannot run (too long for the model, ids outside its
vocabulary, empty, mismatched mask, duplicate id) are skipped with a reason, never dropped silently.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eyrie.jobs.contract.extraction import ExtractionError, ExtractionSummary, ShardResult, summarize
from eyrie.jobs.contract.fidelity import dump_groups
from eyrie.jobs.contract.layers import (
    ENGINE_BATCH_TOKENS,
    LayerChoice,
    ModelFacts,
    read_specforge_config,
    resolve_layers,
)
from eyrie.jobs.contract.layout import (
    SAMPLES,
    fidelity_key,
    parse_samples_key,
    samples_key,
    summary_key,
    turn_sample_key,
)
from eyrie.jobs.extract import codec
from eyrie.jobs.extract.batching import plan_batches
from eyrie.jobs.extract.fidelity import (
    Forward,
    apply_floor,
    decode_rows,
    encode_rows,
    fidelity_parquet,
    fidelity_row,
    floor_agreement,
    score_start,
    tally_rows,
)
from eyrie.jobs.extract.shards import (
    ShardError,
    encode_index,
    index_key,
    load_index,
    part_entries,
    part_key,
    plan_parts,
    read_header,
)
from eyrie.jobs.extract.staging import HostStaging, StatePipeline, Stats
from eyrie.jobs.store import NotFound, Store

log = logging.getLogger("eyrie.extract")



class VocabMismatch(ExtractionError):
    """The model's vocabulary does not cover the tokenizer's ids (wrong extraction.model?)."""


class Backend(Protocol):
    """What the stage needs of a backend. `packs`: whether a batch of mixed lengths costs only its real
    tokens (packed, or the engine's own scheduling), so the plan counts those against the budget;
    otherwise a batch costs its padded width."""

    name: str
    facts: ModelFacts
    packs: bool

    def forward(self, batch: Sequence[Sequence[int]], layer_ids: Sequence[int],
                score_from: Sequence[int | None] | None = None) -> list[Forward]: ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------------- pure logic


def assign_shards(shards: Sequence[int], index: int, count: int) -> list[int]:
    """This pod's input shards: every shard goes to exactly one of `count` pods, by its number."""
    if count < 1 or not 0 <= index < count:
        raise ExtractionError(f"--index {index} --count {count}: need 0 <= index < count")
    return sorted(s for s in shards if s % count == index)


@dataclass
class SampleRow:
    sample_id: str
    input_ids: np.ndarray
    loss_mask: np.ndarray
    source: str = ""
    provider: str | None = None
    segments: list[int] | None = None  # where reasoning, content, tool calls start (absent in older files)


@dataclass
class Skip:
    sample_id: str
    reason: str
    detail: str

    def dump(self) -> dict[str, str]:
        return {"sampleId": self.sample_id, "reason": self.reason, "detail": self.detail}


def screen(rows: Sequence[SampleRow], facts: ModelFacts) -> tuple[list[SampleRow], list[Skip]]:
    """Split rows into those the model can run and those skipped with a reason."""
    ok: list[SampleRow] = []
    skipped: list[Skip] = []
    seen: set[str] = set()
    for r in rows:
        n = len(r.input_ids)
        if r.sample_id in seen:
            skipped.append(Skip(r.sample_id, "duplicate", "sample id appears earlier in this shard"))
            continue
        seen.add(r.sample_id)
        if n == 0:
            skipped.append(Skip(r.sample_id, "empty", "no tokens"))
        elif len(r.loss_mask) != n:
            skipped.append(Skip(r.sample_id, "mask_length_mismatch",
                                f"{n} input ids but {len(r.loss_mask)} loss-mask values"))
        elif facts.max_context is not None and n > facts.max_context:
            skipped.append(Skip(r.sample_id, "too_long", f"{n} tokens > model context {facts.max_context}"))
        elif (hi := int(r.input_ids.max())) >= facts.vocab_size or int(r.input_ids.min()) < 0:
            bad = hi if hi >= facts.vocab_size else int(r.input_ids.min())
            skipped.append(Skip(r.sample_id, "token_out_of_vocab",
                                f"token id {bad} outside the model's vocabulary of {facts.vocab_size}"))
        else:
            ok.append(r)
    return ok, skipped


def read_samples(store: Store, shard: int) -> list[SampleRow]:
    """Rows of samples/shard-N.parquet, ids and masks as numpy views (no per-token Python objects)."""
    key = samples_key(shard)
    try:
        data = store.get(key)
    except NotFound:
        raise ShardError(f"{store.url(key)}: samples shard is missing") from None
    try:
        pf = pq.ParquetFile(io.BytesIO(data))
        turned = "turn" in pf.schema_arrow.names  # one sample per turn: keyed by (id, turn)
        optional = [c for c in ("turn", "source", "provider", "segments") if c in pf.schema_arrow.names]
        table = pf.read(columns=["sample_id", "input_ids", "loss_mask", *optional])
    except (pa.ArrowException, OSError, KeyError) as e:
        raise ShardError(f"{store.url(key)}: not a samples parquet file "
                         f"(sample_id, input_ids, loss_mask): {e}") from None
    sids = table.column("sample_id").to_pylist()
    if turned:
        sids = [turn_sample_key(s, t or 0) for s, t in zip(sids, table.column("turn").to_pylist(), strict=True)]
    n = len(sids)
    sources = table.column("source").to_pylist() if "source" in optional else [""] * n
    providers = table.column("provider").to_pylist() if "provider" in optional else [None] * n
    segments = table.column("segments").to_pylist() if "segments" in optional else [None] * n

    def flat(name: str, dtype: type) -> tuple[np.ndarray, np.ndarray]:
        col = table.column(name).combine_chunks()
        return col.offsets.to_numpy(), col.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)

    id_off, ids = flat("input_ids", np.int64)
    mask_off, masks = flat("loss_mask", np.int8)
    return [SampleRow(str(sid), ids[id_off[i]:id_off[i + 1]], masks[mask_off[i]:mask_off[i + 1]],
                      str(sources[i] or ""), providers[i], segments[i])
            for i, sid in enumerate(sids)]


def list_sample_shards(store: Store) -> list[int]:
    return sorted(s for key in store.list(SAMPLES) if (s := parse_samples_key(key)) is not None)



# ------------------------------------------------------------------------------------ the stage


@dataclass
class Plan:
    layers: LayerChoice
    layout: codec.Layout
    meta: dict[str, Any]
    score: bool = False  # extraction.fidelity.enabled
    floor: float | None = None
    on_low: str = "flag"


def _check_compatible(found: dict[str, Any], meta: dict[str, Any], what: str) -> None:
    for k in ("auxLayers", "dtype", "modelConfigSha256"):
        have = found.get(k)
        if isinstance(have, str) and k == "auxLayers":
            have = json.loads(have)
        if have != meta[k]:
            raise ExtractionError(
                f"{what} was written with {k}={have!r}, this run has {meta[k]!r}; delete the hidden/ "
                "files of this run (or write to another output) to extract with the new settings")


def extract_shard(store: Store, shard: int, backend: Backend, plan: Plan, shard_bytes: int,
                  max_tokens: int, on_part: Callable[[str], None] | None = None,
                  stats: Stats | None = None, staging: HostStaging | None = None) -> ShardResult:
    """Extract one input shard (resuming finished parts); returns its result once the index is written.

    The forwards run on this thread; copies, encoding and writes overlap them (`staging.StatePipeline`,
    its memory bounded as its module says; `staging`: the run's pinned buffers, reused across shards).
    `stats`: where the time went, for benchmarks."""
    ikey = index_key(shard)
    if store.exists(ikey):
        doc = load_index(store, ikey)
        _check_compatible(doc, plan.meta, store.url(ikey))
        log.info("shard %d already extracted (%s); skipping", shard, store.url(ikey))
        return ShardResult.from_index(doc, ikey, resumed=True)

    rows = read_samples(store, shard)
    ok, skipped = screen(rows, backend.facts)
    oov = [s for s in skipped if s.reason == "token_out_of_vocab"]
    if oov and len(oov) * 2 > len(rows):
        raise VocabMismatch(
            f"{store.url(samples_key(shard))}: {len(oov)} of {len(rows)} samples use token ids "
            f"outside the model's vocabulary of {backend.facts.vocab_size} (e.g. sample {oov[0].sample_id}: "
            f"{oov[0].detail}); extraction.model does not match target.tokenizer")
    layout = plan.layout
    parts = plan_parts([len(r.input_ids) for r in ok], layout.bytes_per_token, shard_bytes)
    part_meta = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in plan.meta.items()}
    written: dict[int, tuple[str, int, dict[str, list[int]]]] = {}  # file no -> key, bytes, index rows
    scored: list[dict[str, Any]] = []
    pipe = StatePipeline(store, layout, stats=stats, staging=staging)

    def collect(done: list[tuple[str, int, int, dict[str, list[int]]]]) -> None:
        for key, file_no, size, rows in done:
            written[file_no] = (key, size, rows)
            if on_part:
                on_part(key)

    try:
        for file_no, members in enumerate(parts):
            key = part_key(shard, file_no)
            sids = [ok[i].sample_id for i in members]
            header = None
            if store.exists(key):
                header, start = read_header(store, key)
                if plan.score and "fidelity" not in header["__metadata__"]:
                    log.info("%s has no fidelity scores; computing it again", store.url(key))
                    header = None
            if header is not None:
                _check_compatible(header["__metadata__"], plan.meta, store.url(key))
                if json.loads(header["__metadata__"]["sample_ids"]) != sids:
                    raise ShardError(
                        f"{store.url(key)}: holds other samples than this run plans (did "
                        f"{samples_key(shard)} change?); delete "
                        f"{layout.HIDDEN}/shard-{shard:05d}-* to extract the shard again")
                size = store.size(key)
                written[file_no] = (key, size, part_entries(header, start, file_no, layout, size, store.url(key)))
                if plan.score:
                    scored += decode_rows(header["__metadata__"]["fidelity"])
                log.info("kept %s from an earlier run", store.url(key))
                continue
            pipe.start_part(key, file_no, len(members))
            rows = _compute_part([ok[i] for i in members], backend, plan, max_tokens, shard, pipe)
            pipe.finish_part({**part_meta, "fidelity": encode_rows(rows)} if plan.score else part_meta)
            scored += rows
            collect(pipe.finished())
        collect(pipe.close())
    finally:
        pipe.shutdown()
    files = [written[n][:2] for n in sorted(written)]
    entries = {sid: row for n in sorted(written) for sid, row in written[n][2].items()}
    doc_meta = dict(plan.meta)
    if plan.score:
        skipped += _apply_fidelity(store, shard, scored, entries, plan)
        doc_meta["fidelity"] = dump_groups(tally_rows(scored))
    store.put(ikey, encode_index(shard, files, entries, [s.dump() for s in skipped], layout, doc_meta))
    log.info("shard %d done: %d samples, %d skipped", shard, len(entries), len(skipped))
    return ShardResult.from_index(json.loads(store.get(ikey)), ikey, resumed=False)


def _apply_fidelity(store: Store, shard: int, rows: list[dict[str, Any]], entries: dict[str, list[int]],
                    plan: Plan) -> list[Skip]:
    """The floor on a finished shard: mark rows, keep excluded samples out of the index (their bytes
    stay in the part, unread), write fidelity/shard-N.parquet before the index closes the shard."""
    skips = []
    for row in rows:
        apply_floor(row, plan.floor, plan.on_low)
        if row["excluded"] and entries.pop(row["sample_id"], None) is not None:
            skips.append(Skip(row["sample_id"], "low_fidelity",
                              f"top-1 agreement {floor_agreement(row):.4f} on its reasoning and content < "
                              f"extraction.fidelity.minTop1Agreement {plan.floor}"))
    store.put(fidelity_key(shard), fidelity_parquet(rows))
    return skips


def _compute_part(rows: list[SampleRow], backend: Backend, plan: Plan, max_tokens: int, shard: int,
                  pipe: StatePipeline) -> list[dict[str, Any]]:
    """Runs one part's samples, hands their states to `pipe` by position in the part, and returns their
    fidelity rows when scoring (in the part's order, whatever the batches' order)."""
    scores: list[dict[str, Any] | None] = [None] * len(rows)
    ids = list(plan.layers.ids)
    for batch in plan_batches([len(r.input_ids) for r in rows], max_tokens, backend.packs):
        members = batch.positions
        starts = [score_start(rows[i].loss_mask) if plan.score else None for i in members]
        try:
            res = backend.forward([rows[i].input_ids for i in members], ids, starts)
        except Exception as e:
            names = ", ".join(rows[i].sample_id for i in members[:3]) + (" ..." if len(members) > 3 else "")
            raise ExtractionError(f"shard {shard}: forward of samples {names} failed: "
                                  f"{type(e).__name__}: {e}") from e
        for i, f in zip(members, res, strict=True):
            r = rows[i]
            if f.aux.shape[0] != len(r.input_ids):
                raise ExtractionError(f"shard {shard}: sample {r.sample_id}: backend returned "
                                      f"{f.aux.shape[0]} positions for {len(r.input_ids)} tokens")
            if f.scores is not None:
                scores[i] = fidelity_row(r.sample_id, r.source, r.provider, r.loss_mask, r.segments, f.scores)
        pipe.add(members, [(rows[i].sample_id, rows[i].input_ids, rows[i].loss_mask) for i in members], res)
    return [s for s in scores if s is not None]


def make_plan(spec: Any, backend: Backend) -> Plan:
    ex = spec.extraction
    facts = backend.facts
    layers = resolve_layers(ex.layers, facts.num_layers, read_specforge_config(ex.layers, spec.output.endpoint))
    layout = codec.Layout(len(layers.ids), facts.hidden_size, ex.dtype)
    meta = {
        "engine": backend.name,
        "model": model_path(spec),
        "auxLayers": list(layers.ids),
        "layerConvention": layers.convention,
        "numLayers": facts.num_layers,
        "dtype": ex.dtype,
        "modelConfigSha256": facts.config_sha256,
        "generationShards": spec.generation.shards,
    }
    fid = ex.fidelity
    return Plan(layers, layout, meta, score=fid.enabled, floor=fid.min_top1_agreement, on_low=fid.on_low)


BUILTIN_TINY = "builtin:tiny-llama"
TINY_VOCAB = 163_840  # covers DeepSeek-V4 (~129k) and Kimi (163,840) token ids


def builtin_model(name: str) -> str:
    """`builtin:tiny-chat` (and its impostors): a tiny trained chat model with its own tokenizer
    (extract/tiny.py). `builtin:tiny-llama`: a random-weight 4-layer Llama over any large vocabulary,
    its hidden states and scores meaning nothing. Both built once into the cache (no download)."""
    from eyrie.jobs.cache import models_dir
    from eyrie.jobs.extract import tiny
    from eyrie.jobs.extract.hf_backend import build_tiny_model, no_progress_bars

    if name in tiny.NAMES:
        return str(tiny.model_folder(name))
    if name != BUILTIN_TINY:
        raise ExtractionError(f"extraction.model {name!r}: unknown builtin model; known: "
                              f"{', '.join((BUILTIN_TINY, *tiny.NAMES))}")
    folder = models_dir() / f"tiny-llama-{TINY_VOCAB}"
    if not (folder / "config.json").exists():
        tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
        with no_progress_bars():
            build_tiny_model(tmp, TINY_VOCAB)
        if folder.exists():  # built meanwhile by another process
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.replace(folder)
    return str(folder)


def is_builtin_folder(path: str) -> bool:
    """Whether `path` is one of the builtin models' folders (eyrie's package or its cache): a path that
    exists only where eyrie is installed, so a hand-off to another environment must carry the files."""
    from pathlib import Path

    from eyrie.jobs.cache import models_dir
    from eyrie.jobs.extract import tiny

    try:
        p = Path(path).expanduser().resolve()
    except (OSError, RuntimeError):
        return False
    roots = (Path(tiny.__file__).resolve().parent / "builtin", models_dir().expanduser().resolve())
    return p.is_dir() and any(p.is_relative_to(root) for root in roots)


def model_path(spec: Any) -> str:
    path = spec.extraction.model or spec.target.tokenizer
    if not path:
        raise ExtractionError("extraction.model: not set (nor target.tokenizer)")
    if path.startswith("builtin:"):
        return builtin_model(path)
    if path.startswith("s3://"):
        raise ExtractionError(f"extraction.model {path!r}: s3:// weights are not loaded directly; "
                              "mount them (or bake them into the image) and give the path")
    return path


def open_backend(spec: Any) -> Backend:
    ex = spec.extraction
    if ex.engine == "sglang":
        from eyrie.jobs.extract.sglang_backend import SGLangBackend

        return SGLangBackend(model_path(spec), tp_size=max(1, ex.gpus_per_pod), storage_dtype=ex.dtype,
                             trust_remote_code=ex.trust_remote_code,
                             max_tokens_per_batch=ex.max_tokens_per_batch or ENGINE_BATCH_TOKENS)
    from eyrie.jobs.extract.hf_backend import HFBackend

    return HFBackend(model_path(spec), device=ex.device, storage_dtype=ex.dtype,
                     trust_remote_code=ex.trust_remote_code, attention=ex.attention)


def token_budget(configured: int | None, backend: Backend, aux_layers: int) -> int:
    """`extraction.maxTokensPerBatch`, or the backend's default from the model and the device's memory."""
    if configured is not None:
        return configured
    default = getattr(backend, "default_max_tokens", None)
    return default(aux_layers) if callable(default) else ENGINE_BATCH_TOKENS


def run_extraction(spec: Any, store: Store, index: int = 0, count: int = 1, backend: Backend | None = None,
                   on_part: Callable[[str], None] | None = None, stats: Stats | None = None) -> ExtractionSummary:
    """Extract this pod's share of the run's sample shards; write its summary object; return it.

    `spec` is a DatasetGenerationSpec; `store` the run's output (`store.open_output(spec)`); `stats`
    collects where the time went (benchmarks).
    """
    mine = assign_shards(list_sample_shards(store), index, count)
    own = backend is None
    be = backend or open_backend(spec)
    try:
        plan = make_plan(spec, be)
        summary = ExtractionSummary(
            engine=be.name, model=plan.meta["model"], aux_layers=list(plan.layers.ids),
            layer_convention=plan.layers.convention, hidden_size=plan.layout.hidden,
            num_layers=be.facts.num_layers, dtype=plan.layout.dtype,
            model_config_sha256=be.facts.config_sha256, bytes_per_token=plan.layout.bytes_per_token,
            model_name=spec.extraction.model or spec.target.tokenizer)
        ex = spec.extraction
        budget = token_budget(ex.max_tokens_per_batch, be, len(plan.layers.ids))
        staging = HostStaging(plan.layout)
        for shard in mine:
            summary.shards.append(extract_shard(store, shard, be, plan, ex.shard_bytes, budget, on_part, stats,
                                                staging))
    finally:
        if own:
            be.close()
    store.put(summary_key(index, count), json.dumps(summary.to_manifest(), indent=1).encode())
    return summary


__all__ = ["ExtractionError", "ExtractionSummary", "ShardResult", "VocabMismatch", "assign_shards",
           "run_extraction", "summarize", "token_budget"]
