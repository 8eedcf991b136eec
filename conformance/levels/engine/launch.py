"""Start an engine child process with a deadline; a hang or crash becomes data, not a hung run."""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

from conformance.util import procs

LOG_TAIL = 3000


@dataclass
class EngineRun:
    role: str
    ok: bool
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    log_tail: str = ""
    wall_s: float = 0.0
    timed_out: bool = False  # killed at its deadline: the suite's Error, not the connector's verdict

    def requests(self, batch: str) -> list[dict[str, Any]]:
        return [r for r in self.result.get("requests", []) if r["batch"] == batch]

    def phase(self, phase: int) -> EngineRun:
        """This run as if it were only its ``phase`` (a same-engine run's store pass is 0, its reload 1)."""
        records = [r for r in self.result.get("requests", []) if r.get("phase", 0) == phase]
        return replace(self, result={**self.result, "requests": records})

    def describe_failure(self) -> str:
        return f"engine {self.role}: {self.error}\n--- log tail ---\n{self.log_tail}"


def run_engine(spec: dict[str, Any], workdir: Path, role: str, *, timeout_s: float,
               python: str = sys.executable, env: dict[str, str] | None = None) -> EngineRun:
    """Run one engine (``conformance.levels.engine.child``) and return what it did."""
    proc, paths, started = _start(spec, workdir, role, python, env)
    timed_out = not procs.finished_within(proc, timeout_s)
    return _ended(proc, paths, role, started, timed_out, timeout_s)


@contextmanager
def serving_engine(spec: dict[str, Any], workdir: Path, role: str, *, timeout_s: float,
                   python: str = sys.executable, env: dict[str, str] | None = None) -> Iterator[EngineRun]:
    """A P/D producer: its run as soon as its batches are done (``serve_until`` in its spec), while
    it keeps serving; released, and stopped with its group, when the block ends. A producer that
    failed, crashed or did not get ready within ``timeout_s`` is yielded as such (not ok)."""
    release = workdir / f"{role}.release"
    release.unlink(missing_ok=True)
    proc, paths, started = _start({**spec, "serve_until": str(release), "serve_s": 2 * timeout_s}, workdir, role,
                                  python, env)
    deadline = started + timeout_s
    while not paths[1].exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        if paths[1].exists():
            result = json.loads(paths[1].read_text())
            yield EngineRun(role, bool(result.get("ok")), result, result.get("error", ""),
                            procs.log_tail(paths[2], LOG_TAIL), round(time.monotonic() - started, 2))
        else:
            yield _ended(proc, paths, role, started, proc.poll() is None, timeout_s)
    finally:
        release.touch()
        procs.finished_within(proc, 30)
        procs.kill_group(proc)
        proc.wait()


def _start(spec: dict[str, Any], workdir: Path, role: str, python: str,
           env: dict[str, str] | None) -> tuple[Any, tuple[Path, Path, Path], float]:
    workdir.mkdir(parents=True, exist_ok=True)
    paths = spec_path, result_path, log_path = (workdir / f"{role}.spec.json", workdir / f"{role}.result.json",
                                                workdir / f"{role}.log")
    spec_path.write_text(json.dumps(spec))
    result_path.unlink(missing_ok=True)
    started = time.monotonic()
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
        result = json.loads(paths[1].read_text())
    except (OSError, ValueError):
        return EngineRun(role, False, error=f"exited {proc.returncode} without a result (crashed)",
                         log_tail=tail, wall_s=wall)
    return EngineRun(role, bool(result.get("ok")), result, result.get("error", ""), tail, wall)

