"""The README's clause table, generated from ``CLAUSES`` (rows in their order, promises verbatim).

README.md holds it between ``BEGIN`` and ``END``; ``scripts/render_clause_table.py`` rewrites that
block in place and ``tests/test_readme.py`` checks that it is current.
"""

from conformance.verdict.clauses import CLAUSES

BEGIN = "<!-- clauses:begin -->"
END = "<!-- clauses:end -->"


def clause_table() -> str:
    """The markdown table of every clause: clause, level, promise; one line each, newline-terminated."""
    lines = ["| clause | level | applies to | promise |", "|---|---|---|---|"]
    for c in CLAUSES.values():
        promise = c.promise.replace("|", "\\|")  # a bare | would end the cell
        applies = " and ".join(f"`{cap}`" for cap in sorted(c.requires)) or "all"
        applies += ", not `lossy`" if c.lossless else ""
        lines.append(f"| `{c.id}` | {c.level} | {applies} | {promise} |")
    return "\n".join(lines) + "\n"


def current_block(text: str) -> str:
    """What ``text`` holds between the line ``BEGIN`` and ``END`` (ValueError if the markers are missing)."""
    start, end = text.find(BEGIN + "\n"), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the markers {BEGIN} ... {END} are missing or out of order")
    return text[start + len(BEGIN) + 1:end]


def splice(text: str) -> str:
    """``text`` with the block between the markers replaced by ``clause_table()``."""
    old = current_block(text)
    start = text.find(BEGIN + "\n") + len(BEGIN) + 1
    return text[:start] + clause_table() + text[start + len(old):]
