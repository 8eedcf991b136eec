"""Suite runs forked from one process that imported what every run imports, once.

A fresh interpreter spends 3-4 s importing torch, Hypothesis and pytest before a store cell's first
clause, more than its clauses take (about 2 s): most of a quick tier's store cells, 24 times. The runs
of the runner's own Python (``kvconform run``'s cells, the project's tests' suite runs) are instead
children of multiprocessing's fork server, which imports ``PRELOAD`` once and forks each run from
there: the suite's own modules, the store or connector under test and its plugins are still imported
fresh by each run, which starts with nothing a run before it left. Engine hosts lent to a run
(``conformance.levels.engine.handover``) reach it as inherited fds, as they reach a spawned one.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import signal
import sys
from multiprocessing import reduction
from pathlib import Path
from typing import Any, Mapping, Sequence

from conformance.levels.engine import separate
from conformance.levels.engine.handover import AheadHost

# Best effort: a module this Python lacks (vLLM in a store-only install) is skipped by the fork server.
PRELOAD = ("torch", "numpy", "hypothesis", "yaml", "safetensors", "pytest", "transformers",
           "vllm.distributed.kv_transfer.kv_connector.v1.base")
_FORKS = multiprocessing.get_context("forkserver")
_FORKS.set_forkserver_preload(list(PRELOAD))


class _Inherited:
    """An fd the forked run inherits: multiprocessing sends it over its fork server's socket as it
    pickles the run's arguments, and the run reads it back as an fd number of its own."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _inherited_fd, (reduction.DupFd(self.fd),)


def _inherited_fd(dup: Any) -> int:
    return int(dup.detach())


def forkable(env: Mapping[str, str]) -> bool:
    """Whether a run under ``env`` (the whole environment) can be forked from here: what only an
    interpreter's start reads (PYTHONPATH, PYTHONHASHSEED, ...) is as this process started with it, and
    this process's main script is a file.
    PYTHONUNBUFFERED is the exception: the forked run sets its streams as it would."""
    def start_time(environ: Mapping[str, str]) -> dict[str, str]:
        return {k: v for k, v in environ.items() if k.startswith("PYTHON") and k != "PYTHONUNBUFFERED"}
    # The fork server runs this process's main script again: one read from stdin cannot be.
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    return start_time(env) == start_time(os.environ) and (main is None or os.path.exists(main))


def run_pytest(args: Sequence[str], env: Mapping[str, str], cwd: Path, log: Path, timeout_s: float,
               hosts: Sequence[AheadHost] = ()) -> int | None:
    """What ``python -m pytest ARGS`` in ``cwd`` under ``env`` (the whole environment, ``forkable``) does, forked, its
    output in ``log``, the engine ``hosts`` lent to it; its exit code, or None where it ran past
    ``timeout_s`` (killed, with whatever it started in its process group)."""
    lent = []
    for side, host in zip(separate.SIDES, hosts):
        handed, (read_fd, write_fd) = host.handed(side)
        ((variable, said),) = handed.items()
        lent.append((variable, json.loads(said), _Inherited(read_fd), _Inherited(write_fd)))
    child = _FORKS.Process(target=_pytest_in_fork, args=(list(args), dict(env), str(cwd), str(log), lent))
    child.start()
    child.join(timeout_s)
    in_time = child.exitcode is not None
    try:
        os.killpg(child.pid or 0, signal.SIGKILL)  # what it left in its group too, as for a spawned cell
    except (ProcessLookupError, PermissionError):
        pass
    child.join()
    return child.exitcode if in_time else None


def _pytest_in_fork(args: list[str], env: dict[str, str], cwd: str, log: str,
                    lent: Sequence[tuple[str, dict[str, Any], int, int]]) -> None:  # pragma: no cover - the child
    """In the forked child: the run, set up as ``python -m pytest`` would be, its exit code the process's."""
    import gc

    import pytest

    gc.freeze()  # what the fork server imported is never garbage: pytest's closing collections skip it (1 s)
    os.setpgrp()  # a timeout kills the run with whatever it started
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for variable, handed, read_fd, write_fd in lent:
        os.environ[variable] = json.dumps({**handed, "read_fd": read_fd, "write_fd": write_fd})
    sys.path.insert(0, cwd)  # as `python -m` puts it first
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    if env.get("PYTHONUNBUFFERED"):  # what a killed run printed last is in its log
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(write_through=True)  # type: ignore[union-attr]
    code = 1
    try:
        # What the fork server imported, pytest cannot rewrite asserts in: known, and no news in a log.
        code = int(pytest.main(["-W", "ignore::pytest.PytestAssertRewriteWarning", *args]))
    finally:
        atexit._run_exitfuncs()  # what an interpreter's exit runs (the suite's own clean-up included)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
