"""Isolation clauses: what the spec says the bytes are is part of their identity."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance.contract.keys import fresh_key
from conformance.contract.spec import KVSpec
from conformance.contract.store import REFUSALS, KVEntry, lossy_tolerance
from conformance.contract.strategies import (
    active_format_twins,
    active_kv_cache_dtypes,
    bit_patterns,
    format_twins,
    kv_entries,
    model_dtype_twins,
    scales,
    seeded_entry,
)
from conformance.verdict.asserts import ClauseViolation, assert_equal, assert_same_content
from conformance.verdict.clauses import clause, count_examples
from conformance.verdict.status import not_runnable

from ._steps import assert_not_served

_ISO = "format_isolation"


@clause(_ISO)
def test_format_isolation(kv_store):
    if not active_format_twins():
        not_runnable(f"no two of the active kv_cache_dtypes "
                     f"{list(active_kv_cache_dtypes())} differ in format")
    check_format_isolation(kv_store)
    for n, twins in enumerate(model_dtype_twins()):
        try:
            assert_isolated(kv_store, *(seeded_entry(spec, seed=70 + 2 * n + i) for i, spec in enumerate(twins)))
        except AssertionError as exc:
            exc.add_note(f"in the explicit model-dtype twins under kv_cache_dtype=auto: {twins.first.model_dtype} "
                         f"and {twins.second.model_dtype} models' caches")
            raise


@count_examples
@given(twins=format_twins(), data=st.data())
def check_format_isolation(kv_store, twins, data):
    first, second = (KVEntry(spec, data.draw(bit_patterns(spec), label=f"content[{i}]"),
                             data.draw(scales, label=f"k_scale[{i}]"), data.draw(scales, label=f"v_scale[{i}]"))
                     for i, spec in enumerate(twins))
    assert_isolated(kv_store, first, second)


def assert_isolated(kv_store, first: KVEntry, second: KVEntry) -> None:
    """Twins under one key: neither is served for the other, and with both stored each reads its own."""
    key = fresh_key()
    kv_store.put(key, first)
    why = f"only {first.spec.describe()} was stored under that key"
    assert_not_served(kv_store, key, second.spec, clause=_ISO, why=why)
    assert_equal(f"contains({key!r}, {second.spec.describe()})", kv_store.contains(key, second.spec),
                 False, clause=_ISO, context=why)
    # Both formats under one key: each reader gets its own bytes.
    kv_store.put(key, second)
    for entry in (first, second):
        got = kv_store.get(key, entry.spec)
        if got is None:
            raise ClauseViolation(_ISO, f"get({entry.spec.describe()}) missed after both twins were stored")
        assert_equal("recorded spec", got.spec.describe(), entry.spec.describe(), clause=_ISO)
        assert_same_content(got.tensor, entry.tensor, tolerance=lossy_tolerance(kv_store),
                            element=entry.spec.element_format.torch_dtype, clause=_ISO,
                            context=f"{first.spec.kv_cache_dtype} and {second.spec.kv_cache_dtype} under one key")


_MISMATCH = "mismatch_rejection"


def _mismatched_tensor(spec: KVSpec, how: str) -> torch.Tensor:
    """A tensor that contradicts ``spec``: another dtype of the same shape, or another shape."""
    if how == "dtype":
        other = torch.float16 if spec.storage_dtype != torch.float16 else torch.bfloat16
        return torch.zeros(spec.layer_shape, dtype=other)
    shape = list(spec.layer_shape)
    shape[spec.block_dim] += 1  # one block more than the spec allocates
    return torch.zeros(shape, dtype=spec.storage_dtype)


@clause(_MISMATCH)
@given(entry=kv_entries(), how=st.sampled_from(["dtype", "shape"]))
def test_mismatch_rejection(kv_store, entry, how):
    bad = KVEntry(entry.spec, _mismatched_tensor(entry.spec, how), entry.k_scale, entry.v_scale)
    key = fresh_key()
    try:
        kv_store.put(key, bad)
    except REFUSALS:
        pass
    else:
        t = bad.tensor
        raise ClauseViolation(_MISMATCH, f"put accepted a {tuple(t.shape)} {t.dtype} tensor for spec "
                                         f"{entry.spec.describe()} (expects {entry.spec.layer_shape} "
                                         f"{entry.spec.storage_dtype}); it must refuse, never cast")
    assert_not_served(kv_store, key, entry.spec, clause=_MISMATCH, why="put of it was refused")
