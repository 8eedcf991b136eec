"""What each tier costs, from measured cell wall times and stack install times (nothing is run):

    python benchmarks/tier_cost.py --out benchmarks/results/tier_cost.json

For each tier of matrix.yaml: the cell-minutes (the sum of the cells' wall times; an engine cell
keeps both cores busy, so a 2-core machine's CPU-minutes are about twice that), the wall time on one
2-core machine with ``--jobs 2``, and fanned out as ``kvconform plan`` plans it: the longest job
(its stack's install plus its cells over the runner's two lanes), cold (the stack installed) and
cached (the venv restored, which costs its download: the venv's size is given with it).

The wall times come from runs recorded in the repository, by cell id and tier: the published reports
(reports/*/matrix.json, each cell's ``wall_s`` and its stack's ``install_s``) and the quick tier's run
(benchmarks/results/quick_tier_run.json). A cell none of them measured (one added since) is counted
apart, never guessed. The speed-up of two lanes over one is the full tier's measured one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from conformance.matrix.definition import Matrix, load
from conformance.matrix.plan import OWN_PYTHON, plan

HERE = Path(__file__).resolve().parents[1]
REPORTS = {"quick": HERE / "reports" / "matrix.json", "standard": HERE / "reports" / "standard" / "matrix.json",
           "full": HERE / "reports" / "full" / "matrix.json"}
QUICK_RUN = HERE / "benchmarks" / "results" / "quick_tier_run.json"
FULL_RUN = HERE / "benchmarks" / "results" / "full_tier_run.json"


def measured(tier: str) -> tuple[dict[str, float], dict[str, float]]:
    """(cell name -> wall s, stack name -> cold install s) recorded for ``tier``."""
    walls: dict[str, float] = {}
    installs: dict[str, float] = {}
    report = REPORTS.get(tier)
    if report and report.exists():
        for cell in json.loads(report.read_text())["cells"]:
            if cell.get("wall_s") is not None:
                walls[cell["name"]] = float(cell["wall_s"])
            stack = cell.get("stack") or {}
            if stack.get("install_s"):
                installs[stack["name"]] = float(stack["install_s"])
    if tier == "quick":  # the newest quick run wins over the published report
        for cell in json.loads(QUICK_RUN.read_text())["per_cell"]:
            walls[cell["name"]] = float(cell["wall_s"])
    return walls, installs


def tier_cost(matrix: Matrix, tier: str, lanes_speedup: float, install_default_s: float | None) -> dict[str, Any]:
    cells = {c.name: c for c in matrix.cells(tier)}
    walls, installs = measured(tier)
    known = {n: walls[n] for n in cells if n in walls}
    missing = sorted(set(cells) - set(known))
    jobs: list[dict[str, Any]] = []
    for job in plan(matrix, tier):
        cell_s = sum(known.get(n, 0.0) for n in job.cells)
        install = install_default_s if job.stack == OWN_PYTHON else installs.get(job.stack)
        run_s = cell_s / lanes_speedup
        jobs.append({"job": job.id, "cells": len(job.cells), "cells_measured": sum(n in known for n in job.cells),
                     "cells_wall_s": round(cell_s), "run_s": round(run_s),
                     "install_cold_s": None if install is None else round(install),
                     "longest_cold_s": None if install is None else round(run_s + install)})
    total = sum(known.values())
    colds = [j["longest_cold_s"] for j in jobs if j["longest_cold_s"] is not None]
    return {"tier": tier, "cells": len(cells), "cells_measured": len(known), "not_measured": missing,
            "cell_minutes": round(total / 60, 1),
            "one_machine_jobs2_minutes": round(total / lanes_speedup / 60, 1),
            "jobs": len(jobs), "longest_job_cached_minutes": round(max((j["run_s"] for j in jobs), default=0) / 60, 1),
            "longest_job_cold_minutes": round(max(colds, default=0) / 60, 1) if colds else None,
            "per_job": jobs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", type=Path, default=HERE / "matrix.yaml")
    parser.add_argument("--install-default-s", type=float, default=None,
                        help="the measured install of the default stack's venv (nox -s stack(default)), if known")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    matrix = load(args.matrix)
    full_run = json.loads(FULL_RUN.read_text())
    speedup = float(full_run["overlap_speedup"])
    doc = {"install_default_s": args.install_default_s,
           "lanes_speedup": speedup, "lanes_speedup_source": f"{FULL_RUN.name}: the full tier, --jobs 2",
           "environment": full_run["environment"],
           "tiers": [tier_cost(matrix, t, speedup, args.install_default_s) for t in ("quick", "standard", "full")]}
    text = json.dumps(doc, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    for t in doc["tiers"]:
        print(f"{t['tier']}: {t['cells']} cells ({t['cells_measured']} measured), {t['cell_minutes']} cell-min, "
              f"one machine {t['one_machine_jobs2_minutes']} min, {t['jobs']} jobs, longest job "
              f"{t['longest_job_cached_minutes']} min cached / {t['longest_job_cold_minutes']} min cold")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
