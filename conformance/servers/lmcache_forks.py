"""LMCache's servers forked from one process that imported LMCache once.

An LMCacheMPConnector engine cell runs a server per world of its roles (and a spare to lose one),
each a fresh ``python -m lmcache.v1.multiprocess.http_server`` of 6 s on two cores, most of it
imports (torch, LMCache, and the L2 adapters its parser loads); four at a cell's start took 9-22 s
each beside the engines. A fork server (``python -m conformance.servers.lmcache_forks``, in the
stack's Python, with the servers' environment ``SERVER_ENV``) imports what a server imports once
(``_warm``), then forks each server: the same module run as ``__main__`` with the same command
line, in a process group of its own, its output to its log; one is ready in 0.3 s, four in 1.4 s. LMCache
starts no thread at import (checked on 0.5.6), so the fork is the program a fresh process would be.

Protocol: ``forking``'s; a request is ``{"args", "log"}``, and its ready line says nothing more.
The suite's end (``ForkServer``) asks for a server and returns its process at once, whose pid is read
when first needed (the fork server may still be importing).
"""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import sys
from pathlib import Path
from typing import TypedDict, cast

from conformance.util import forking, procs

SERVER_MODULE = "lmcache.v1.multiprocess.http_server"
SERVER_ENV = {"HF_HUB_OFFLINE": "1"}  # what a server's environment adds to the suite's
REPLY_S = 120.0  # as long as a server is given to be ready: its imports (6 s here) and a fork


class Request(TypedDict):
    """What the suite asks of it: a server of these arguments, logging there."""

    args: list[str]
    log: str


class ForkServer(forking.ForkServer):
    """The suite's end, started now and not waited for."""

    def __init__(self, python: str, log_path: Path, reply_s: float = REPLY_S) -> None:
        self.owner = os.getpid()
        proc = procs.spawn_speaking([python, "-m", __name__], log_path, {**os.environ, **SERVER_ENV},
                                    die_with_parent=True)
        super().__init__(proc, "LMCache fork server", log_path, reply_s)

    def usable(self) -> bool:
        """Whether this process may ask it (a forked child of its owner shares its pipes: never)."""
        return self.owner == os.getpid() and self.proc.poll() is None

    def server(self, args: list[str], log_path: Path) -> forking.Child:
        """A server of ``args`` logging to ``log_path``; one it could not fork ended at once (``error``)."""
        asked: Request = {"args": args, "log": str(log_path)}
        return self.fork(asked)

    def stop(self) -> None:
        """Killed, and the servers still running with it (SIGKILL: each one that served was stopped by
        its own first; the rest hold nothing); at once, even while it imports."""
        self.close(grace_s=0)


# -- the fork server ---------------------------------------------------------------------------
def _serve(request: Request) -> None:
    """In the forked child: become the server ``request`` asks for."""
    sys.argv = [SERVER_MODULE, *request["args"]]
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)


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
    channel = forking.protocol_channel()  # LMCache logs on stdout and stderr
    try:
        _warm()
    except BaseException as exc:  # noqa: BLE001 (the suite reads why)
        forking.say(channel, {"ready": False, "why": f"the fork server cannot import {SERVER_MODULE}: {exc!r}"})
        return
    forking.say(channel, {"ready": True})
    forking.serve(channel, lambda request: _start(cast(Request, request), channel))


def _start(request: Request, channel: int) -> int:
    return forking.fork_child(lambda: _serve(request), Path(request["log"]), append=True, close=(channel,))


if __name__ == "__main__":
    main()
