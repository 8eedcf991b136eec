"""``kvconform diff BASE HEAD``: the regression gate for connector PRs.

Compares only cells that both runs ran (aligned, as wpt.fyi compares runs), clause by clause,
and exits non-zero when any clause newly fails. Cells that disappeared are listed, since a
cell that stops running can hide a regression.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.report.render import load_results, matrix_document
from conformance.verdict.status import Status, is_red


@dataclass(frozen=True)
class Change:
    cell: str
    clause: str
    base: str
    head: str


@dataclass
class Diff:
    newly_failing: list[Change]
    newly_passing: list[Change]
    other_changes: list[Change]
    cells_gone: list[str]
    cells_new: list[str]
    compared: int

    @property
    def regressed(self) -> bool:
        return bool(self.newly_failing)


def _cells(results_dir: Path) -> dict[str, dict[str, Any]]:
    return {f"{c['id']} [{c['tier']}]": c for c in matrix_document(load_results(results_dir))["cells"]}


def compare(base_dir: Path, head_dir: Path) -> Diff:
    base, head = _cells(base_dir), _cells(head_dir)
    common = sorted(set(base) & set(head))
    diff = Diff([], [], [], sorted(set(base) - set(head)), sorted(set(head) - set(base)), len(common))
    for key in common:
        b, h = base[key]["statuses"], head[key]["statuses"]
        for clause in sorted(set(b) | set(h)):
            was, now = b.get(clause, "absent"), h.get(clause, "absent")
            if was == now:
                continue
            change = Change(key, clause, was, now)
            if is_red(now) and not is_red(was):
                diff.newly_failing.append(change)
            elif is_red(was) and now in {s.value for s in Status} and not is_red(now):
                diff.newly_passing.append(change)
            else:
                diff.other_changes.append(change)
    return diff


def markdown(diff: Diff) -> str:
    lines = [f"# kvconform diff: {diff.compared} cells compared", ""]
    for title, changes in (("Newly failing", diff.newly_failing), ("Newly passing", diff.newly_passing),
                           ("Other changes", diff.other_changes)):
        lines.append(f"## {title} ({len(changes)})")
        if changes:
            lines += ["", "| cell | clause | base | head |", "|---|---|---|---|"]
            lines += [f"| {c.cell} | `{c.clause}` | {c.base} | {c.head} |" for c in changes]
        lines.append("")
    for title, cells in (("Cells gone (in base, not in head)", diff.cells_gone),
                         ("New cells (not compared)", diff.cells_new)):
        lines.append(f"## {title} ({len(cells)})")
        lines += [f"- {c}" for c in cells] + [""]
    lines.append("Verdict: " + ("REGRESSION" if diff.regressed else "no regression"))
    return "\n".join(lines) + "\n"
