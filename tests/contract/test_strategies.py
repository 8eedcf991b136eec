"""The strategies produce what they promise: every realisation holds the same logical bytes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.contract.formats import special_bit_patterns
from conformance.contract.keys import KEY_NAMES, KEY_SHAPES, KEY_TWINS, pool_keys, realistic_key
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
                     settings=settings(max_examples=2000, database=None, derandomize=True,
                                      deadline=None))  # never flaky, even on a loaded machine
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


@pytest.mark.parametrize("shape", KEY_SHAPES)
def test_a_key_pool_shares_all_but_its_last_character(shape):
    keys = pool_keys(shape)
    assert list(keys) == list(KEY_NAMES)
    assert len({len(k) for k in keys.values()}) == 1
    assert len({k[:-1] for k in keys.values()}) == 1 and len(set(keys.values())) == len(KEY_NAMES)
    assert pool_keys(shape) != keys  # a pool no other run uses


def test_key_pools_include_case_twins_and_keys_of_256_to_1024_bytes():
    assert {"a", "A"} <= set(KEY_NAMES)
    lengths = {len(next(iter(pool_keys(shape).values())).encode()) for shape in KEY_SHAPES}
    assert {256, 1024} <= lengths and max(lengths) == 1024  # past memcached's 250 and a 255-byte name


def test_key_twins_collide_only_under_case_folding_or_a_length_cap():
    for twins in KEY_TWINS:
        a, b = pool_keys(twins.shape, twins.names).values()
        assert a != b
        case_only = a.lower() == b.lower()
        assert case_only or (len(a) == len(b) >= 256 and a[:250] == b[:250] and a[:255] == b[:255]), twins
    assert any(a.lower() == b.lower() for a, b in (pool_keys(t.shape, t.names).values() for t in KEY_TWINS))


def test_long_lmcache_keys_look_like_lmcaches():
    # LMCache's layerwise key string: model@world_size@worker_id@chunk_hash@dtype@layer
    model, world_size, worker, chunk, dtype, layer = pool_keys("lmcache_1024")["b"].split("@")
    assert model.startswith("/mnt/") and (world_size, worker, dtype, layer) == ("8", "3", "bfloat16", "b")
    assert len(chunk) == 64 and int(chunk, 16) >= 0
    with pytest.raises(ValueError, match="valid: hash"):
        realistic_key("nope")
