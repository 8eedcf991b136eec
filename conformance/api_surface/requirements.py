"""``kvconform api-requirements``: the vLLM names a connector needs, checked before any engine starts.

A connector written for vLLM 0.19 that imports ``get_kv_cache_layout`` dies with an
``ImportError`` inside the engine's worker on 0.29+, after minutes of start-up and with the cause
buried in a worker log. Reading the connector with ``ast`` and resolving each name against the
installed vLLM (by import) or a committed fingerprint says the same in a second, with the release
where the name was last seen.

Imports under ``if TYPE_CHECKING`` or inside ``try``/``except ImportError`` are skipped: they
cannot fail at run time, and the second is how connectors support several releases.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Protocol

from conformance.api_surface import fingerprint as fpfile
from conformance.api_surface.fingerprint import Fingerprint
from conformance.api_surface.static import BASE_CLASS
from conformance.util.versions import version_key

BASE_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.base"
CONNECTORS = "vllm.distributed.kv_transfer.kv_connector."
GUARDS = {"ImportError", "ModuleNotFoundError", "AttributeError", "Exception", "BaseException"}


@dataclass(frozen=True)
class Requirement:
    module: str  # the vllm module the name is expected in
    name: str  # dotted below ``module``; "" for the module itself; ``KVConnectorBase_V1.m`` for a base method
    line: int
    how: str  # "import", "attribute", "overrides" or "calls"


@dataclass(frozen=True)
class Missing:
    requirement: Requirement
    version: str  # the vLLM it is missing from
    last_seen: str | None  # the newest committed release before ``version`` that has it
    gone_from: str | None  # the first committed release after ``last_seen`` that lacks it

    def __str__(self) -> str:
        r = self.requirement
        what = f"`{r.name}` from {r.module}" if r.name else f"module {r.module}"
        if r.how in ("overrides", "calls"):
            what = f"{r.how} `{r.name}` of {r.module}"
        seen = (f"last seen in {self.last_seen}" + (f", gone from {self.gone_from}" if self.gone_from else "")
                if self.last_seen else "in no committed release before it")
        return f"{what}: not in vLLM {self.version} ({seen})"


class Resolver(Protocol):
    version: str

    def is_module(self, module: str) -> bool | None: ...

    def has(self, module: str, name: str) -> bool | None: ...


def _guarded(handlers: list[ast.ExceptHandler]) -> bool:
    names = {n.id if isinstance(n, ast.Name) else getattr(n, "attr", "")
             for h in handlers for n in ([] if h.type is None else ast.walk(h.type))}
    return any(h.type is None for h in handlers) or bool(names & GUARDS)


class _Scanner(ast.NodeVisitor):
    """Collects requirements; ``aliases`` maps a local name bound by ``import vllm...`` to its module."""

    def __init__(self) -> None:
        self.found: list[Requirement] = []
        self.aliases: dict[str, str] = {}
        self.base_module = BASE_MODULE
        self.connector_classes = {BASE_CLASS}
        self.base_aliases: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" not in ast.unparse(node.test):
            self.generic_visit(node)
        else:
            for stmt in node.orelse:
                self.visit(stmt)

    def visit_Try(self, node: ast.Try) -> None:
        for stmt in [*node.orelse, *node.finalbody, *(s for h in node.handlers for s in h.body)]:
            self.visit(stmt)
        if not _guarded(node.handlers):
            for stmt in node.body:
                self.visit(stmt)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] == "vllm":
                self.found.append(Requirement(alias.name, "", node.lineno, "import"))
                self.aliases[alias.asname or "vllm"] = alias.name if alias.asname else "vllm"

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or (node.module or "").split(".")[0] != "vllm":
            return
        for alias in node.names:
            self.found.append(Requirement(node.module, alias.name, node.lineno, "import"))  # type: ignore[arg-type]
            if alias.name == BASE_CLASS:
                self.base_module = node.module  # type: ignore[assignment]
                self.base_aliases.add(alias.asname or alias.name)
            if node.module.startswith(CONNECTORS) and alias.name[:1].isupper():  # type: ignore[union-attr]
                self.connector_classes.add(alias.asname or alias.name)  # the base, or an in-tree connector

    def visit_Attribute(self, node: ast.Attribute) -> None:
        parts: list[str] = []
        root: ast.expr = node
        while isinstance(root, ast.Attribute):
            parts.insert(0, root.attr)
            root = root.value
        if isinstance(root, ast.Name) and root.id in self.aliases:
            self.found.append(Requirement(self.aliases[root.id], ".".join(parts), node.lineno, "attribute"))
        elif isinstance(root, ast.Name) and root.id in self.base_aliases:  # KVConnectorBase_V1.method(self, ...)
            self.found.append(Requirement(self.base_module, f"{BASE_CLASS}.{parts[0]}", node.lineno, "calls"))
        else:
            self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.generic_visit(node)
        bases = {ast.unparse(b).split(".")[-1] for b in node.bases}
        if not bases & self.connector_classes:
            return
        defined = {n.name: n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assigned = {t.attr for t in ast.walk(node) if isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store)}
        for name, fn in defined.items():
            self.found.append(Requirement(self.base_module, f"{BASE_CLASS}.{name}", fn.lineno, "overrides"))
        for call in ast.walk(node):
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and ast.unparse(call.func.value) in ("self", "super()", "cls")
                    and call.func.attr not in defined and call.func.attr not in assigned):
                self.found.append(Requirement(self.base_module, f"{BASE_CLASS}.{call.func.attr}", call.lineno, "calls"))


def scan(path: Path) -> list[Requirement]:
    """Every vLLM name the connector source at ``path`` needs, in source order, without duplicates."""
    scanner = _Scanner()
    scanner.visit(ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path)))
    unique = {(r.module, r.name, r.how): r for r in reversed(scanner.found)}
    return sorted(unique.values(), key=lambda r: (r.line, r.name))


class FingerprintResolver:
    """Answers from a fingerprint: the exports index, the list of modules, and the surface sections."""

    def __init__(self, fp: Fingerprint) -> None:
        self.fp, self.version = fp, fp["vllm_version"]
        self.modules = set(fp["exports"]["all_modules"])
        exports: dict[str | None, set[str]] = {m: set(names) for m, names in fp["exports"]["modules"].items()}
        exports.setdefault(fp["dtype_map"]["module"], set()).add(fp["dtype_map"]["name"])
        exports.setdefault(fp["cache_dtype"]["module"], set()).add("CacheDType")
        for places in fp["layout_api"].values():
            for p in places:
                exports.setdefault(p["module"], set()).add(p["qualname"].split(".")[0])
        self.exports = exports
        self.base = set(fp["connector"]["methods"])

    def is_module(self, module: str) -> bool | None:
        return module in self.modules

    def has(self, module: str, name: str) -> bool | None:
        if name.startswith(BASE_CLASS + "."):
            return name.split(".", 1)[1] in self.base
        if module not in self.modules:
            return False
        if name in self.exports.get(module, ()) or f"{module}.{name}" in self.modules:
            return True
        return False if module in self.fp["exports"]["modules"] else None


class ImportResolver:
    """Answers from the installed vLLM by importing the modules named (never a connector)."""

    def __init__(self) -> None:
        import vllm

        self.version = vllm.__version__

    def _module(self, module: str) -> Any:
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as exc:
            return False if (exc.name or "") == module or module.startswith((exc.name or "") + ".") else None
        except Exception:  # noqa: BLE001 - it exists but needs what this machine lacks
            return None

    def is_module(self, module: str) -> bool | None:
        return None if (found := self._module(module)) is None else found is not False

    def has(self, module: str, name: str) -> bool | None:
        if name.startswith(BASE_CLASS + "."):
            base = self._module(module)
            return None if not base else hasattr(getattr(base, BASE_CLASS, None), name.split(".", 1)[1])
        found = self._module(module)
        if not found:
            return found
        return hasattr(found, name) or (hasattr(found, "__path__") and self.is_module(f"{module}.{name}") is True)


def present(resolver: Resolver, r: Requirement) -> bool | None:
    """Whether ``r`` resolves; dotted attribute chains descend through modules, then stop at the first object."""
    if r.how in ("overrides", "calls"):
        return resolver.has(r.module, r.name)
    if not r.name:
        return resolver.is_module(r.module)
    module, parts = r.module, r.name.split(".")
    while len(parts) > 1 and resolver.is_module(f"{module}.{parts[0]}"):
        module, parts = f"{module}.{parts[0]}", parts[1:]
    return resolver.has(module, parts[0])


def _history(r: Requirement, version: str, history: list[Fingerprint]) -> tuple[str | None, str | None]:
    """The newest committed release before ``version`` that has ``r``, and the first after it that does not."""
    older = [fp for fp in history if version_key(fp["vllm_version"]) < version_key(version)]
    seen = [present(FingerprintResolver(fp), r) for fp in older]
    last = max((i for i, ok in enumerate(seen) if ok), default=None)
    if last is None:
        return None, None
    gone = next((older[i]["vllm_version"] for i in range(last + 1, len(older)) if seen[i] is False), version)
    return older[last]["vllm_version"], gone


def check(requirements: Iterable[Requirement], resolver: Resolver,
          history: list[Fingerprint]) -> tuple[list[Missing], list[Requirement]]:
    """(missing, unchecked). A base method the connector defines or calls is a requirement only if some
    committed release's base class had it: otherwise it is the connector's own, or a mixin's."""
    missing, unchecked = [], []
    for r in requirements:
        ok = present(resolver, r)
        if ok is False:
            last, gone = _history(r, resolver.version, history)
            if r.how in ("overrides", "calls") and last is None:
                continue
            missing.append(Missing(r, resolver.version, last, gone))
        elif ok is None:
            unchecked.append(r)
    return missing, unchecked


