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
# Where the rule holds: the package, its tests (#56: a test module past a room is split by topic,
# as the package's are), the benchmarks, the scripts and the noxfile.
ROOMS = ("conformance", "tests", "benchmarks", "scripts")


def test_a_module_over_the_size_of_a_room_says_why_at_its_top() -> None:
    import ast

    unexplained = []
    for path in sorted([*(p for room in ROOMS for p in (REPO / room).rglob("*.py")), REPO / "noxfile.py"]):
        text = path.read_text()
        if text.count("\n") > ROOM_LINES:
            docstring = ast.get_docstring(ast.parse(text)) or ""
            if f"Over {ROOM_LINES} lines:" not in docstring:
                unexplained.append(f"{path.relative_to(REPO)} ({text.count(chr(10))} lines)")
    assert not unexplained, f"over {ROOM_LINES} lines without a reason at the top (\"Over {ROOM_LINES} lines: ...\"): " \
                            f"{unexplained}"


FUNCTION_LINES = 80  # a function past this says in its docstring why it is one (#56)


def test_a_function_over_80_lines_says_why_in_its_docstring() -> None:
    import ast

    unexplained = []
    for path in sorted((REPO / "conformance").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    (node.end_lineno or node.lineno) - node.lineno + 1 > FUNCTION_LINES and \
                    f"Over {FUNCTION_LINES} lines:" not in (ast.get_docstring(node) or ""):
                unexplained.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    assert not unexplained, f"functions over {FUNCTION_LINES} lines without a reason (\"Over {FUNCTION_LINES} " \
                            f"lines: ...\"): {unexplained}"


# The house's floors, lowest first (#52): a module imports its own room and lower floors, never a
# higher one. The vocabulary (level and option names) is the ground floor every room may read.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("conformance", "vocabulary", "contract", "util", "data"),
    ("verdict", "api_surface", "servers"),
    ("stores", "levels", "report"),
    ("zoo", "plugin"),
    ("matrix",),
    ("certify",),
    ("cli",),
)
FLOOR = {room: floor for floor, rooms in enumerate(FLOORS) for room in rooms}
# Modules of a higher room that stand on the ground floor: the statuses (and NotRunnable, which a store
# factory of the contract raises) are vocabulary every room speaks, and import nothing of the package.
GROUND_MODULES = ("conformance.verdict.status",)


def _floor(module: str) -> int:
    return 0 if module in GROUND_MODULES else FLOOR[_room(module)]


TEST_FRAMEWORKS = ("pytest", "_pytest", "hypothesis")


