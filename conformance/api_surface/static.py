"""The fingerprint read from vLLM's source with ``ast`` alone: the primary reader.

Nothing is imported or installed, so any release on PyPI can be fingerprinted from its sdist,
including ones whose dependencies cannot be installed here. Everything is found by name, not
by path, because the names stay while their modules move between releases.
"""

from __future__ import annotations

import ast
from typing import Iterator

from conformance.api_surface import SCHEMA
from conformance.api_surface.fingerprint import (
    CacheDtypeSection,
    ClassEntry,
    ConfigSection,
    ConnectorSection,
    DefEntry,
    DtypeMapSection,
    ExportsSection,
    Field,
    Fingerprint,
    Param,
    Place,
    Registered,
    RegistrySection,
)
from conformance.api_surface.sources import SourceTree

BASE_CLASS = "KVConnectorBase_V1"
LAYOUT_NAMES = ("get_kv_connector_cache_layout", "get_kv_cache_layout", "set_kv_cache_layout",
                "get_required_kvcache_layout", "KVCacheLayout", "resolve_kv_cache_layout", "allocate_kv_cache")
BACKEND_METHODS = ("get_kv_cache_shape", "get_kv_cache_stride_order", "supported_kv_cache_layouts")
BACKENDS_PACKAGE = "vllm.v1.attention.backends"
CONNECTOR_PACKAGE = "vllm.distributed.kv_transfer"
# str(torch.half) is "torch.float16": spell the map's values the way torch prints them.
TORCH_ALIASES = {"torch.half": "torch.float16", "torch.float": "torch.float32", "torch.double": "torch.float64",
                 "torch.int": "torch.int32", "torch.long": "torch.int64", "torch.short": "torch.int16",
                 "torch.cfloat": "torch.complex64", "torch.cdouble": "torch.complex128"}
KINDS = {"classmethod": "classmethod", "staticmethod": "staticmethod", "property": "property",
         "cached_property": "property"}
MAX_RETURN_TEXT = 240

Def = ast.FunctionDef | ast.AsyncFunctionDef


def _text(node: ast.AST | None) -> str | None:
    return None if node is None else ast.unparse(node)


def _decorator_names(fn: Def) -> list[str]:
    names = []
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        names.append(target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", ""))
    return names


def params(args: ast.arguments) -> list[Param]:
    """Parameters in order: name, kind (as ``inspect.Parameter.kind``), annotation and default as source text."""
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    rows = [(a, "positional_only" if i < len(args.posonlyargs) else "positional_or_keyword", d)
            for i, (a, d) in enumerate(zip(positional, defaults))]
    if args.vararg:
        rows.append((args.vararg, "var_positional", None))
    rows += [(a, "keyword_only", d) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        rows.append((args.kwarg, "var_keyword", None))
    return [{"name": a.arg, "kind": kind, "annotation": _text(a.annotation), "default": _text(d)}
            for a, kind, d in rows]


def _returns(fn: Def) -> list[str] | None:
    """The function's own ``return`` expressions as text, when there are few and they are short."""
    found: list[str] = []
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Return) and node.value is not None:
            found.append(ast.unparse(node.value))
        stack.extend(ast.iter_child_nodes(node))
    return found if len(found) <= 4 and all(len(t) <= MAX_RETURN_TEXT for t in found) else None


def function(fn: Def, in_class: bool = True, with_body: bool = False) -> DefEntry:
    """A def as data: kind (function/method/classmethod/staticmethod/property), abstractness, signature."""
    decorators = _decorator_names(fn)
    entry: DefEntry = {"kind": next((KINDS[d] for d in decorators if d in KINDS), "method" if in_class else "function"),
             "abstract": "abstractmethod" in decorators,
             "params": params(fn.args), "returns": _text(fn.returns)}
    if with_body:
        entry["return_exprs"] = _returns(fn)
    return entry


def enum_members(cls: ast.ClassDef) -> dict[str, str]:
    """``NAME = value`` lines of a class body: an Enum's members with their values as source text."""
    return {t.id: ast.unparse(node.value) for node in cls.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name) and not t.id.startswith("_")}


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements that run at import, looking into ``if``/``try`` but not ``if TYPE_CHECKING``."""
    for node in body:
        if _is_type_checking(node):
            continue
        yield node
        if isinstance(node, ast.If):
            yield from top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from top_level(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])


def _bound_names(node: ast.stmt) -> Iterator[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield node.name
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        for alias in node.names:
            yield alias.asname or alias.name.split(".")[0]
    elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
            yield from (n.id for n in ast.walk(target) if isinstance(n, ast.Name))


def find_class(src: SourceTree, name: str) -> tuple[str, ast.ClassDef] | None:
    """The first module (sorted) that defines class ``name`` at top level."""
    for module in src.grep(rf"^class {name}\b"):
        for node in src.tree(module).body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
    return None


def find_assignment(src: SourceTree, name: str) -> tuple[str, ast.expr] | None:
    """The first module (sorted) that assigns ``name`` at top level, and the assigned expression."""
    for module in src.grep(rf"^{name}\s*(:[^=\n]*)?="):
        for node in top_level(src.tree(module).body):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and name in _bound_names(node):
                return module, node.value
    return None


def _methods(cls: ast.ClassDef, with_body: bool = False) -> dict[str, DefEntry]:
    return {n.name: function(n, with_body=with_body) for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def connector(src: SourceTree) -> ConnectorSection:
    base, role = find_class(src, BASE_CLASS), find_class(src, "KVConnectorRole")
    return {"module": base and base[0], "class": BASE_CLASS, "methods": _methods(base[1]) if base else {},
            "role": {"module": role and role[0], "members": enum_members(role[1]) if role else {}}}


def kv_transfer_config(src: SourceTree) -> ConfigSection:
    found = find_class(src, "KVTransferConfig")
    fields: dict[str, Field] = {} if found is None else {
        n.target.id: {"annotation": _text(n.annotation), "default": _text(n.value)}
        for n in found[1].body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return {"module": found and found[0], "fields": fields}


def registry(src: SourceTree) -> RegistrySection:
    """``KVConnectorFactory.register_connector(name, module_path, class_name)`` calls, at import time."""
    found = find_class(src, "KVConnectorFactory")
    connectors: dict[str, Registered] = {}
    for node in top_level(src.tree(found[0]).body) if found else ():
        call = node.value if isinstance(node, ast.Expr) else None
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "register_connector":
            values = [*call.args, *(k.value for k in call.keywords)]
            if len(values) == 3 and all(isinstance(v, ast.Constant) for v in values):
                name, module, cls = (v.value for v in values)  # type: ignore[attr-defined]
                connectors[name] = {"module": module, "class": cls}
    return {"module": found and found[0], "connectors": connectors}


def dtype_map(src: SourceTree) -> DtypeMapSection:
    found = find_assignment(src, "STR_DTYPE_TO_TORCH_DTYPE")
    entries: dict[str, str] = {}
    if found and isinstance(found[1], ast.Dict):
        for k, v in zip(found[1].keys, found[1].values):
            if isinstance(k, ast.Constant):
                entries[str(k.value)] = TORCH_ALIASES.get(ast.unparse(v), ast.unparse(v))
    return {"module": found and found[0], "name": "STR_DTYPE_TO_TORCH_DTYPE", "entries": entries}


def cache_dtype(src: SourceTree) -> CacheDtypeSection:
    found = find_assignment(src, "CacheDType")
    values: list[str] = []
    if found and isinstance(found[1], ast.Subscript):
        inner = found[1].slice
        values = [str(e.value) for e in (inner.elts if isinstance(inner, ast.Tuple) else [inner])
                  if isinstance(e, ast.Constant)]
    return {"module": found and found[0], "values": values}


def _definition(module: str, qualname: str, node: ast.stmt) -> Place:
    """A layout helper's place and shape; ``qualname`` has a dot when it is a method."""
    if isinstance(node, ast.ClassDef):
        cls: ClassEntry = {"module": module, "qualname": qualname, "kind": "class",
                           "bases": [ast.unparse(b) for b in node.bases], "members": enum_members(node)}
        return cls
    return {"module": module, "qualname": qualname, **function(node, in_class="." in qualname)}  # type: ignore[arg-type]


