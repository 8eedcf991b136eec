"""Engine hosts kept warm for a matrix run's engine cells (conformance/levels/engine/handover.py).

Each engine cell borrows a host that is importing, or has imported, its stack's vLLM, and gives it
back when it ends: a run pays one import per host, not one per cell. A cell whose connector declares
a cross-engine capability borrows two (its load engines run in an interpreter of their own:
conformance/levels/engine/separate.py). The runner's own Python's hosts start with the run (their
imports overlap the cells before the first engine cell); a stack's, once a cell of it has shown its
interpreter. Hosts wait only for the next cells the run hands its jobs (one per job): one no such
cell takes is stopped at once (a run over ten stacks once kept four idle hosts of each, 0.9 GiB
apiece, for cells an hour away), the rest when the run ends.
"""

from __future__ import annotations

import shutil
import threading
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from conformance.levels.capabilities import parse_capabilities
from conformance.levels.engine import separate
from conformance.levels.engine.handover import AheadHost
from conformance.matrix.definition import Cell

FRESH = "--kv-engine-start=fresh"  # a cell that starts every engine as a process of its own takes no host
CAPABILITIES = "--kv-connector-capabilities="
ENGINE_ENV = "--kv-engine-env="  # a cell whose engines need an environment starts its own hosts


def hosts_take_none(args: Sequence[str]) -> bool:
    """Whether an engine-level run of ``args`` uses no host lent to it: its engines start fresh, or
    with an environment it declares (--kv-engine-env), which the hosts were not started with."""
    return FRESH in args or any(a.startswith(ENGINE_ENV) for a in args)


def hosts_for(cell: Cell) -> int:
    """The hosts ``cell`` takes: none (no engine, or ``hosts_take_none``), one, or two where its
    connector declares a capability whose clauses run load engines."""
    if cell.level != "engine" or hosts_take_none(cell.args):
        return 0
    declared = [a[len(CAPABILITIES):] for a in cell.args if a.startswith(CAPABILITIES)]
    capabilities, _ = parse_capabilities(",".join(declared))
    return 2 if capabilities & separate.CROSS_ENGINE else 1


def _stack(cell: Cell) -> str:
    return cell.stack.name if cell.stack is not None else ""  # "": the runner's own Python


class WarmHosts:
    def __init__(self, cells: Iterable[Cell], spare_dir: Path, jobs: int = 1,
                 known: Mapping[str, tuple[str, Mapping[str, str]]] | None = None) -> None:
        """For ``cells`` in run order, ``jobs`` at a time; ``known``: per stack name ("" for none), the
        Python and environment its cells run with, known before any ran (the runner's own): the hosts
        of the first of them start at once."""
        self._upcoming = [(cell, n) for cell in cells if (n := hosts_for(cell))]  # in run order
        self._idle: dict[str, list[AheadHost]] = defaultdict(list)  # per interpreter
        self._lent: dict[str, int] = defaultdict(int)  # per interpreter: hosts a running cell holds
        self._known: dict[str, tuple[str, Mapping[str, str]]] = dict(known or {})  # stack -> its interpreter and env
        self._spare_dir, self._jobs = spare_dir, max(1, jobs)
        self._lock = threading.Lock()
        self._started = 0
        for host in self._fit():
            host.stop()

    def take(self, cell: Cell, python: str, env: Mapping[str, str]) -> list[AheadHost]:
        """The hosts ``cell`` borrows in ``python`` (started with ``env``, the cell's), in ``separate.SIDES``
        order; none for a cell that takes none. Starts the hosts the next cells take, and stops those
        they no longer take."""
        needed = hosts_for(cell)
        if not needed:
            return []
        with self._lock:
            # This cell, and any before it that never took hosts (their stack failed to install): the
            # jobs take cells in run order.
            at = next((i for i, (c, _) in enumerate(self._upcoming) if c is cell), -1)
            del self._upcoming[:at + 1]
            self._known[_stack(cell)] = (python, env)
            idle = self._idle[python]
            hosts = [idle.pop(0) if idle else self._start(python, env) for _ in range(needed)]
            self._lent[python] += needed
            unwanted = self._fit()
        for host in unwanted:
            host.stop()
        return hosts

    def give_back(self, hosts: Sequence[AheadHost], log_path: Path) -> list[Path]:
        """After the cell that borrowed ``hosts``: what each logged meanwhile in ``log_path`` (the second's
        beside it: the paths written are returned), each taken back for the next cells (or stopped,
        where it cannot serve one)."""
        back, written = [], []
        for side, host in zip(separate.SIDES, hosts):
            path = log_path if side == separate.FIRST else log_path.with_name(f"{log_path.stem}-{side}{log_path.suffix}")
            try:
                path.write_text(host.logged_while_lent())
                written.append(path)
            except OSError:  # its log gone under it (the directory emptied): the cell's verdict stands
                pass
            back.append(host.reclaim())
        with self._lock:
            for host, reclaimed in zip(hosts, back):
                self._lent[host.python] -= 1
                if reclaimed:
                    self._idle[host.python].append(host)
            unwanted = self._fit()
        for host in unwanted:
            host.stop()
        return written

    def _fit(self) -> list[AheadHost]:
        """Start the hosts the next cells to come take (one cell per job) beyond those idle or lent; return
        the idle ones none of them takes."""
        wanted: dict[str, int] = defaultdict(int)
        for cell, n in self._upcoming[:self._jobs]:
            if _stack(cell) in self._known:
                wanted[self._known[_stack(cell)][0]] += n
        unwanted = []
        for python, idle in self._idle.items():
            while idle and len(idle) + self._lent[python] > wanted[python]:
                unwanted.append(idle.pop())  # the newest: the older ones are further into their import
        envs = dict(self._known.values())
        for python, n in wanted.items():
            while len(self._idle[python]) + self._lent[python] < n:
                self._idle[python].append(self._start(python, envs[python]))
        return unwanted

    def close(self) -> None:
        """Stop every host (a cell still holding one has ended: the run is over)."""
        with self._lock:
            for idle in self._idle.values():
                for host in idle:
                    host.stop()
            self._idle.clear()
        shutil.rmtree(self._spare_dir, ignore_errors=True)

    def _start(self, python: str, env: Mapping[str, str]) -> AheadHost:
        self._spare_dir.mkdir(parents=True, exist_ok=True)
        self._started += 1
        return AheadHost(python, self._spare_dir / f"host-{self._started}.log", env)
