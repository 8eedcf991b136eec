"""The stateful clause: any sequence of operations agrees with a plain dict.

Keys come from a small pool so that overwrites, deletes of absent keys and gets after delete
all happen. Each machine run draws its pool (``pool_keys``) on the shared store in the next of
the real key shapes (a chunk hash, LMCache's composite key, a long path, LMCache's layerwise key
under a model path of 256 and of 1024 bytes): the pool's keys differ only in their last
character, as real keys sharing a long prefix do, and two of them only in its case.

After the drawn runs, one explicit run per ``kv_cache_dtype`` of the axis: put, overwrite with every
bit inverted and other scales, get, contains (and delete, get, contains). Drawn contents are mostly
zeros, so a drawn overwrite often puts the bytes the key already held, and a store that keeps the
first put under a key (LMCache's LocalCPU and LocalDisk backends) passed or failed by the seed.
Then one explicit run per pair of key twins (``KEY_TWINS``: keys that differ only in case, keys of
256 and of 1024 bytes that differ only in their last character; ``key_field_twins``: for every field
of LMCache's layerwise key, early, middle and late, keys of 110, 256 and 1024 bytes that differ only
in that field's middle character or in all of it): each twin put, with other bytes, each read back
(and one deleted, the other still there). Whether a drawn run meets both twins depends on its draws;
a store that folds case, caps, elides or parses its keys must fail whatever they were.
"""

from __future__ import annotations

import itertools
from typing import Callable, Mapping

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from conformance.contract.keys import KEY_NAMES, KEY_SHAPES, KEY_TWINS, FieldTwins, key_field_twins, pool_keys
from conformance.contract.spec import KVSpec
from conformance.contract.store import KVEntry, lossy_tolerance
from conformance.contract.strategies import bit_patterns, kv_specs, scales, small_entry, sweep_entries
from conformance.verdict import seeds
from conformance.verdict.asserts import ClauseViolation, assert_equal, assert_same_content, float_bits
from conformance.verdict.clauses import clause, count_example

from ._steps import invert_bits

_CLAUSE = "state_machine"
KEY_POOL = st.sampled_from(KEY_NAMES)
_RUNS = itertools.count()


class StoreMachine(RuleBasedStateMachine):
    def __init__(self, store, keys: Mapping[str, str] | None = None) -> None:
        super().__init__()
        count_example()
        self.store = store
        # Each run the next key shape: no draw of its own, so the runs' operations stay as drawn.
        self.keys = dict(keys) if keys is not None else pool_keys(KEY_SHAPES[next(_RUNS) % len(KEY_SHAPES)])
        self.model: dict[str, KVEntry] = {}
        self.spec: KVSpec | None = None

    @initialize(spec=kv_specs(max_blocks=1))
    def choose_spec(self, spec):
        self.spec = spec

    def _key(self, k: str) -> str:
        return self.keys[k]

    @rule(k=KEY_POOL, data=st.data())
    def put(self, k, data):
        self.put_entry(k, KVEntry(self.spec, data.draw(bit_patterns(self.spec, max_overrides=4), label="content"),
                                  data.draw(scales, label="k_scale"), data.draw(scales, label="v_scale")))

    def put_entry(self, k: str, entry: KVEntry) -> None:
        self.store.put(self._key(k), entry)
        self.model[k] = entry

    @rule(k=KEY_POOL)
    def get(self, k):
        got = self.store.get(self._key(k), self.spec)
        want = self.model.get(k)
        if want is None:
            if got is not None:
                raise ClauseViolation(_CLAUSE, f"get({k!r}) returned an entry, but the model has none "
                                               "(never put, or deleted)")
            return
        if got is None:
            raise ClauseViolation(_CLAUSE, f"get({k!r}) returned None, but the model holds an entry")
        assert_same_content(got.tensor, want.tensor, tolerance=lossy_tolerance(self.store),
                            element=self.spec.element_format.torch_dtype, clause=_CLAUSE,
                            context=f"get({k!r}) after the model's last put (overwrites replace)")
        if "scales" in self.store.capabilities:
            assert_equal("(k_scale, v_scale)", (float_bits(got.k_scale), float_bits(got.v_scale)),
                         (float_bits(want.k_scale), float_bits(want.v_scale)), clause=_CLAUSE,
                         context=f"get({k!r})")

    @rule(k=KEY_POOL)
    def contains(self, k):
        assert_equal(f"contains({k!r})", self.store.contains(self._key(k), self.spec), k in self.model,
                     clause=_CLAUSE)

    @precondition(lambda self: "delete" in self.store.capabilities)
    @rule(k=KEY_POOL)
    def delete(self, k):
        assert_equal(f"delete({k!r})", self.store.delete(self._key(k), self.spec), k in self.model,
                     clause=_CLAUSE, context="delete returns whether an entry was removed")
        self.model.pop(k, None)


