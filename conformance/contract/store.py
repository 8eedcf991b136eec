"""The store protocol: the small surface every KV store under test implements.

A store keeps *entries*: one layer's paged KV tensor together with the spec that says what
its bytes are and the ``k_scale``/``v_scale`` that were in force when it was written. Keys
are opaque strings (a real connector derives them from token hashes); the *spec* is passed
on every ``get`` so that a store can never be excused for serving bytes of another format
under the same key.

Minimal implementation::

    class MyStore:
        capabilities = frozenset({"scales", "delete"})
        def put(self, key: str, entry: KVEntry) -> None: ...
        def get(self, key: str, spec: KVSpec) -> KVEntry | None: ...
        def contains(self, key: str, spec: KVSpec) -> bool: ...
        def delete(self, key: str, spec: KVSpec) -> bool: ...   # with "delete"
        def close(self) -> None: ...

    def make_store(workdir: pathlib.Path) -> MyStore: ...

and run ``pytest --pyargs conformance --kv-store mypkg.mymod:make_store``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from conformance.contract.spec import KVSpec
from conformance.verdict.status import NotRunnable

# What a store may claim. A clause that needs a capability the store does not claim is
# reported Disabled, never Fail.
CAPABILITIES: dict[str, str] = {
    "scales": "records each entry's k_scale/v_scale and returns them on get",
    "delete": "implements delete(key, spec)",
    "at_rest": "keeps bytes at rest that can be damaged; implements damage(key, spec, how)",
    "lossy": "declares its round trip lossy (e.g. a quantizing serde), with the relative RMS error it keeps within "
             "as ``lossy_tolerance``: byte-exact clauses are Disabled, the others compare values within it",
}

def lossy_tolerance(store: Any) -> float | None:
    """The relative RMS error a store that declares itself lossy keeps its round trip within (its
    ``lossy_tolerance``, checked when it was loaded); None for a lossless store: bytes, exactly."""
    return float(store.lossy_tolerance) if "lossy" in store.capabilities else None


# How the at_rest hook is asked to damage an entry: its last element cut, its last byte's low bit
# flipped, its first byte's low bit flipped (a header, a length, a magic), its second half gone (a full
# disk). A hook written for the first two only may refuse the others (ValueError): they are not drawn then.
DAMAGE_KINDS = ("truncate", "flip", "flip_first", "halve")
FIRST_DAMAGE_KINDS = ("truncate", "flip")


def damaged(blob: bytes, how: str, *, element_size: int = 1) -> bytes:
    """``blob`` as a disk or a network damages it.

    ``truncate`` drops the last element (``element_size`` bytes), ``flip`` flips the low bit of the
    last byte, ``flip_first`` that of the first; ``flip_middle`` inverts the middle byte, as
    bit rot or a torn write leaves a file whose layout the suite does not know; ``halve`` keeps the
    first half, cut mid-tensor, as a full disk leaves it.
    """
    data = bytearray(blob)
    if how == "truncate":
        del data[len(data) - max(1, element_size):]
    elif how == "flip":
        data[-1] ^= 0x01
    elif how == "flip_first":
        data[0] ^= 0x01
    elif how == "flip_middle":
        data[len(data) // 2] ^= 0xFF
    elif how == "halve":
        del data[len(data) // 2:]
    else:
        raise ValueError(f"how={how!r}, but valid: {', '.join(DAMAGE_KINDS)}, flip_middle")
    return bytes(data)


class KVContractError(ValueError):
    """Raised by a store for an entry that contradicts its own spec (wrong dtype or shape)."""


class KVCorruptionError(RuntimeError):
    """Raised by a store whose bytes at rest are damaged (truncated, checksum mismatch)."""


# Raised by a store factory that cannot run here (an unsupported version, a missing platform): every
# clause is then *Not runnable* with its reason, a fact about the platform, not a crash. The suite's
# one NotRunnable, under the name store authors import.
StoreNotRunnable = NotRunnable


# How a store refuses cleanly: a miss (None) or one of these. Anything else (AttributeError,
# IndexError, struct.error, ...) is a crash, not a refusal.
REFUSALS: tuple[type[Exception], ...] = (KVContractError, KVCorruptionError, ValueError,
                                         LookupError, OSError)


@dataclass(frozen=True)
class KVEntry:
    """One layer's KV tensor, what it is, and the scales to read it with.

    The tensor may be any view (HND permutes, slices, storage offsets): a store must keep its
    *logical* content, as indexing reads it, not whatever its memory happens to hold.
    Scales travel with the entry, not the spec: they are values calibrated per checkpoint or
    at run time, and fp8 bytes read with the wrong scale are wrong numbers.
    """

    spec: KVSpec
    tensor: torch.Tensor
    k_scale: float = 1.0
    v_scale: float = 1.0

    def __repr__(self) -> str:
        t = self.tensor
        return (f"KVEntry({self.spec.describe()}, tensor={tuple(t.shape)} {t.dtype} "
                f"stride={t.stride()} offset={t.storage_offset()}, "
                f"k_scale={self.k_scale!r}, v_scale={self.v_scale!r})")


class KVStore(Protocol):
    """The store protocol (the README's five methods; ``delete`` only with the capability):
    the loader checks a factory's store against it."""

    capabilities: frozenset[str]

    def put(self, key: str, entry: KVEntry) -> None: ...

    def get(self, key: str, spec: KVSpec) -> KVEntry | None: ...

    def contains(self, key: str, spec: KVSpec) -> bool: ...

    def close(self) -> None: ...


def logical_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's logical content as raw bytes, in row-major order of its shape.

    This is what bit-exact means here: bytes, never ``==`` on floats (NaN != NaN, -0 == +0).
    """
    return tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()


def check_entry_matches_spec(entry: KVEntry) -> None:
    """Raise ``KVContractError`` unless the entry's tensor is what its spec says.

    Stores call this on ``put``: a tensor of the wrong dtype or shape is refused, never cast.
    """
    spec, t = entry.spec, entry.tensor
    if t.dtype != spec.storage_dtype:
        raise KVContractError(f"tensor dtype={t.dtype}, but spec {spec.describe()} stores "
                              f"{spec.storage_dtype}; refusing to cast")
    if tuple(t.shape) != spec.layer_shape:
        raise KVContractError(f"tensor shape={tuple(t.shape)}, but spec {spec.describe()} has "
                              f"layer shape {spec.layer_shape}")
    for name in ("k_scale", "v_scale"):
        value = getattr(entry, name)
        if not isinstance(value, float) or not math.isfinite(value) or value <= 0:
            raise KVContractError(f"{name}={value!r}, but scales must be positive finite floats")


def tensor_from_bytes(data: bytes, spec: KVSpec) -> torch.Tensor:
    """A contiguous tensor of ``spec``'s layer shape and storage dtype over ``data``."""
    if len(data) != spec.layer_nbytes:
        raise KVCorruptionError(f"payload is {len(data)} bytes, but {spec.describe()} needs "
                                f"{spec.layer_nbytes}")
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return raw.view(spec.storage_dtype).view(spec.layer_shape)
