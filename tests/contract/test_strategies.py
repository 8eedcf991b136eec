"""The strategies produce what they promise: every realisation holds the same logical bytes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.contract.formats import special_bit_patterns
from conformance.contract.spec import KVSpec, Layout
from conformance.contract.store import logical_bytes
from conformance.contract.strategies import (
    NON_CONTIGUOUS_VIEW_KINDS,
    PADDING_BYTE,
    VIEW_KINDS,
    bit_patterns,
    bits_dtype,
    format_twins,
    kv_specs,
    realise,
)


@given(data=st.data(), kind=st.sampled_from(VIEW_KINDS))
@settings(max_examples=60)
def test_realisations_keep_logical_content(data, kind):
    spec = data.draw(kv_specs())
    content = data.draw(bit_patterns(spec))
    assert content.dtype == spec.storage_dtype and tuple(content.shape) == spec.layer_shape
    view = realise(content, spec, kind, offset=data.draw(st.integers(1, 7)), layer=data.draw(st.integers(1, 2)))
    assert logical_bytes(view) == logical_bytes(content)
    # A permutation that moves only dims of size 1 (one KV head) lays the bytes out as the identity does.
    moved = [d for d in spec.memory_order if spec.layer_shape[d] != 1]
    identity = moved == sorted(moved)
    if kind in NON_CONTIGUOUS_VIEW_KINDS and not (kind == "stride_order" and identity):
        assert not view.is_contiguous() or view.storage_offset() > 0
    if kind == "storage_offset":
        assert view.storage_offset() > 0


def test_padding_is_visible_around_views():
    spec = KVSpec(layout=Layout.BLOCKS_FIRST, num_kv_heads=2, head_size=64)
    content = torch.zeros(spec.layer_shape, dtype=spec.storage_dtype)
    view = realise(content, spec, "padded", offset=3)
    raw = bytes(view.untyped_storage())
    assert bytes([PADDING_BYTE]) * 3 in raw  # what a stride-ignoring store would leak


@given(spec=kv_specs(max_blocks=1), data=st.data())
@settings(max_examples=40)
def test_uniform_specials_can_fill_a_tensor(spec, data):
    content = data.draw(bit_patterns(spec))
    bits = content.contiguous().view(bits_dtype(spec.element_format))
    assert bits.numel() == content.numel()


def test_specials_are_reachable():
    # Hypothesis must be able to place every special pattern; find() proves reachability.
    from hypothesis import find

    spec = KVSpec(kv_cache_dtype="fp8_e5m2", layout=Layout.FUSED, num_kv_heads=2, head_size=64)
    for name, pattern in special_bit_patterns(spec.element_format).items():
        # Random bytes hit each of 256 patterns anyway; the point is the *uniform* fill.
        found = find(bit_patterns(spec), lambda t, p=pattern: bool((t.view(torch.uint8) == p).all()),
                     settings=settings(max_examples=2000, database=None, derandomize=True))  # never flaky
        assert bool((found.view(torch.uint8) == pattern).all()), name


@given(twins=format_twins())
def test_format_twins_differ_only_in_format(twins):
    a, b = twins
    assert a.replace(kv_cache_dtype=b.kv_cache_dtype) == b
    assert (a.element_format, a.storage_dtype) != (b.element_format, b.storage_dtype)


@pytest.mark.parametrize("kind", ["nope"])
def test_unknown_view_kind_is_rejected(kind):
    spec = KVSpec()
    with pytest.raises(ValueError, match="valid: contiguous"):
        realise(torch.zeros(spec.layer_shape, dtype=spec.storage_dtype), spec, kind)
