"""An engine host started ahead of its cells and lent to one after another.

A cell's host imports vLLM before its first engine can start: 9 of an ExampleConnector cell's 29 s
on two cores (docs/benchmarks.md), on the cell's critical path, and paid again by every engine cell
of a matrix run and every engine run of the project's tests. A runner instead starts the host of a
cell's stack Python before the cell (``AheadHost``) and lends it to the cell's pytest as two inherited
pipe fds named in ``HANDED_ENV``; the cell's ``EngineHost`` adopts it (``adopt``) in place of starting
its own. The host is the same program either way: it has only imported vLLM, and forks each engine
fresh, so the next cell can borrow it as it is. A cell whose load engines run in an interpreter of
their own (``separate``) is lent two, each started with a hash seed of its own, the second named in
``HANDED_ENV_SECOND`` (``handed_env``).

The runner keeps what only a parent can do: its own ends of the pipes, and the host's reaping. After
the cell it takes the host back (``reclaim``: the engines the cell left killed, the protocol read to
its end) or stops it. The cell only lets go of it (``forking.ForkServer.detach``) and sees its end on
its pidfd (a host that died before the cell asked is a host that failed: its engines start as fresh
processes, as when a host of its own fails).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from pathlib import Path
from typing import IO, Any, Iterator, Mapping, Sequence

from conformance.levels.engine import separate
from conformance.util import procs

HANDED_ENV = "KVCONFORM_ENGINE_HOST"  # {"pid", "read_fd", "write_fd", "python", "log", "hash_seed"}: a host handed over
RELEASE_S = 300.0  # a host taken back before its imports ended answers once they did (ready_timeout_s)


def handed_env(side: str) -> str:
    """The variable that hands over the host of a cell's ``side`` (``separate.SIDES``): the first
    interpreter's ``HANDED_ENV``, the second's ``HANDED_ENV_SECOND``."""
    return HANDED_ENV if side == separate.FIRST else f"{HANDED_ENV}_{side.upper()}"


def start_host(python: str, log_path: Path, env: Mapping[str, str]) -> subprocess.Popen:
    """``conformance.levels.engine.host`` in ``python``: its protocol on pipes, its stderr to ``log_path``,
    in a session of its own; a hand-over in ``env`` is not passed on to it."""
    handing = {handed_env(side) for side in separate.SIDES}
    return procs.spawn_speaking([python, "-m", "conformance.levels.engine.host"], log_path,
                                {k: v for k, v in env.items() if k not in handing})


class AheadHost:
    """A host the runner started for ``python``, lent to one cell at a time (``handed``) and taken back
    after it (``reclaim``): its imports are paid once, not per cell. It runs with a hash seed of its own
    (``separate``): the first engines' interpreter of each cell it serves."""

    def __init__(self, python: str, log_path: Path, env: Mapping[str, str]) -> None:
        self.python, self.log_path = python, log_path
        self.hash_seed = separate.draw_seed()
        self.proc = start_host(python, log_path, {**env, **separate.interpreter_env(self.hash_seed, {})})
        self.lent = 0  # the cells it was taken back from
        self._lent_at = 0  # the size of its log when it was lent to the cell holding it

    def handed(self, side: str = separate.FIRST) -> tuple[dict[str, str], tuple[int, ...]]:
        """The environment and the fds that lend this host to the process spawned with them, as the
        host of the cell's ``side``. The runner keeps its own ends: the cell's end is not the host's."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._lent_at = _size(self.log_path)
        read_fd, write_fd = self.proc.stdout.fileno(), self.proc.stdin.fileno()
        return ({handed_env(side): json.dumps({"pid": self.proc.pid, "read_fd": read_fd, "write_fd": write_fd,
                                         "python": self.python, "log": str(self.log_path),
                                         "hash_seed": self.hash_seed})},
                (read_fd, write_fd))

    def reclaim(self) -> bool:
        """Take the host back from the cell it was lent to, once that cell's process ended: every engine
        it forked for the cell killed and reaped, all it said to the cell read, its ready line said
        again for the next. A host that died, or did not answer within RELEASE_S, is stopped: False."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        release = f"release-{self.lent}"
        try:
            os.write(self.proc.stdin.fileno(), (json.dumps({"release": release}) + "\n").encode())
            said = _lines(self.proc.stdout.fileno(), time.monotonic() + RELEASE_S)
            while next(said).get("released") != release:
                pass
        except (OSError, TimeoutError):
            self.stop()
            return False
        self.lent += 1
        return True

    def logged_while_lent(self) -> str:
        """What the host logged since it was last lent (its imports too, the first time)."""
        with open(self.log_path, "rb") as log:
            log.seek(self._lent_at)
            return log.read().decode(errors="replace")

    def stop(self) -> None:
        """Killed with its group (its engines too), imported or not."""
        procs.kill_group(self.proc)
        self.proc.wait()
        procs.hang_up(self.proc)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _lines(fd: int, deadline: float) -> Iterator[dict[str, Any]]:
    """The protocol's messages read from ``fd`` byte by byte (what follows the one asked for stays in
    the pipe, for the next cell), until ``deadline``; a line that is not JSON reads as ``{}``."""
    line = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError
        byte = os.read(fd, 1)
        if not byte:
            raise OSError("the host ended")
        if byte != b"\n":
            line += byte
            continue
        try:
            message = json.loads(line)
        except ValueError:
            message = {}
        line = b""
        yield message if isinstance(message, dict) else {}


