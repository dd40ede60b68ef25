"""Export to the per-sample layout SpecForge's offline EAGLE-3 training reads, unchanged.

SpecForge (`scripts/prepare_hidden_states.py` writes; `OfflineEagle3Dataset` and the offline manifest
reader read) expects one `torch.load(..., mmap=True)`-able dict per sample, in `.ckpt` files found
recursively under a folder (`rows_{start}-{end}/data_{i}.ckpt`, 5000 per folder), with keys
`input_ids` [T] int64, `loss_mask` [T] int64, `hidden_state` [1, T, H] (the last hidden state, after
the final norm: its training target) and `aux_hidden_state` [1, T, 3H] (the three auxiliary layers).

What SpecForge does not check and would fail on later, or train wrongly with, is refused or fixed here:
- SpecForge never casts and its target head is bfloat16: every stored dtype (float32, float16,
  float8 with its scales) is written as bfloat16;
- its EAGLE-3 draft takes exactly 3 x H: any other aux layer count is refused before a file is written;
- it picks up every `.ckpt` under the folder: an export into a non-empty folder is refused unless
  `overwrite`, which first removes what an earlier export wrote (and refuses files eyrie did not write);
- it cuts samples to its `max_len` silently: `max_length` counts them, and `truncate` cuts them here,
  the loss mask alike, so the cut is a decision the user saw.
`sample_ids.jsonl` maps each data_{i} (and its file) back to its eyrie sample id; `eyrie_export.json`
records the layers in both conventions (HF `output_hidden_states` indices, and SpecForge's = HF - 1).
Only samples in the shard index are exported: one excluded for low fidelity stays in its part, unread.

Beside the features, what SpecForge 0.2.0's offline trainer (`specforge train -c CONFIG` with
`data.hidden_states_path`) asks for: `draft-config.json`, an EAGLE-3 draft of the target's shape (the
config SpecForge generates from the target when `model.draft_model_config` is unset: the target's
architecture fields, one `LlamaForCausalLMEagle3` layer, a draft vocabulary of at most 32,000, plus
`eagle_config.eagle_aux_hidden_state_layer_ids`: the layers these features hold, for serving), and
`specforge-offline.yaml`, the run config naming the folder, the target and that draft. Its vocabulary
mapping needs no data file: SpecForge 0.2.0 counts the loss tokens of the features themselves.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from eyrie.jobs.contract.layers import SPECFORGE_AUX_LAYERS
from eyrie.jobs.errors import EyrieError
from eyrie.jobs.extract.codec import decode
from eyrie.jobs.extract.run import is_builtin_folder
from eyrie.jobs.extract.shards import ShardError, layout_of, list_indexes, load_index, parse_header
from eyrie.jobs.store import NotFound, Store

ROWS_PER_FOLDER = 5000
METADATA = "eyrie_export.json"
SAMPLE_IDS = "sample_ids.jsonl"
DRAFT_CONFIG = "draft-config.json"
RUN_CONFIG = "specforge-offline.yaml"
EXPORT_DTYPE = torch.bfloat16
TARGET_MODEL = "target-model"  # a builtin demo target, copied into the export (it exists nowhere else)
_OURS = re.compile(r"^(rows_\d+-\d+|sample_ids\.jsonl|eyrie_export\.json|\.sample_ids\.jsonl\.tmp|"
                   r"draft-config\.json|specforge-offline\.yaml|target-model)$")
SPECFORGE_VERSION = "0.2.0"  # the release whose data code the exports are checked against
# Where SpecForge trains: its own environment, with its own pins (torch, transformers, sglang)
TRAIN_INSTALL = f"python -m venv ~/specforge-env && ~/specforge-env/bin/pip install specforge=={SPECFORGE_VERSION}"
# Beside eyrie, for the exports' checks: SpecForge's data code only, without its pins (--no-deps)
CHECK_INSTALL = f"pip install 'eyrie[specforge]' && pip install --no-deps specforge=={SPECFORGE_VERSION}"
RUN_FROM_HERE = ("Paths are relative to this folder: run specforge train from it (cd into it), in SpecForge's own "
                 f"environment\n({TRAIN_INSTALL}; docs/operating.md, Train a drafter with SpecForge).")
# What SpecForge copies from the target's (text) config into the EAGLE-3 draft it generates
# (specforge/training/model_loading.py `_TARGET_ARCHITECTURE_FIELDS`), and its EAGLE-3 defaults.
DRAFT_FIELDS = ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                "max_position_embeddings", "rms_norm_eps", "hidden_act", "initializer_range", "attention_bias",
                "attention_dropout", "head_dim", "rope_theta", "rope_scaling", "bos_token_id", "eos_token_id",
                "pad_token_id", "sliding_window", "use_sliding_window", "max_window_layers")
DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle3"
DRAFT_VOCAB = 32000


class ExportError(EyrieError, RuntimeError):
    """The export cannot be written as SpecForge needs it; the message says what to change."""


@dataclass(frozen=True)
class ExportOptions:
    overwrite: bool = False
    max_length: int | None = None  # the trainer's max_len: samples longer are counted (and cut with truncate)
    truncate: bool = False
    model: str | None = None  # the target model (its config.json) for the draft config; None: the extracted one
    trust_remote_code: bool = False


@dataclass
class ExportResult:
    samples: int
    over_max_length: int  # samples longer than max_length (cut when truncate)
    stored_dtype: str
    aux_layers: list[int]
    longest: int = 0
    draft_config: str | None = None  # draft-config.json when the target's config could be read
    draft_error: str | None = None  # else why not
    target_model_path: str | None = None  # as the run config names it (portable_target)
    output_dir: str | None = None  # where training writes, relative to the folder (train_output_dir)


def _compact(t: torch.Tensor) -> torch.Tensor:
    """A tensor that owns exactly its bytes: torch.save writes a view's whole storage otherwise."""
    t = t.contiguous()
    return t if t.untyped_storage().nbytes() == t.numel() * t.element_size() else t.clone()


