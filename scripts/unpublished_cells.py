"""The cells of a tier that a published matrix.json does not hold as made by this checkout's suite:
what is left to run when a published report is regenerated over several sessions or machines.

    python scripts/unpublished_cells.py [--tier full] [--matrix matrix.yaml] [--any-build] [MATRIX.json]

prints one ``--cell NAME`` per line (nothing when the report is complete), so that

    kvconform run --tier full --jobs 2 $(python scripts/unpublished_cells.py reports/full/matrix.json)
    kvconform report reports/full/matrix.json --add results/full

runs what is missing and joins it. A cell counts as published when its ``suite`` digest is this
suite's (``util.identity.suite_digest``): one made by other code, or before builds were recorded, is
listed again. With ``--any-build`` a cell counts whichever recorded build made it: what finishes a
report left half made by an earlier build (the report then says which builds made it). A summary goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conformance.matrix import definition  # noqa: E402
from conformance.matrix.definition import Cell  # noqa: E402
from conformance.util.identity import suite_digest  # noqa: E402


def unpublished(cells: list[Cell], published: Path, any_build: bool = False) -> list[str]:
    """Names of ``cells`` that ``published`` lacks, holds from before builds were recorded, or (unless
    ``any_build``) holds as another build's."""
    digest = suite_digest()
    def held_here(cell: dict) -> bool:
        made_by = (cell.get("suite") or {}).get("digest")
        return made_by is not None and (any_build or made_by == digest)

    held = {c["id"] for c in json.loads(published.read_text())["cells"] if held_here(c)}
    return [c.name for c in cells if c.id not in held]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("published", type=Path, nargs="?", default=ROOT / "reports" / "full" / "matrix.json")
    parser.add_argument("--tier", default="full")
    parser.add_argument("--matrix", type=Path, default=ROOT / "matrix.yaml")
    parser.add_argument("--any-build", action="store_true", help="a published cell counts whatever build made it")
    args = parser.parse_args(argv)
    cells = definition.load(args.matrix).cells(args.tier)  # excluded cells aside
    names = unpublished(cells, args.published, args.any_build)
    made_by = "by any build" if args.any_build else f"as made by this suite (files {suite_digest()[:12]})"
    print(f"{len(names)} of {len(cells)} cells of tier {args.tier!r} are not in {args.published} {made_by}",
          file=sys.stderr)
    print("\n".join(f"--cell {name}" for name in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
