"""Attention over packed batches: several samples end to end in one row, each attending only to itself.

Registered with transformers' `AttentionInterface` under `IMPLEMENTATION` (a model loaded with it
runs every attention layer through `attention`; padded and uniform batches go on to SDPA as before).
The samples' boundaries do not travel through the model's keyword arguments (their names and
plumbing differ between transformers releases): the backend sets them for the duration of one
forward with `documents(...)`, a context variable the attention reads.

Three kernels for a packed row, chosen by `Kernel`:
- `SDPA`: PyTorch's `scaled_dot_product_attention`, causal, once per sample (slices of the row).
  Exact, no mask built, runs everywhere; its cost is one call per sample per layer.
- `FLEX`: `torch.nn.attention.flex_attention` with a document mask (a `BlockMask` built once per
  forward, shared by all layers). Compiled on CUDA (where it is a fused kernel); eager elsewhere,
  which materializes the scores and serves only to check it on the CPU.
- `FLASH`: FlashAttention's `flash_attn_varlen_func` (the `flash_attn` package, CUDA only) when it
  is installed.
Samples never see each other in any of them, and positions restart at 0 for each sample (the
backend passes `position_ids`), so a packed sample's states equal its states run alone, within the
rounding a different kernel shape gives.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import importlib.util
import itertools
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from eyrie.jobs.errors import EyrieError

IMPLEMENTATION = "eyrie_varlen"


class VarlenError(EyrieError, RuntimeError):
    """The chosen packed attention cannot run here (kernel missing, a model feature it does not support)."""


class Kernel(enum.Enum):
    SDPA = "sdpa"
    FLEX = "flex"
    FLASH = "flash"


def flash_available() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


def choose_kernel(requested: str, device: str) -> Kernel | None:
    """`extraction.attention` -> the kernel for packed batches, or None for padded batches.

    `auto`: FlashAttention's varlen on CUDA when installed, else per-sample SDPA (flex needs a
    compile per shape on first use; the GPU benchmark measures it against the others)."""
    if requested == "padded":
        return None
    if requested == "auto":
        return Kernel.FLASH if device.startswith("cuda") and flash_available() else Kernel.SDPA
    kernel = Kernel(requested)
    if kernel is Kernel.FLASH and not (device.startswith("cuda") and flash_available()):
        raise VarlenError("extraction.attention flash: needs CUDA and the flash_attn package; use auto, sdpa "
                          "or flex")
    return kernel


def packable(config: Any) -> str | None:
    """Why this model's attention cannot be packed (None: it can). Packed attention here is plain
    causal attention within each sample: sliding windows, logit softcapping, attention sinks and
    non-causal or non-attention layers are left to padded batches and the model's own attention."""
    types = getattr(config, "layer_types", None)
    if types and any(t != "full_attention" for t in types):
        return f"layer types {sorted(set(types))}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return f"sliding window {config.sliding_window}"
    if getattr(config, "attn_logit_softcapping", None):
        return "attention logit softcapping"
    if not getattr(config, "is_causal", True):
        return "bidirectional attention"
    return None


@dataclass
class Documents:
    """The samples of one packed row: cumulative lengths [0, n0, n0+n1, ...] (host and device)."""

    cu: tuple[int, ...]
    kernel: Kernel
    device: torch.device
    cu_device: torch.Tensor = field(init=False)
    block_mask: Any = None  # FLEX: built once per forward, on first use

    def __post_init__(self) -> None:
        self.cu_device = torch.tensor(self.cu, dtype=torch.int32, device=self.device)

    @property
    def max_length(self) -> int:
        return max(b - a for a, b in itertools.pairwise(self.cu))


_DOCUMENTS: ContextVar[Documents | None] = ContextVar("eyrie_varlen_documents", default=None)


