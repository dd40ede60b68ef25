"""What a spec's extraction will store per token, known before extraction runs: the canary multiplies
it by the projected tokens (generate/budget/forecast.py), so the bytes show beside the dollars."""

from __future__ import annotations

from typing import Any

from eyrie.jobs.contract.layers import hidden_bytes_per_token, model_facts, num_aux_layers


def stored_bytes_per_token(spec: Any) -> int | None:
    """The bytes per token the spec's extraction will store, from the model's config alone (no
    weights): what the canary multiplies by the projected tokens. None when extraction is off or the
    config cannot be read here (an s3:// model, a hub id offline, a generation image without torch for
    a builtin model): the projection is then left out, nothing else changes."""
    ex = spec.extraction
    path = ex.model or spec.target.tokenizer
    if not ex.enabled or not path or path.startswith("s3://"):
        return None
    try:
        if path.startswith("builtin:"):
            from eyrie.jobs.extract.run import model_path  # builds the builtin model once (torch)

            path = model_path(spec)
        from transformers import AutoConfig

        facts = model_facts(AutoConfig.from_pretrained(path, trust_remote_code=ex.trust_remote_code))
    except Exception:
        return None
    return hidden_bytes_per_token(num_aux_layers(ex.layers), facts.hidden_size, ex.dtype)
