"""An engine host started ahead of its cell and handed over to it.

A cell's host imports vLLM before its first engine can start: 9 of an ExampleConnector cell's 29 s
on two cores (docs/benchmarks.md), on the cell's critical path, paid by every engine cell of a matrix
run. A matrix runner instead starts the host of a cell's stack Python before the cell (``AheadHost``),
the next one while that cell runs, and hands it to the cell's pytest as two inherited pipe fds named
in ``HANDED_ENV``; the cell's ``EngineHost`` adopts it (``adopt``) in place of starting its own. The
host is the same program either way: it has only imported vLLM, and forks each engine fresh. A cell
whose load engines run in an interpreter of their own (``separate``) is handed two, each started with
a hash seed of its own, the second named in ``HANDED_ENV_SECOND`` (``handed_env``).

The runner keeps what only a parent can do: it reaps the host and kills its group after the cell. The
cell sees the host's end on its pidfd (a host that died before the cell asked is a host that failed:
its engines start as fresh processes, as when a host of its own fails).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import IO, Any, Mapping, Sequence

from conformance.levels.engine import separate
from conformance.util import procs

HANDED_ENV = "KVCONFORM_ENGINE_HOST"  # {"pid", "read_fd", "write_fd", "python", "log", "hash_seed"}: a host handed over
ENDED_S = 10.0  # a host whose cell closed its stdin has this long to end with its children


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
    """A host the runner started for ``python``, until a cell takes it (``handed``) and ends (``finish``).
    It runs with a hash seed of its own (``separate``): the cell's first engines' interpreter."""

    def __init__(self, python: str, log_path: Path, env: Mapping[str, str]) -> None:
        self.python, self.log_path = python, log_path
        self.hash_seed = separate.draw_seed()
        self.proc = start_host(python, log_path, {**env, **separate.interpreter_env(self.hash_seed, {})})

    def handed(self, side: str = separate.FIRST) -> tuple[dict[str, str], tuple[int, ...]]:
        """The environment and the fds that hand this host to the process spawned with them, as the
        host of the cell's ``side``."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        read_fd, write_fd = self.proc.stdout.fileno(), self.proc.stdin.fileno()
        return ({handed_env(side): json.dumps({"pid": self.proc.pid, "read_fd": read_fd, "write_fd": write_fd,
                                         "python": self.python, "log": str(self.log_path),
                                         "hash_seed": self.hash_seed})},
                (read_fd, write_fd))

    def let_go(self) -> None:
        """Close the runner's ends of the pipes once the cell has its own: the host sees its cell's
        end (or death) as the end of its stdin, and the runner never reads what it says."""
        procs.hang_up(self.proc)

    def stop(self) -> None:
        """A host no cell took: killed with its group, imported or not."""
        self.let_go()
        procs.kill_group(self.proc)
        self.proc.wait()

    def finish(self) -> None:
        """After its cell: the host ended with its children (its stdin closed), or is killed with its group."""
        self.let_go()
        if not procs.finished_within(self.proc, ENDED_S):
            procs.kill_group(self.proc)
        self.proc.wait()


class HandedHost(procs.NotChild):
    """The cell's end of a host handed over: read as the ``subprocess.Popen`` an ``EngineHost`` starts
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
    engines' environment: the host was started without it), which ends it."""
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
    for fd in fds:  # the host ends when its stdin does: never one that no cell will use
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
