"""Pressure without declaration: every store meets more puts than a small cache holds, whether it
declares a capacity or not, and is read back oldest first. A bounded store may have evicted what
is read (a miss); what it serves is the entry's bytes, and contains agrees with get. The first read
comes after 1,048 other puts: no other clause reads an entry that far from its put."""

from __future__ import annotations

from conformance.contract.keys import fresh_key
from conformance.contract.store import lossy_tolerance
from conformance.contract.strategies import MiB, sized_entry, small_entry
from conformance.verdict.asserts import ClauseViolation, assert_same_content
from conformance.verdict.clauses import clause, count_example

_CLAUSE = "long_reuse_distance"
SMALL_PUTS = 1000  # entries of the smallest real size (2 KiB)
LARGE_PUTS = 48  # then entries of 1 MiB: 50 MiB in all, past a cache of 32 MiB
SMALL_STRIDE, LARGE_STRIDE = 25, 4  # which are read back: 40 small and 12 large, oldest first


def _read(store, key: str, entry, distance: int, tolerance: float | None) -> bool:
    """Whether ``key`` hit; a hit's bytes are ``entry``'s, and contains agrees with get."""
    count_example()
    held = store.contains(key, entry.spec)
    got = store.get(key, entry.spec)
    where = f"the entry put {distance} puts before this read ({entry.spec.layer_nbytes} bytes)"
    if got is None:
        if held:
            raise ClauseViolation(_CLAUSE, f"contains said True but get returned None, for {where}")
        return False
    if not held:
        raise ClauseViolation(_CLAUSE, f"get returned an entry but contains said False, for {where}")
    assert_same_content(got.tensor, entry.tensor, tolerance=tolerance, element=entry.spec.element_format.torch_dtype,
                        clause=_CLAUSE, context=f"get of {where}: a bounded store may miss, never serve other bytes")
    return True


@clause(_CLAUSE)
def test_long_reuse_distance(kv_store):
    tolerance = lossy_tolerance(kv_store)
    puts = []  # (key, entry) in put order
    for i in range(SMALL_PUTS):
        puts.append((fresh_key(), small_entry(seed=1000 + i)))
    for i in range(LARGE_PUTS):
        puts.append((fresh_key(), sized_entry(MiB, seed=5000 + i)))
    newest = (fresh_key(), small_entry(seed=9999))
    puts.append(newest)
    for key, entry in puts:
        kv_store.put(key, entry)
    reads = [*range(0, SMALL_PUTS, SMALL_STRIDE), *range(SMALL_PUTS, SMALL_PUTS + LARGE_PUTS, LARGE_STRIDE)]
    for index in reads:
        key, entry = puts[index]
        _read(kv_store, key, entry, distance=len(puts) - 1 - index, tolerance=tolerance)
    key, entry = newest
    if not _read(kv_store, key, entry, distance=0, tolerance=tolerance):
        raise ClauseViolation(_CLAUSE, f"the newest entry ({entry.spec.layer_nbytes} bytes), put last, missed after "
                                       f"{len(reads)} reads: a bounded store degrades to misses, never to holding nothing")
