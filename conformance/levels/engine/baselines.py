"""No-connector engine runs, kept and shared across the cells of a matrix run.

A baseline is vLLM alone on a model, a kv_cache_dtype and the cell's prompts: it does not depend
on the connector under test, and an engine run is bit-reproducible (the engine level's premise:
a load engine is compared bit for bit with a baseline from another process). So the cells of one
stack and model share their baselines instead of starting the same engine again, once per
connector and once more as each dtype's format twin. The key is the whole engine spec plus the
Python that ran it; a reused run says where it came from in the cell's timings.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from conformance.levels.engine.launch import EngineRun
from conformance.levels.engine.specs import EngineSpec
from conformance.util.identity import suite_digest


class BaselineStore:
    """A directory of successful no-connector runs, keyed by what determines their output."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def key(self, spec: EngineSpec, python: str) -> str:
        if spec.get("connector"):
            raise ValueError("only no-connector runs are shared: a connector's run depends on its storage")
        # The path as given, never resolved: every venv's python is a symlink to the same base
        # interpreter, so resolving it would hand one stack's baselines to every other stack.
        # ... and the suite's code: the engine child that ran it (its spec keys) may have changed since.
        material = json.dumps({"spec": spec, "python": os.path.abspath(python), "suite": suite_digest()},
                              sort_keys=True)
        return hashlib.sha256(material.encode()).hexdigest()[:32]

    def get_or_run(self, spec: EngineSpec, python: str, run: Callable[[], EngineRun]) -> EngineRun:
        """The stored run for ``spec`` or a fresh one (stored when it succeeded)."""
        path = self.root / f"{self.key(spec, python)}.json"
        try:
            kept = EngineRun(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            kept = None
        if kept is not None:
            kept.result["reused_from"] = str(path)
            return kept
        fresh = run()
        if fresh.ok:  # a failure may be a timeout or a loaded machine: never made permanent
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(asdict(fresh)))
            tmp.replace(path)  # atomic: a concurrent cell reads a whole run or none
        return fresh
