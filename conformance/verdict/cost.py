"""What a cell cost, read off its results document (``kvconform.results/1``), nothing rerun: the
cost model the report's cell detail shows and ``benchmarks/summarize_matrix_run.py --cost`` sums per
tier.

Derived at read time from what every results file already records, so results written before this
module render too:

- ``wall_s``: the cell's wall time (``cell.wall_s``, the matrix runner's; absent from a bare pytest run);
- ``clauses_s``: per clause, the seconds of its tests (``tests[].duration_s``: pytest's time for the
  phase the verdict was read from, its call), summed over a parametrized clause's tests;
- ``outside_clauses_s``: the wall less those: the interpreter's start, imports, collection, and the
  session fixtures (an engine cell's model, its hosts' setup and teardown) that no clause's call holds;
- for an engine cell (``connector.engine_timings``, written by ``levels/engine/cell.EngineCell.timings``):
  ``engines_started`` and ``engines_reused`` (no-connector baselines a matrix run kept), ``vllm_imports``
  and its hosts' ``host_import_s`` and ``host_ready_s`` (a host handed over by the runner imported vLLM
  before or beside the cell: those seconds need not be inside its wall; one lent to it after an earlier
  cell, ``lent``, was that cell's import and is not counted), ``roles_s`` (each engine run's
  own wall, whichever lane ran it), and where the cell recorded them (results written since):
  ``clause_roles_s``, per clause the seconds its test spent starting or waiting for each engine run
  (a clause that waited on the second lane is charged to the role it waited for; the rest of its
  seconds are its own: comparing, judging), and ``models_s``, the seconds each model directory took to
  materialise (find, or generate on first use).

Results written before ``clause_roles_s`` was recorded have no honest answer to which clause ran
or waited for which engine (the first clause to ask starts an engine, and which one asks first is
pytest's order, not data): there the per clause and per role seconds stand side by side, unjoined.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, TypedDict

from conformance.verdict.clauses import running
from conformance.verdict.results import ResultsDocument

HOSTS = ("engine_host", "second_engine_host")  # the engine hosts ``engine_timings`` describes


class CellCost(TypedDict, total=False):
    """A cell's cost model (module doc); seconds rounded to 0.01, mappings slowest first."""

    wall_s: float
    clauses_s: dict[str, float]
    outside_clauses_s: float
    engines_started: int
    engines_reused: int
    vllm_imports: int
    host_import_s: float
    host_ready_s: float
    roles_s: dict[str, float]
    clause_roles_s: dict[str, dict[str, float]]
    models_s: dict[str, float]


class Charges:
    """What an engine cell records for ``clause_roles_s``: per clause, the seconds its test spent on
    each engine run, starting it (what a role needs first is charged to those runs) or waiting for
    the second lane to finish it. A clause is charged only for the time it was blocked; what a lane
    ran meanwhile is that run's own wall (``roles_s``). Only the thread that made the cell charges:
    its clauses run there, never on a lane's."""

    def __init__(self) -> None:
        self.seconds: dict[str, dict[str, float]] = {}
        self._thread = threading.get_ident()
        self._inner: list[float] = []  # per open charge, the seconds the charges opened within it took

    @contextmanager
    def charge(self, run: str) -> Iterator[None]:
        """Charge the running clause test's seconds in the block to ``run``, less what the charges
        opened within it took (charged to theirs)."""
        test = running()
        if test is None or threading.get_ident() != self._thread:
            yield
            return
        started = time.monotonic()
        self._inner.append(0.0)
        try:
            yield
        finally:
            inner = self._inner.pop()
            spent = time.monotonic() - started
            if self._inner:
                self._inner[-1] += spent
            roles = self.seconds.setdefault(test.clause, {})
            roles[run] = roles.get(run, 0.0) + spent - inner

    def recorded(self) -> dict[str, dict[str, float]]:
        """Per clause, per run, its seconds (those of 0.01 s and more)."""
        return {clause: kept for clause, roles in self.seconds.items()
                if (kept := {run: round(s, 2) for run, s in roles.items() if s >= 0.005})}