def _save_atomic(obj: dict[str, torch.Tensor], path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def prepare_dir(out: Path, overwrite: bool, ours: Collection[str] | None = None) -> None:
    """An empty folder to export into; `overwrite` removes an earlier export's files first (`ours`:
    the names that export writes; default the offline export's)."""
    out.mkdir(parents=True, exist_ok=True)
    present = sorted(p.name for p in out.iterdir())
    if not present:
        return
    if not overwrite:
        raise ExportError(f"{out} is not empty ({len(present)} entries, e.g. {present[0]}): an export writes into "
                          "a folder of its own (SpecForge trains on every .ckpt under it); choose an empty folder "
                          "or pass --overwrite")
    foreign = [n for n in present if not (n in ours if ours is not None else _OURS.match(n))]
    if foreign:
        raise ExportError(f"{out} holds files an eyrie export did not write ({', '.join(foreign[:5])}); "
                          "--overwrite removes only an earlier export: choose another folder")
    for name in present:
        p = out / name
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def _check_layers(index: dict[str, Any], key: str) -> None:
    n = int(index["auxLayerCount"])
    if n != SPECFORGE_AUX_LAYERS:
        raise ExportError(
            f"{key}: this run captured {n} aux layers {index.get('auxLayers')}; SpecForge's EAGLE-3 draft "
            f"takes exactly {SPECFORGE_AUX_LAYERS} (aux_hidden_state is 3 x hidden): extract again with "
            "extraction.layers auto, 3 layer ids, or specforge:<draft config>")


def _metadata(store: Store, index: dict[str, Any], result: ExportResult, opts: ExportOptions) -> dict[str, Any]:
    hf = list(index.get("auxLayers") or [])
    return {
        "format": "specforge-offline-eagle3",
        "source": store.uri,
        "samples": result.samples,
        "keys": {"input_ids": "int64 [T]", "loss_mask": "int64 [T]", "hidden_state": "bfloat16 [1, T, H]",
                 "aux_hidden_state": "bfloat16 [1, T, 3H]"},
        "hiddenSize": int(index["hiddenSize"]),
        "storedDtype": result.stored_dtype,
        "dtype": "bfloat16",
        "auxLayers": hf,
        "specforgeAuxLayerIds": [i - 1 for i in hf],
        "layerConvention": index.get("layerConvention", ""),
        "layerNote": "auxLayers are HF output_hidden_states indices (the input of decoder layer i); SpecForge's "
                     "eagle_aux_hidden_state_layer_ids are those minus 1: set them to specforgeAuxLayerIds",
        "maxLength": opts.max_length,
        "overMaxLength": result.over_max_length,
        "truncated": result.over_max_length if opts.truncate else 0,
        "draftConfig": DRAFT_CONFIG if result.draft_config else None,
        "draftConfigError": result.draft_error,
        "runConfig": RUN_CONFIG,
    }


def export_specforge(store: Store, out_dir: str | Path, opts: ExportOptions = ExportOptions()) -> ExportResult:
    """Write every extracted sample as SpecForge `.ckpt` files."""
    if opts.truncate and not opts.max_length:
        raise ExportError("--truncate needs --max-length N (the trainer's max_len)")
    indexes = list_indexes(store)
    if not indexes:
        raise ShardError(f"{store.url('hidden')}: no hidden states to export (no shard index files)")
    loaded = [(key, load_index(store, key)) for _shard, key in indexes]
    for key, idx in loaded:  # refuse before a single file is written
        _check_layers(idx, store.url(key))
    out = Path(out_dir)
    prepare_dir(out, opts.overwrite)
    result = ExportResult(0, 0, loaded[0][1]["dtype"], list(loaded[0][1].get("auxLayers") or []))
    with (out / ".sample_ids.jsonl.tmp").open("w") as ids_file:
        for key, idx in loaded:
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
                    ids, mask = cols["input_ids"], cols["loss_mask"]
                    if opts.max_length and len(ids) > opts.max_length:
                        result.over_max_length += 1
                        if opts.truncate:
                            n = opts.max_length
                            ids, mask, aux, last = ids[:n], mask[:n], aux[:n], last[:n]
                    n = result.samples
                    start = (n // ROWS_PER_FOLDER) * ROWS_PER_FOLDER
                    folder = out / f"rows_{start}-{start + ROWS_PER_FOLDER}"
                    folder.mkdir(exist_ok=True)
                    path = folder / f"data_{n}.ckpt"
                    _save_atomic({
                        "input_ids": _compact(ids.to(torch.long)),
                        "loss_mask": _compact(mask.to(torch.long)),
                        "hidden_state": _compact(last.to(EXPORT_DTYPE).unsqueeze(0)),
                        "aux_hidden_state": _compact(aux.to(EXPORT_DTYPE).unsqueeze(0)),
                    }, path)
                    ids_file.write(json.dumps({"index": n, "file": str(path.relative_to(out)), "sampleId": sid})
                                   + "\n")
                    result.samples += 1
                    result.longest = max(result.longest, len(ids))
                left_out = {s["sampleId"] for s in idx["skipped"]}
                if not listed <= set(sids) or not set(sids) - listed <= left_out:
                    raise ShardError(f"{store.url(part)}: its samples differ from {store.url(key)}")
    os.replace(out / ".sample_ids.jsonl.tmp", out / SAMPLE_IDS)
    _training_files(out, loaded[0][1], result, opts)
    (out / METADATA).write_text(json.dumps(_metadata(store, loaded[0][1], result, opts), indent=1) + "\n")
    return result


def draft_config(model_config: Any, aux_layers: list[int] | None) -> dict[str, Any]:
    """The EAGLE-3 draft config SpecForge generates for a target (`model.draft_model_config` unset), with
    `eagle_config` naming the aux layers the features hold (SpecForge's ids: HF indices - 1), so a
    server capturing with this draft takes the same layers (None: no features, SpecForge's own choice);
    the draft vocabulary never exceeds the target's."""
    get = getattr(model_config, "get_text_config", None)
    text = get() if callable(get) else model_config
    doc: dict[str, Any] = {}
    for name in DRAFT_FIELDS:
        v = getattr(text, name, None)
        if v is not None:
            doc[name] = str(v).replace("torch.", "") if type(v).__module__ == "torch" else v
    if "vocab_size" not in doc or "hidden_size" not in doc:
        raise ExportError("the target's config has no vocab_size/hidden_size: no draft config can be derived")
    doc["vocab_size"] = int(getattr(text, "padded_vocab_size", None) or doc["vocab_size"])  # as SpecForge counts it
    doc.update({"architectures": [DRAFT_ARCHITECTURE], "model_type": "llama", "num_hidden_layers": 1,
                "tie_word_embeddings": False, "use_cache": True,
                "draft_vocab_size": min(DRAFT_VOCAB, doc["vocab_size"])})
    if aux_layers is not None:
        doc["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in aux_layers]}
    doc.setdefault("pad_token_id", 0)
    return doc


def install_hint(why: str) -> str:
    """The command that fixes SpecForge's data code not importing beside eyrie (`why`: the import error):
    SpecForge itself (without its pins), or the modules its data code imports (eyrie[specforge])."""
    if "No module named 'specforge" in why or "'specforge' is not a package" in why:
        first = (f"SpecForge is not installed here: `pip install --no-deps specforge=={SPECFORGE_VERSION}` (--no-deps: "
                 "its pins, torch and sglang, are for training, in SpecForge's own environment)")
    else:
        first = "a module SpecForge's data code imports is missing here: `pip install 'eyrie[specforge]'` installs them"
    return f"{first}; both at once: `{CHECK_INSTALL}`"


def portable_target(model: str, out: Path) -> str:
    """The target as a run config names it (`model.target_model_path`), for SpecForge's environment, run
    from the export folder: a builtin demo model (which exists only where eyrie is installed) is copied
    into the folder and named `target-model`; a local folder, relative to the export folder; a model
    id as it is."""
    if is_builtin_folder(model):
        dest = out / TARGET_MODEL
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(model, dest)
        return TARGET_MODEL
    p = Path(model).expanduser()
    if p.is_dir():
        return os.path.relpath(p.resolve(), out.resolve())
    return model


def train_output_dir(out: Path) -> str:
    """Where SpecForge writes checkpoints, relative to the export folder (where it is run from): a
    sibling `<folder>-train`, so a later `export --overwrite` finds the folder holding only the export
    (SpecForge's default `./output` would be inside it)."""
    return f"../{out.resolve().name}-train"


def _training_files(out: Path, index: dict[str, Any], result: ExportResult, opts: ExportOptions) -> None:
    """draft-config.json (when the target's config can be read) and specforge-offline.yaml."""
    import yaml
    from transformers import AutoConfig

    model = opts.model or index.get("model")
    try:
        if not model:
            raise ExportError("the shard index names no model: pass --model")
        config = AutoConfig.from_pretrained(str(model), trust_remote_code=opts.trust_remote_code)
        doc = draft_config(config, result.aux_layers)
        (out / DRAFT_CONFIG).write_text(json.dumps(doc, indent=1) + "\n")
        result.draft_config = str((out / DRAFT_CONFIG).resolve())
    except Exception as e:  # the features are written and valid; only the convenience is missing
        result.draft_error = f"{type(e).__name__}: {e}"
    target = portable_target(str(model), out) if model else "<the target model>"
    result.target_model_path = target
    run = {"model": {"target_model_path": target,
                     **({"draft_model_config": DRAFT_CONFIG} if result.draft_config else {})},
           "data": {"hidden_states_path": ".", "max_length": opts.max_length or result.longest},
           "training": {"strategy": "eagle3"},
           "output_dir": train_output_dir(out)}
    result.output_dir = run["output_dir"]
    head = (f"SpecForge {SPECFORGE_VERSION} run config for offline EAGLE-3 training on this export: specforge train -c "
            f"{RUN_CONFIG}\n(add training.* settings; the vocab mapping is counted from the features' loss tokens; "
            f"checkpoints go to output_dir, beside this folder, never into it).\n{RUN_FROM_HERE}\n")
    (out / RUN_CONFIG).write_text("".join(f"# {x}\n" for x in head.splitlines()) + yaml.safe_dump(run, sort_keys=False))
