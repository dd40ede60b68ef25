"""Which hidden states EAGLE-3 needs, named in one convention shared by every backend.

Convention (recorded in the manifest): a layer id `i` is an index into Hugging Face
`output_hidden_states`, i.e. the residual stream entering decoder layer `i` (0 would be the
embeddings; ids must lie in 1..L-1). This is exactly what SGLang captures for `layers_to_capture`
(`hidden_states + residual` before layer `i` runs), and what SpecForge reads as
`hidden_states[aux_hidden_states_layers[k] + 1]` (its own ids are ours minus one).

`auto` follows the EAGLE-3 default that SGLang's `set_eagle3_layers_to_capture(None)` and
SpecForge's offline generation use for every family they support (Llama, Qwen, DeepSeek/Kimi,
GPT-OSS, ...): the inputs of layers 2, L//2 and L-3 (low, middle, high). Models too shallow for
those to be distinct (L < 7, e.g. the tiny test models) use 1, L//2, L-1 instead.

`last_hidden` is the final hidden state after the model's last norm, what the LM head consumes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from typing import Any, Literal

from eyrie.jobs.errors import EyrieError

EAGLE3_CONVENTION = (
    "eagle3: aux = inputs of decoder layers {ids} (HF output_hidden_states indices; SGLang "
    "layers_to_capture; SpecForge aux_hidden_states_layers + 1), default 2, L//2, L-3; "
    "last_hidden = final hidden state after the last norm"
)
SHALLOW_CONVENTION = (
    "eagle3-shallow: aux = inputs of decoder layers {ids} (HF output_hidden_states indices), "
    "1, L//2, L-1 because L < 7 makes 2, L//2, L-3 collide; last_hidden = after the last norm"
)
SPECFORGE_CONVENTION = (
    "specforge: aux = inputs of decoder layers {ids} (HF output_hidden_states indices) = SpecForge "
    "eagle_aux_hidden_state_layer_ids {sf} + 1, from the draft config {uri}; "
    "last_hidden = final hidden state after the last norm"
)
SPECFORGE_PREFIX = "specforge:"
SPECFORGE_AUX_LAYERS = 3  # SpecForge's EAGLE-3 draft takes exactly 3 x H (`resolve_eagle_capture_layers`)
EXPLICIT_CONVENTION = (
    "explicit: aux = inputs of decoder layers {ids} (HF output_hidden_states indices); "
    "last_hidden = final hidden state after the last norm"
)

# config keys that say nothing about the weights' meaning (they differ between images/tools)
_VOLATILE_CONFIG_KEYS = {"transformers_version", "_name_or_path", "_commit_hash", "torch_dtype", "dtype",
                         "_attn_implementation_autoset", "_attn_implementation"}
_CONTEXT_KEYS = ("max_position_embeddings", "max_sequence_length", "n_positions", "seq_length")


class LayerError(EyrieError, ValueError):
    """`extraction.layers` cannot be used with this model; the message names the layer id."""


@dataclass(frozen=True)
class ModelFacts:
    """What extraction needs to know about the target model, read from its config alone."""

    model_type: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    max_context: int | None
    config_sha256: str


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def config_sha256(config: Any) -> str:
    """Hash of the model config without tool-version fields, so both backends agree."""
    d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    clean = {k: v for k, v in d.items() if k not in _VOLATILE_CONFIG_KEYS}
    return hashlib.sha256(json.dumps(clean, sort_keys=True, default=str).encode()).hexdigest()


def model_facts(config: Any) -> ModelFacts:
    """Layers, width, vocabulary and context of a transformers config (text part of multimodal ones)."""
    text = _text_config(config)
    needed = ("num_hidden_layers", "hidden_size", "vocab_size")
    missing = [k for k in needed if getattr(text, k, None) is None]
    if missing:
        raise LayerError(f"model config ({getattr(config, 'model_type', '?')}) lacks {', '.join(missing)}")
    context = next((int(v) for k in _CONTEXT_KEYS if (v := getattr(text, k, None))), None)
    return ModelFacts(
        model_type=str(getattr(config, "model_type", "") or ""),
        num_layers=int(text.num_hidden_layers),
        hidden_size=int(text.hidden_size),
        vocab_size=int(text.vocab_size),
        max_context=context,
        config_sha256=config_sha256(config),
    )


@dataclass(frozen=True)
class LayerChoice:
    ids: tuple[int, ...]
    convention: str


def specforge_layer_ids(config: Any, where: str) -> list[int]:
    """The HF indices a SpecForge draft config asks for: its `eagle_aux_hidden_state_layer_ids`
    (under `eagle_config`, or at the top level) plus one, SpecForge's ids being HF indices - 1."""
    if not isinstance(config, dict):
        raise LayerError(f"extraction.layers: {where} is not a JSON object (a SpecForge draft config)")
    nested = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    ids = nested.get("eagle_aux_hidden_state_layer_ids", config.get("eagle_aux_hidden_state_layer_ids"))
    if ids is None:
        raise LayerError(f"extraction.layers: {where} has no eagle_config.eagle_aux_hidden_state_layer_ids "
                         "(SpecForge would derive the layers from the target model: use `auto` then)")
    if (not isinstance(ids, list) or len(ids) != SPECFORGE_AUX_LAYERS
            or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids)):
        raise LayerError(f"extraction.layers: {where}: eagle_aux_hidden_state_layer_ids must be "
                         f"{SPECFORGE_AUX_LAYERS} non-negative integers, got {ids!r}")
    return [i + 1 for i in ids]


