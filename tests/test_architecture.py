"""docs/architecture.md's package map names every module of the package, so a newcomer's map of
the house stays true as rooms are added."""

from __future__ import annotations

from tests.conftest import REPO


def test_the_package_map_names_every_module() -> None:
    package_map = (REPO / "docs" / "architecture.md").read_text().split("## The flow of a run")[0]
    modules = sorted(p.relative_to(REPO) for p in (REPO / "conformance").rglob("*.py")
                     if p.name != "__init__.py" and "zoo" not in p.parts)  # the zoo is named by its folders
    unnamed = [str(p) for p in modules if p.name not in package_map]
    assert not unnamed, f"docs/architecture.md's package map does not name: {unnamed}"


ROOM_LINES = 450  # a module past this says at its top why it is one room (#40)


def test_a_module_over_the_size_of_a_room_says_why_at_its_top() -> None:
    import ast

    unexplained = []
    for path in sorted((REPO / "conformance").rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > ROOM_LINES:
            docstring = ast.get_docstring(ast.parse(text)) or ""
            if f"Over {ROOM_LINES} lines:" not in docstring:
                unexplained.append(f"{path.relative_to(REPO)} ({text.count(chr(10))} lines)")
    assert not unexplained, f"over {ROOM_LINES} lines without a reason at the top (\"Over {ROOM_LINES} lines: ...\"): " \
                            f"{unexplained}"
