"""The process-level watchdog: a call that returns, raises, dies or hangs in its child process
ends as an Outcome in the caller, whose own process goes on."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from conformance.verdict.forked import ChildDied, ChildHung, Foreign, call_forked


def run(call, *args, deadline_s=30.0, tmp_path):
    return call_forked(call, *args, name="the call", deadline_s=deadline_s, log=tmp_path / "child.log")


def test_a_value_comes_back(tmp_path):
    assert run(lambda a, b: {"sum": a + b}, 2, 3, tmp_path=tmp_path).unwrap() == {"sum": 5}


def test_an_exception_comes_back_with_the_childs_traceback(tmp_path):
    def fails():
        raise KeyError("missing")

    outcome = run(fails, tmp_path=tmp_path)
    with pytest.raises(KeyError, match="missing") as caught:
        outcome.unwrap()
    assert "raised in the supervised child process" in "\n".join(getattr(caught.value, "__notes__", []))


def test_an_exception_that_cannot_be_pickled_keeps_its_type_name_and_words(tmp_path):
    class Local(Exception):  # a class pickle cannot find by name
        pass

    def fails():
        raise Local("held a lock")

    with pytest.raises(Foreign, match="held a lock") as caught:
        run(fails, tmp_path=tmp_path).unwrap()
    assert caught.value.type_name == "Local"


@pytest.mark.parametrize("die, says", [
    (lambda: os._exit(139), "exited with status 139"),
    (lambda: os.kill(os.getpid(), signal.SIGSEGV), "killed by SIGSEGV (signal 11)"),
    (lambda: os.kill(os.getpid(), signal.SIGKILL), "the OOM killer sends SIGKILL"),
])
def test_a_death_is_an_error_with_the_exit_status_and_what_it_printed(tmp_path, die, says):
    def dies():
        print("loading block 7 from the transfer engine", flush=True)
        die()

    outcome = run(dies, tmp_path=tmp_path)
    assert isinstance(outcome.exc, ChildDied)
    assert says in str(outcome.exc) and "loading block 7 from the transfer engine" in str(outcome.exc)


def test_a_hang_is_killed_at_the_deadline_with_what_it_started(tmp_path):
    def hangs():
        pid = os.fork()  # a helper process of its own: it goes with the group
        if pid == 0:
            time.sleep(600)
        (tmp_path / "helper").write_text(str(pid))
        threading.Event().wait()

    started = time.monotonic()
    outcome = run(hangs, deadline_s=1.0, tmp_path=tmp_path)
    assert isinstance(outcome.exc, ChildHung) and "still running after 1s" in str(outcome.exc)
    assert time.monotonic() - started < 30
    helper = int((tmp_path / "helper").read_text())
    time.sleep(0.2)
    assert _state(helper) in (None, "Z"), "the hung call's helper process is still running"


def _state(pid: int) -> str | None:
    """A process's state letter (Z: dead, not yet reaped by whoever inherited it), None when gone."""
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0])
    except OSError:
        return None


def test_the_caller_state_is_untouched(tmp_path):
    seen = []
    run(seen.append, 1, tmp_path=tmp_path).unwrap()
    assert seen == []


class NeedsTwo(Exception):
    def __init__(self, phase, inner):  # a constructor pickle cannot call with the message alone
        super().__init__(f"{phase}: {inner}")
        self.phase = phase


@pytest.mark.parametrize("raise_it, kind, says", [
    (lambda: pytest.skip("not in --kv-cache-dtypes"), pytest.skip.Exception, "not in --kv-cache-dtypes"),
    (lambda: (_ for _ in ()).throw(NeedsTwo("register_kv_caches", "bad stride")), NeedsTwo, "bad stride"),
])
def test_exceptions_of_any_constructor_come_back_as_themselves(tmp_path, raise_it, kind, says):
    with pytest.raises(kind, match=says):
        run(raise_it, tmp_path=tmp_path).unwrap()


def test_an_exception_holding_one_that_cannot_travel_keeps_its_own_type(tmp_path):
    class Local(Exception):
        pass

    def fails():
        exc = NeedsTwo("worker hooks", "a vendor's error")
        exc.inner = Local("its own words")  # as ConnectorRaised holds what the connector raised
        raise exc

    with pytest.raises(NeedsTwo) as caught:
        run(fails, tmp_path=tmp_path).unwrap()
    assert isinstance(caught.value.inner, Foreign) and caught.value.inner.type_name == "Local"
    assert str(caught.value.inner) == "its own words"
