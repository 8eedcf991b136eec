"""A correct lossy store: a quantizing serde, as an LMCache codec or a compressed tier is. 16- and
32-bit KV keeps 5 significant bits of each value (about 1.5% relative error at most, saturating at the format's
largest value; fp8 and int8 KV is kept as it is), NaN and infinities unchanged, and it declares what it keeps within:
``lossy_tolerance`` 0.02, the relative RMS error of its round trip. The positive control that a
lossy store is held to closeness and to exact bytes nowhere (``understated_loss`` is the same
codec declaring less loss than it makes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from conformance.contract.store import KVEntry
from conformance.stores.memory import MemoryStore

WIDE = (torch.bfloat16, torch.float16, torch.float32)
MANTISSA_STEPS = 32  # 5 significant bits: frexp's mantissa in [0.5, 1) rounded to 1/32


def quantized(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` with each finite value rounded to ``MANTISSA_STEPS`` steps of its binade."""
    if tensor.dtype not in WIDE:
        return tensor
    wide = tensor.detach().to(torch.float32)
    mantissa, exponent = torch.frexp(wide)
    rounded = torch.ldexp(torch.round(mantissa * MANTISSA_STEPS) / MANTISSA_STEPS, exponent)
    largest = torch.finfo(tensor.dtype).max  # rounding up past it would turn a finite value infinite
    return torch.where(wide.isfinite(), rounded.clamp(-largest, largest), wide).to(tensor.dtype)


class QuantizingStore(MemoryStore):
    capabilities = frozenset({"lossy", "scales", "delete"})
    lossy_tolerance = 0.02

    def put(self, key: str, entry: KVEntry) -> None:
        super().put(key, KVEntry(entry.spec, quantized(entry.tensor), entry.k_scale, entry.v_scale))


def make_store(workdir: Path | None = None, **_: Any) -> QuantizingStore:
    return QuantizingStore()