class HandedHost(procs.NotChild):
    """The cell's end of a host lent to it: read as the ``subprocess.Popen`` an ``EngineHost`` starts
    (``stdin``, ``stdout``, ``pid``, ``poll``, ``wait``); not this process's child, so its end is
    seen on a pidfd and its status is the runner's (0 here)."""

    def __init__(self, pid: int, read_fd: int, write_fd: int) -> None:
        super().__init__(pid)  # the runner reaps the host only after this process ended
        self.stdout: IO[bytes] = os.fdopen(read_fd, "rb")
        self.stdin: IO[bytes] = os.fdopen(write_fd, "wb")
        for fd in (read_fd, write_fd):  # a process this one spawns holds no end of the host's pipes
            os.set_inheritable(fd, False)


def adopt(python: str, accept: bool = True, side: str = separate.FIRST) -> tuple[HandedHost, Path, str | None] | None:
    """The host handed to this process for ``python`` as its ``side``'s, its log and its hash seed,
    once (the first caller takes it); None when none was handed, it was handed for another Python, its
    fds are not this process's, or the caller cannot ``accept`` it (a connector that declares its
    engines' environment: the host was started without it), whose ends it closes (its runner takes it back)."""
    raw = os.environ.pop(handed_env(side), "")
    if not raw or not hasattr(os, "pidfd_open"):  # none handed, or not Linux (no pidfds): a host of its own
        return None
    try:
        handed: dict[str, Any] = json.loads(raw)
        fds = (int(handed["read_fd"]), int(handed["write_fd"]))
        for fd in fds:
            os.fstat(fd)
    except (ValueError, KeyError, TypeError, OSError):  # a stale value an outer process left: not ours
        return None
    if accept and os.path.abspath(handed["python"]) == os.path.abspath(python):
        try:
            return HandedHost(int(handed["pid"]), *fds), Path(handed["log"]), handed.get("hash_seed")
        except OSError:  # gone already (no pidfd): the host failed, as one of the cell's own can
            pass
    for fd in fds:  # this process's ends only: the runner holds its own, and takes the host back
        os.close(fd)
    return None


def spawn_with(handed: Sequence[AheadHost]) -> tuple[dict[str, str], tuple[int, ...]]:
    """The environment and fds a cell's pytest is spawned with to take the ``handed`` hosts, in
    ``separate.SIDES`` order (a side none is handed for: nothing, and no stale hand-over passes through)."""
    env = {handed_env(side): "" for side in separate.SIDES}
    fds: tuple[int, ...] = ()
    for side, host in zip(separate.SIDES, handed):
        more, its_fds = host.handed(side)
        env.update(more)
        fds += its_fds
    return env, fds
