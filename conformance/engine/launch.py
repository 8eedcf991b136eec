"""Start an engine child process with a deadline; a hang or crash becomes data, not a hung run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOG_TAIL = 3000


@dataclass
class EngineRun:
    role: str
    ok: bool
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    log_tail: str = ""
    wall_s: float = 0.0

    def requests(self, batch: str) -> list[dict[str, Any]]:
        return [r for r in self.result.get("requests", []) if r["batch"] == batch]

    def describe_failure(self) -> str:
        return f"engine {self.role}: {self.error}\n--- log tail ---\n{self.log_tail}"


def run_engine(spec: dict[str, Any], workdir: Path, role: str, *, timeout_s: float,
               python: str = sys.executable, env: dict[str, str] | None = None) -> EngineRun:
    """Run one engine (``conformance.engine.child``) and return what it did."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path, result_path, log_path = (workdir / f"{role}.spec.json", workdir / f"{role}.result.json",
                                        workdir / f"{role}.log")
    spec_path.write_text(json.dumps(spec))
    result_path.unlink(missing_ok=True)
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([python, "-m", "conformance.engine.child", str(spec_path), str(result_path)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
        try:
            proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        # Always: an engine core or worker the child spawned must not outlive it (they would
        # hold memory and cores for the rest of the run).
        _kill_group(proc.pid)
        proc.wait()
    wall = round(time.monotonic() - started, 2)
    tail = log_path.read_text(errors="replace")[-LOG_TAIL:]
    if timed_out:
        return EngineRun(role, False, error=f"did not finish within {timeout_s:g}s (killed)", log_tail=tail, wall_s=wall)
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        return EngineRun(role, False, error=f"exited {proc.returncode} without a result (crashed)",
                         log_tail=tail, wall_s=wall)
    return EngineRun(role, bool(result.get("ok")), result, result.get("error", ""), tail, wall)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
