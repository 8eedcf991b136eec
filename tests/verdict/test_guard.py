"""The watchdog: a call that never returns becomes an Error, in the thread vLLM would make it in."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from conformance.verdict.guard import StoreTimeout, call_within


def test_a_constructor_runs_in_the_main_thread_where_it_may_install_signal_handlers():
    def build() -> str:
        previous = signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGTERM))  # main thread only
        signal.signal(signal.SIGTERM, previous)
        return threading.current_thread().name

    assert call_within(5, "build", build) == threading.main_thread().name


def test_a_constructor_that_waits_forever_is_interrupted_at_the_deadline():
    before, started = signal.getsignal(signal.SIGALRM), time.monotonic()
    with pytest.raises(StoreTimeout, match="wait: did not return within 0.2s"):
        call_within(0.2, "wait", time.sleep, 30)
    assert time.monotonic() - started < 5
    assert signal.getsignal(signal.SIGALRM) == before  # the previous handler is back