def _module_name(path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> str:
    """A module's room: its package under conformance/ (conformance.vocabulary and cli are rooms of one module)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imports(path, top_level_only: bool = False) -> list[tuple[str, int]]:
    """(module imported, line) for every import in ``path``: anywhere in it, or only those that run
    when it is imported (not in a function, nor under ``if TYPE_CHECKING``)."""
    import ast

    tree = ast.parse(path.read_text())
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    nodes: list = []
    if top_level_only:
        pending = list(tree.body)
        while pending:
            node = pending.pop()
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                pending.extend(node.orelse)
            elif isinstance(node, (ast.If, ast.Try)):
                pending.extend([*node.body, *node.orelse, *getattr(node, "handlers", []), *getattr(node, "finalbody", [])])
            elif isinstance(node, ast.ExceptHandler):
                pending.extend(node.body)
            else:
                nodes.append(node)
    else:
        nodes = list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], *([base] if base else [])])
            found.append((base, node.lineno))
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]  # a submodule imported by name
    return found


def _package_modules():
    return {_module_name(p): p for p in sorted((REPO / "conformance").rglob("*.py"))}


def _owner(target: str, modules) -> str:
    """The module an imported name lives in (``conformance.__version__`` -> ``conformance``)."""
    while target not in modules and "." in target:
        target = target.rpartition(".")[0]
    return target


def test_every_room_has_a_floor_and_no_module_imports_a_higher_one() -> None:
    modules = _package_modules()
    unranked = sorted({_room(m) for m in modules} - set(FLOOR))
    assert not unranked, f"rooms with no floor in FLOORS: {unranked}"
    upward = [f"{path.relative_to(REPO)}:{line} ({_room(name)}, floor {_floor(name)}) imports {target} "
              f"({_room(target)}, floor {_floor(_owner(target, modules))})"
              for name, path in modules.items() for target, line in _imports(path)
              if target.split(".")[0] == "conformance" and _floor(_owner(target, modules)) > _floor(name)]
    assert not upward, "imports of a higher floor:\n" + "\n".join(upward)
    grounded = [f"{module} imports {target}" for module in GROUND_MODULES for target, _ in _imports(modules[module])
                if target.split(".")[0] == "conformance"]
    assert not grounded, f"a ground-floor module imports the package: {grounded}"


# What runs in a Python that has no test framework: the noxfile's imports (nox's own Python), the
# matrix.yml plan job (`python -m conformance.matrix.plan`), the report and kvconform's commands.
FRAMEWORK_FREE = ("conformance.matrix.definition", "conformance.matrix.stacks", "conformance.matrix.plan",
                  "conformance.report.render", "conformance.report.html", "conformance.report.diff",
                  "conformance.certify.verify", "conformance.cli")


def test_what_runs_without_a_test_framework_imports_none() -> None:
    """Follows the imports each of FRAMEWORK_FREE runs when imported (module level, transitively):
    none may reach pytest or Hypothesis. Only what runs tests (the plugin, the levels' clause
    modules, the strategies) imports them at its top."""
    modules = _package_modules()
    seen: dict[str, str] = {}  # module -> the chain that reached it
    pending = [(m, m) for m in FRAMEWORK_FREE]
    offenders = []
    while pending:
        module, chain = pending.pop()
        if module in seen:
            continue
        seen[module] = chain
        for target, line in _imports(modules[module], top_level_only=True):
            if target.split(".")[0] in TEST_FRAMEWORKS:
                offenders.append(f"{chain} imports {target} (line {line})")
            elif target in modules:
                pending.append((target, f"{chain} -> {target}"))
                parent = target.rpartition(".")[0]  # importing a.b.c runs a/__init__ and a/b/__init__ first
                while parent.count("."):
                    pending.append((parent, f"{chain} -> {parent}"))
                    parent = parent.rpartition(".")[0]
    assert not offenders, "\n".join(offenders)


def _import_graph() -> dict[str, dict[str, int]]:
    """Each module of the package -> {module of the package it imports: the line of its first such
    import}. Every import counts, wherever it is: at the top, in a function (it still runs, later) and
    under ``if TYPE_CHECKING`` (the type it names is still the other module's). ``from a.b import c``
    is an edge to ``a.b.c`` where ``c`` is a submodule, else to ``a.b``; a package's ``__init__`` is a
    module of its own. Only the module named is an edge, not the parents' ``__init__`` that importing it
    runs first: with those, every child that imports a name its package's ``__init__`` re-exports would
    be a circle with its own package."""
    modules = _package_modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        found = _imports(path)
        on_line: dict[int, set[str]] = {}
        for target, line in found:
            on_line.setdefault(line, set()).add(target)
        edges: dict[str, int] = {}
        for target, line in found:
            if target.split(".")[0] != "conformance":
                continue
            named = [other for other in on_line[line] if other.startswith(target + ".")]
            if named and all(other in modules for other in named):
                continue  # ``from package import submodule``: an edge to the submodule alone
            edges.setdefault(_owner(target, modules), line)
        graph[name] = edges
    return graph


def test_no_module_imports_itself_through_another() -> None:
    """No import circle among the package's modules (#56): in a circle neither module can be read,
    tested or moved without the other, and which one Python finishes first depends on who imported
    first. A circle is a strongly connected set of the import graph (``_import_graph``: every import,
    function-level and typing-only ones included), or a module importing itself; each is named with the
    imports that close it. Break one by moving what both need to a lower module both import, not by
    hiding an import in a function."""
    graph = _import_graph()
    modules = _package_modules()

    def reached_from(start: str) -> set[str]:
        seen: set[str] = set()
        pending = [start]
        while pending:
            for target in graph[pending.pop()]:
                if target not in seen:
                    seen.add(target)
                    pending.append(target)
        return seen

    reached = {module: reached_from(module) for module in graph}
    circles = sorted({tuple(sorted(other for other in reached[module] if module in reached[other]))
                      for module in graph if module in reached[module]})
    named = ["{" + ", ".join(circle) + "}: " + "; ".join(
        f"{modules[module].relative_to(REPO)}:{line} imports {target}"
        for module in circle for target, line in sorted(graph[module].items()) if target in circle)
        for circle in circles]
    assert not named, "modules that import themselves through others:\n" + "\n".join(named)
