"""The process-level watchdog: one call made in a forked child the caller supervises.

A connector's hooks run native code (torch ops, a vendor's transfer library, LMCache's C
extension); one that segfaults, calls ``os._exit`` or is taken by the OOM killer would end the
pytest process itself, and with it every later verdict and the results file. Made here, such a
death is an *Error* for the call that was running, with the exit status and the tail of what
the child printed, and the run goes on. A child that outlives its deadline is killed with its
whole process group (the thread watchdog in ``guard`` cannot stop a call that holds the GIL).

The child is forked (``util.forking``, as every child the suite forks), so it starts from the
caller's state (vLLM and torch imported, servers started) and changes none of it: what the call
returns, or raises, is pickled back.
"""

from __future__ import annotations

import io
import os
import pickle
import select
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from conformance.util.forking import describe_status, fork_child
from conformance.util.procs import kill_pgid
from conformance.verdict.guard import HarnessError, StoreTimeout

_OUTCOMES = (pytest.skip.Exception,)  # pytest's own outcomes: verdicts, not crashes

LOG_TAIL_LINES = 15
FAULT_LINES = 8  # of faulthandler's report of a fatal signal


class ChildDied(HarnessError):
    """The child died before it reported an outcome: no verdict could be reached."""


class ChildHung(StoreTimeout):
    """The child outlived its deadline and was killed."""


class Foreign(Exception):
    """An exception raised in the child that cannot be pickled back: its type name and words."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(message)
        self.type_name = type_name

    def __reduce__(self) -> Any:
        return (type(self), (self.type_name, str(self)))


@dataclass
class Outcome:
    """What a supervised call ended in: its value, or the exception ``unwrap`` raises."""

    value: Any = None
    exc: BaseException | None = None

    def unwrap(self) -> Any:
        if self.exc is not None:
            raise self.exc
        return self.value


_BEAT: list[Path] = []  # in a child: the file whose touch tells the parent it makes progress


def beat() -> None:
    """Tell the supervising parent, if any, that the call makes progress (a new step begins)."""
    if _BEAT:
        _BEAT[0].touch()


def call_forked(call: Callable[..., Any], *args: Any, name: str, deadline_s: float | None, log: Path,
                idle_s: float | None = None) -> Outcome:
    """``call(*args)`` in a forked child, its output in ``log`` (echoed to this process's stderr
    once it ends, where pytest captures it). Never raises for the child's sake: a death is a
    ChildDied outcome; a child past ``deadline_s``, or that went ``idle_s`` without a ``beat()``,
    a ChildHung one."""
    result = log.with_name(log.name + ".result")
    result.unlink(missing_ok=True)
    heartbeat = log.with_name(log.name + ".beat")
    heartbeat.touch()
    pid = fork_child(lambda: _child(call, args, heartbeat, result), log)
    try:
        status, why = _wait(pid, deadline_s, idle_s, heartbeat)
    except BaseException:  # interrupted: the child goes too
        kill_pgid(pid)
        raise
    kill_pgid(pid)  # whatever the call left running (a helper process) ends with it
    printed = log.read_text(errors="replace") if log.exists() else ""
    if printed:
        sys.stderr.write(printed)
    if status is None:
        return Outcome(exc=ChildHung(f"{name}: {why}, so its process was killed (raise --kv-timeout if it is "
                                     f"merely slow){_tail(printed)}"))
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and result.exists():
        kind, payload, child_traceback = _load(result)
        result.unlink()
        if kind == "raised":
            # A skip is a verdict the test reached (Not runnable, Disabled, ...), said in its own words.
            if child_traceback and hasattr(payload, "add_note") and not isinstance(payload, _OUTCOMES):
                payload.add_note(f"raised in the supervised child process:\n{child_traceback}")
            return Outcome(exc=payload)
        return Outcome(value=payload)
    return Outcome(exc=ChildDied(f"{name}: its process {describe_status(status)} before it returned: a crash "
                                 f"(a native library's segfault, os._exit, the OOM killer), not a verdict"
                                 f"{_tail(printed)}"))


def _tail(printed: str) -> str:
    """The last lines the child printed; for a fatal signal, the last lines before faulthandler's
    report and that report's first frames (the innermost: where it died)."""
    before, marker, report = printed.partition("Fatal Python error")
    lines = [line for line in before.splitlines() if line.strip()][-LOG_TAIL_LINES:]
    if marker:
        lines += (marker + report).splitlines()[:FAULT_LINES]
    return ("; its last lines:\n" + "\n".join(lines)) if lines else "; it printed nothing"


