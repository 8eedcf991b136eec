"""Engine hosts kept warm for a matrix run's engine cells (conformance/levels/engine/handover.py).

Each engine cell takes a host that is importing, or has imported, its stack's vLLM: the first cell
of a stack the one started as it asks (the import overlaps pytest's start), each later one the spare
started while the cell before it ran. A spare is started only while cells of its stack remain to take
it, at most one per job; what no cell took is stopped when the run ends.
"""

from __future__ import annotations

import shutil
import threading
from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterable, Mapping

from conformance.levels.engine.handover import AheadHost
from conformance.matrix.definition import Cell

FRESH = "--kv-engine-start=fresh"  # a cell that starts every engine as a process of its own takes no host


def takes_host(cell: Cell) -> bool:
    return cell.level == "engine" and FRESH not in cell.args


def _stack(cell: Cell) -> str:
    return cell.stack.name if cell.stack is not None else ""  # "": the runner's own Python


class WarmHosts:
    def __init__(self, cells: Iterable[Cell], spare_dir: Path, jobs: int = 1) -> None:
        self._remaining = Counter(_stack(c) for c in cells if takes_host(c))
        self._spares: dict[str, list[AheadHost]] = defaultdict(list)
        self._spare_dir, self._jobs = spare_dir, max(1, jobs)
        self._lock = threading.Lock()
        self._started = 0

    def take(self, cell: Cell, python: str, env: Mapping[str, str], log_path: Path) -> AheadHost | None:
        """A host for ``cell`` in ``python`` (started with ``env``, the cell's), its log moved to
        ``log_path``; None for a cell that takes none. Starts the spares its stack's next cells take."""
        if not takes_host(cell):
            return None
        stack = _stack(cell)
        with self._lock:
            self._remaining[stack] -= 1
            spares = self._spares[python]
            host = spares.pop(0) if spares else self._start(python, env)
            while len(spares) < min(self._jobs, self._remaining[stack]):
                spares.append(self._start(python, env))
        host.log_path = host.log_path.rename(log_path)  # the host writes on: an open file follows its rename
        return host

    def close(self) -> None:
        """Stop the spares no cell took."""
        with self._lock:
            for spares in self._spares.values():
                for host in spares:
                    host.stop()
            self._spares.clear()
        shutil.rmtree(self._spare_dir, ignore_errors=True)

    def _start(self, python: str, env: Mapping[str, str]) -> AheadHost:
        self._spare_dir.mkdir(parents=True, exist_ok=True)
        self._started += 1
        return AheadHost(python, self._spare_dir / f"host-{self._started}.log", env)
