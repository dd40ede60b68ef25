"""The transformers backend: the reference every other backend is compared with (CPU or CUDA).

Only the needed layers are kept: a forward pre-hook on each chosen decoder layer takes the
residual stream entering it (identical to `output_hidden_states[i]`), and the base model's
`last_hidden_state` (after the final norm) is the last hidden state; the LM head runs only to
score the answers (`forward(..., score_from=...)`), over the completion rows in chunks
(`fidelity.lm_scores`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eyrie.jobs.contract.layers import LayerError, ModelFacts, model_facts
from eyrie.jobs.errors import EyrieError
from eyrie.jobs.extract.fidelity import Forward, lm_scores


class ModelLoadError(EyrieError, RuntimeError):
    """The extraction model cannot be loaded; the message names the path."""


def default_compute_dtype(device: str, storage: str) -> torch.dtype:
    """CPU computes in float32 (fast and exact there); CUDA in the storage precision like SGLang."""
    if not device.startswith("cuda") or storage == "float32":
        return torch.float32
    return torch.float16 if storage == "float16" else torch.bfloat16


def _layers_of(decoder: torch.nn.Module) -> torch.nn.ModuleList:
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ModelLoadError(f"{type(decoder).__name__} has no `layers` list of decoder layers")
    return layers


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' progress bars off for what runs inside (eyrie reports its own progress: no per-load
    bars in job logs), then as they were: the setting is the process's, not this library's."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


class HFBackend:
    """Loads an `AutoModelForCausalLM` and returns per-sample (aux [T, kH], last [T, H]) tensors."""

    name = "transformers"

    def __init__(self, model_path: str, *, device: str | None = None, storage_dtype: str = "bfloat16",
                 trust_remote_code: bool = False, compute_dtype: torch.dtype | None = None):
        from transformers import AutoConfig, AutoModelForCausalLM

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = compute_dtype or default_compute_dtype(self.device, storage_dtype)
        try:
            with no_progress_bars():
                config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
                self.facts: ModelFacts = model_facts(config)
                model = AutoModelForCausalLM.from_pretrained(
                    model_path, config=config, dtype=dtype, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"extraction.model {model_path!r} cannot be loaded: {e}") from None
        self.model = model.to(self.device).eval()
        self.decoder = self.model.base_model
        self.layers = _layers_of(self.decoder)
        self.compute_dtype = dtype

    def hidden_states(self, batch: Sequence[Sequence[int]], layer_ids: Sequence[int]
                      ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(aux, last) per sample, without scores."""
        return [(f.aux, f.last) for f in self.forward(batch, layer_ids)]

    @torch.inference_mode()
    def forward(self, batch: Sequence[Sequence[int]], layer_ids: Sequence[int],
                score_from: Sequence[int | None] | None = None) -> list[Forward]:
        """Right-padded forward of a batch; tensors stay on the model's device. `score_from[b]`: score
        sample b's tokens from that position on with the LM head (None: not at all)."""
        if not batch:
            return []
        for i in layer_ids:
            if not 0 <= i < len(self.layers):
                raise LayerError(f"layer id {i} is out of range for a model with {len(self.layers)} layers")
        lengths = [len(x) for x in batch]
        width = max(lengths)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for b, x in enumerate(batch):
            ids[b, : len(x)] = torch.as_tensor(np.asarray(x, dtype=np.int64))
            mask[b, : len(x)] = 1
        padded = min(lengths) != width
        captured: dict[int, torch.Tensor] = {}

        def grab(i: int):
            def hook(_mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                captured[i] = args[0] if args else kwargs["hidden_states"]
            return hook

        handles = [self.layers[i].register_forward_pre_hook(grab(i), with_kwargs=True) for i in layer_ids]
        try:
            out = self.decoder(input_ids=ids.to(self.device),
                               attention_mask=mask.to(self.device) if padded else None, use_cache=False)
        finally:
            for h in handles:
                h.remove()
        last = out.last_hidden_state
        aux = torch.cat([captured[i] for i in layer_ids], dim=-1)
        starts = list(score_from) if score_from is not None else [None] * len(batch)
        head = self.model.get_output_embeddings()
        softcap = getattr(self.model.config, "final_logit_softcapping", None)
        return [Forward(aux[b, :n], last[b, :n],
                        lm_scores(head, last[b, :n], ids[b, :n], s, softcap) if s is not None else None)
                for b, (n, s) in enumerate(zip(lengths, starts, strict=True))]

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]


def build_tiny_model(path: str | Path, vocab_size: int, hidden_size: int = 64, layers: int = 4,
                     context: int = 32768, seed: int = 0, initializer_range: float = 0.02) -> Path:
    """A random-weight LlamaForCausalLM built from a config (no download), saved for `extraction.model`.

    The vocabulary must cover the tokenizer's ids (DeepSeek-V4's ~129k is fine at hidden 64:
    embeddings are tied to the LM head, ~33 MB). At the default initializer range its argmax is
    mostly the token it was given; 0.2 makes its greedy answers depend on the context (fidelity tests).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = max(1, hidden_size // 16)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=context, tie_word_embeddings=True, initializer_range=initializer_range)
    with torch.random.fork_rng(devices=[]):  # the seeded init leaves the caller's global generator as it was
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    return out
