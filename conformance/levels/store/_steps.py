"""Steps shared by the store clauses: put then get, and "must not be served"."""

from __future__ import annotations

from typing import Any

from conformance.contract.spec import KVSpec
from conformance.contract.store import REFUSALS, KVEntry
from conformance.contract.strategies import fresh_key
from conformance.verdict.asserts import ClauseViolation, assert_hit


def put_then_get(store: Any, entry: KVEntry, *, clause: str | None = None) -> KVEntry:
    """Put ``entry`` under a fresh key and get it back under the same spec."""
    __tracebackhide__ = True
    key = fresh_key()
    store.put(key, entry)
    return assert_hit(store.get(key, entry.spec), clause=clause, key=key, spec=entry.spec)


def assert_not_served(store: Any, key: str, spec: KVSpec, *, why: str, clause: str | None = None) -> None:
    """``get(key, spec)`` misses or refuses cleanly; it never returns an entry."""
    __tracebackhide__ = True
    try:
        got = store.get(key, spec)
    except REFUSALS:
        return
    if got is not None:
        raise ClauseViolation(f"get({key!r}, {spec.describe()}) returned an entry "
                              f"({got.spec.describe()}), but {why}", clause=clause)
