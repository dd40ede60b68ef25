"""The transformers backend: the reference every other backend is compared with (CPU or CUDA).

A batch runs in the cheapest shape its lengths allow (`batching.Shape`): one length is a [B, T]
batch with no mask; mixed lengths are packed end to end into one [1, N] row when the model's
attention can be packed (`varlen.py`: no padding computed, no mask built), else right-padded with a
mask as before. Which samples share a batch is the caller's plan (`batching.plan_batches`).

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
from eyrie.jobs.extract import varlen
from eyrie.jobs.extract.batching import Shape, activation_bytes_per_token, default_budget
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
    """Loads an `AutoModelForCausalLM` and returns per-sample (aux [T, kH], last [T, H]) tensors.

    `attention` (`extraction.attention`): how a batch of mixed lengths runs: `auto`, `sdpa`, `flex`
    or `flash` pack it (`varlen.choose_kernel`), `padded` pads it. A model whose attention cannot be
    packed (`varlen.packable`) runs padded whatever is asked, and says why in `packing_refused`.
    """

    name = "transformers"

    def __init__(self, model_path: str, *, device: str | None = None, storage_dtype: str = "bfloat16",
                 trust_remote_code: bool = False, compute_dtype: torch.dtype | None = None,
                 attention: str = "auto"):
        from transformers import AutoConfig, AutoModelForCausalLM

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = compute_dtype or default_compute_dtype(self.device, storage_dtype)
        try:
            with no_progress_bars():
                config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
                impl = self._choose_attention(config, attention)
                model = AutoModelForCausalLM.from_pretrained(
                    model_path, config=config, dtype=dtype, trust_remote_code=trust_remote_code, **impl)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"extraction.model {model_path!r} cannot be loaded: {e}") from None
        self._adopt(model, dtype)

    @classmethod
    def random(cls, config: Any, *, device: str, dtype: torch.dtype, attention: str = "auto",
               seed: int = 0) -> HFBackend:
        """A backend over random weights built from `config` on `device` (benchmarks: an 8B model's shape
        without 16 GB to load); the caller's random generators are left as they were."""
        from transformers import AutoModelForCausalLM

        self = cls.__new__(cls)
        self.device = device
        impl = self._choose_attention(config, attention)
        cuda = [torch.device(device).index or 0] if device.startswith("cuda") else []
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(seed)
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(config, dtype=dtype, **impl)
        self._adopt(model, dtype)
        return self

    def _choose_attention(self, config: Any, attention: str) -> dict[str, str]:
        self.facts: ModelFacts = model_facts(config)
        self.kernel = varlen.choose_kernel(attention, self.device)
        self.packing_refused = varlen.packable(config.get_text_config()) if self.kernel else None
        if self.packing_refused:
            self.kernel = None
        return {"attn_implementation": varlen.register()} if self.kernel else {}

    def _adopt(self, model: Any, dtype: torch.dtype) -> None:
        self.model = model.to(self.device).eval()
        self.decoder = self.model.base_model
        self.layers = _layers_of(self.decoder)
        self.compute_dtype = dtype

    @property
    def packs(self) -> bool:
        """Whether batches of mixed lengths run packed (else padded). A model loaded to pack can be told
        to pad (`kernel = None`, what the benchmarks compare with): its attention masks as SDPA's."""
        return self.kernel is not None

    def default_max_tokens(self, aux_layers: int = 3, staged_batches: int = 2) -> int:
        """Tokens per forward when `extraction.maxTokensPerBatch` is not set (`batching.default_budget`):
        from the memory left on the device after the weights, over what a token holds in flight."""
        free = torch.cuda.mem_get_info(torch.device(self.device))[0] if self.device.startswith("cuda") else None
        text = self.model.config.get_text_config()
        hidden = self.facts.hidden_size
        per_token = activation_bytes_per_token(hidden, int(getattr(text, "intermediate_size", 4 * hidden)),
                                               aux_layers, self.compute_dtype.itemsize, staged_batches)
        return default_budget(self.device, free, per_token)

    def hidden_states(self, batch: Sequence[Sequence[int]], layer_ids: Sequence[int]
                      ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(aux, last) per sample, without scores."""
        return [(f.aux, f.last) for f in self.forward(batch, layer_ids)]

    def shape_of(self, lengths: Sequence[int]) -> Shape:
        """How a batch of these lengths runs here."""
        if min(lengths) == max(lengths):
            return Shape.UNIFORM
        return Shape.PACKED if self.packs else Shape.PADDED

    @torch.inference_mode()
    def forward(self, batch: Sequence[Sequence[int]], layer_ids: Sequence[int],
                score_from: Sequence[int | None] | None = None) -> list[Forward]:
        """Forward of a batch in its shape (`shape_of`); each sample's tensors are views on the model's
        device, in batch order. `score_from[b]`: score sample b's tokens from that position on with the
        LM head (None: not at all)."""
        if not batch:
            return []
        for i in layer_ids:
            if not 0 <= i < len(self.layers):
                raise LayerError(f"layer id {i} is out of range for a model with {len(self.layers)} layers")
        lengths = [len(x) for x in batch]
        shape = self.shape_of(lengths)
        if shape is Shape.PACKED:
            ids = torch.from_numpy(np.concatenate([np.asarray(x, dtype=np.int64) for x in batch]))[None]
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).tolist()
            rows = [(0, a, n) for a, n in zip(starts, lengths, strict=True)]
        else:
            width = max(lengths)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            for b, x in enumerate(batch):
                ids[b, : len(x)] = torch.as_tensor(np.asarray(x, dtype=np.int64))
            rows = [(b, 0, n) for b, n in enumerate(lengths)]
        aux, last = self._run(ids, lengths, shape, layer_ids)
        scores = list(score_from) if score_from is not None else [None] * len(batch)
        head = self.model.get_output_embeddings()
        softcap = getattr(self.model.config, "final_logit_softcapping", None)
        out = []
        for (b, a, n), s in zip(rows, scores, strict=True):
            last_b = last[b, a:a + n]
            out.append(Forward(aux[b, a:a + n], last_b,
                               lm_scores(head, last_b, ids[b, a:a + n], s, softcap) if s is not None else None))
        return out

    def _run(self, ids: torch.Tensor, lengths: Sequence[int], shape: Shape, layer_ids: Sequence[int]
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder over `ids` in `shape`: (aux [B, N, kH], last [B, N, H]) on the device."""
        captured: dict[int, torch.Tensor] = {}

        def grab(i: int):
            def hook(_mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                captured[i] = args[0] if args else kwargs["hidden_states"]
            return hook

        kwargs: dict[str, Any] = {}
        packing: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if shape is Shape.PACKED:
            assert self.kernel is not None
            kwargs["position_ids"] = varlen.position_ids(lengths, self.device)
            packing = varlen.documents(lengths, self.kernel, self.device)
        elif shape is Shape.PADDED:
            mask = torch.zeros(ids.shape, dtype=torch.long)
            for b, n in enumerate(lengths):
                mask[b, :n] = 1
            kwargs["attention_mask"] = mask.to(self.device)
        handles = [self.layers[i].register_forward_pre_hook(grab(i), with_kwargs=True) for i in layer_ids]
        try:
            with packing:
                out = self.decoder(input_ids=ids.to(self.device), use_cache=False, **kwargs)
        finally:
            for h in handles:
                h.remove()
        return torch.cat([captured[i] for i in layer_ids], dim=-1), out.last_hidden_state

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
