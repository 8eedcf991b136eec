"""Steps shared by the store clauses: put then get, "must not be served", and the explicit
examples every byte-level clause runs after its drawn ones, and the bit inversion that makes
every element of a tensor change."""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import torch

from conformance.contract.keys import fresh_key
from conformance.contract.spec import KVSpec
from conformance.contract.store import REFUSALS, KVEntry
from conformance.contract.strategies import DEEP_SIZE_LIMITS, SIZE_LIMITS, sweep_entries
from conformance.verdict.asserts import ClauseViolation, assert_hit

# The integer dtype of each element width: a view of the same bits that bitwise ops accept.
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def invert_bits(tensor: torch.Tensor) -> None:
    """Invert every bit of ``tensor``'s elements in place: every element changes, whatever it held."""
    tensor.view(_BITS[tensor.element_size()]).bitwise_not_()


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


def every_dtype(*, kinds: Sequence[str] = ("contiguous",), sizes: bool = False,
                each: tuple[str, Sequence[Any]] | None = None,
                **fixed: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """After the drawn examples, the test's body once per ``kv_cache_dtype`` of the axis and, with
    ``sizes``, once at and past each payload size limit (``sweep_entries``): derandomized draws
    can miss a dtype (an e5m2 NaN-payload bug escaped that way) and never reach megabytes.
    ``fixed`` gives the body's other drawn arguments; ``each`` (a name and its values) runs every
    entry once per value (every kind of damage, not the few the draws pick). Apply it between
    ``@clause`` and ``@given``."""

    def decorate(test: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(test)
        def swept(*args: Any, **kwargs: Any) -> None:
            from hypothesis import settings

            test(*args, **kwargs)
            deep = settings.get_current_profile_name() in ("deep", "certify")
            limits = (DEEP_SIZE_LIMITS if deep else SIZE_LIMITS) if sizes else ()
            body = swept.hypothesis.inner_test  # type: ignore[attr-defined]  # counted by @clause
            name, values = each or ("", [None])
            for label, entry in sweep_entries(kinds=kinds, limits=limits):
                for value in values:
                    varied = {name: value} if each else {}
                    try:
                        body(*args, entry=entry, **fixed, **varied, **kwargs)
                    except AssertionError as exc:
                        if hasattr(exc, "add_note"):
                            exc.add_note(f"in the explicit example {label}{f', {name}={value}' if each else ''} "
                                         "(every dtype and size limit runs once)")
                        raise

        return swept

    return decorate
