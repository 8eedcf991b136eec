"""A watchdog around the store under test: a hung call becomes an *Error*, never a hung CI.

Every call runs on one worker thread and is awaited with a timeout. A call that times out
leaves its thread stuck, so the store is marked hung and every later call fails at once with
the name of the call that hung: the run finishes, and the report says where.
"""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any


class HarnessError(Exception):
    """The suite could not reach a verdict (hang, crash, infrastructure): reported as *Error*."""


class StoreTimeout(HarnessError):
    pass


class GuardedStore:
    """Forwards attribute access to ``store``; calls to its methods are timed out."""

    def __init__(self, store: Any, *, name: str, timeout_s: float) -> None:
        self._store = store
        self._name = name
        self._timeout_s = timeout_s
        self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvconform-store")
        self._hung: str | None = None
        self.capabilities = frozenset(store.capabilities)

    @property
    def inner(self) -> Any:
        return self._store

    def __getattr__(self, attr: str) -> Any:
        target = getattr(self._store, attr)
        if not callable(target):
            return target

        def guarded(*args: Any, **kwargs: Any) -> Any:
            return self._call(attr, target, args, kwargs)

        return guarded

    def _call(self, attr: str, target: Any, args: tuple, kwargs: dict) -> Any:
        if self._hung is not None:
            raise StoreTimeout(f"{self._name}.{attr} not attempted: the store hung earlier in "
                               f"{self._hung} and cannot be trusted")
        future = self._pool.submit(target, *args, **kwargs)
        try:
            return future.result(timeout=self._timeout_s)
        except cf.TimeoutError:
            self._hung = f"{attr}()"
            raise StoreTimeout(f"{self._name}.{attr} did not return within {self._timeout_s:g}s "
                               "(raise --kv-timeout if the store is merely slow)") from None

    def close(self) -> None:
        try:
            if self._hung is None:
                self._call("close", self._store.close, (), {})
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)
