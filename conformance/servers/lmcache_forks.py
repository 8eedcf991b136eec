"""LMCache's servers forked from one process that imported LMCache once.

An LMCacheMPConnector engine cell runs a server per world of its roles (and a spare to lose one),
each a fresh ``python -m lmcache.v1.multiprocess.http_server`` of 6 s on two cores, most of it
imports (torch, LMCache, and the L2 adapters its parser loads); four at a cell's start took 9-22 s
each beside the engines. A fork server (``python -m conformance.servers.lmcache_forks``, in the
stack's Python, with the servers' environment ``SERVER_ENV``) imports what a server imports once
(``_warm``), then forks each server: the same module run as ``__main__`` with the same command
line, in a session of its own, its output to its log; one is ready in 0.3 s, four in 1.4 s. LMCache
starts no thread at import (checked on 0.5.6), so the fork is the program a fresh process would be.

Protocol: one JSON line a request on the fork server's stdin (``{"args", "log"}``), one line a reply
on its stdout (``{"pid"}`` or ``{"error"}``), in order; its first line is ``{"ready": true}`` (or its
``error``). It ends when its stdin does, and each server still running is killed with it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import select
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, TypedDict

from conformance.util import procs

SERVER_MODULE = "lmcache.v1.multiprocess.http_server"
SERVER_ENV = {"HF_HUB_OFFLINE": "1"}  # what a server's environment adds to the suite's
REPLY_S = 120.0  # as long as a server is given to be ready: its imports (6 s here) and a fork


class Reply(TypedDict, total=False):
    """A line of the fork server's: its ready line, a forked server's pid, or why there is none."""

    ready: bool
    pid: int
    error: str


class Request(TypedDict):
    """What the suite asks of it: a server of these arguments, logging there."""

    args: list[str]
    log: str


class ForkServer:
    """The suite's end: started now, not waited for; ``fork`` asks for a server and returns its process
    at once, whose pid is read when first needed (the fork server may still be importing)."""

    def __init__(self, python: str, log_path: Path, reply_s: float = REPLY_S) -> None:
        self.log_path, self.owner, self.reply_s = log_path, os.getpid(), reply_s
        self.proc = procs.spawn_speaking([python, "-m", __name__], log_path, {**os.environ, **SERVER_ENV},
                                         die_with_parent=True)
        self._lock = threading.Lock()  # requests and replies in order, from any lane's thread
        self._asked = 0
        self._replies: list[Reply] = []  # what it said, its ready line first
        self._failure: Reply | None = None  # why it will say nothing more (``{"error"}``)
        self._unread = b""  # what it said past the last line read (read from its fd, not a buffered file)

    def usable(self) -> bool:
        """Whether this process may ask it (a forked child of its owner shares its pipes: never)."""
        return self.owner == os.getpid() and self.proc.poll() is None

    def fork(self, args: list[str], log_path: Path) -> Forked:
        assert self.proc.stdin is not None
        with self._lock:
            try:
                asked: Request = {"args": args, "log": str(log_path)}
                self.proc.stdin.write((json.dumps(asked) + "\n").encode())
                self.proc.stdin.flush()
            except OSError:  # it ended: the reply says how
                pass
            self._asked += 1
            return Forked(self, self._asked)

    def reply(self, number: int) -> Reply:
        """The reply to request ``number`` (1-based: its ready line is the 0th), read in order;
        ``{"error"}`` once it failed."""
        with self._lock:
            while len(self._replies) <= number and self._failure is None:
                said = self._read()
                if "error" in said:  # once it failed (exited, hung, garbled), every later reply fails at once
                    self._failure = said
                else:
                    self._replies.append(said)
            if number < len(self._replies):
                return self._replies[number]
            assert self._failure is not None
            return self._failure

    def _read(self) -> Reply:
        """Its next line, within ``reply_s`` (a fork server that hangs is one that failed)."""
        assert self.proc.stdout is not None
        fd, deadline = self.proc.stdout.fileno(), time.monotonic() + self.reply_s
        while b"\n" not in self._unread:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                return {"error": f"the LMCache fork server did not answer within {self.reply_s:g}s"}
            chunk = os.read(fd, 65536)
            if not chunk:
                return {"error": "the LMCache fork server exited:\n" + procs.log_tail(self.log_path, 2000)}
            self._unread += chunk
        line, self._unread = self._unread.split(b"\n", 1)
        try:
            said: Reply = json.loads(line)
            return said
        except ValueError:
            return {"error": f"the LMCache fork server said {line[:200]!r}"}

    def stop(self) -> None:
        """Killed, and the servers still running with it (SIGKILL: each one that served was stopped by
        its own first; the rest hold nothing); at once, even while it imports."""
        procs.hang_up(self.proc)
        procs.kill_group(self.proc)
        self.proc.wait()


class Forked:
    """A server the fork server forked, read as the ``subprocess.Popen`` ``LMCacheServer`` keeps; a
    fork that failed is a process that ended at once (its reason in ``error``)."""

    def __init__(self, server: ForkServer, number: int) -> None:
        self._server, self._number = server, number
        self._proc: procs.NotChild | None = None
        self.error: str | None = None
        self.returncode: int | None = None

    @property
    def known(self) -> bool:
        """Whether its reply was read (its pid known, or why there is none)."""
        return self._proc is not None or self.error is not None

    def _resolved(self) -> procs.NotChild | None:
        if self._proc is None and self.error is None:
            reply = self._server.reply(self._number)
            try:
                self._proc = procs.NotChild(int(reply["pid"]))
            except (KeyError, ValueError, TypeError, OSError):  # no pid, or it is gone already
                self.error = reply.get("error") or f"the server it forked ended at once: {reply}"
                self.returncode = 1
        return self._proc

    @property
    def pid(self) -> int | None:
        proc = self._resolved()
        return proc.pid if proc else None

    def poll(self) -> int | None:
        proc = self._resolved()
        self.returncode = proc.poll() if proc else self.returncode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        proc = self._resolved()
        self.returncode = proc.wait(timeout) if proc else self.returncode
        assert self.returncode is not None
        return self.returncode


# -- the fork server ---------------------------------------------------------------------------
def _say(stream: Any, message: Reply) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def _serve(request: Request, protocol: int) -> None:
    """In the forked child: become the server ``request`` asks for; never returns."""
    code = 1
    try:
        os.setsid()
        # Killed with the fork server (which dies with the cell): the suite stops each server it used
        # before it, so what is left served nothing.
        procs.end_with_parent(signal.SIGKILL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        for fd in (log, null, protocol):
            os.close(fd)
        sys.argv = [SERVER_MODULE, *request["args"]]
        runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 (what ended the server goes to its log)
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _warm() -> None:
    """Import what a server imports before it serves: the module, and what its command line's parser
    imports (every L2 adapter's module: 3.5 of a forked server's 4 s), by asking it for ``--help``."""
    __import__(SERVER_MODULE)
    sys.argv = [SERVER_MODULE, "--help"]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise RuntimeError(f"{SERVER_MODULE} --help exited with {exc.code}") from None


def main() -> None:
    out = os.fdopen(os.dup(1), "w")  # the protocol's; LMCache logs on stdout and stderr
    os.dup2(2, 1)
    try:
        _warm()
    except BaseException as exc:  # noqa: BLE001 (the suite reads why)
        _say(out, {"error": f"the fork server cannot import {SERVER_MODULE}: {exc!r}"})
        return
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its servers are reaped by the kernel
    _say(out, {"ready": True})
    for line in sys.stdin:
        request: Request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _serve(request, out.fileno())
        _say(out, {"pid": pid})


if __name__ == "__main__":
    main()
