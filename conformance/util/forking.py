"""Children forked from a process that already did the expensive part (imported vLLM, LMCache, or
reached a clause's state): the one mechanism behind the engine host, LMCache's fork server and the
forked clause runner.

A child is set up the same way wherever it is forked (``fork_child``): its own process group (set
on both sides of the fork, so the group can be killed before the child ran a line), SIGKILL when its
parent dies, stdin from /dev/null, the signal handlers its parent installed for itself reset, the
parent's protocol fds closed, and everything it prints (fds 1 and 2, ``sys.stdout``/``stderr``,
logging's stream handlers, faulthandler) in its own log. It runs a body and leaves with the body's
exit status: a ``SystemExit``'s code, or ``CHILD_FAILED`` with the traceback in its log.

A fork server (``serve``, in the forking process) and its client (``ForkServer``, in the suite)
speak one protocol, one JSON object per line. The server says ``{"ready": true, ...}`` once it is
ready to fork (``{"ready": false, "why"}`` and ends, where it cannot); the client writes requests
``{"id", ...}``; the server answers each with ``{"started": pid, "id"}`` and ``{"ended": pid,
"status"}`` (a ``waitpid`` status) once it reaped the child. End of its stdin, or SIGTERM, ends the
server and every child it forked.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import IO, Any, Callable, Mapping, NoReturn, Protocol, Sequence

from conformance.util import procs

CHILD_FAILED = 70  # the body raised, or the child could not be set up (EX_SOFTWARE)
REAP_POLL_S = 0.02  # a fork server reports a child's end within this long


# -- the child -----------------------------------------------------------------------------------
def fork_child(body: Callable[[], int | None], log: Path, *, append: bool = False,
               env: Mapping[str, str] | None = None, close: Sequence[int] = ()) -> int:
    """Fork a child that runs ``body`` set up as the module says, its output to ``log`` (appended to,
    or truncated), ``env`` added to its environment and the fds in ``close`` closed; its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child (coverage cannot follow it)
        _child(body, log, append, env or {}, close, parent)
    try:
        os.setpgid(pid, pid)  # both sides: the caller may kill the group before the child ran a line
    except OSError:  # it did so itself, or is gone already
        pass
    return pid


def _child(body: Callable[[], int | None], log: Path, append: bool, env: Mapping[str, str],
           close: Sequence[int], parent: int) -> NoReturn:  # pragma: no cover - the child
    code = CHILD_FAILED
    try:
        os.setpgid(0, 0)
        procs.end_with_parent(signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the line above took effect
            os._exit(CHILD_FAILED)
        for sig in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd in close:
            os.close(fd)
        print_to(log, append)
        os.environ.update(env)
        try:
            code = body() or 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 (what ended it goes to its log)
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def print_to(log: Path, append: bool = False) -> None:
    """Everything this process prints from now on goes to ``log``: fds 1 and 2, ``sys.stdout`` and
    ``sys.stderr`` (pytest's capture, or a protocol's stream, belongs to the parent), logging's stream
    handlers on them, and faulthandler's report of a fatal signal."""
    old = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC), 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    stream = open(2, "w", buffering=1, closefd=False, errors="replace")
    sys.stdout = sys.stderr = stream
    for logger in [logging.getLogger(), *map(logging.getLogger, list(logging.root.manager.loggerDict))]:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, logging.StreamHandler) and handler.stream in old:
                handler.setStream(stream)
    if faulthandler.is_enabled():
        faulthandler.enable(file=stream)


