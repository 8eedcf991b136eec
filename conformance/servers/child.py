"""A server process a store factory starts (redis-server, LMCache's own ``lm`` server) on a free
loopback port, and whether it is still there to answer: a dead server is the suite's Error with its
exit status and log, never a store's Fail."""

from __future__ import annotations

import logging
import socket
import subprocess
import time
from pathlib import Path

from conformance.util import procs

log = logging.getLogger(__name__)
START_S = 30.0  # deadline for a child server to accept connections


def _wait_for_port(port: int, proc: subprocess.Popen, what: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening on "
                               f"127.0.0.1:{port}; log {log_path}: {_tail(log_path)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    _stop(proc)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {START_S:g}s; "
                       f"log {log_path}: {_tail(log_path)}")


def _tail(path: Path, n: int = 400) -> str:
    return procs.log_tail(path, n).strip() or "(empty)"


def _stop(proc: subprocess.Popen) -> None:
    procs.stop(proc, grace_s=5)


class ChildServer:
    """A server process a factory started, and whether it is still there to answer."""

    def __init__(self, what: str, port: int, proc: subprocess.Popen) -> None:
        self.what = what
        self.port = port
        self.proc = proc
        self.killed_by = ""  # why the suite killed it (fault injection), if it did
        self._gone: str | None = None

    def gone(self) -> str | None:
        """Why the server can no longer be trusted, or None while its process runs.

        A dead process is permanent, so the text is computed once: every later call raises
        the same message. A server that runs but hangs is the watchdog's (``--kv-timeout``).
        """
        if self._gone is None and self.proc.poll() is not None:
            code = self.proc.returncode
            how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            why = f"; {self.killed_by}" if self.killed_by else ""
            self._gone = (f"{self.what} at 127.0.0.1:{self.port} stopped answering: "
                          f"{_connect_error(self.port)} (pid {self.proc.pid} {how}{why})")
        return self._gone

    def kill(self, reason: str) -> None:
        """SIGKILL the server and reap it, so the next call sees it dead (fault injection)."""
        self.killed_by = reason
        log.warning("%s: %s", self.what, reason)
        self.proc.kill()
        self.proc.wait(5)

    def stop(self) -> None:
        _stop(self.proc)


def _connect_error(port: int) -> str:
    """What a client gets now from 127.0.0.1:PORT, e.g. ``ConnectionRefusedError: ...``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return "the port still accepts connections (another process holds it)"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def start_server(argv: list[str], what: str, workdir: Path, port: int) -> ChildServer:
    """Start a child server logging to ``workdir/WHAT.log``; return once it accepts connections."""
    log_path = workdir / f"{what}.log"
    proc = procs.spawn(argv, log_path, cwd=workdir, die_with_parent=True)
    _wait_for_port(port, proc, what, log_path)
    return ChildServer(what, port, proc)
