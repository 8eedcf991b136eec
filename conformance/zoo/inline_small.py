"""Keeps values under 4 KiB inline in its index, whose rows hold 2,000 bytes, and zero-fills the
rest on read (an inline-value optimisation with the row limit of the database under it): every
entry of 4 KiB and more is stored whole, but the smallest real entry, one KV head of 64 per rank,
16 fp8 tokens (2,048 bytes), loses its last 48."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.zoo.value_capped import ValueCappedStore

INLINE_BELOW = 4096
ROW_BYTES = 2000


class InlineSmallStore(ValueCappedStore):
    """A value capped only when it is small: the rest of a small value reads back as zeros."""

    def kept(self, data: bytes) -> bytes:
        return data[:ROW_BYTES] if len(data) < INLINE_BELOW else data


def make_store(workdir: Path | None = None, **_: Any) -> InlineSmallStore:
    return InlineSmallStore()
