"""Helpers for testing the suite itself: run it the way a user does, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conformance.report.render import clause_statuses

REPO = Path(__file__).resolve().parents[1]


@dataclass
class SuiteRun:
    returncode: int
    output: str
    results: dict[str, Any] | None
    results_path: Path

    def statuses(self) -> dict[str, str]:
        assert self.results is not None, self.output[-3000:]
        return clause_statuses(self.results["tests"])

    def failed_clauses(self) -> set[str]:
        return {c for c, s in self.statuses().items() if s == "Fail"}


@pytest.fixture
def run_suite(tmp_path: Path):
    """Run ``pytest --pyargs conformance`` against a store; return exit code, output, results."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> SuiteRun:
        results = tmp_path / f"results-{len(list(tmp_path.iterdir()))}.json"
        cmd = [sys.executable, "-m", "pytest", "--pyargs", "conformance", "-p", "no:cacheprovider",
               "-q", f"--kv-results={results}", f"--basetemp={tmp_path / 'base'}", *args]
        full_env = {**os.environ, **(env or {})}
        full_env.pop("KVCONFORM_STORE", None) if env is None or "KVCONFORM_STORE" not in env else None
        proc = subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)
        data = json.loads(results.read_text()) if results.exists() else None
        return SuiteRun(proc.returncode, proc.stdout + proc.stderr, data, results)

    return run
