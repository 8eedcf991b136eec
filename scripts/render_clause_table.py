"""Rewrite README.md's clause table (between <!-- clauses:begin --> and <!-- clauses:end -->) from CLAUSES.

    python scripts/render_clause_table.py [README.md]

tests/test_readme.py fails while the table is stale; run this after changing a clause.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conformance.verdict.clause_table import splice  # noqa: E402


def main(argv: list[str]) -> int:
    readme = Path(argv[0]) if argv else ROOT / "README.md"
    old = readme.read_text(encoding="utf-8")
    new = splice(old)
    if new == old:
        print(f"{readme}: clause table already current")
    else:
        readme.write_text(new, encoding="utf-8")
        print(f"{readme}: clause table rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