def read_specforge_config(layers: Any, endpoint: str | None = None) -> Any:
    """The draft config `extraction.layers: specforge:URI` names (None for other settings), read
    before anything is paid for (preflight) and again by each extraction pod."""
    if not (isinstance(layers, str) and layers.startswith(SPECFORGE_PREFIX)):
        return None
    from eyrie.jobs.store import StoreError, read_uri

    uri = layers.removeprefix(SPECFORGE_PREFIX)
    try:
        return json.loads(read_uri(uri, endpoint))
    except (StoreError, OSError) as e:
        raise LayerError(f"extraction.layers: cannot read the SpecForge draft config {uri}: {e}") from None
    except ValueError as e:
        raise LayerError(f"extraction.layers: {uri} is not JSON: {e}") from None


def resolve_layers(layers: Literal["auto"] | list[int] | str, num_layers: int,
                   specforge_config: Any = None) -> LayerChoice:
    """`auto` -> the EAGLE-3 default for this depth; explicit ids are checked, never reordered;
    `specforge:URI` -> the ids of that draft config (`specforge_config`, read by the caller), +1."""
    if isinstance(layers, str) and layers.startswith(SPECFORGE_PREFIX):
        uri = layers.removeprefix(SPECFORGE_PREFIX)
        ids = specforge_layer_ids(specforge_config, uri)
        explicit = resolve_layers(ids, num_layers)
        return LayerChoice(explicit.ids, SPECFORGE_CONVENTION.format(
            ids=", ".join(map(str, ids)), sf=[i - 1 for i in ids], uri=uri))
    if layers == "auto":
        if num_layers < 4:
            raise LayerError(
                f"extraction.layers: auto needs a model with at least 4 decoder layers, this one has "
                f"{num_layers}; give explicit ids in 1..{num_layers - 1}")
        ids = [2, num_layers // 2, num_layers - 3]
        template = EAGLE3_CONVENTION
        if len(set(ids)) < 3 or num_layers < 7:
            ids, template = [1, num_layers // 2, num_layers - 1], SHALLOW_CONVENTION
        return LayerChoice(tuple(ids), template.format(ids=", ".join(map(str, ids))))
    ids = list(layers)
    if not ids:
        raise LayerError("extraction.layers: give at least one layer id (or auto)")
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= num_layers - 1:
            raise LayerError(
                f"extraction.layers: layer id {i!r} is out of range for a model with {num_layers} "
                f"decoder layers (valid: 1..{num_layers - 1}, the input of decoder layer i)")
    for a, b in itertools.pairwise(ids):
        if b <= a:
            raise LayerError(
                f"extraction.layers: layer id {b} follows {a}; ids must be strictly increasing "
                "(engines capture in layer order)")
    return LayerChoice(tuple(ids), EXPLICIT_CONVENTION.format(ids=", ".join(map(str, ids))))


def num_aux_layers(layers: Literal["auto"] | list[int] | str) -> int:
    """How many aux layers a spec's `extraction.layers` captures, without knowing the model."""
    return 3 if isinstance(layers, str) else len(layers)


ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8": 1}  # extraction.dtype -> bytes per value
SCALE_BYTES = 4  # float8: one float32 scale per token per layer


def hidden_bytes_per_token(aux_layers: int, hidden: int, dtype: str) -> int:
    """What one token's stored hidden states take: (aux + 1) x H values, plus one scale per layer for
    float8 (codec.Layout stores exactly this; torch-free, for the generation job's projection)."""
    n = (aux_layers + 1) * hidden * ELEMENT_BYTES[dtype]
    return n + (aux_layers + 1) * SCALE_BYTES if dtype == "float8" else n


ENGINE_BATCH_TOKENS = 16384
"""Tokens per batch of the SGLang backend (and its /dev/shm spool) when `extraction.maxTokensPerBatch`
is not set; the transformers backend sizes its own from the model and the device (`batching.py`)."""


def spool_bytes(tokens: int, num_aux: int, hidden: int, elem_bytes: int) -> int:
    """Bytes the sglang backend spools for `tokens` positions: aux (num_aux x H) and last (H) each.

    SGLang's `generate()` returns only after the whole batch, so a batch is spooled in full before
    eyrie reads it; the extraction Job's /dev/shm and the backend's start-up check both use this.
    """
    return tokens * (num_aux + 1) * hidden * elem_bytes

