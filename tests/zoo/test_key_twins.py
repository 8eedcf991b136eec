"""The state machine's explicit key-twin runs flag a store that folds case or caps its keys
whatever the drawn runs met, and pass the reference stores (which must hash or keep long keys)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.contract.strategies import KEY_TWINS, pool_keys, sweep_entries
from conformance.levels.store.test_state_machine import explicit_failure, twins_run
from conformance.stores import file, memory
from conformance.zoo import case_folding, key_capped, key_truncating
from conformance.zoo._key_mapping import KeyMappingStore


class NameCapped(KeyMappingStore):
    """A file store's 255-byte file name, as a key cap."""

    def store_key(self, key: str) -> str:
        return key[:255]


def _found(store, twins) -> str | None:
    _, entry = sweep_entries()[0]
    return explicit_failure(store, entry.spec, twins_run(entry, twins), pool_keys(twins.shape, twins.names))


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
