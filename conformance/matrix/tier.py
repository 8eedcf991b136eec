"""A run of one tier, as ``kvconform run`` asks for it: which of its cells run (``--cell``, ``--shard``),
the cells matrix.yaml excludes recorded as excluded, the stacks they run on, the run itself
(``runner.run_cells``), then the report of the tier as matrix.yaml has it now: the results of cells it
no longer has stay on disk but out of the report.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from conformance.matrix import plan, runner
from conformance.matrix.definition import Cell, Matrix, load
from conformance.matrix.stacks import PLATFORM
from conformance.report import render as report


class TierError(Exception):
    """A tier's run that cannot start (a malformed matrix, a cell it does not have, a bad shard, a
    results directory in use); the message is one line."""


@dataclass(frozen=True)
class Selection:
    """What a run of a tier covers."""

    matrix: Matrix
    cells: list[Cell]  # the cells to run: every cell of the tier, or those named and the shard's
    listed: list[Cell]  # every cell of the tier
    excluded: list[tuple[Cell, str]]  # the tier's cells matrix.yaml excludes, each with its reason
    record_excluded: bool  # whether this run records them (a whole tier, or the first shard of one)

    @property
    def current(self) -> set[str]:
        """The file stem of every cell the tier has now, excluded ones included: what its report covers."""
        return {c.file_stem for c in [*self.listed, *(c for c, _ in self.excluded)]}


def select(matrix_path: Path, tier: str, names: Sequence[str] = (), shard: str | None = None) -> Selection | None:
    """The cells of ``tier`` that a run covers: those ``names`` names (by name or id) and those of job
    I of the tier's plan in N jobs (``shard``: ``I/N``), or every cell when neither is given. None when
    the shard has no cells (the plan needs fewer jobs); TierError for a cell the tier does not have
    (or excludes) or a malformed shard."""
    try:
        loaded = load(matrix_path)
        cells, excluded = loaded.cells(tier), loaded.excluded(tier)
        unknown = sorted(set(names) - {c.name for c in cells} - {c.id for c in cells})
        left_out = {n: why for c, why in excluded for n in (c.name, c.id)}
        if unknown and unknown[0] in left_out:
            raise TierError(f"{matrix_path}: cell {unknown[0]!r} is excluded: {left_out[unknown[0]]}")
        if unknown:
            raise TierError(_no_such_cell(matrix_path, tier, unknown[0], cells))
        sharded = plan.shard(loaded, tier, shard) if shard else None
    except ValueError as exc:  # a MatrixError, or a malformed shard
        raise TierError(str(exc)) from None
    if sharded is not None and not sharded:
        return None
    wanted = [*names, *(sharded or ())]
    first_shard = shard is not None and int(shard.partition("/")[0]) == 1  # validated by plan.shard
    return Selection(loaded, [c for c in cells if not wanted or c.name in wanted or c.id in wanted], cells, excluded,
                     record_excluded=not wanted or first_shard)


def listing(matrix_path: Path, tier: str, names: Sequence[str] = (), shard: str | None = None) -> list[str]:
    """``kvconform run --list``: the tier's cells (name, then id), and those it excludes, with why."""
    chosen = select(matrix_path, tier, names, shard)
    if chosen is None:
        return [_empty_shard(tier, shard)]
    return ([f"{c.name}\t{c.id}" for c in chosen.listed]
            + [f"{c.name}\t{c.id}\texcluded: {why}" for c, why in chosen.excluded])


def run_tier(matrix_path: Path, tier: str, *, results: Path | None = None, report_dir: Path | None = None,
             names: Sequence[str] = (), shard: str | None = None, rerun: bool = False, jobs: int = 1,
             stacks_dir: Path = runner.DEFAULT_STACKS_DIR, provision: bool = True,
             say: Callable[[str], None] = print) -> int:
    """Run the cells of ``tier`` that ``select`` chooses into ``results`` (default results/TIER), ``jobs``
    at a time, and render the tier's report into ``report_dir`` (default RESULTS/report). 1 when the
    report has a red verdict, else 0; TierError when the run cannot start."""
    chosen = select(matrix_path, tier, names, shard)
    if chosen is None:
        say(_empty_shard(tier, shard))
        return 0
    results_dir = results or Path("results") / tier
    for cell, reason in chosen.excluded if chosen.record_excluded else ():
        runner.write_excluded(cell, reason, results_dir)
    # pip's constraints come with the matrix: constraints/cpu.txt beside matrix.yaml, when it has one.
    constraints = Path(matrix_path).parent / "constraints" / f"{PLATFORM}.txt"
    stacks = runner.default_provisioner(stacks_dir, provision=provision, platform=chosen.matrix.tiers[tier].platform,
                                        constraints=constraints if constraints.is_file() else None)
    notice = runner.platform_notice(chosen.cells)
    if notice:
        say(notice)
    try:
        runner.run_cells(chosen.cells, results_dir, rerun=rerun, stacks=stacks, jobs=jobs)
    except runner.ResultsInUse as exc:
        raise TierError(str(exc)) from None
    current = chosen.current
    stale = sorted(p.stem for p in Path(results_dir).glob("*.json") if p.stem not in current)
    if stale:
        say(f"kvconform: left out of the report, no longer cells of tier {tier!r}: {', '.join(stale)} "
            f"(their files stay in {results_dir})")
    out = report_dir or results_dir / "report"
    rendered = report.render(results_dir, out, only=current)
    say(f"kvconform: report written to {out}/index.html, matrix.md and matrix.json")
    return 1 if report.any_red(rendered) else 0


def _empty_shard(tier: str, shard: str | None) -> str:
    return f"kvconform: shard {shard} of tier {tier!r} has no cells (the plan needs fewer jobs)"


def _no_such_cell(matrix_path: Path, tier: str, name: str, cells: list[Cell]) -> str:
    """One line: the closest names, and how to list them all (a tier may have hundreds)."""
    close = difflib.get_close_matches(name, [c.name for c in cells] + [c.id for c in cells], n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
    return (f"{matrix_path}: tier {tier!r} has no cell {name!r}; {hint}"
            f"`kvconform run --tier {tier} --list` lists its {len(cells)} cells")