def explicit_failure(store, spec: KVSpec, steps: Callable[[StoreMachine], None],
                     keys: Mapping[str, str] | None = None) -> str | None:
    """An explicit run (module doc): ``steps`` through the machine's own steps, so that its checks
    apply; what it found, if anything (returned, not raised: the clause's message names the run once)."""
    machine = StoreMachine(store, keys)
    machine.spec = spec
    try:
        steps(machine)
    except ClauseViolation as exc:
        return exc.detail
    return None


def _inverted(entry: KVEntry) -> KVEntry:
    """``entry`` with every bit inverted and other scales: every element and both scales differ."""
    changed = entry.tensor.clone()
    invert_bits(changed)
    return KVEntry(entry.spec, changed, entry.k_scale * 2, entry.v_scale * 2 + 1)


def overwrite_run(entry: KVEntry) -> Callable[[StoreMachine], None]:
    def steps(machine: StoreMachine) -> None:
        machine.put_entry("a", entry)
        machine.put_entry("a", _inverted(entry))
        machine.get("a")
        machine.contains("a")
        if "delete" in machine.store.capabilities:
            machine.delete("a")
            machine.get("a")
            machine.contains("a")
    return steps


def twins_run(entry: KVEntry, names: tuple[str, str]) -> Callable[[StoreMachine], None]:
    first, second = names

    def steps(machine: StoreMachine) -> None:
        machine.put_entry(first, entry)
        machine.put_entry(second, _inverted(entry))
        for name in (first, second):
            machine.get(name)
            machine.contains(name)
        if "delete" in machine.store.capabilities:
            machine.delete(first)
            machine.get(second)
            machine.contains(first)
    return steps


def _twins_label(keys: Mapping[str, str]) -> str:
    a, b = (f"'...{key[-20:]}'" for key in keys.values())
    return f"{a} and {b}, {len(next(iter(keys.values())))} bytes"


def _field_label(twins: FieldTwins) -> str:
    """Where the twins' keys differ, with a few characters around it."""
    a, b = twins.keys
    at = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    return f"'...{a[max(at - 12, 0):at + 12]}...' and '...{b[max(at - 12, 0):at + 12]}...' (at byte {at})"


@clause(_CLAUSE)
def test_state_machine(kv_store):
    def factory() -> StoreMachine:
        return StoreMachine(kv_store)

    seeds.register(factory, "state_machine")  # its draws follow from the clause, not this code
    run_state_machine_as_test(factory, settings=settings())
    for label, entry in sweep_entries():
        if (found := explicit_failure(kv_store, entry.spec, overwrite_run(entry))) is not None:
            raise ClauseViolation(_CLAUSE, f"{found} [the explicit overwrite run, {label}]")
    label, entry = sweep_entries()[0]
    for twins in KEY_TWINS:
        keys = pool_keys(twins.shape, twins.names)
        if (found := explicit_failure(kv_store, entry.spec, twins_run(entry, twins.names), keys)) is not None:
            raise ClauseViolation(_CLAUSE, f"{found} [the explicit run of {twins.why} ({_twins_label(keys)}), "
                                           f"{label}]")
    small = small_entry()
    for field_twins in key_field_twins():
        keys = dict(zip(("a", "b"), field_twins.keys))
        if (found := explicit_failure(kv_store, small.spec, twins_run(small, ("a", "b")), keys)) is not None:
            raise ClauseViolation(_CLAUSE, f"{found} [the explicit run of {field_twins.why}: "
                                           f"{_field_label(field_twins)}]")
