"""The README stays short and current: its clause table is generated from CLAUSES, it has at most
200 lines, and no relative link in it or in docs/*.md points at a missing file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conformance.verdict.clause_table import BEGIN, END, clause_table, current_block

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_LINES = 200

# A markdown link's target: `](target)` or `](target "title")`.
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)


def relative_links(text: str) -> list[str]:
    """The link targets of ``text`` that name a file of this checkout (code spans and fences are not markdown)."""
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    targets = [m.group(1) for m in LINK.finditer(prose)]
    return [t for t in targets if not re.match(r"^(https?:|mailto:|#)", t)]


def test_clause_table_is_generated_from_clauses():
    readme = README.read_text(encoding="utf-8")
    assert readme.count(BEGIN) == 1 and readme.count(END) == 1, f"README.md needs one {BEGIN} ... {END} block"
    assert current_block(readme) == clause_table(), (
        "README.md's clause table is stale: run python scripts/render_clause_table.py")


def test_readme_has_at_most_200_lines():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines (at most {MAX_LINES}): move detail to a docs/ page"


@pytest.mark.parametrize("page", [README, *sorted((REPO / "docs").glob("*.md"))],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_at_existing_files(page: Path):
    missing = []
    for target in relative_links(page.read_text(encoding="utf-8")):
        path = target.split("#", 1)[0].split("?", 1)[0]
        if not (page.parent / path).exists():
            missing.append(target)
    assert not missing, f"{page.relative_to(REPO)} links to missing files: {missing}"


def test_link_finder_skips_code_and_external_links():
    text = "[a](docs/x.md) [b](https://e.org) [c](#top) `[d](no.md)` [e](y.md#part \"t\")\n```\n[f](z.md)\n```\n"
    assert relative_links(text) == ["docs/x.md", "y.md#part"]
