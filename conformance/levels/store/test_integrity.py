"""Integrity clauses: damaged bytes at rest are reported, never served as KV."""

from hypothesis import currently_in_test_context, given, reject
from hypothesis import strategies as st

from conformance.contract.keys import fresh_key
from conformance.contract.store import DAMAGE_KINDS, FIRST_DAMAGE_KINDS, REFUSALS, logical_bytes
from conformance.contract.strategies import kv_entries
from conformance.levels.store._steps import every_dtype
from conformance.verdict.asserts import ClauseViolation
from conformance.verdict.clauses import clause

_CLAUSE = "corruption_detected"


# After the drawn examples, every kind of damage on every swept entry: a check that catches a damaged
# byte only some of the time (a checksum compared with < instead of !=) meets more than one flip.
@clause(_CLAUSE)
@every_dtype(each=("how", DAMAGE_KINDS))
@given(entry=kv_entries(), how=st.sampled_from(DAMAGE_KINDS))
def test_corruption_detected(kv_store, entry, how):
    key = fresh_key()
    kv_store.put(key, entry)
    try:
        kv_store.damage(key, entry.spec, how)
    except ValueError:
        if how in FIRST_DAMAGE_KINDS:
            raise
        # a hook written before this kind of damage was asked for: not drawn (nor swept) for it
        if currently_in_test_context():
            reject()
        return
    try:
        got = kv_store.get(key, entry.spec)
    except REFUSALS:
        return
    if got is not None and logical_bytes(got.tensor) != logical_bytes(entry.tensor):
        raise ClauseViolation(_CLAUSE, f"after damage ({how}) at rest, get returned different bytes "
                                       f"without an error, for {entry.spec.describe()}")
