"""The README stays short and current: its clause table is generated from CLAUSES (as docs/matrix.md's
known failures are from matrix.yaml), it has at most 200 lines, and no relative link in it or in
docs/*.md points at a missing file."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from conformance.util.generated import current_block, markers, splice

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


def _generated_tables() -> dict[Path, tuple[str, str]]:
    """scripts/render_tables.py's blocks: document -> (block, what it must hold)."""
    spec = importlib.util.spec_from_file_location("render_tables", REPO / "scripts" / "render_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.tables()


@pytest.mark.parametrize("page, block, body", [(p, *b) for p, b in _generated_tables().items()],
                         ids=lambda v: v.name if isinstance(v, Path) else None)
def test_generated_tables_are_current(page: Path, block: str, body: str):
    assert current_block(page.read_text(encoding="utf-8"), block) == body, (
        f"{page.relative_to(REPO)}'s {block} table is stale: run python scripts/render_tables.py")


def test_a_block_is_spliced_between_its_markers_only():
    begin, end = markers("t")
    text = f"before\n{begin}\nold\n{end}\nafter\n"
    assert splice(text, "t", "new\n") == f"before\n{begin}\nnew\n{end}\nafter\n"
    with pytest.raises(ValueError):
        current_block(text + begin + "\n", "t")


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
