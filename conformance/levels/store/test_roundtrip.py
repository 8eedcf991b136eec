"""Round-trip clauses: what put was given is what get returns, bytes, dtype, shape, metadata."""

from hypothesis import given

from conformance.contract.store import logical_bytes
from conformance.contract.strategies import NON_CONTIGUOUS_VIEW_KINDS, kv_entries
from conformance.verdict.asserts import ClauseViolation, assert_equal, assert_same_bytes, float_bits
from conformance.verdict.clauses import clause

from ._steps import put_then_get


@clause("byte_exact_roundtrip")
@given(entry=kv_entries())
def test_byte_exact_roundtrip(kv_store, entry):
    before = logical_bytes(entry.tensor)
    got = put_then_get(kv_store, entry, clause="byte_exact_roundtrip")
    assert_same_bytes(got.tensor, entry.tensor, clause="byte_exact_roundtrip",
                      context=f"put/get of {entry!r}")
    if logical_bytes(entry.tensor) != before:
        raise ClauseViolation("byte_exact_roundtrip", "put modified the caller's tensor in place")


@clause("dtype_preserved")
@given(entry=kv_entries())
def test_dtype_preserved(kv_store, entry):
    got = put_then_get(kv_store, entry, clause="dtype_preserved")
    ctx = entry.spec.describe()
    assert_equal("tensor dtype", got.tensor.dtype, entry.spec.storage_dtype, clause="dtype_preserved", context=ctx)
    assert_equal("element format", got.spec.element_format.name, entry.spec.element_format.name,
                 clause="dtype_preserved", context=ctx)


@clause("shape_preserved")
@given(entry=kv_entries())
def test_shape_preserved(kv_store, entry):
    got = put_then_get(kv_store, entry, clause="shape_preserved")
    assert_equal("tensor shape", tuple(got.tensor.shape), entry.spec.layer_shape,
                 clause="shape_preserved", context=entry.spec.describe())


@clause("stride_contract")
@given(entry=kv_entries(kinds=NON_CONTIGUOUS_VIEW_KINDS))
def test_stride_contract(kv_store, entry):
    got = put_then_get(kv_store, entry, clause="stride_contract")
    assert_same_bytes(got.tensor, entry.tensor, clause="stride_contract",
                      context=f"non-contiguous put of {entry!r}; got stride={got.tensor.stride()}")


@clause("metadata_roundtrip")
@given(entry=kv_entries())
def test_metadata_roundtrip(kv_store, entry):
    got = put_then_get(kv_store, entry, clause="metadata_roundtrip")
    assert_equal("recorded spec", got.spec.to_dict(), entry.spec.to_dict(), clause="metadata_roundtrip")


@clause("scales_roundtrip")
@given(entry=kv_entries())
def test_scales_roundtrip(kv_store, entry):
    got = put_then_get(kv_store, entry, clause="scales_roundtrip")
    ctx = entry.spec.describe()
    # Compared as the bits of a float64 (float.hex), never with ==: a scale narrowed to
    # float32 or reparsed from a rounded string is a different scale.
    for name in ("k_scale", "v_scale"):
        assert_equal(name, float_bits(getattr(got, name)), float_bits(getattr(entry, name)),
                     clause="scales_roundtrip", context=ctx)

