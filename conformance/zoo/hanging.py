"""Not a conformance bug but a harness fault: ``get`` never returns. Must end as Error."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from conformance.contract.spec import KVSpec
from conformance.contract.store import KVEntry
from conformance.stores.memory import MemoryStore

_NEVER = threading.Event()


class HangingStore(MemoryStore):
    def get(self, key: str, spec: KVSpec) -> KVEntry | None:
        _NEVER.wait()  # a dead server: the call blocks forever
        return None


def make_store(workdir: Path | None = None, **_: Any) -> HangingStore:
    return HangingStore()
