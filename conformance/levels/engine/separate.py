"""Engines that are really separate processes: what a cell's second engine differs from its first in.

Two ``vllm serve`` processes started apart share nothing a process draws for itself: above all
Python's hash seed (``PYTHONHASHSEED`` unset: each interpreter draws its own, so ``hash()`` of a str
or bytes differs between them), the interpreter's random state and the PID. A cell forks its engines
from a warm host (``host.py``), and forks share the host's hash seed: a connector that keys its
storage by ``hash()`` would find across forks what it never finds across two real processes. So the
engines that read what another engine stored (``SECOND`` in ``cell.py``: the cross-engine load
roles and the P/D consumer) run in another interpreter, started with another hash seed: a host of
their own, or fresh processes, each given a seed the suite draws (``draw_seed``).

Python reads ``PYTHONHASHSEED`` once, at interpreter start; vLLM reads it again when an engine
starts (``vllm.v1.core.kv_cache_utils.init_none_hash``, called by the engine core: it derives
``NONE_HASH``, the seed of every block hash, from ``PYTHONHASHSEED`` when it is set, else from a
fixed seed under sha256, the default, or random bytes per process under xxhash). A separately
started ``vllm serve`` has none set, so a seed the suite drew is taken out of the environment as
soon as the interpreter has read it (``settle``): vLLM sees what it sees in production. A seed the
connector *declares* (``--kv-engine-env PYTHONHASHSEED=0``, for a connector whose documentation
requires one) is the deployment's own: every engine runs with it, and vLLM sees it too.

Random state: CPython reseeds ``random`` in a forked child itself; ``after_fork`` gives numpy's
global generator fresh entropy and torch's default generator its initial seed, as a fresh
interpreter has them (vLLM then seeds all three from the engine's ``seed`` anyway).
"""

from __future__ import annotations

import os
import secrets
from typing import Any, Collection, Mapping

HASH_SEED = "PYTHONHASHSEED"
DRAWN = "KVCONFORM_DRAWN_HASH_SEED"  # set beside a PYTHONHASHSEED the suite drew: vLLM must not see it
FIRST, SECOND = "first", "second"  # a cell's two interpreters: the engines that store, those that load
SIDES = (FIRST, SECOND)  # in the order a matrix runner hands their hosts over
# The capabilities of the clauses that run an engine in the SECOND interpreter (a connector that
# declares neither runs every engine in the first).
CROSS_ENGINE = frozenset({"persistent", "pd"})

_UNREAD: Any = object()
_started_with: Any = _UNREAD  # the PYTHONHASHSEED this interpreter started with (``settle``)


def draw_seed(avoid: Collection[str] = ()) -> str:
    """A hash seed for an interpreter, as Python draws one (not 0, which turns hashing's key off),
    never one in ``avoid``."""
    while True:
        seed = str(secrets.randbelow(2**32 - 1) + 1)
        if seed not in avoid:
            return seed


def interpreter_env(seed: str, declared: Mapping[str, str]) -> dict[str, str]:
    """The environment an engine interpreter (a host, or a fresh engine process) is started with:
    the connector's ``declared`` environment, and the drawn ``seed`` unless it declares one."""
    if HASH_SEED in declared:
        return dict(declared)
    return {**declared, HASH_SEED: seed, DRAWN: seed}


def seed_of(env: Mapping[str, str]) -> str | None:
    """The hash seed an interpreter started with ``env`` runs with."""
    return env.get(HASH_SEED)


def settle() -> None:
    """In an engine interpreter, before vLLM is imported: remember the hash seed it started with and
    take a seed the suite drew out of the environment (vLLM would derive its block hashes from it;
    a separately started ``vllm serve`` has none). A forked child keeps its host's record."""
    global _started_with
    if _started_with is _UNREAD:
        _started_with = os.environ.get(HASH_SEED)
    if os.environ.pop(DRAWN, None) is not None:
        os.environ.pop(HASH_SEED, None)


def started_with() -> str | None:
    """The hash seed this interpreter runs with (None: Python drew it, or ``settle`` has not run)."""
    return None if _started_with is _UNREAD else _started_with


def after_fork() -> None:
    """In an engine forked from a host: the random state a fresh interpreter starts with (numpy's
    global generator from entropy, torch's default generator at its initial seed; CPython reseeds
    ``random`` in a fork itself). Only what the host imported; a module without these calls (a
    stand-in) is left as it is."""
    import sys

    reseed = getattr(getattr(sys.modules.get("numpy"), "random", None), "seed", None)
    if callable(reseed):
        reseed()
    torch = sys.modules.get("torch")
    initial, manual = getattr(torch, "initial_seed", None), getattr(torch, "manual_seed", None)
    if callable(initial) and callable(manual):
        manual(initial())


def identity() -> dict[str, Any]:
    """What makes this engine process itself, for its result: its PID, the hash seed its interpreter
    runs with (None: drawn by Python), a probe of ``hash()`` and vLLM's ``NONE_HASH`` (set once an
    engine started), each short: enough to tell two engines apart, nothing to recover a seed from."""
    found: dict[str, Any] = {"pid": os.getpid(), "hash_seed": started_with(),
                             "hash_probe": f"{hash(b'kvconform') & 0xFFFFFFFF:08x}"}
    try:
        from vllm.v1.core import kv_cache_utils

        none_hash = getattr(kv_cache_utils, "NONE_HASH", None)
        if isinstance(none_hash, bytes):
            found["none_hash"] = none_hash[:4].hex()
    except Exception:  # a release without it: nothing to record
        pass
    return found