@contextlib.contextmanager
def documents(lengths: Sequence[int], kernel: Kernel, device: torch.device | str) -> Iterator[Documents]:
    """The packed row's samples for the forward run inside (their lengths, in row order)."""
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + int(n))
    docs = Documents(tuple(cu), kernel, torch.device(device))
    token = _DOCUMENTS.set(docs)
    try:
        yield docs
    finally:
        _DOCUMENTS.reset(token)


def position_ids(lengths: Sequence[int], device: torch.device | str) -> torch.Tensor:
    """[1, N]: 0..n-1 for each sample of the row, so rotary positions restart with each sample."""
    return torch.cat([torch.arange(int(n), device=device) for n in lengths]).unsqueeze(0)


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
              **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: query [B, H, N, D], key and value [B, Hkv, N, D] ->
    ([B, N, H, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    docs = _DOCUMENTS.get()
    if docs is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    for name in ("sliding_window", "softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise VarlenError(f"packed attention does not support {name}; set extraction.attention: padded")
    if query.shape[0] != 1 or query.shape[2] != docs.cu[-1]:
        raise VarlenError(f"packed attention got a query of shape {tuple(query.shape)} for "
                          f"{len(docs.cu) - 1} samples of {docs.cu[-1]} tokens")
    if docs.kernel is Kernel.FLASH:
        return _flash(query, key, value, docs, scaling), None
    if docs.kernel is Kernel.FLEX:
        return _flex(query, key, value, docs, scaling), None
    return _sdpa(query, key, value, docs, scaling), None


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: Documents, scaling: float | None
          ) -> torch.Tensor:
    gqa = q.shape[1] != k.shape[1]
    out = torch.empty(1, q.shape[2], q.shape[1], v.shape[-1], dtype=q.dtype, device=q.device)
    for a, b in itertools.pairwise(docs.cu):
        o = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], is_causal=True, scale=scaling, enable_gqa=gqa)
        out[:, a:b] = o.transpose(1, 2)
    return out


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: Documents, scaling: float | None
          ) -> torch.Tensor:
    from torch.nn.attention.flex_attention import create_block_mask

    n = q.shape[2]
    if docs.block_mask is None:
        sample = torch.repeat_interleave(
            torch.arange(len(docs.cu) - 1, device=q.device),
            torch.tensor([b - a for a, b in itertools.pairwise(docs.cu)], device=q.device))

        def same_sample_causal(_b: Any, _h: Any, qi: Any, ki: Any) -> Any:
            return (sample[qi] == sample[ki]) & (qi >= ki)

        docs.block_mask = create_block_mask(same_sample_causal, None, None, n, n, device=q.device,
                                            _compile=q.is_cuda)
    out = _flex_kernel(q.is_cuda)(q, k, v, block_mask=docs.block_mask, scale=scaling,
                                  enable_gqa=q.shape[1] != k.shape[1])
    return out.transpose(1, 2)


@functools.cache
def _flex_kernel(compiled: bool) -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True) if compiled else flex_attention


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: Documents, scaling: float | None
           ) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]

    # [1, H, N, D] -> [N, H, D]; flash_attn takes grouped keys and values as they are
    qs, ks, vs = (x[0].transpose(0, 1) for x in (q, k, v))
    m = docs.max_length
    out = flash_attn_varlen_func(qs, ks, vs, docs.cu_device, docs.cu_device, m, m, softmax_scale=scaling,
                                 causal=True)
    return out.unsqueeze(0)


@functools.cache
def register() -> str:
    """Make `IMPLEMENTATION` known to transformers (once per process; adds a name, changes no other).

    Its mask is SDPA's (a padded batch gets its padding mask, a uniform one none), except during a
    packed forward: there transformers would build an [N, N] mask from the restarting positions,
    which the packed kernels never read."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    sdpa_mask = ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]

    def mask(*args: Any, **kwargs: Any) -> Any:
        return None if _DOCUMENTS.get() is not None else sdpa_mask(*args, **kwargs)

    AttentionInterface.register(IMPLEMENTATION, attention)
    AttentionMaskInterface.register(IMPLEMENTATION, mask)
    return IMPLEMENTATION