def layout_api(src: SourceTree) -> dict[str, list[Place]]:
    """Where each layout helper is defined: at module level anywhere, or as a method outside the
    connector implementations (whose overrides of the base class's hook are not API)."""
    found: dict[str, list[Place]] = {name: [] for name in LAYOUT_NAMES}
    for module in src.grep(r"^\s*(def|class) (" + "|".join(LAYOUT_NAMES) + r")\b"):
        for node in top_level(src.tree(module).body):
            if getattr(node, "name", None) in found:
                found[node.name].append(_definition(module, node.name, node))  # type: ignore[attr-defined]
            if not isinstance(node, ast.ClassDef) or (
                    module.startswith(CONNECTOR_PACKAGE + ".kv_connector.") and node.name != BASE_CLASS):
                continue
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.name in found:
                    found[sub.name].append(_definition(module, f"{node.name}.{sub.name}", sub))
    return found


def backends(src: SourceTree) -> dict[str, dict[str, DefEntry]]:
    """Each attention backend class's KV shape, stride order and supported layouts, with what they return."""
    out: dict[str, dict[str, DefEntry]] = {}
    for module in src.grep(r"def (" + "|".join(BACKEND_METHODS) + r")\b"):
        if not module.startswith(BACKENDS_PACKAGE + "."):
            continue
        for node in src.tree(module).body:
            if isinstance(node, ast.ClassDef):
                methods = {k: v for k, v in _methods(node, with_body=True).items() if k in BACKEND_METHODS}
                if methods:
                    out[f"{module}:{node.name}"] = methods
    return out


def exports(src: SourceTree) -> ExportsSection:
    """Names bound at import time (and child modules) of every module under the connector package and
    of every module the in-tree connectors import from: what ``from vllm.X import Y`` can be checked against;
    and the names of all modules, so that a module that is gone can be told from one that is not indexed."""
    wanted = {m for m in src.modules if m == CONNECTOR_PACKAGE or m.startswith(CONNECTOR_PACKAGE + ".")}
    for module in list(wanted):
        for node in ast.walk(src.tree(module)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("vllm"):
                wanted.add(node.module)  # type: ignore[arg-type]
    modules: dict[str, list[str]] = {}
    for module in sorted(wanted & set(src.modules)):
        names = {n for node in top_level(src.tree(module).body) for n in _bound_names(node) if not n.startswith("__")}
        children = {m[len(module) + 1:] for m in src.modules if m.startswith(module + ".") and "." not in m[len(module) + 1:]}
        modules[module] = sorted(names | children)
    return {"covered": [CONNECTOR_PACKAGE], "modules": modules, "all_modules": sorted(src.modules)}


def fingerprint(src: SourceTree, obtained_by: str = "static") -> Fingerprint:
    return {"schema": SCHEMA, "vllm_version": src.version, "obtained_by": obtained_by, "source": src.origin,
            "connector": connector(src), "kv_transfer_config": kv_transfer_config(src), "registry": registry(src),
            "dtype_map": dtype_map(src), "cache_dtype": cache_dtype(src), "layout_api": layout_api(src),
            "backends": backends(src), "exports": exports(src)}
