"""The input audit: for every clause, the fields its promise depends on, and how the clause draws two
inputs that differ only in each field (a near miss), early and late, by one unit and by a lot.

A bug hides where the inputs never differ in one field alone, or only at its start, or only by a lot.
Each reach is drawn (True), not applicable (why), or a ``Gap`` (what is missing and what it lets
through): a gap is visible, never a blank. ``tests/verdict/test_audit.py`` checks that every clause
has rows, that each ``drawn_by`` exists and is reached from the clause's own test module; the table
in ``docs/input-audit.md`` is rendered from here (``scripts/render_tables.py``).
"""

from __future__ import annotations

from conformance.verdict.audit import connector, engine, store
from conformance.verdict.audit.schema import FIELDS, Gap, Reach, Twin
from conformance.verdict.clauses import CLAUSES
from conformance.vocabulary import LEVELS

__all__ = ["AUDIT", "FIELDS", "Gap", "Reach", "Twin", "gaps", "render"]

AUDIT: dict[str, tuple[Twin, ...]] = {**store.ROWS, **connector.ROWS, **engine.ROWS}
BLOCK = "audit"


def gaps() -> list[tuple[str, str, str, Gap]]:
    """Every reach not drawn: (clause, field, reach, what is missing)."""
    return [(cid, t.field, reach, value) for cid, twins in AUDIT.items() for t in twins
            for reach, value in zip(("early", "late", "one unit", "a lot"), (t.early, t.late, t.slight, t.large))
            if isinstance(value, Gap)]


def render() -> str:
    """The audit as markdown tables, one per level: a gap shows as what it lets through, never as a blank."""
    out = []
    for level in LEVELS:
        rows = [(cid, t) for cid, c in CLAUSES.items() if c.level == level for t in AUDIT.get(cid, ())]
        missing = sum(isinstance(r, Gap) for _, t in rows for r in (t.early, t.late, t.slight, t.large))
        out += [f"### {level.capitalize()} level: {len(rows)} fields, {missing} gaps", "",
                "| clause | field | the pair drawn | early | late | one unit | a lot | drawn by |",
                "|---|---|---|---|---|---|---|---|"]
        for cid, t in rows:
            reaches = " | ".join(_reach(r) for r in (t.early, t.late, t.slight, t.large))
            out.append(f"| `{cid}` | {t.field} | {_cell(t.pair)} | {reaches} | `{t.drawn_by}` |")
        out.append("")
    return "\n".join(out)


def _reach(reach: Reach) -> str:
    if reach is True:
        return "yes"
    if isinstance(reach, Gap):
        return f"**gap**: {_cell(reach)}"
    return f"n/a: {_cell(str(reach))}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
