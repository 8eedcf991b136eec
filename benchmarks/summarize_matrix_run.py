"""What a matrix run cost: cell wall times per level, the run's elapsed time, and what sharing saved.

Reads a results directory written by ``kvconform run`` (no rerun) and writes a JSON summary:

    python benchmarks/summarize_matrix_run.py results/full --jobs 2 --since 2026-11-30T08:09:00+00:00 \
        --out benchmarks/results/full_tier_run.json

``--since`` keeps the cells finished in one run (earlier results in the directory were kept, not
rerun). Elapsed is first start to last finish of those cells; the speed-up of ``--jobs`` is the sum
of their wall times over that elapsed time (1.0 means no overlap at all).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from conformance.report.render import cell_level


def load(results_dir: Path, since: datetime | None) -> list[dict[str, Any]]:
    docs = []
    for path in sorted(results_dir.glob("*.json")):
        doc = json.loads(path.read_text())
        if "cell" not in doc or not doc["cell"].get("ran", True):
            continue
        finished = datetime.fromisoformat(doc["created"])
        if since is None or finished >= since:
            docs.append(doc)
    return docs


def summarize(docs: list[dict[str, Any]], jobs: int) -> dict[str, Any]:
    walls: dict[str, list[float]] = defaultdict(list)
    engines_started = baselines_reused = 0
    per_cell = []
    for doc in docs:
        cell = doc["cell"]
        level = cell_level(cell) or "?"
        key = level + ("/" + cell["coordinates"].get("connector", "") if level != "store" else "")
        walls[key].append(cell["wall_s"])
        timings = (doc.get("connector") or {}).get("engine_timings") or {}
        per_cell.append({"name": cell.get("name"), "level": key, "wall_s": cell["wall_s"],
                         "engine_starts": timings.get("engine_starts"), "vllm_imports": timings.get("vllm_imports")})
        for role, timing in timings.items():
            if isinstance(timing, dict) and "wall_s" in timing:
                reused = "reused_from" in timing
                baselines_reused += reused
                engines_started += not reused
    ends = [datetime.fromisoformat(d["created"]) for d in docs]
    starts = [e - timedelta(seconds=d["cell"]["wall_s"]) for e, d in zip(ends, docs)]
    elapsed = (max(ends) - min(starts)).total_seconds() if docs else 0.0
    total = sum(w for ws in walls.values() for w in ws)
    return {
        "cells": len(docs), "jobs": jobs, "elapsed_s": round(elapsed), "sum_of_cell_wall_s": round(total),
        "mean_cell_wall_s": round(total / len(docs), 1) if docs else None,
        "overlap_speedup": round(total / elapsed, 2) if elapsed else None,
        "engines_started": engines_started, "baselines_reused": baselines_reused,
        "per_level": {k: {"cells": len(ws), "median_wall_s": round(statistics.median(ws), 1),
                         "max_wall_s": round(max(ws), 1), "sum_wall_s": round(sum(ws))}
                     for k, ws in sorted(walls.items())},
        "environment": docs[0]["environment"] if docs else {},
        "per_cell": sorted(per_cell, key=lambda c: str(c["name"])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--jobs", type=int, required=True, help="the --jobs the run used")
    parser.add_argument("--since", type=datetime.fromisoformat, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--note", default=None, help="how the run was made, kept in the summary")
    args = parser.parse_args()
    summary = summarize(load(args.results_dir, args.since), args.jobs)
    if args.note:
        summary["note"] = args.note
    text = json.dumps(summary, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
