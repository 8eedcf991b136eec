"""Render a results directory into the compatibility report: matrix.json, matrix.md, index.html.

Reads result files only, so re-rendering never reruns anything.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, cast

from conformance.report.answers import MARK_MEANINGS, MARKS, answers
from conformance.report.document import MatrixReport, Prefill, ReportCell
from conformance.report.html import LEVEL_TITLES, render_html
from conformance.util.versions import version_key
from conformance.verdict import results
from conformance.verdict.clauses import CLAUSES, GROUPS, PassRecord
from conformance.verdict.cost import cell_cost
from conformance.verdict.results import CellInfo, ResultsDocument, TestEntry, platform_of
from conformance.verdict.status import Status, is_red, worst
from conformance.vocabulary import Level


def cell_level(cell: CellInfo) -> Level | None:
    """A result's cell level (results written before the rename call it ``kind``)."""
    level = cell.get("level", cell.get("kind"))
    return cast(Level, level) if isinstance(level, str) else None


def load_results(results_dir: Path, only: set[str] | None = None) -> list[ResultsDocument]:
    """Every cell result in ``results_dir`` (or only the cells whose file stem is in ``only``)."""
    docs = []
    for path in sorted(Path(results_dir).glob("*.json")):
        if only is not None and path.stem not in only:
            continue
        try:
            doc = json.loads(path.read_text())
        except ValueError:
            continue
        if doc.get("schema") == results.SCHEMA and "cell" in doc:
            docs.append(doc)
    return docs


def clause_verdicts(tests: list[TestEntry]) -> dict[str, TestEntry]:
    """One test per clause: its most severe (a parametrized clause has several), which the clause's
    status and message are read from."""
    verdicts: dict[str, TestEntry] = {}
    for t in tests:
        seen = verdicts.get(t["clause"])
        if seen is None or Status(t["status"]).severity > Status(seen["status"]).severity:
            verdicts[t["clause"]] = t
    return verdicts


def clause_statuses(tests: list[TestEntry]) -> dict[str, str]:
    """One status per clause: the most severe of its tests."""
    return {clause: t["status"] for clause, t in clause_verdicts(tests).items()}


def matrix_document(docs: list[ResultsDocument]) -> MatrixReport:
    cells: list[ReportCell] = []
    for doc in docs:
        timings = (doc.get("connector") or {}).get("engine_timings") or {}
        verdicts = clause_verdicts(doc["tests"])
        statuses = {clause: t["status"] for clause, t in verdicts.items()}
        packages = doc["environment"]["packages"]
        coordinates = dict(doc["cell"].get("coordinates") or {})
        if cell_level(doc["cell"]) == "engine" and "vllm" not in coordinates:
            # No stack: the versions the engines ran are the cell's coordinates.
            seen = {**packages, **((doc.get("connector") or {}).get("engine_versions") or {})}
            coordinates.update(results.stack_versions(seen))
        cells.append({
            **doc["cell"],
            "command": portable(doc["cell"].get("command") or ""),
            "coordinates": coordinates,
            "statuses": statuses,
            "verdict": (worst(Status(s) for s in statuses.values()) or Status.SKIP).value,
            "packages": packages,
            "platform": platform_of(doc["environment"]),  # the machine it ran on: CPU, its features, GPU
            "suite": {"version": doc["suite_version"], "digest": doc["suite_digest"]},
            "cost": cell_cost(doc),  # seconds per clause, per engine role, engines started, vLLM imports
            "problems": [{"clause": t["clause"], "status": t["status"], "message": portable(t["message"] or "")}
                         for t in doc["tests"] if is_red(t["status"])],
            "messages": {clause: portable(t.get("message") or t.get("expected") or "")
                         for clause, t in verdicts.items() if t["status"] != Status.PASS.value},
            "reasons": {clause: t["expected"] for clause, t in verdicts.items() if t.get("expected")},
            **({"prefill": p} if (p := prefill(timings)) else {}),
            # the environment its engines ran with, as the connector declares it (names; safe values only)
            **({"engine_env": e} if (e := (doc.get("connector") or {}).get("engine_env")) else {}),
            # what the suite started in the user's place (LMCache's server), in words
            **({"supplied": u} if (u := (doc.get("connector") or {}).get("supplied")) else {}),
            # the one geometry a one-geometry connector was shown
            **({"geometry": ", ".join(f"{k}={v}" for k, v in g.items())}
               if (g := (doc.get("connector") or {}).get("geometry")) else {}),
            # per clause, what its recorded connector-level passes loaded (the results' evidence)
            **({"loads": e} if (e := load_evidence(doc["tests"])) else {}),
            # each engine role's log, kept beside the results file (relative to its folder)
            **({"evidence": e} if (e := {role: ev["log"] for role, ev in
                                         ((doc.get("connector") or {}).get("engine_evidence") or {}).items()
                                         if ev.get("log")}) else {}),
        })
    return derive({"schema": "kvconform.matrix-report/1", "cells": cells})


