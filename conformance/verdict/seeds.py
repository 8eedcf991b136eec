"""Seeds from what a test means, not from how it is written.

Under a derandomized profile (ci, certify) Hypothesis seeds a test from a hash of its source, so
editing a clause's body, even a comment, changes what it draws and can change a published verdict.
Every ``@given`` function the suite runs is registered here under a stable name (a clause test under
its clause id, a helper under its module and qualified name), and when a derandomized profile is
loaded each gets a seed derived from that name and the profile: ``hypothesis.seed`` takes precedence
over derandomize. Under a random profile (dev, deep) the seeds are cleared and Hypothesis draws anew.
"""

from __future__ import annotations

import hashlib
import weakref
from typing import Any, Callable

# Each registered function -> its name (a state machine's factory is registered anew for each run).
_REGISTERED: weakref.WeakKeyDictionary[Callable[..., Any], str] = weakref.WeakKeyDictionary()
_ATTRIBUTE = "_hypothesis_internal_use_seed"  # what hypothesis.seed sets, read when the test runs
_active: str | None = None  # the derandomized profile whose seeds are set, if any


def seed_for(name: str, profile: str) -> int:
    """The seed of the test called ``name`` under ``profile``: the same for every edit of its body."""
    return int.from_bytes(hashlib.sha256(f"kvconform:{profile}:{name}".encode()).digest()[:8], "big")


def register(test: Callable[..., Any], name: str) -> None:
    """Seed ``test`` (a ``@given`` function, or a state machine's factory) by ``name`` from now on."""
    _REGISTERED[test] = name
    _set(test, name)


def apply(profile: str, derandomized: bool) -> None:
    """Seed every registered test for ``profile`` if it is derandomized, else clear the seeds."""
    global _active
    _active = profile if derandomized else None
    for test, name in list(_REGISTERED.items()):
        _set(test, name)


def _set(test: Callable[..., Any], name: str) -> None:
    seed = seed_for(name, _active) if _active is not None else None
    for target in _chain(test):
        setattr(target, _ATTRIBUTE, seed)


def _chain(test: Callable[..., Any]) -> list[Callable[..., Any]]:
    """``test`` and the functions it wraps (``functools.wraps``), down to Hypothesis' own wrapper,
    which is where Hypothesis reads the seed."""
    found = [test]
    while hasattr(found[-1], "__wrapped__") and found[-1].__wrapped__ not in found:
        found.append(found[-1].__wrapped__)
    return found
