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