def describe_status(status: int) -> str:
    """A wait status in words: 'was killed by SIGSEGV (signal 11)', 'exited with status 139'."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            label = signal.Signals(sig).name
        except ValueError:
            label = "an unknown signal"
        oom = " (the OOM killer sends SIGKILL)" if sig == signal.SIGKILL else ""
        return f"was killed by {label} (signal {sig}){oom}"
    return f"exited with status {os.WEXITSTATUS(status)}"


# -- the fork server -----------------------------------------------------------------------------
def protocol_channel() -> int:
    """In a fork server, before its imports: an fd of its own for the protocol, and stdout pointed at
    stderr (its log), so that what an import prints (vLLM 0.19's and LMCache's loggers write to
    stdout) never lands in the protocol."""
    channel = os.dup(1)
    os.dup2(2, 1)
    return channel


def say(channel: int, message: Mapping[str, Any]) -> None:
    os.write(channel, (json.dumps(message) + "\n").encode())


def serve(channel: int, start: Callable[[dict[str, Any]], int],
          ready: Mapping[str, Any] | None = None) -> NoReturn:
    """The fork server's loop, once it said it is ready: each request read on stdin is given to
    ``start`` (which forks, with ``fork_child``, and returns the pid), each child reaped and reported.
    Ends, with every child it forked killed, when its stdin ends or it gets SIGTERM.

    A server that says it is ``ready`` can be lent to one client after another (``handover.AheadHost``): a
    ``{"release": id}`` request kills and reaps every child it forked, says ``{"released": id}`` and
    then its ready line again (with ``"lent"``, how many clients it served before) for the next one."""
    children: set[int] = set()
    lent = 0

    def end(*_: Any) -> NoReturn:
        for pid in children:
            procs.kill_pgid(pid)
        os._exit(0)

    signal.signal(signal.SIGTERM, end)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pending = b""
    while True:
        if select.select([0], [], [], REAP_POLL_S)[0]:
            chunk = os.read(0, 65536)
            if not chunk:  # the suite is gone
                end()
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                if "release" in request and ready is not None:
                    _release(channel, children)
                    lent += 1
                    say(channel, {"released": request["release"]})
                    say(channel, {"ready": True, **ready, "lent": lent})
                    continue
                pid = start(request)
                children.add(pid)
                say(channel, {"started": pid, "id": request["id"]})
        _reap(channel, children)


def _release(channel: int, children: set[int]) -> None:
    """Every child killed with its group and reaped (each end reported), before the next client."""
    for pid in children:
        procs.kill_pgid(pid)
    for pid in list(children):
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            continue
        say(channel, {"ended": pid, "status": status})
    children.clear()


def _reap(channel: int, children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        say(channel, {"ended": pid, "status": status})


# -- the client ----------------------------------------------------------------------------------
class Speaking(procs.Process, Protocol):
    """A fork server's process as the client holds it: a ``subprocess.Popen`` it spawned with
    ``procs.spawn_speaking``, or one handed over to it (``handover.HandedHost``)."""

    @property
    def stdin(self) -> IO[bytes] | None: ...

    @property
    def stdout(self) -> IO[bytes] | None: ...


REAPED_S = 120.0  # a killed child the server has not reported reaped by then is taken as gone


class ForkServer:
    """The suite's end of a fork server (``serve``) running as ``proc``: what it said when ready, the
    children it forks, and their ends. ``what`` names it in messages; a fork is answered within
    ``reply_s`` of being waited for, or the server is taken as failed (it hangs)."""

    def __init__(self, proc: Speaking, what: str, log_path: Path, reply_s: float) -> None:
        self.proc, self.what, self.log_path, self.reply_s = proc, what, log_path, reply_s
        self.changed = threading.Condition()
        self.ready: dict[str, Any] | None = None  # its ready line, less "ready"
        self.failed = ""  # why it cannot be used ("" while it can)
        self._children: dict[int, Child] = {}
        self._started: dict[int, int] = {}  # request id -> pid
        self._early: dict[int, int] = {}  # pid -> return code: reaped before its Child asked for its pid
        self._next_id = 0
        self._ended = False  # its protocol reached its end
        assert proc.stdout is not None
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True, name=what).start()

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether it is ready to fork, within ``timeout_s`` (a server not ready by then is killed)."""
        with self.changed:
            if not self.changed.wait_for(lambda: self.ready is not None or self.failed or self._ended, timeout_s):
                procs.kill_group(self.proc)
                self.failed = f"the {self.what} was not ready within {timeout_s:g}s"
            elif self.ready is None and not self.failed:
                self.failed = f"the {self.what} exited before it was ready:\n{procs.log_tail(self.log_path, 2000)}"
            return self.ready is not None and not self.failed

    def fork(self, request: Mapping[str, Any]) -> Child:
        """A child for ``request``, asked now and returned at once: its pid is read when first needed."""
        assert self.proc.stdin is not None
        with self.changed:
            request_id, self._next_id = self._next_id, self._next_id + 1
            try:
                self.proc.stdin.write((json.dumps({**request, "id": request_id}) + "\n").encode())
                self.proc.stdin.flush()
            except (OSError, ValueError):  # it ended (or was closed): its reply says how
                pass
            return Child(self, request_id)

    def detach(self) -> None:
        """Let go of a server lent to this process (``handover``): the children it forked for this
        process killed, this process's end of its stdin closed. It lives on for its lender."""
        self._hang_up()
        self._lost()

    def gone(self) -> bool:
        return self._ended or self.proc.poll() is not None

    def close(self, grace_s: float) -> None:
        """Its stdin closed (it ends with its children), then killed with its group after ``grace_s``.
        Its stdout is the reader's, which sees it end."""
        self._hang_up()
        if not procs.finished_within(self.proc, grace_s):
            procs.kill_group(self.proc)
            self.proc.wait()
        self._lost()

    def _hang_up(self) -> None:
        """This process's end of the server's stdin closed (its only end, unless the server is lent)."""
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def _answer(self, child: Child) -> tuple[int | None, int | None, str | None]:
        """The server's answer for ``child``, waited for within ``reply_s``: (its pid, its return code
        if it ended already, None) with a running child registered for its end, or (None, 1, why not)."""
        with self.changed:
            answered = self.changed.wait_for(
                lambda: child.request_id in self._started or self.failed or self._ended, self.reply_s)
            pid = self._started.pop(child.request_id, None)
            if pid is None:
                if not answered:
                    self.failed = f"the {self.what} did not answer within {self.reply_s:g}s"
                elif not self.failed:
                    self.failed = f"the {self.what} exited:\n{procs.log_tail(self.log_path, 2000)}"
                return None, 1, self.failed
            if pid in self._early:  # reaped before anyone asked for its pid
                return pid, self._early.pop(pid), None
            if self._ended:  # its server is gone: so is it
                procs.kill_pgid(pid)
                return pid, -signal.SIGKILL, None
            self._children[pid] = child
            return pid, None, None

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            try:
                message = json.loads(line)
            except ValueError:  # not the server's: skipped, never the end of the reader
                continue
            with self.changed:
                if message.get("ready") is False:
                    self.failed = message.get("why") or f"the {self.what} refused to start"
                elif "ready" in message:
                    self.ready = {k: v for k, v in message.items() if k != "ready"}
                elif "started" in message:
                    self._started[message["id"]] = message["started"]
                elif "ended" in message:
                    self._ended_child(message["ended"], os.waitstatus_to_exitcode(message["status"]))
                self.changed.notify_all()
        self._lost()

    def _ended_child(self, pid: int, code: int) -> None:
        child = self._children.pop(pid, None)
        if child is not None:
            child.returncode = code
        else:
            self._early[pid] = code

    def _lost(self) -> None:
        """The server is gone: a child it left is killed, and reads as killed."""
        with self.changed:
            self._ended = True
            for child in self._children.values():
                procs.kill_group(child)
                child.returncode = -signal.SIGKILL
            self._children.clear()
            self.changed.notify_all()


