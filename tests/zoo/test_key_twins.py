"""The state machine's explicit key-twin runs flag a store that folds case or caps its keys
whatever the drawn runs met, and pass the reference stores (which must hash or keep long keys)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.contract.keys import KEY_FIELDS, KEY_TWINS, key_field_twins, key_fields, pool_keys
from conformance.contract.strategies import small_entry, sweep_entries
from conformance.levels.store.test_state_machine import explicit_failure, twins_run
from conformance.stores import file, memory
from conformance.zoo import case_folding, key_capped, key_truncating, middle_elided_key
from conformance.zoo._key_mapping import KeyMappingStore


class NameCapped(KeyMappingStore):
    """A file store's 255-byte file name, as a key cap."""

    def store_key(self, key: str) -> str:
        return key[:255]


def _found(store, twins) -> str | None:
    _, entry = sweep_entries()[0]
    return explicit_failure(store, entry.spec, twins_run(entry, twins.names), pool_keys(twins.shape, twins.names))


@pytest.mark.parametrize("make", [memory.make_store, file.make_store], ids=["memory", "file"])
def test_reference_stores_keep_every_twin_apart(make, tmp_path: Path):
    store = make(tmp_path)
    assert [_found(store, twins) for twins in KEY_TWINS] == [None] * len(KEY_TWINS)


@pytest.mark.parametrize("store, flagged", [
    (case_folding.make_store(), {"two keys that differ only in letter case"}),
    (key_capped.make_store(), {t.why for t in KEY_TWINS if "bytes" in t.why}),
    (NameCapped(), {t.why for t in KEY_TWINS if "bytes" in t.why}),
    (key_truncating.make_store(), {t.why for t in KEY_TWINS}),
], ids=["case_folding", "key_capped", "name_capped_255", "key_truncating"])
def test_key_mapping_stores_are_flagged_by_their_twins(store, flagged):
    found = {twins.why: _found(store, twins) for twins in KEY_TWINS}
    assert {why for why, what in found.items() if what is not None} == flagged, found


def test_field_twins_differ_in_their_field_alone_at_their_length():
    twins = key_field_twins()
    assert {t.field for t in twins} == set(KEY_FIELDS)
    for t in twins:
        a, b = (key.split("@") for key in t.keys)
        i = KEY_FIELDS.index(t.field)
        assert len(a) == len(b) == len(KEY_FIELDS) and a[i] != b[i] and a[:i] + a[i + 1:] == b[:i] + b[i + 1:], t
        assert len(t.keys[0]) == len(t.keys[1]), t
        if t.change == "one character":
            assert sum(x != y for x, y in zip(*t.keys)) == 1, t
    assert {len(t.keys[0]) for t in twins} == {len("@".join(key_fields())), 256, 1024}


def _field_found(store) -> dict[str, str]:
    small = small_entry()
    found = {}
    for t in key_field_twins():
        what = explicit_failure(store, small.spec, twins_run(small, ("a", "b")), dict(zip("ab", t.keys)))
        if what is not None:
            found[t.why] = what
    return found


@pytest.mark.parametrize("make", [memory.make_store, file.make_store], ids=["memory", "file"])
def test_reference_stores_keep_every_field_twin_apart(make, tmp_path: Path):
    assert _field_found(make(tmp_path)) == {}


def test_a_store_that_elides_the_middle_of_long_keys_is_flagged_only_by_a_middle_field_of_a_long_key():
    found = _field_found(middle_elided_key.make_store())
    assert found and all("1024 bytes" in why and "model" in why for why in found), found
    # The twins of before (the end, the case) never met it: every one passes.
    assert [_found(middle_elided_key.make_store(), twins) for twins in KEY_TWINS] == [None] * len(KEY_TWINS)
