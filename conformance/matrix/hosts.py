"""Engine hosts kept warm for a matrix run's engine cells (conformance/levels/engine/handover.py).

Each engine cell takes a host that is importing, or has imported, its stack's vLLM: the first cell
of a stack the one started as it asks (the import overlaps pytest's start), each later one the spare
started while the cell before it ran. A cell whose connector declares a cross-engine capability takes
two (its load engines run in an interpreter of their own: conformance/levels/engine/separate.py).
Spares wait only for the next cells the run hands its jobs (one per job), for any stack whose
interpreter a cell has used; a spare no such cell takes is stopped at once (a run over ten stacks
once kept four idle hosts of each, 0.9 GiB apiece, for cells an hour away), the rest when the run ends.
"""

from __future__ import annotations

import shutil
import threading
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Mapping

from conformance.levels.engine import separate
from conformance.levels.engine.handover import AheadHost
from conformance.levels.subject import parse_capabilities
from conformance.matrix.definition import Cell

FRESH = "--kv-engine-start=fresh"  # a cell that starts every engine as a process of its own takes no host
CAPABILITIES = "--kv-connector-capabilities="
ENGINE_ENV = "--kv-engine-env="  # a cell whose engines need an environment starts its own hosts


def takes_host(cell: Cell) -> bool:
    return cell.level == "engine" and FRESH not in cell.args


def hosts_for(cell: Cell) -> int:
    """The hosts ``cell`` takes: none (no engine, fresh engines, an engine environment the hosts were not
    started with), one, or two where its connector declares a capability whose clauses run load engines."""
    if not takes_host(cell) or any(a.startswith(ENGINE_ENV) for a in cell.args):
        return 0
    declared = [a[len(CAPABILITIES):] for a in cell.args if a.startswith(CAPABILITIES)]
    capabilities, _ = parse_capabilities(",".join(declared))
    return 2 if capabilities & separate.CROSS_ENGINE else 1


def _stack(cell: Cell) -> str:
    return cell.stack.name if cell.stack is not None else ""  # "": the runner's own Python


class WarmHosts:
    def __init__(self, cells: Iterable[Cell], spare_dir: Path, jobs: int = 1) -> None:
        self._upcoming = [(cell, n) for cell in cells if (n := hosts_for(cell))]  # in run order
        self._spares: dict[str, list[AheadHost]] = defaultdict(list)  # per interpreter
        self._known: dict[str, tuple[str, Mapping[str, str]]] = {}  # stack -> the interpreter and env its cells used
        self._spare_dir, self._jobs = spare_dir, max(1, jobs)
        self._lock = threading.Lock()
        self._started = 0

    def take(self, cell: Cell, python: str, env: Mapping[str, str], log_path: Path) -> list[AheadHost]:
        """The hosts for ``cell`` in ``python`` (started with ``env``, the cell's), in ``separate.SIDES``
        order, their logs moved to ``log_path`` (the second's beside it); none for a cell that takes
        none. Starts the spares the next cells take, and stops those they no longer take."""
        needed = hosts_for(cell)
        if not needed:
            return []
        with self._lock:
            # This cell, and any before it that never took hosts (their stack failed to install): the
            # jobs take cells in run order.
            at = next((i for i, (c, _) in enumerate(self._upcoming) if c is cell), -1)
            del self._upcoming[:at + 1]
            self._known[_stack(cell)] = (python, env)
            spares = self._spares[python]
            hosts = [spares.pop(0) if spares else self._start(python, env) for _ in range(needed)]
            idle = self._fit_spares()
        for host in idle:
            host.stop()
        try:
            for side, host in zip(separate.SIDES, hosts):  # the host writes on: an open file follows its rename
                host.log_path = host.log_path.rename(
                    log_path if side == separate.FIRST else log_path.with_name(f"{log_path.stem}-{side}{log_path.suffix}"))
        except OSError:  # its log gone under it (the directory emptied): the cell starts its own, never the run's end
            for host in hosts:
                host.stop()
            return []
        return hosts

    def _fit_spares(self) -> list[AheadHost]:
        """Start the spares the next cells to come take (one cell per job); return those none of them takes."""
        wanted: dict[str, int] = defaultdict(int)
        for cell, n in self._upcoming[:self._jobs]:
            if _stack(cell) in self._known:
                wanted[self._known[_stack(cell)][0]] += n
        idle = []
        for python, spares in self._spares.items():
            while len(spares) > wanted[python]:
                idle.append(spares.pop())  # the newest: the older ones are further into their import
        envs = dict(self._known.values())
        for python, n in wanted.items():
            while len(self._spares[python]) < n:
                self._spares[python].append(self._start(python, envs[python]))
        return idle

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