class Child:
    """A child a fork server forked, read as a ``subprocess.Popen`` (``pid``, ``poll``, ``wait``,
    ``returncode``): its process group is its pid, so ``procs.kill_group`` stops it as it stops a
    spawned one. One the server could not fork is a process that ended at once, ``error`` saying why."""

    def __init__(self, server: ForkServer, request_id: int) -> None:
        self._server, self.request_id = server, request_id
        self._pid: int | None = None
        self._resolving = threading.Lock()  # its answer is read once, whichever thread asks first
        self.error: str | None = None
        self.returncode: int | None = None

    @property
    def known(self) -> bool:
        """Whether the server's answer was read (its pid known, or why there is none)."""
        return self._pid is not None or self.error is not None

    @property
    def pid(self) -> int | None:
        # The server's lock held until the answer is stored: its reader may report this child's end
        # as soon as it is registered.
        with self._resolving, self._server.changed:
            if not self.known:
                self._pid, self.returncode, self.error = self._server._answer(self)
        return self._pid

    def poll(self) -> int | None:
        self.pid  # noqa: B018 (resolved first: a fork that failed has ended)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its return code; without ``timeout`` (after a kill) at most REAPED_S, then it reads as killed."""
        if self.pid is None:
            assert self.returncode is not None
            return self.returncode
        with self._server.changed:
            if not self._server.changed.wait_for(lambda: self.returncode is not None,
                                                 REAPED_S if timeout is None else timeout):
                if timeout is not None:
                    raise subprocess.TimeoutExpired(f"{self._server.what}'s child {self._pid}", timeout)
                self.returncode = -signal.SIGKILL
        assert self.returncode is not None
        return self.returncode

