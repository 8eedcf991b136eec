"""Child processes the suite starts (engines, LMCache's servers, redis-server): each in its own
process group with its output in a log file, awaited with a deadline, and stopped with its whole
group, so that nothing it spawned outlives it and holds cores or ports for the rest of a run."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Protocol, Sequence


def spawn(argv: Sequence[str], log_path: Path, *, env: Mapping[str, str] | None = None,
          cwd: Path | None = None, append: bool = False, die_with_parent: bool = False,
          pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """Start ``argv`` in a new process group, stdout and stderr to ``log_path``, stdin closed.

    ``die_with_parent``: the child gets SIGTERM when the suite's process dies (a killed run leaves
    no server behind); ``env`` is added to this process's environment; ``pass_fds`` are inherited.
    """
    with open(log_path, "ab" if append else "wb") as log:
        return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=cwd, start_new_session=True, env={**os.environ, **(env or {})},
                                pass_fds=tuple(pass_fds),
                                preexec_fn=end_with_parent if die_with_parent and sys.platform == "linux" else None)


def spawn_speaking(argv: Sequence[str], log_path: Path, env: Mapping[str, str],
                   die_with_parent: bool = False) -> subprocess.Popen:
    """Start ``argv`` in a new session with ``env`` (the whole environment) to speak a protocol with
    this process on its stdin and stdout, its stderr appended to ``log_path``."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                start_new_session=True, env=dict(env),
                                preexec_fn=end_with_parent if die_with_parent and sys.platform == "linux" else None)


def hang_up(proc: subprocess.Popen) -> None:
    """Close this process's ends of ``proc``'s protocol pipes (``spawn_speaking``): it reads the end of its stdin."""
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


class Awaitable(Protocol):
    def wait(self, timeout: float | None = None) -> int: ...


def finished_within(proc: Awaitable, timeout_s: float) -> bool:
    """Wait for ``proc``; False when it is still running after ``timeout_s``."""
    try:
        proc.wait(timeout=timeout_s)
        return True
    except subprocess.TimeoutExpired:
        return False


class GroupLeader(Protocol):
    @property
    def pid(self) -> int | None: ...


class Process(GroupLeader, Awaitable, Protocol):
    """What ``stop`` takes: a ``subprocess.Popen``, or a process watched on a pidfd (``NotChild``)."""

    def poll(self) -> int | None: ...


def kill_group(proc: GroupLeader, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the process group ``proc`` leads (gone already, or never started: nothing to do)."""
    if proc.pid is not None:
        kill_pgid(proc.pid, sig)


def kill_pgid(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the process group ``pgid`` (gone already: nothing to do)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(proc: Process, *, grace_s: float, first: int | None = signal.SIGTERM) -> None:
    """Ask the group to stop with ``first`` (None: it was asked already, and a second signal would land
    in its shutdown); SIGKILL it after ``grace_s``; reap ``proc``."""
    if proc.poll() is None:
        if first is not None:
            kill_group(proc, first)
        if finished_within(proc, grace_s):
            return
    kill_group(proc)
    proc.wait()


def log_tail(path: Path, chars: int) -> str:
    """The last ``chars`` characters of a log, or why there are none."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(unreadable)"


_RAISED = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b:?")


def raised(stderr: str, limit: int = 400) -> str:
    """The exception that ended a Python process, from its stderr, on one line: from its traceback's
    last line naming one to the end (transformers words an ImportError over lines, the last of which,
    "you may need to restart your runtime", names no missing package), else the last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    first = next((i for i in range(len(lines) - 1, -1, -1) if _RAISED.match(lines[i])), len(lines) - 1)
    text = " ".join(lines[first:]) if lines else ""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def free_port() -> int:
    """A TCP port on 127.0.0.1 that no one listens on now (a server of the suite's takes it next)."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct such ports: each held while the next is chosen, so no two are the same (a
    server's ZMQ and HTTP ports on one number answer its health check in ZMQ's bytes)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(n):
            s = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
        return ports


def end_with_parent(sig: int = signal.SIGTERM) -> None:
    """In the child: ``sig`` when the parent (the thread that started it) dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass


class NotChild:
    """A process this one did not start, watched on a pidfd (Linux), read as the ``subprocess.Popen``
    the suite's helpers take (``pid``, ``poll``, ``wait``, ``returncode``). Its exit status is its
    parent's to collect: ``returncode`` is 0 once it ended, whatever its status was."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid)  # OSError (ProcessLookupError) when it is gone already

    def poll(self) -> int | None:
        return self._ended(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._ended(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"process {self.pid}", timeout or 0.0)
        return code

    def _ended(self, timeout: float | None) -> int | None:
        # The pidfd stays open: a thread may be waiting on it while another polls.
        if self.returncode is None and select.select([self._pidfd], [], [], timeout)[0]:
            self.returncode = 0
        return self.returncode
