"""Storage dtypes for hidden states: plain casts, or float8 e4m3 with one scale per token per layer.

float8 halves bf16's bytes. Each layer's slice of a token (H values) gets its own float32 scale
(amax / 448, the largest finite e4m3 value), so a loud layer does not crush a quiet one's precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from eyrie.jobs.contract.layers import hidden_bytes_per_token

StorageDtype = Literal["bfloat16", "float16", "float32", "float8"]

TORCH_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "float8": torch.float8_e4m3fn,
}
E4M3_MAX = 448.0
SCALE_DTYPE = torch.float32


@dataclass(frozen=True)
class Layout:
    """How one token's hidden states are stored: `aux_layers` slices of `hidden` plus the last one."""

    aux_layers: int
    hidden: int
    dtype: StorageDtype

    @property
    def element_bytes(self) -> int:
        return TORCH_DTYPES[self.dtype].itemsize

    @property
    def quantized(self) -> bool:
        return self.dtype == "float8"

    @property
    def bytes_per_token(self) -> int:
        """(aux + 1) x H x bytes per element, plus one float32 scale per layer for float8."""
        return hidden_bytes_per_token(self.aux_layers, self.hidden, self.dtype)

    def columns(self) -> dict[str, tuple[torch.dtype, int]]:
        """Per-sample tensors in the shard: name -> (dtype, values per token)."""
        store = TORCH_DTYPES[self.dtype]
        cols: dict[str, tuple[torch.dtype, int]] = {
            "input_ids": (torch.int32, 1),
            "loss_mask": (torch.int8, 1),
            "aux_hidden": (store, self.aux_layers * self.hidden),
            "last_hidden": (store, self.hidden),
        }
        if self.quantized:
            cols["aux_scale"] = (SCALE_DTYPE, self.aux_layers)
            cols["last_scale"] = (SCALE_DTYPE, 1)
        return cols


def _quantize(x: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, groups*H] -> (e4m3 [T, groups*H], float32 scales [T, groups])."""
    t = x.shape[0]
    g = x.float().reshape(t, groups, -1)
    amax = g.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (g / scale.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.reshape(t, -1), scale.to(SCALE_DTYPE)


def encode(aux: torch.Tensor, last: torch.Tensor, layout: Layout) -> dict[str, torch.Tensor]:
    """Cast (or quantize) one sample's [T, kH] aux and [T, H] last hidden states for storage."""
    if aux.shape[-1] != layout.aux_layers * layout.hidden or last.shape[-1] != layout.hidden:
        raise ValueError(
            f"hidden states have widths {aux.shape[-1]} and {last.shape[-1]}, expected "
            f"{layout.aux_layers} x {layout.hidden} and {layout.hidden}")
    if not layout.quantized:
        dt = TORCH_DTYPES[layout.dtype]
        return {"aux_hidden": aux.to(dt), "last_hidden": last.to(dt)}
    qa, sa = _quantize(aux, layout.aux_layers)
    ql, sl = _quantize(last, 1)
    return {"aux_hidden": qa, "last_hidden": ql, "aux_scale": sa, "last_scale": sl}


def decode(tensors: dict[str, torch.Tensor], layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """Stored tensors -> (aux [T, kH], last [T, H]); float8 comes back dequantized to float32."""
    aux, last = tensors["aux_hidden"], tensors["last_hidden"]
    if not layout.quantized:
        return aux, last
    t = aux.shape[0]
    a = aux.float().reshape(t, layout.aux_layers, -1) * tensors["aux_scale"].float().unsqueeze(-1)
    b = last.float() * tensors["last_scale"].float()
    return a.reshape(t, -1), b
