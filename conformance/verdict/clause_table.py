"""The README's clause table, generated from ``CLAUSES`` (rows in their order, promises verbatim):
README.md's ``clauses`` block (``conformance/util/generated.py``)."""

from conformance.verdict.clauses import CLAUSES

BLOCK = "clauses"


def clause_table() -> str:
    """The markdown table of every clause: clause, level, promise; one line each, newline-terminated."""
    lines = ["| clause | level | applies to | promise |", "|---|---|---|---|"]
    for c in CLAUSES.values():
        promise = c.promise.replace("|", "\\|")  # a bare | would end the cell
        applies = " and ".join(f"`{cap}`" for cap in sorted(c.requires)) or "all"
        applies += ", not `lossy`" if c.lossless else ""
        lines.append(f"| `{c.id}` | {c.level} | {applies} | {promise} |")
    return "\n".join(lines) + "\n"
