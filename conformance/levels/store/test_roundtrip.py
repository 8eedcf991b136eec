"""Round-trip clauses: what put was given is what get returns, bytes, dtype, shape, metadata."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance.contract.keys import fresh_key
from conformance.contract.store import KVEntry, logical_bytes, lossy_tolerance
from conformance.contract.strategies import NON_CONTIGUOUS_VIEW_KINDS, VIEW_KINDS, kv_entries
from conformance.verdict.asserts import (
    ClauseViolation,
    assert_equal,
    assert_hit,
    assert_same_bytes,
    assert_same_content,
    float_bits,
)
from conformance.verdict.clauses import clause

from ._steps import every_dtype, invert_bits, put_then_get


@clause("byte_exact_roundtrip")
@every_dtype(sizes=True)
@given(entry=kv_entries())
def test_byte_exact_roundtrip(kv_store, entry):
    before = logical_bytes(entry.tensor)
    got = put_then_get(kv_store, entry, clause="byte_exact_roundtrip")
    assert_same_bytes(got.tensor, entry.tensor, clause="byte_exact_roundtrip",
                      context=f"put/get of {entry!r}")
    if logical_bytes(entry.tensor) != before:
        raise ClauseViolation("byte_exact_roundtrip", "put modified the caller's tensor in place")


@clause("dtype_preserved")
@every_dtype()
@given(entry=kv_entries())
def test_dtype_preserved(kv_store, entry):
    got = put_then_get(kv_store, entry, clause="dtype_preserved")
    ctx = entry.spec.describe()
    assert_equal("tensor dtype", got.tensor.dtype, entry.spec.storage_dtype, clause="dtype_preserved", context=ctx)
    assert_equal("element format", got.spec.element_format.name, entry.spec.element_format.name,
                 clause="dtype_preserved", context=ctx)


@clause("shape_preserved")
@every_dtype()
@given(entry=kv_entries())
def test_shape_preserved(kv_store, entry):
    got = put_then_get(kv_store, entry, clause="shape_preserved")
    assert_equal("tensor shape", tuple(got.tensor.shape), entry.spec.layer_shape,
                 clause="shape_preserved", context=entry.spec.describe())


@clause("stride_contract")
@every_dtype(kinds=NON_CONTIGUOUS_VIEW_KINDS)
@given(entry=kv_entries(kinds=NON_CONTIGUOUS_VIEW_KINDS))
def test_stride_contract(kv_store, entry):
    got = put_then_get(kv_store, entry, clause="stride_contract")
    assert_same_content(got.tensor, entry.tensor, tolerance=lossy_tolerance(kv_store),
                        element=entry.spec.element_format.torch_dtype, clause="stride_contract",
                        context=f"non-contiguous put of {entry!r}; got stride={got.tensor.stride()}")


@clause("metadata_roundtrip")
@every_dtype()
@given(entry=kv_entries())
def test_metadata_roundtrip(kv_store, entry):
    got = put_then_get(kv_store, entry, clause="metadata_roundtrip")
    assert_equal("recorded spec", got.spec.to_dict(), entry.spec.to_dict(), clause="metadata_roundtrip")


@clause("scales_roundtrip")
@every_dtype()
@given(entry=kv_entries())
def test_scales_roundtrip(kv_store, entry):
    got = put_then_get(kv_store, entry, clause="scales_roundtrip")
    ctx = entry.spec.describe()
    # Compared as the bits of a float64 (float.hex), never with ==: a scale narrowed to
    # float32 or reparsed from a rounded string is a different scale.
    for name in ("k_scale", "v_scale"):
        assert_equal(name, float_bits(getattr(got, name)), float_bits(getattr(entry, name)),
                     clause="scales_roundtrip", context=ctx)



@clause("no_aliasing")
@every_dtype(kinds=VIEW_KINDS, whole=True)
@given(entry=kv_entries(kinds=VIEW_KINDS), whole=st.booleans())
def test_no_aliasing(kv_store, entry, whole):
    """The asynchronous-save bug in a store: a put that keeps a reference to the caller's tensor
    (vLLM reuses a freed block for the next request), if only until its first read (a write-behind
    store), or a get that hands out the store's own buffer (the engine writes into the tensor it
    loads). So the caller overwrites its tensor right after put, before any get. Judged against the
    bytes as they were at put, read back through the store: a twin of the tensor taken at put (the
    same view over a copy of its memory) is put under a second key and never touched, so a store
    that gets the bytes wrong anyway (byte_exact_roundtrip's business) is judged here only on
    whether they stay put."""
    cid = "no_aliasing"
    key, control = fresh_key(), fresh_key()
    at_put = KVEntry(entry.spec, _twin(entry.tensor), entry.k_scale, entry.v_scale)
    kv_store.put(key, entry)
    kv_store.put(control, at_put)
    _scribble(entry.tensor, whole)
    how = "all of its memory" if whole else "the view's region"
    got = assert_hit(kv_store.get(key, entry.spec), clause=cid, key=key, spec=entry.spec)
    want = assert_hit(kv_store.get(control, entry.spec), clause=cid, key=control, spec=entry.spec).tensor.clone()
    assert_same_bytes(got.tensor, want, clause=cid,
                      context=f"after the caller overwrote {how} of the tensor it had put, before the first get "
                              f"({entry!r}): the store kept a reference to it, not its bytes")
    _scribble(got.tensor, whole=False)
    again = assert_hit(kv_store.get(key, entry.spec), clause=cid, key=key, spec=entry.spec)
    assert_same_bytes(again.tensor, want, clause=cid,
                      context=f"after the caller wrote into the tensor a get returned ({entry!r}): get handed out "
                              "the store's own buffer")


def _twin(tensor: torch.Tensor) -> torch.Tensor:
    """The same view as ``tensor`` (size, strides, storage offset) over a copy of all of its memory:
    what put was given, laid out as it was, that no later write to ``tensor`` reaches."""
    memory = torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage()).clone()
    return torch.empty(0, dtype=tensor.dtype).set_(memory.untyped_storage(), tensor.storage_offset(),
                                                    tensor.shape, tensor.stride())


def _scribble(tensor: torch.Tensor, whole: bool) -> None:
    """Invert every bit of ``tensor``'s region (or of all the memory under it), as a reused block is
    overwritten: every element changes, whatever it held."""
    if whole:
        torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage()).bitwise_not_()
    else:
        invert_bits(tensor)
