"""The special bit patterns are derived, not listed: check them against torch's own decoding."""

from __future__ import annotations

import math

import pytest
import torch

from conformance.contract.formats import FORMATS, NanEncoding, special_bit_patterns
from conformance.contract.strategies import _signed, bits_dtype

FLOAT_FORMATS = [f for f in FORMATS.values() if f.is_float]


def decode(fmt, pattern: int) -> float:
    bits = torch.tensor([_signed(pattern, fmt.bits)], dtype=bits_dtype(fmt))
    return bits.view(fmt.torch_dtype).to(torch.float64).item()


@pytest.mark.parametrize("fmt", FLOAT_FORMATS, ids=str)
def test_float_specials_decode_as_named(fmt):
    pats = special_bit_patterns(fmt)
    finfo = torch.finfo(fmt.torch_dtype)
    assert decode(fmt, pats["+0"]) == 0 and math.copysign(1, decode(fmt, pats["+0"])) == 1
    assert decode(fmt, pats["-0"]) == 0 and math.copysign(1, decode(fmt, pats["-0"])) == -1
    assert decode(fmt, pats["max_finite"]) == finfo.max
    assert decode(fmt, pats["-max_finite"]) == -finfo.max
    assert decode(fmt, pats["min_normal"]) == finfo.smallest_normal
    assert 0 < decode(fmt, pats["min_subnormal"]) < finfo.smallest_normal
    assert decode(fmt, pats["max_subnormal"]) < finfo.smallest_normal
    nans = [n for n in pats if "nan" in n]
    assert nans and all(math.isnan(decode(fmt, pats[n])) for n in nans)
    if fmt.nan_encoding is NanEncoding.IEEE:
        assert decode(fmt, pats["+inf"]) == math.inf and decode(fmt, pats["-inf"]) == -math.inf
        assert len({pats[n] for n in nans}) >= 3  # distinct payloads: == on floats can't see them
    else:
        assert not any("inf" in n for n in pats)  # e4m3fn has no infinity


def test_e4m3fn_has_only_two_nans():
    pats = special_bit_patterns(FORMATS["e4m3fn"])
    assert {pats["nan"], pats["-nan"]} == {0x7F, 0xFF}


def test_integer_specials():
    pats = special_bit_patterns(FORMATS["int8"])
    decoded = {n: torch.tensor([p], dtype=torch.uint8).view(torch.int8).item() for n, p in pats.items()}
    assert decoded == {"zero": 0, "one": 1, "minus_one": -1, "max": 127, "min": -128}