def _slowest_first(seconds: Mapping[str, float]) -> dict[str, float]:
    return {k: round(v, 2) for k, v in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))}


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def cell_cost(doc: ResultsDocument) -> CellCost:
    """The cost model of the cell ``doc`` is the results of (module doc)."""
    cost: CellCost = {}
    clauses: dict[str, float] = {}
    for test in doc.get("tests") or ():
        clauses[test["clause"]] = clauses.get(test["clause"], 0.0) + (_seconds(test.get("duration_s")) or 0.0)
    cost["clauses_s"] = _slowest_first(clauses)
    wall = _seconds((doc.get("cell") or {}).get("wall_s"))
    if wall is not None:
        cost["wall_s"] = round(wall, 2)
        cost["outside_clauses_s"] = round(max(wall - sum(clauses.values()), 0.0), 2)
    timings = (doc.get("connector") or {}).get("engine_timings")
    if isinstance(timings, dict):
        cost.update(engine_cost(timings))
    return cost


def engine_cost(timings: Mapping[str, Any]) -> CellCost:
    """The engine part of a cell's cost, from its ``engine_timings``."""
    runs = {name: t for name, t in timings.items() if isinstance(t, dict) and "wall_s" in t}
    started = {name: s for name, t in runs.items() if "reused_from" not in t and (s := _seconds(t["wall_s"]))}
    hosts = [t for side in HOSTS if isinstance(t := timings.get(side), dict) and not t.get("lent")]
    cost: CellCost = {
        "engines_started": int(timings.get("engine_starts", len(started))),
        "engines_reused": sum("reused_from" in t for t in runs.values()),
        "vllm_imports": int(timings.get("vllm_imports") or 0),
        "host_import_s": round(sum(_seconds(h.get("import_s")) or 0.0 for h in hosts), 2),
        "host_ready_s": round(sum(_seconds(h.get("ready_s")) or 0.0 for h in hosts), 2),
        "roles_s": _slowest_first(started),
    }
    charged = timings.get("clause_roles_s")
    if isinstance(charged, dict):
        cost["clause_roles_s"] = {clause: _slowest_first(roles) for clause, roles in sorted(charged.items())}
    models = timings.get("models_s")
    if isinstance(models, dict):
        cost["models_s"] = _slowest_first(models)
    return cost


def _s(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def cost_line(cost: CellCost, slowest: int = 3) -> str:
    """``cost`` in one line, as the report's cell detail shows it: the wall, what the engines cost,
    and the ``slowest`` clauses (each with the engine runs it started or waited for, where recorded).
    Read from a matrix.json too, whose mappings are key-sorted: the order is taken from the seconds."""
    parts = [f"{_s(cost['wall_s'])} wall" if "wall_s" in cost else "no wall recorded"]
    if "engines_started" in cost:
        reused = f" ({_plural(cost['engines_reused'], 'baseline')} reused)" if cost.get("engines_reused") else ""
        parts.append(_plural(cost["engines_started"], "engine") + f" started{reused}")
        parts.append(_plural(cost.get("vllm_imports", 0), "vLLM import")
                     + (f" ({_s(cost['host_import_s'])} in its hosts)" if cost.get("host_import_s") else ""))
    if cost.get("models_s"):
        parts.append(f"models {_s(sum(cost['models_s'].values()))}")
    line = ", ".join(parts)
    named = []
    for clause, seconds in list(_slowest_first(cost.get("clauses_s") or {}).items())[:slowest]:
        roles = _slowest_first((cost.get("clause_roles_s") or {}).get(clause) or {})
        on = ", ".join(f"{role} {_s(s)}" for role, s in list(roles.items())[:3] if s >= 0.05)
        named.append(f"{clause} {_s(seconds)}" + (f" (on {on})" if on else ""))
    if named:
        line += "; slowest clauses: " + ", ".join(named)
    if "outside_clauses_s" in cost:
        line += f"; outside any clause {_s(cost['outside_clauses_s'])}"
    return line
