"""``kvconform diff BASE HEAD``: the regression gate for connector PRs.

Compares only cells that both runs ran (aligned, as wpt.fyi compares runs), clause by clause.
It fails closed: a side that is missing, empty, truncated or holds an unknown status is an input
error (exit 2), never "nothing to compare"; a clause that newly fails is a regression, and lost
coverage (a cell gone, a clause gone or no longer reaching a verdict) fails the gate too unless
the caller allows it, since a cell that stops running can hide a regression.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from conformance.report.document import ReportCell
from conformance.report.render import matrix_document
from conformance.verdict import results
from conformance.verdict.results import ResultsDocument
from conformance.verdict.status import Status, is_red

STATUSES = frozenset(s.value for s in Status)
ABSENT = "absent"
# What a clause that stopped reaching a verdict shows: coverage lost (a Fail turned into one hides it).
NO_VERDICT = frozenset({Status.DISABLED.value, Status.SKIP.value, Status.NOT_RUNNABLE.value,
                        Status.NOT_EXERCISED.value, ABSENT})
VERDICT = frozenset({Status.PASS.value, Status.XFAIL.value})


class DiffInputError(Exception):
    """A side of the diff cannot be read as a results directory: one line, exit 2."""


@dataclass(frozen=True)
class Change:
    cell: str
    clause: str
    base: str
    head: str
    message: str = ""  # head's message for the clause (why it fails now)
    command: str = ""  # head's repro command for the cell


@dataclass
class Diff:
    newly_failing: list[Change]
    newly_passing: list[Change]
    other_changes: list[Change]
    cells_gone: list[str]
    cells_new: list[str]
    compared: int
    lost: list[Change] = field(default_factory=list)  # clauses that no longer reach a verdict

    @property
    def regressed(self) -> bool:
        return bool(self.newly_failing)

    @property
    def coverage_lost(self) -> bool:
        return bool(self.cells_gone or self.lost)

    def failed(self, allow_lost: bool = False) -> bool:
        return self.regressed or (self.coverage_lost and not allow_lost)


def load_side(results_dir: Path, side: str) -> list[ResultsDocument]:
    """Every results file of ``results_dir``; anything that is not one is a DiffInputError."""
    where = f"{side} {results_dir}"
    if not results_dir.is_dir():
        raise DiffInputError(f"{where}: {'not a directory' if results_dir.exists() else 'does not exist'}")
    docs: list[ResultsDocument] = []
    for path in sorted(results_dir.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise DiffInputError(f"{side} {path}: unreadable or truncated results file ({exc})") from None
        if not isinstance(doc, dict) or doc.get("schema") != results.SCHEMA or "cell" not in doc:
            raise DiffInputError(f"{side} {path}: not a kvconform matrix result (schema {results.SCHEMA} with a cell)")
        unknown = sorted({str(t.get("status")) for t in doc.get("tests", [])} - STATUSES)
        if unknown:
            raise DiffInputError(f"{side} {path}: unknown status {unknown[0]!r}; valid: {', '.join(sorted(STATUSES))}")
        docs.append(doc)  # type: ignore[arg-type]  # checked above: schema, cell, statuses
    if not docs:
        raise DiffInputError(f"{where}: no results files (*.json written by kvconform run)")
    return docs


def _cells(docs: list[ResultsDocument]) -> dict[str, ReportCell]:
    return {f"{c['id']} [{c['tier']}]": c for c in matrix_document(docs)["cells"]}


def compare(base_dir: Path, head_dir: Path) -> Diff:
    base, head = _cells(load_side(Path(base_dir), "BASE")), _cells(load_side(Path(head_dir), "HEAD"))
    common = sorted(set(base) & set(head))
    diff = Diff([], [], [], sorted(set(base) - set(head)), sorted(set(head) - set(base)), len(common))
    for key in common:
        b, h = base[key]["statuses"], head[key]["statuses"]
        for clause in sorted(set(b) | set(h)):
            was, now = b.get(clause, ABSENT), h.get(clause, ABSENT)
            if was == now:
                continue
            change = Change(key, clause, was, now, head[key]["messages"].get(clause, ""),
                            head[key].get("command") or "")
            if is_red(now) and not is_red(was):
                diff.newly_failing.append(change)
            elif is_red(was) and not is_red(now) and now in VERDICT:
                diff.newly_passing.append(change)
            elif now in NO_VERDICT and was not in NO_VERDICT:  # a verdict (even a Fail) no longer reached
                diff.lost.append(change)
            else:
                diff.other_changes.append(change)
    return diff


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0].replace("|", "\\|")


def markdown(diff: Diff, allow_lost: bool = False) -> str:
    lines = [f"# kvconform diff: {diff.compared} cells compared", ""]
    lines.append(f"## Newly failing ({len(diff.newly_failing)})")
    if diff.newly_failing:
        lines += ["", "| cell | clause | base | head | message | repro |", "|---|---|---|---|---|---|"]
        lines += [f"| {c.cell} | `{c.clause}` | {c.base} | {c.head} | {_first_line(c.message)} | `{c.command}` |"
                  for c in diff.newly_failing]
    lines.append("")
    for title, changes in ((f"Coverage lost{' (allowed)' if allow_lost else ''}", diff.lost),
                           ("Newly passing", diff.newly_passing), ("Other changes", diff.other_changes)):
        lines.append(f"## {title} ({len(changes)})")
        if changes:
            lines += ["", "| cell | clause | base | head |", "|---|---|---|---|"]
            lines += [f"| {c.cell} | `{c.clause}` | {c.base} | {c.head} |" for c in changes]
        lines.append("")
    for title, cells in (("Cells gone (in base, not in head)", diff.cells_gone),
                         ("New cells (not compared)", diff.cells_new)):
        lines.append(f"## {title} ({len(cells)})")
        lines += [f"- {c}" for c in cells] + [""]
    verdict = ("REGRESSION" if diff.regressed else
               "COVERAGE LOST" if diff.coverage_lost and not allow_lost else "no regression")
    lines.append(f"Verdict: {verdict}")
    return "\n".join(lines) + "\n"


def as_json(diff: Diff, allow_lost: bool = False) -> str:
    return json.dumps({**asdict(diff), "failed": diff.failed(allow_lost)}, indent=2) + "\n"