def load_evidence(tests: list[TestEntry]) -> dict[str, str]:
    """Per clause, what the passes its results entries recorded loaded, in words: a Pass or a Not
    exercised reads as what it rests on (the passes themselves are in the results file)."""
    seen: dict[str, list[PassRecord]] = {}
    for test in tests:
        seen.setdefault(test["clause"], []).extend(test.get("evidence") or ())
    said = {}
    for clause, passes in seen.items():
        if passes:
            loaded = sum(n for p in passes for n in (p.get("loaded") or {}).values())
            failed = sum(len(p.get("failed_blocks") or ()) for p in passes)
            said[clause] = (f"its last {len(passes)} recorded pass(es) loaded {loaded} tokens"
                            + (f", {failed} block(s) reported failed" if failed else "")
                            + f" ({', '.join(sorted({p['kv_cache_dtype'] for p in passes if p.get('kv_cache_dtype')}))})")
    return said


def derive(matrix: MatrixReport) -> MatrixReport:
    """The views a report shows, computed from its cells alone (so a published matrix.json can be
    re-rendered after the report changes, without its results): clauses, coordinates, the answer
    grids, the vLLM x LMCache grid and the counts."""
    cells = matrix["cells"]
    for cell in cells:
        if "level" not in cell:  # matrix documents from before the rename
            cell["level"] = cell.get("kind") or ""
        cell["command"] = portable(cell.get("command") or "")
        cell["messages"] = {c: portable(m) for c, m in (cell.get("messages") or {}).items()}
    present = {c for cell in cells for c in cell["statuses"]}
    counts: dict[str, int] = {}
    for cell in cells:
        counts[cell["verdict"]] = counts.get(cell["verdict"], 0) + 1
    return {**matrix, "clauses": [c for c in CLAUSES if c in present], "coordinates": coordinate_names(cells),
            "answers": answers(cells), "versions": version_grid(cells), "counts": counts,
            "platforms": sorted({cell["platform"] for cell in cells if cell.get("platform")}),
            "suites": suite_builds(cells)}


def suite_builds(cells: list[ReportCell]) -> list[str]:
    """Which kvconform builds made the cells, most cells first: a matrix joined from runs of other
    code (``kvconform report --add``, a fleet's shards, several sessions) says so."""
    made: dict[str, int] = {}
    for cell in cells:
        suite = cell.get("suite")
        name = (f"kvconform {suite['version']} (files {suite['digest'][:12]})" if suite
                else "a kvconform that did not record its build")
        made[name] = made.get(name, 0) + 1
    return [f"{name}: {n} cells" for name, n in sorted(made.items(), key=lambda kv: (-kv[1], kv[0]))]


def prefill(timings: dict[str, Any]) -> Prefill | None:
    """What loading saved: the boundary batch (prompts served one by one, none an engine's first
    batch) as the baseline recomputed it and as the load engine (or, without one, the same engine
    after its reset) loaded it; None where either is missing."""
    def batch(role: str, name: str) -> float | None:
        value = ((timings.get(role) or {}).get("batches_s") or {}).get(name)
        return value if isinstance(value, (int, float)) and value > 0 else None

    base = batch("baseline", "boundaries")
    loaded, by = batch("load", "boundaries"), "a fresh engine"
    if loaded is None:
        loaded, by = batch("same_engine", "boundaries@1"), "the same engine"
    if base is None or loaded is None:
        return None
    return {"baseline_s": base, "loaded_s": loaded, "speedup": round(base / loaded, 2), "loaded_by": by}


_HOME = str(Path.home())
_SITE_PACKAGES = re.compile(r"[^\s'\"()\[\],;]*/lib/python3\.\d+/site-packages/")


def portable(text: str) -> str:
    """``text`` without the paths of the machine that ran it: the checkout is ``.``, the home ``~``,
    temporary directories ``<tmp>``, any venv's installed packages ``<site-packages>`` (a stack's
    traceback names vLLM's file, not where that machine keeps its venvs)."""
    text = _SITE_PACKAGES.sub("<site-packages>/", text)
    text = text.replace(str(Path.cwd()) + "/", "./").replace(str(Path.cwd()), ".")
    text = re.sub(r"/tmp/[^\s'\"\],;)]*", "<tmp>", text)
    return text.replace(_HOME + "/", "~/") if _HOME not in ("/", "") else text


