"""``kvconform gate``: the PR gate a connector's (or store's) own repository adopts.

The suite runs twice on one cell, once over each side of a change (two checkouts of the
repository: the base and the head), each side's code first on the import path; then
``kvconform diff`` compares them, fail-closed: a head that regressed a clause, lost coverage
or could not run at all fails the gate. The reusable workflow (.github/workflows/gate.yml)
is these steps on a GitHub runner; the markdown table goes to the job summary.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

from conformance.matrix.definition import Cell, Tier
from conformance.matrix.runner import run_cell
from conformance.report import diff
from conformance.vocabulary import DEFAULT_MODEL, Level

SIDES = ("base", "head")


def gate_cell(subject: str, subject_args: Sequence[str], level: Level, profile: str = "ci",
              timeout_s: float = 1800, model: str = DEFAULT_MODEL, kv_cache_dtype: str = "auto") -> Cell:
    """The one cell both sides run: the suite's options for ``subject`` (a store or connector), at one level."""
    return Cell("gate", level, (*subject_args, f"--kv-levels={level}"), Tier("gate", profile, timeout_s),
                coordinates={"store": subject, "connector": subject, "model": model, "kv_cache_dtype": kv_cache_dtype})


def run_gate(base: Path, head: Path, out: Path, cell: Cell, *, allow_lost: bool = False,
             summary: Path | None = None, say: Callable[[str], None] = print) -> int:
    """Run ``cell`` over each side into ``out/SIDE``; 0 no regression, 1 regression or lost coverage,
    2 a side that could not be read (``kvconform diff``'s codes)."""
    for side, tree in zip(SIDES, (base, head)):
        if not tree.is_dir():
            say(f"kvconform gate: {side} {tree}: not a directory (a checkout of the change's {side})")
            return 2
        path = os.pathsep.join(filter(None, [str(tree.resolve()), os.environ.get("PYTHONPATH")]))
        say(f"kvconform gate: running {cell.id} over the {side} ({tree})")
        (out / side).mkdir(parents=True, exist_ok=True)
        run_cell(cell, out / side, env={"PYTHONPATH": path})
    try:
        result = diff.compare(out / "base", out / "head")
    except diff.DiffInputError as exc:
        say(f"kvconform gate: {exc}")
        return 2
    table = diff.markdown(result, allow_lost)
    say(table.rstrip("\n"))
    if summary is not None:
        with open(summary, "a") as sink:
            sink.write(table)
    return 1 if result.failed(allow_lost) else 0
