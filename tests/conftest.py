"""Helpers for testing the suite itself: run it the way a user does, in a process of its own."""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conformance.report.render import clause_statuses

REPO = Path(__file__).resolve().parents[1]
REQUIRE_TOOLS = "KVCONFORM_REQUIRE_SYSTEM_TOOLS"  # the noxfile's test sessions set it


def require_tool(command: str) -> str:
    """The path of a system ``command`` a test needs (constraints/system.txt names its package). A
    missing one fails the test under the README's test command (nox sets REQUIRE_TOOLS) and in CI,
    naming the line that installs it; a bare pytest run skips it, saying the same."""
    found = shutil.which(command)
    if found:
        return found
    lines = (line.split() for line in (REPO / "constraints" / "system.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#"))
    package = dict(lines).get(command, command)
    why = f"{command} is not installed: sudo apt-get install -y {package}"
    required = os.environ.get(REQUIRE_TOOLS) or os.environ.get("CI")
    raise pytest.fail.Exception(why) if required else pytest.skip.Exception(why)
# Each suite run is a fork of one process per test worker that has imported these and nothing of the
# suite: a fresh interpreter spends 10-15 s importing vLLM, once per run, 160 times in the engine
# session (CI's longest step). The suite's own modules are imported fresh in every run; a missing
# one (no vLLM in the tests session) is skipped.
PRELOADED = ["torch", "numpy", "hypothesis", "yaml", "safetensors", "transformers",
             "vllm.distributed.kv_transfer.kv_connector.v1.base"]
_FORKS = multiprocessing.get_context("forkserver")
_FORKS.set_forkserver_preload(PRELOADED)


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


def _pytest_in_fork(args: list[str], env: dict[str, str], cwd: str, log: str) -> None:
    """In the forked child: what ``python -m pytest ARGS`` in ``cwd`` under ``env`` does, its output
    (stdout and stderr, interleaved) into ``log``, its exit code the process's."""
    os.setpgrp()  # a timeout kills the run with whatever it started
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.path.insert(0, cwd)  # as `python -m` puts it first
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(out, 1)
    os.dup2(out, 2)
    code = 1
    try:
        code = int(pytest.main(args))
    finally:
        atexit._run_exitfuncs()  # what an interpreter's exit runs (the suite's own clean-up included)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _pytest(args: list[str], env: dict[str, str], log: Path, timeout: float) -> int:
    """``python -m pytest ARGS`` in REPO: forked from the preloaded process, or started afresh where
    ``env`` sets what only an interpreter's start reads (PYTHONHASHSEED, PYTHONPATH, ...)."""
    if any(k.startswith("PYTHON") and os.environ.get(k) != v for k, v in env.items()):
        with open(log, "w") as out:
            return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=REPO, env=env, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout).returncode
    child = _FORKS.Process(target=_pytest_in_fork, args=(args, env, str(REPO), str(log)))
    child.start()
    child.join(timeout)
    if child.exitcode is None and child.pid is not None:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            child.kill()
        child.join()
        raise subprocess.TimeoutExpired(["pytest", *args], timeout)
    assert child.exitcode is not None
    return child.exitcode


@pytest.fixture
def run_suite(tmp_path: Path):
    """Run ``pytest --pyargs conformance`` against a store; return exit code, output, results."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> SuiteRun:
        n = len(list(tmp_path.iterdir()))
        results, log = tmp_path / f"results-{n}.json", tmp_path / f"output-{n}.txt"
        argv = ["--pyargs", "conformance", "-p", "no:cacheprovider", "-q", f"--kv-results={results}",
                f"--basetemp={tmp_path / 'base'}", *args]
        full_env = {**os.environ, **(env or {})}
        full_env.pop("KVCONFORM_STORE", None) if env is None or "KVCONFORM_STORE" not in env else None
        code = _pytest(argv, full_env, log, timeout)
        data = json.loads(results.read_text()) if results.exists() else None
        return SuiteRun(code, log.read_text(errors="replace"), data, results)

    return run