# Columns read from what is tested to what it ran on; result files store coordinates key-sorted.
COORDINATE_ORDER = ("store", "connector", "model", "kv_cache_dtype", "vllm", "lmcache")


def coordinate_names(cells: list[ReportCell]) -> list[str]:
    names = {k for cell in cells for k in cell.get("coordinates", {})}
    return sorted(names, key=lambda k: (COORDINATE_ORDER.index(k) if k in COORDINATE_ORDER else len(COORDINATE_ORDER), k))


def version_grid(cells: list[ReportCell]) -> dict[str, Any]:
    """vLLM x LMCache columns against (connector or store, model, dtype, tier) rows: each cell's verdict.

    A maintainer reads one row to see where a connector breaks across versions; a stack that failed
    to install is a cell too (Error), never a gap that looks like "not tested".
    """
    versioned = [(i, c) for i, c in enumerate(cells) if "vllm" in c["coordinates"]]
    pairs = sorted({(c["coordinates"]["vllm"], c["coordinates"].get("lmcache", "")) for _, c in versioned},
                   key=lambda p: (version_key(p[0]), version_key(p[1])))
    columns = [f"vLLM {v} / LMCache {lm}" for v, lm in pairs]
    rows: dict[tuple[str, ...], dict[str, Any]] = {}
    for i, cell in versioned:
        co = cell["coordinates"]
        key = (co.get("connector") or co.get("store", ""), co.get("model", ""), co.get("kv_cache_dtype", ""),
               cell["tier"])
        row = rows.setdefault(key, {"key": list(key), "cells": {}})
        column = columns[pairs.index((co["vllm"], co.get("lmcache", "")))]
        row["cells"][column] = {"index": i, "id": cell["id"], "verdict": cell["verdict"]}
    return {"header": ["connector / store", "model", "kv_cache_dtype", "tier"], "columns": columns,
            "rows": list(rows.values())}


def markdown(matrix: MatrixReport) -> str:
    counts = matrix.get("counts") or {}
    lines = ["# kvconform compatibility matrix", "",
             f"{len(matrix['cells'])} cells: " + ", ".join(f"{n} {s}" for s, n in sorted(
                 counts.items(), key=lambda kv: -Status(kv[0]).severity)) + ".", "",
             *([f"Run on: {'; '.join(matrix['platforms'])}.", ""] if matrix.get("platforms") else []),
             *([f"Made by: {'; '.join(matrix['suites'])}.", ""] if len(matrix.get("suites") or ()) > 1 else []),
             "Each grid cell has one mark per clause group, in this order: " + ", ".join(matrix["answers"]["groups"])
             + ". Marks: " + "; ".join(f"`{m}` {what}" for m, what in MARK_MEANINGS.items())
             + ". A number points at the note under its grid.", ""]
    for headline in matrix["answers"].get("headlines") or []:
        lines += [f"## {headline['title']}", "", "| cell | verdict | " + " | ".join(matrix["answers"]["groups"])
                  + " | why |", "|---|---|" + "---|" * (len(matrix["answers"]["groups"]) + 1)]
        lines += [f"| {r['id']} | {r['verdict']} | " + " | ".join(MARKS.get(r["groups"].get(g, ""), "·")
                  for g in matrix["answers"]["groups"]) + f" | {r['why']} |" for r in headline["rows"]]
        lines.append("")
    for subject in matrix["answers"]["subjects"]:
        lines += _subject_markdown(subject)
    lines += ["## Detail by level", "",
              "Statuses: Pass, Fail (a clause was broken), Error (no verdict: hang, crash, "
              "install), XFail (a documented known failure), XPass (a known failure passed: stale), "
              "Disabled (capability not claimed), Not runnable, Not exercised (ran, but compared nothing: the "
              "connector loaded nothing), Skip (not run: excluded by the matrix); — the clause is not run in that cell.",
              ""]
    for level in dict.fromkeys(CLAUSES[c].level for c in matrix["clauses"]):
        clauses = [c for c in matrix["clauses"] if CLAUSES[c].level == level]
        rows = [cell for cell in matrix["cells"] if any(c in cell["statuses"] for c in clauses)]
        coords = coordinate_names(rows)
        lines += [f"### {LEVEL_TITLES[level]}", "",
                  "| cell | tier | " + "".join(f"{k} | " for k in coords) + " | ".join(f"`{c}`" for c in clauses) + " |",
                  "|---|---|" + "---|" * (len(coords) + len(clauses))]
        for cell in rows:
            values = [str(cell.get("coordinates", {}).get(k, "")) for k in coords]
            row = [cell["statuses"].get(c, "—") for c in clauses]
            lines.append(f"| {cell['id']} | {cell['tier']} | " + "".join(f"{v} | " for v in values) + " | ".join(row) + " |")
        lines.append("")
    excluded = [cell for cell in matrix["cells"] if cell.get("excluded")]
    if excluded:
        lines += ["## Excluded by the matrix", ""] + [f"- **{cell['id']}**: {cell['excluded']}" for cell in excluded]
        lines.append("")
    problems = [(cell, p) for cell in matrix["cells"] for p in cell["problems"]]
    if problems:
        lines += ["## Problems", ""]
        for cell, p in problems:
            first = (p["message"] or "").splitlines()[0] if p["message"] else ""
            lines.append(f"- **{cell['id']}** `{p['clause']}` {p['status']}: {first}")
            repro = (cell.get("command") or "").replace("RESULTS.json", "out.json").replace(" --junitxml=JUNIT.xml", "")
            lines.append(f"  - repro: `{repro}`")
            if (cell.get("loads") or {}).get(p["clause"]):
                lines.append(f"  - evidence: {cell['loads'][p['clause']]}")
            if cell.get("evidence"):
                lines.append("  - engine logs: " + ", ".join(f"[{role}]({href})" for role, href in cell["evidence"].items()))
    return "\n".join(lines) + "\n"


