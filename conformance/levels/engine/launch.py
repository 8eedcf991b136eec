"""Start an engine child process with a deadline; a hang or crash becomes data, not a hung run."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

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
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, result_path, log_path = (workdir / f"{role}.spec.json", workdir / f"{role}.result.json",
                                        workdir / f"{role}.log")
    spec_path.write_text(json.dumps(spec))
    result_path.unlink(missing_ok=True)
    started = time.monotonic()
    proc = procs.spawn([python, "-m", "conformance.levels.engine.child", str(spec_path), str(result_path)],
                       log_path, env=env)
    timed_out = not procs.finished_within(proc, timeout_s)
    # Always: an engine core or worker the child spawned must not outlive it (they would
    # hold memory and cores for the rest of the run).
    procs.kill_group(proc)
    proc.wait()
    wall = round(time.monotonic() - started, 2)
    tail = procs.log_tail(log_path, LOG_TAIL)
    if timed_out:
        return EngineRun(role, False, error=f"did not finish within {timeout_s:g}s (killed)", log_tail=tail,
                         wall_s=wall, timed_out=True)
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        return EngineRun(role, False, error=f"exited {proc.returncode} without a result (crashed)",
                         log_tail=tail, wall_s=wall)
    return EngineRun(role, bool(result.get("ok")), result, result.get("error", ""), tail, wall)

