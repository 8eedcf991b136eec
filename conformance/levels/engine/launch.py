"""Start an engine child process with a deadline; a hang or crash becomes data, not a hung run.

A child is forked by an ``EngineHost`` (vLLM imported once per cell) or, without one, started as a
fresh ``python -m conformance.levels.engine.child``: the same code, the same result file, the same
deadline and the same process-group kill either way.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Mapping

from conformance.levels.engine import handover, separate
from conformance.levels.engine.specs import EngineResult, EngineSpec, Request
from conformance.util import forking, procs

LOG_TAIL = 3000
FORK_S = 60.0  # a ready host forks an engine within this long, or is taken as hung


@dataclass
class EngineRun:
    role: str
    ok: bool
    result: EngineResult = field(default_factory=lambda: EngineResult())
    error: str = ""
    log_tail: str = ""
    wall_s: float = 0.0
    timed_out: bool = False  # killed at its deadline: the suite's Error, not the connector's verdict
    killed: bool = False  # SIGKILL the suite did not send (the kernel's OOM killer): an Error too

    @property
    def suite_error(self) -> bool:
        """The engine ended for a reason that says nothing about the connector."""
        return self.timed_out or self.killed

    def requests(self, batch: str) -> list[Request]:
        return [r for r in self.result.get("requests", []) if r["batch"] == batch]

    def phase(self, phase: int) -> EngineRun:
        """This run as if it were only its ``phase`` (a same-engine run's store pass is 0, its reload 1)."""
        records = [r for r in self.result.get("requests", []) if r.get("phase", 0) == phase]
        return replace(self, result={**self.result, "requests": records})

    def describe_failure(self) -> str:
        """The error, where it was raised (the last frames of the traceback the child saved: an
        ``AssertionError`` says nothing by itself), and the log's tail."""
        frames = last_frames(self.result.get("traceback") or "")
        raised = f"\n--- raised at ---\n{frames}" if frames else ""
        return f"engine {self.role}: {self.error}{raised}\n--- log tail ---\n{self.log_tail}"


def last_frames(traceback: str, frames: int = 2) -> str:
    """The last ``frames`` frames of a formatted traceback (file, line, code), without the caret lines."""
    lines = [line for line in traceback.rstrip().splitlines() if line.strip() and set(line.strip()) - set("^~")]
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "')]
    return "\n".join(lines[starts[-frames]:]).strip() if starts else ""


def run_engine(spec: EngineSpec, workdir: Path, role: str, *, timeout_s: float,
               python: str = sys.executable, env: dict[str, str] | None = None,
               host: EngineHost | None = None) -> EngineRun:
    """Run one engine (``conformance.levels.engine.child``, forked by ``host`` if given) and return what it did."""
    proc, paths, started = _start(spec, workdir, role, python, env, host)
    timed_out = not procs.finished_within(proc, timeout_s)
    return _ended(proc, paths, role, started, timed_out, timeout_s)


@contextmanager
def serving_engine(spec: EngineSpec, workdir: Path, role: str, *, timeout_s: float,
                   python: str = sys.executable, env: dict[str, str] | None = None,
                   host: EngineHost | None = None) -> Iterator[EngineRun]:
    """A P/D producer: its run as soon as its batches are done (``serve_until`` in its spec), while
    it keeps serving; released, and stopped with its group, when the block ends. A producer that
    failed, crashed or did not get ready within ``timeout_s`` is yielded as such (not ok)."""
    release = workdir / f"{role}.release"
    release.unlink(missing_ok=True)
    proc, paths, started = _start({**spec, "serve_until": str(release), "serve_s": 2 * timeout_s}, workdir, role,
                                  python, env, host)
    deadline = started + timeout_s
    while not paths[1].exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        if paths[1].exists():
            result: EngineResult = json.loads(paths[1].read_text())
            yield EngineRun(role, bool(result.get("ok")), result, result.get("error", ""),
                            procs.log_tail(paths[2], LOG_TAIL), round(time.monotonic() - started, 2))
        else:
            yield _ended(proc, paths, role, started, proc.poll() is None, timeout_s)
    finally:
        release.touch()
        procs.finished_within(proc, 30)
        procs.kill_group(proc)
        proc.wait()


def _start(spec: EngineSpec, workdir: Path, role: str, python: str, env: dict[str, str] | None,
           host: EngineHost | None) -> tuple[Any, tuple[Path, Path, Path], float]:
    workdir.mkdir(parents=True, exist_ok=True)
    paths = spec_path, result_path, log_path = (workdir / f"{role}.spec.json", workdir / f"{role}.result.json",
                                                workdir / f"{role}.log")
    spec_path.write_text(json.dumps(spec))
    result_path.unlink(missing_ok=True)
    started = time.monotonic()
    hosted = host.start(spec_path, result_path, log_path, env) if host is not None else None
    if hosted is not None:
        return hosted, paths, started
    proc = procs.spawn([python, "-m", "conformance.levels.engine.child", str(spec_path), str(result_path)],
                       log_path, env=env)
    return proc, paths, started


def _ended(proc: Any, paths: tuple[Path, Path, Path], role: str, started: float, timed_out: bool,
           timeout_s: float) -> EngineRun:
    # Always: an engine core or worker the child spawned must not outlive it (they would
    # hold memory and cores for the rest of the run).
    procs.kill_group(proc)
    proc.wait()
    wall = round(time.monotonic() - started, 2)
    tail = procs.log_tail(paths[2], LOG_TAIL)
    if timed_out:
        return EngineRun(role, False, error=f"did not finish within {timeout_s:g}s (killed)", log_tail=tail,
                         wall_s=wall, timed_out=True)
    try:
        result: EngineResult = json.loads(paths[1].read_text())
    except (OSError, ValueError):
        if proc.returncode == -signal.SIGKILL:  # the suite kills only at a deadline (timed_out, above)
            return EngineRun(role, False, error="killed by a SIGKILL the suite did not send (the kernel's OOM "
                                                "killer, most likely: see dmesg), without a result",
                             log_tail=tail, wall_s=wall, killed=True)
        return EngineRun(role, False, error=f"exited {proc.returncode} without a result (crashed)",
                         log_tail=tail, wall_s=wall)
    return EngineRun(role, bool(result.get("ok")), result, result.get("error", ""), tail, wall)



class EngineHost:
    """The suite's end of an engine host (``conformance.levels.engine.host``, a ``forking`` fork server)
    in ``python``, started on first use. A host that does not come up, or dies, is reported in its
    log and in ``describe()``; ``start`` then answers None and the engines start as fresh processes."""

    def __init__(self, python: str, log_path: Path, ready_timeout_s: float = 300.0, *,
                 env: Mapping[str, str] | None = None, adopt: bool = True, side: str = separate.FIRST) -> None:
        self.python, self.log_path, self.ready_timeout_s = python, log_path, ready_timeout_s
        # What its interpreter is started with beside this process's environment (its hash seed:
        # ``separate.interpreter_env``), whether the host a matrix runner handed over for its ``side``
        # (started without the connector's declared environment) may stand in.
        self.env, self.adopt, self.side = dict(env or {}), adopt, side
        self.hash_seed = separate.seed_of(self.env)  # a handed host's own, once adopted
        self._launched: float | None = None
        self._launching = threading.Lock()  # two lanes may ask for a host not launched yet: one process
        self._server: forking.ForkServer | None = None
        self.handed = False  # started ahead by a matrix runner and handed over (``handover``)
        self.failed = ""  # why the host cannot be used ("" while it can)
        self.ready_s: float | None = None

    def start(self, spec_path: Path, result_path: Path, log_path: Path,
              env: dict[str, str] | None) -> forking.Child | None:
        """A child running ``spec_path``, or None where no host can run it."""
        if not self._up():
            return None
        assert self._server is not None
        child = self._server.fork({"spec": str(spec_path), "result": str(result_path), "log": str(log_path),
                                   "env": dict(env or {})})
        if child.pid is None:
            self.failed = child.error or "the engine host forked no child"
            return None
        return child

    @property
    def launched(self) -> bool:
        """Whether its process was started (or adopted)."""
        return self._launched is not None

    def describe(self) -> dict[str, Any]:
        """What the cell's timings record about the host."""
        ready = self._server.ready if self._server is not None else None
        return {"ready_s": self.ready_s, **(ready or {}), **({"handed": True} if self.handed else {}),
                **({"failed": self.failed} if self.failed else {})}

    def close(self) -> None:
        if self._server is None:
            return
        if self.handed:  # lent by a runner, which takes it back: its engines for this cell end here
            self._server.detach()
        else:
            self._server.close(grace_s=10)  # its stdin closed: the host ends with its children

    # -- the host process -------------------------------------------------------------------------
    def launch(self) -> None:
        """Start the host (or adopt the one a matrix runner started ahead of this cell) without waiting
        for its imports: ``start`` waits for them. Once; a host that already failed is not retried."""
        with self._launching:
            if self.failed or self._server is not None:
                return
            self._launched = time.monotonic()
            proc: forking.Speaking
            adopted = handover.adopt(self.python, accept=self.adopt, side=self.side)
            if adopted is not None:
                proc, self.log_path, self.hash_seed = adopted
                self.handed = True
            else:
                proc = handover.start_host(self.python, self.log_path, {**os.environ, **self.env})
            self._server = forking.ForkServer(proc, "engine host", self.log_path, reply_s=FORK_S)

    def _up(self) -> bool:
        if self.failed:
            return False
        started = time.monotonic()  # ready_s: how long the first engine waited for the host (launched ahead)
        self.launch()
        if self._server is None:
            return False
        if self.ready_s is not None:
            return not self._server.gone() or self._fail("the engine host exited (see its log)")
        if not self._server.wait_ready(self.ready_timeout_s):
            return self._fail(self._server.failed)
        self.ready_s = round(time.monotonic() - started, 2)
        return True

    def _fail(self, why: str) -> bool:
        self.failed = why
        return False