def source_path(module_or_file: str) -> Path:
    """A connector file, or the file of a dotted module name (found without importing the module itself)."""
    path = Path(module_or_file)
    if path.exists():
        return path
    spec = importlib.util.find_spec(module_or_file)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise FileNotFoundError(f"{module_or_file}: no such file, and no Python module of that name")
    return Path(spec.origin)


def connector_modules(module: str, name: str, _seen: set[tuple[str, str]] | None = None) -> list[str]:
    """The modules the code of connector class ``name`` in ``module`` is written in, found without
    importing anything: ``module`` itself, then, where ``name`` is imported there from another
    module (a wrapper's re-export or alias) or is a class inheriting from one imported, that module,
    followed the same way. vLLM's own modules end the walk (the installed vLLM has what it needs)."""
    seen = _seen if _seen is not None else set()
    if (module, name) in seen or module.split(".")[0] == "vllm":
        return []
    seen.add((module, name))
    try:
        tree = ast.parse(source_path(module).read_text())
    except (OSError, SyntaxError, ValueError, ImportError):
        return [module]
    imported: dict[str, tuple[str, str]] = {}  # local name -> (module, name there)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            origin = _absolute(module, node.module or "", node.level)
            for alias in node.names:
                imported[alias.asname or alias.name] = (origin, alias.name)
    found = [module]
    follow: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            follow += [b.id for b in node.bases if isinstance(b, ast.Name)]
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets) \
                and isinstance(node.value, ast.Name):
            follow.append(node.value.id)
    if name in imported and not any(isinstance(n, ast.ClassDef) and n.name == name for n in tree.body):
        follow.append(name)
    for local in follow:  # imported from another module, or defined here under another name
        found += connector_modules(*imported.get(local, (module, local)), _seen=seen)
    return list(dict.fromkeys(found))


def _absolute(module: str, target: str, level: int) -> str:
    """``from .x import y`` in ``module`` -> the absolute name of ``.x``."""
    if not level:
        return target
    package = module.rsplit(".", level)[0]
    return f"{package}.{target}" if target else package


def check_requirements(module_or_file: str | Path, fingerprint: Fingerprint | None = None,
                       history: list[Fingerprint] | None = None) -> list[Missing]:
    """What the connector needs that the installed vLLM (or ``fingerprint``) lacks: the plugin's entry point."""
    resolver: Resolver = FingerprintResolver(fingerprint) if fingerprint else ImportResolver()
    history = fpfile.committed() if history is None else history
    return check(scan(source_path(str(module_or_file))), resolver, history)[0]