def _wait(pid: int, deadline_s: float | None, idle_s: float | None, heartbeat: Path) -> tuple[int | None, str]:
    """(the child's wait status, "") or, once it outlived ``deadline_s`` or went ``idle_s`` without
    touching ``heartbeat``, (None, why) with the child killed. Woken the moment the child exits
    (a pidfd), not at the next poll."""
    started = time.monotonic()
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux >= 5.3: poll
        pidfd = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status, ""
            now = time.monotonic()
            why = ""
            if deadline_s is not None and now - started > deadline_s:
                why = f"still running after {deadline_s:g}s"
            elif idle_s is not None and time.time() - heartbeat.stat().st_mtime > idle_s:
                why = f"no progress for {idle_s:g}s"
            if why:
                kill_pgid(pid)
                os.waitpid(pid, 0)
                return None, why
            if pidfd is not None:
                select.select([pidfd], [], [], 1.0)
            else:
                time.sleep(0.05)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _save(outcome: Any, path: Path) -> None:
    with open(path, "wb") as sink:
        _Pickler(sink, protocol=pickle.HIGHEST_PROTOCOL).dump(outcome)


def _load(path: Path) -> Any:
    return pickle.loads(path.read_bytes())


class _Pickler(pickle.Pickler):
    """Pickles any exception, whatever its constructor takes (pytest's Skipped, a connector's own):
    one that does not survive the plain round trip is rebuilt from its class, args and attributes
    without calling its constructor, or, if even that cannot travel, becomes a Foreign."""

    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, BaseException) or isinstance(obj, Foreign):
            return NotImplemented
        try:
            pickle.loads(pickle.dumps(obj))
            return NotImplemented
        except Exception:
            pass
        state = {k: v for k, v in vars(obj).items() if k != "__traceback__"}
        where = _class_path(type(obj))
        try:
            if where is None:
                raise TypeError("its class cannot be imported")
            _Pickler(io.BytesIO()).dump((where, obj.args, state))  # an exception inside it: the same rules
        except Exception:
            return (Foreign, (type(obj).__name__, str(obj)))
        return (_rebuild, (where, obj.args, state))


def _class_path(cls: type) -> tuple[str, str] | None:
    """Where ``cls`` can be imported from: pytest's outcome exceptions (Skipped, Failed, ...) claim
    to live in ``builtins``, for their display, but live in ``_pytest.outcomes``."""
    from importlib import import_module

    for module in (cls.__module__, "_pytest.outcomes"):
        try:
            if getattr(import_module(module), cls.__qualname__, None) is cls:
                return (module, cls.__qualname__)
        except ImportError:
            continue
    return None  # a class defined in a function: it cannot travel


def _rebuild(where: tuple[str, str], args: tuple, state: dict[str, Any]) -> BaseException:
    from importlib import import_module

    cls = getattr(import_module(where[0]), where[1])
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


def _child(call: Callable[..., Any], args: tuple, heartbeat: Path, result: Path) -> None:  # pragma: no cover
    """In the child (set up by ``fork_child``): the call, its outcome pickled to ``result``."""
    _BEAT[:] = [heartbeat]
    if "torch" in sys.modules:  # libgomp's pool does not survive a fork: the child's first parallel op would hang
        sys.modules["torch"].set_num_threads(1)
    try:
        outcome: tuple[str, Any, str] = ("returned", call(*args), "")
    except BaseException as exc:
        outcome = ("raised", exc, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    partial = result.with_name(result.name + ".partial")
    _save(outcome, partial)
    os.replace(partial, result)