def _subject_markdown(subject: dict[str, Any]) -> list[str]:
    """A subject's answer grid: its summary, one row per model and dtype, one column per stack."""
    title = subject["name"] + (f" (LMCache {subject['lmcache']})" if subject.get("lmcache") else "")
    lines = [f"## {title}", ""] + [f"- {line}" for line in subject["summary"]] + [""]
    lines += ["| model | kv_cache_dtype | " + " | ".join(subject["columns"]) + " |",
              "|---|---|" + "---|" * len(subject["columns"])]
    for row in subject["rows"]:
        marks = []
        for column in subject["columns"]:
            cell = row["cells"].get(column)
            marks.append(" ".join(
                MARKS.get(g["status"], "?") + "".join(f"[{n}]" for n in g["notes"] if g["status"] != "Pass")
                if (g := cell["groups"].get(group)) else "·" for group in GROUPS) if cell else "")
        lines.append(f"| {row['model'] or '-'} | {row['kv_cache_dtype'] or '-'} | " + " | ".join(marks) + " |")
    lines.append("")
    lines += [f"{n['n']}. {n['status']} (" + ", ".join(f"`{c}`" for c in n["clauses"]) + f"): {n['text'] or '(no message)'}"
              for n in subject["notes"]]
    return lines + [""]


def render(results_dir: Path, out_dir: Path, only: set[str] | None = None) -> MatrixReport:
    return write_report(matrix_document(load_results(results_dir, only)), out_dir)


def write_report(matrix: MatrixReport, out_dir: Path) -> MatrixReport:
    """matrix.json, matrix.md and index.html of ``matrix`` in ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    matrix = linked_evidence(without_interpreters(matrix), out_dir)
    (out_dir / "matrix.json").write_text(json.dumps(matrix, indent=2, sort_keys=True) + "\n")
    (out_dir / "matrix.md").write_text(markdown(matrix))
    (out_dir / "index.html").write_text(render_html(matrix))
    return matrix


def without_interpreters(matrix: MatrixReport) -> MatrixReport:
    """``matrix`` without the path of each stack's Python: a path of the machine that ran it, which a
    published report (or a matrix.json joined into one) does not carry; its stack says what ran."""
    cells: list[ReportCell] = []
    for cell in matrix["cells"]:
        stack = cast(dict[str, Any] | None, cell.get("stack"))
        cells.append({**cell, "stack": {k: v for k, v in stack.items() if k != "python"}} if stack else cell)
    return {**matrix, "cells": cells}


def linked_evidence(matrix: MatrixReport, out_dir: Path) -> MatrixReport:
    """``matrix`` with each cell's engine logs as links from ``out_dir`` (a report beside its results,
    ``results/TIER/report/``, reaches them; a published copy without them links none)."""
    cells = []
    for cell in matrix["cells"]:
        logs = {role: f"../{path}" for role, path in (cell.get("evidence") or {}).items()
                if (out_dir / ".." / path).is_file()}
        linked: ReportCell = {**cell}
        linked.pop("evidence", None)
        if logs:
            linked["evidence"] = logs
        cells.append(linked)
    return {**matrix, "cells": cells}


def any_red(matrix: MatrixReport) -> bool:
    """A matrix with a red cell fails the run."""
    return any(is_red(cell["verdict"]) for cell in matrix["cells"])
