"""Rewrite the documents' generated tables from the project's data:

- README.md's clause table (``clauses`` block) from CLAUSES;
- docs/matrix.md's known failures (``expectations`` block) from matrix.yaml;
- docs/input-audit.md's near-miss table (``audit`` block) from the input audit.

    python scripts/render_tables.py

tests/test_readme.py fails while one is stale; run this after changing a clause or an expectation.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conformance.matrix import definition  # noqa: E402
from conformance.matrix.expectation_table import expectation_table  # noqa: E402
from conformance.util.generated import splice  # noqa: E402
from conformance.verdict import audit  # noqa: E402
from conformance.verdict.clause_table import clause_table  # noqa: E402


def tables() -> dict[Path, tuple[str, str]]:
    """Each generated block: its document -> (block name, what it must hold)."""
    return {ROOT / "README.md": ("clauses", clause_table()),
            ROOT / "docs" / "matrix.md": ("expectations", expectation_table(definition.load(ROOT / "matrix.yaml"))),
            ROOT / "docs" / "input-audit.md": (audit.BLOCK, audit.render())}


def main() -> int:
    for page, (block, body) in tables().items():
        old = page.read_text(encoding="utf-8")
        new = splice(old, block, body)
        if new != old:
            page.write_text(new, encoding="utf-8")
        print(f"{page.relative_to(ROOT)}: {block} table {'rewritten' if new != old else 'already current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
