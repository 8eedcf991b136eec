"""Integrity clauses: damaged bytes at rest are reported, never served as KV."""

from hypothesis import given, reject
from hypothesis import strategies as st

from conformance.contract.keys import fresh_key
from conformance.contract.store import DAMAGE_KINDS, FIRST_DAMAGE_KINDS, REFUSALS, logical_bytes
from conformance.contract.strategies import kv_entries
from conformance.verdict.asserts import ClauseViolation
from conformance.verdict.clauses import clause

_CLAUSE = "corruption_detected"


@clause(_CLAUSE)
@given(entry=kv_entries(), how=st.sampled_from(DAMAGE_KINDS))
def test_corruption_detected(kv_store, entry, how):
    key = fresh_key()
    kv_store.put(key, entry)
    try:
        kv_store.damage(key, entry.spec, how)
    except ValueError:
        if how in FIRST_DAMAGE_KINDS:
            raise
        reject()  # a hook written before this kind of damage was asked for: not drawn for it
    try:
        got = kv_store.get(key, entry.spec)
    except REFUSALS:
        return
    if got is not None and logical_bytes(got.tensor) != logical_bytes(entry.tensor):
        raise ClauseViolation(_CLAUSE, f"after damage ({how}) at rest, get returned different bytes "
                                       f"without an error, for {entry.spec.describe()}")
