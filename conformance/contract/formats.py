"""Element formats: what the bytes of a KV cache *mean*, independent of the torch dtype
that holds them.

vLLM keeps fp8 KV caches in ``torch.uint8`` tensors; only the ``kv_cache_dtype`` string says
whether those bytes are e4m3 or e5m2. A store that reasons from the torch dtype alone cannot
tell them apart, so the contract names the element format explicitly.

Special bit patterns (±0, ±inf, NaN payloads, subnormal and normal extremes) are derived
from each format's exponent and mantissa widths rather than listed by hand, and
``tests/contract/test_formats.py`` checks them against torch's own float8/float16/bfloat16 decoding.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class NanEncoding(enum.Enum):
    """How a floating format spends its all-ones exponent."""

    IEEE = "ieee"  # all-ones exponent: mantissa 0 is inf, anything else NaN
    FN = "fn"  # "finite": no inf; only the all-ones exponent+mantissa is NaN (e4m3fn)


@dataclass(frozen=True)
class ElementFormat:
    """The logical element format of KV bytes.

    ``exponent_bits``/``mantissa_bits`` are ``None`` for integer formats.
    """

    name: str
    bits: int
    torch_dtype: torch.dtype
    exponent_bits: int | None = None
    mantissa_bits: int | None = None
    nan_encoding: NanEncoding | None = None

    @property
    def is_float(self) -> bool:
        return self.exponent_bits is not None

    @property
    def itemsize(self) -> int:
        return self.bits // 8

    def __str__(self) -> str:
        return self.name


E4M3FN = ElementFormat("e4m3fn", 8, torch.float8_e4m3fn, 4, 3, NanEncoding.FN)
E5M2 = ElementFormat("e5m2", 8, torch.float8_e5m2, 5, 2, NanEncoding.IEEE)
FP16 = ElementFormat("fp16", 16, torch.float16, 5, 10, NanEncoding.IEEE)
BF16 = ElementFormat("bf16", 16, torch.bfloat16, 8, 7, NanEncoding.IEEE)
FP32 = ElementFormat("fp32", 32, torch.float32, 8, 23, NanEncoding.IEEE)
INT8 = ElementFormat("int8", 8, torch.int8)

FORMATS: dict[str, ElementFormat] = {f.name: f for f in (E4M3FN, E5M2, FP16, BF16, FP32, INT8)}


def special_bit_patterns(fmt: ElementFormat) -> dict[str, int]:
    """Named bit patterns that stores most often mangle, as unsigned integers of ``fmt.bits``.

    Floats: ±0, ±inf (IEEE only), NaN payloads (quiet, signalling, max payload, negative),
    smallest/largest subnormal, smallest normal, largest finite (both signs).
    Integers: 0, ±1, the extremes.
    """
    bits = fmt.bits
    sign = 1 << (bits - 1)
    if not fmt.is_float:
        return {"zero": 0, "one": 1, "minus_one": (1 << bits) - 1, "max": sign - 1, "min": sign}
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    assert e is not None and m is not None  # sanity check: is_float
    exp_all_ones = ((1 << e) - 1) << m
    mant_all_ones = (1 << m) - 1
    pats = {
        "+0": 0,
        "-0": sign,
        "min_subnormal": 1,
        "-min_subnormal": sign | 1,
        "max_subnormal": mant_all_ones,
        "min_normal": 1 << m,
        "-min_normal": sign | (1 << m),
    }
    if fmt.nan_encoding is NanEncoding.FN:
        # e4m3fn: the all-ones exponent is finite except S.1111.111, the only NaN.
        pats["max_finite"] = exp_all_ones | (mant_all_ones - 1)
        pats["-max_finite"] = sign | pats["max_finite"]
        pats["nan"] = exp_all_ones | mant_all_ones
        pats["-nan"] = sign | exp_all_ones | mant_all_ones
    else:
        pats["max_finite"] = (exp_all_ones - (1 << m)) | mant_all_ones
        pats["-max_finite"] = sign | pats["max_finite"]
        pats["+inf"] = exp_all_ones
        pats["-inf"] = sign | exp_all_ones
        pats["quiet_nan"] = exp_all_ones | (1 << (m - 1))
        pats["signalling_nan"] = exp_all_ones | 1
        pats["max_payload_nan"] = exp_all_ones | mant_all_ones
        pats["-nan_payload"] = sign | exp_all_ones | 1
    return pats
