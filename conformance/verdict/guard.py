"""A watchdog around the implementation under test (a store, a connector): a hung call becomes an
*Error*, never a hung CI.

Every call runs on a daemon thread and is awaited with a timeout. A call that times out
leaves its thread stuck (Python cannot kill it), so the store is marked hung and every later
call fails at once with the name of the call that hung: the run finishes, the report says
where, and the stuck daemon thread does not keep the interpreter from exiting.
"""

from __future__ import annotations

import threading
from typing import Any, Callable


class HarnessError(Exception):
    """The suite could not reach a verdict (hang, crash, infrastructure): reported as *Error*."""


class StoreTimeout(HarnessError):
    pass


class Guarded:
    """Forwards attribute access to ``target``; calls to its methods are timed out."""

    noun = "object"

    def __init__(self, target: Any, *, name: str, timeout_s: float, noun: str | None = None,
                 on_call: Callable[[], None] | None = None) -> None:
        self.noun = noun or self.noun
        self._target = target
        self._name = name
        self._timeout_s = timeout_s
        self._on_call = on_call  # told before each call (a supervising process's heartbeat)
        self._hung: str | None = None

    @property
    def inner(self) -> Any:
        return self._target

    def __getattr__(self, attr: str) -> Any:
        target = getattr(self._target, attr)
        if not callable(target):
            return target

        def guarded(*args: Any, **kwargs: Any) -> Any:
            return self._call(attr, target, args, kwargs)

        return guarded

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """Call the target itself (a constructor, a factory) under the timeout."""
        return self._call("__call__", self._target, args, kwargs)

    def _call(self, attr: str, target: Any, args: tuple, kwargs: dict) -> Any:
        outcome: list[Any] = []
        if self._on_call is not None:
            self._on_call()
        if self._hung is None:
            worker = threading.Thread(target=_capture, args=(outcome, target, args, kwargs),
                                      name=f"kvconform-store-{attr}", daemon=True)
            worker.start()
            worker.join(self._timeout_s)
            if not outcome:
                self._hung = (f"{attr}() after {self._timeout_s:g}s (raise --kv-timeout if the {self.noun} "
                              "is merely slow)")
        if self._hung is not None:
            # One raise site, so Hypothesis sees the same failure on every replay.
            raise StoreTimeout(f"{self._name}.{attr}: the {self.noun} hung in {self._hung}; "
                               "no later call is attempted")
        ok, value = outcome[0]
        if not ok:
            raise value
        return value



class GuardedStore(Guarded):
    noun = "store"

    def __init__(self, store: Any, *, name: str, timeout_s: float) -> None:
        super().__init__(store, name=name, timeout_s=timeout_s)
        self.capabilities = frozenset(store.capabilities)

    def close(self) -> None:
        if self._hung is None:
            self._call("close", self._target.close, (), {})


def call_within(timeout_s: float, name: str, call: Any, *args: Any) -> Any:
    """``call(*args)`` in this thread, as vLLM makes it (a connector's constructor may install a
    signal handler, which only the main thread can): past ``timeout_s`` a SIGALRM interrupts it
    with StoreTimeout. Off the main thread, where no alarm can be set, it runs on a watched thread."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        return Guarded(call, name=name, timeout_s=timeout_s).call(*args)

    def expire(signum: int, frame: Any) -> None:
        raise StoreTimeout(f"{name}: did not return within {timeout_s:g}s (raise --kv-timeout if it is merely slow)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return call(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _capture(outcome: list[Any], target: Any, args: tuple, kwargs: dict) -> None:
    try:
        outcome.append((True, target(*args, **kwargs)))
    except BaseException as exc:  # re-raised in the caller's thread
        outcome.append((False, exc))
