"""The fingerprint of the installed vLLM by import: the static reader's cross-check.

The static reader runs over the installed package's files; then every fact that the running
interpreter can state for itself replaces the static one: which methods exist and their kind,
abstractness and parameter names, enum members, config fields, the factory's registry, the
dtype map, the cache dtype literal, whether each layout helper resolves where it was found.
Source text (annotations, defaults, return expressions) and the exports index stay static:
import cannot tell them. If the static reader misreads anything the runtime knows, the two
fingerprints differ, and ``tests/api_surface/test_api_surface.py`` says where.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import typing
from pathlib import Path
from typing import Any, cast

from conformance.api_surface import fingerprint as fpfile
from conformance.api_surface import sources, static

WRAPPERS = {classmethod: "classmethod", staticmethod: "staticmethod", property: "property",
            functools.cached_property: "property"}


def _function_of(raw: Any) -> Any:
    for attr in ("__func__", "fget", "func"):
        if hasattr(raw, attr) and callable(getattr(raw, attr)):
            return getattr(raw, attr)
    return raw


def _params(func: Any, static_params: list[fpfile.Param]) -> list[fpfile.Param]:
    """The runtime's parameter names and kinds, with the static reader's source text for each name."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return static_params
    text = {p["name"]: p for p in static_params}
    return [{"name": p.name, "kind": p.kind.name.lower(),
             "annotation": text[p.name]["annotation"] if p.name in text else None,
             "default": text[p.name]["default"] if p.name in text else None}
            for p in sig.parameters.values()]


def callable_entry(raw: Any, static_entry: fpfile.DefEntry | None, in_class: bool = True) -> fpfile.DefEntry:
    """A def as the runtime sees it (``raw`` as found by ``inspect.getattr_static``): the static reader's
    entry (its source text) with the runtime's kind, abstractness and parameters."""
    found: fpfile.DefEntry = static_entry or {"kind": "", "abstract": False, "params": [], "returns": None}
    kind = next((k for t, k in WRAPPERS.items() if isinstance(raw, t)), "method" if in_class else "function")
    return {**found, "kind": kind, "abstract": bool(getattr(raw, "__isabstractmethod__", False)),
            "params": _params(_function_of(raw), found["params"])}


def _members(cls: type) -> dict[str, str]:
    return {name: repr(member.value) for name, member in cls.__members__.items()}  # type: ignore[attr-defined]


def _resolve(module: str | None, qualname: str) -> Any:
    obj: Any = importlib.import_module(module or "")
    for part in qualname.split("."):
        obj = inspect.getattr_static(obj, part)
    return obj


def _class_methods(cls: type, static_methods: dict[str, fpfile.DefEntry]) -> dict[str, fpfile.DefEntry]:
    return {name: callable_entry(raw, static_methods.get(name)) for name, raw in vars(cls).items()
            if not isinstance(raw, type) and (callable(raw) or type(raw) in WRAPPERS)}


def _connector(section: fpfile.ConnectorSection) -> None:
    base = _resolve(section["module"], section["class"])
    section["methods"] = _class_methods(base, section["methods"])
    section["role"]["members"] = _members(_resolve(section["role"]["module"], "KVConnectorRole"))


def _kv_transfer_config(section: fpfile.ConfigSection) -> None:
    cls = _resolve(section["module"], "KVTransferConfig")
    names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else list(cls.model_fields)
    section["fields"] = {n: section["fields"].get(n, {"annotation": None, "default": None}) for n in names}


def _registry(section: fpfile.RegistrySection) -> None:
    factory = _resolve(section["module"], "KVConnectorFactory")
    connectors: dict[str, fpfile.Registered] = {}
    for name, loader in factory._registry.items():
        found = inspect.getclosurevars(loader).nonlocals
        connectors[name] = {"module": found.get("module_path"), "class": found.get("class_name")}
    section["connectors"] = connectors


def registered_names() -> list[str]:
    """The connector names vLLM's factory registers."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    return list(KVConnectorFactory._registry)


def registered_module(name: str) -> str | None:
    """The module vLLM's factory would import for the registered connector ``name`` (not imported)."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    loader = KVConnectorFactory._registry.get(name)
    return inspect.getclosurevars(loader).nonlocals.get("module_path") if loader else None


def _dtype_map(section: fpfile.DtypeMapSection) -> None:
    table = _resolve(section["module"], section["name"])
    section["entries"] = {k: str(v) for k, v in table.items()}


def _cache_dtype(section: fpfile.CacheDtypeSection) -> None:
    section["values"] = list(typing.get_args(_resolve(section["module"], "CacheDType")))


def _layout_api(section: dict[str, list[fpfile.Place]]) -> None:
    for places in section.values():
        for i, place in enumerate(places):
            module, qualname = place["module"], place["qualname"]
            raw = _resolve(module, qualname)
            if isinstance(raw, type):  # a class, as the static reader found it
                cast(fpfile.ClassEntry, place)["members"] = _members(raw) if hasattr(raw, "__members__") else {}
            else:
                places[i] = callable_entry(raw, cast(fpfile.DefEntry, place), in_class="." in qualname)


def _backends(section: dict[str, dict[str, fpfile.DefEntry]]) -> None:
    """Backends that import here (CUDA- or ROCm-only ones may not) are checked; the rest stay static."""
    for key, methods in section.items():
        module, cls_name = key.split(":")
        try:
            cls = _resolve(module, cls_name)
        except Exception:  # noqa: BLE001 - a backend for hardware this machine lacks
            continue
        section[key] = {name: {**callable_entry(inspect.getattr_static(cls, name), entry),
                               "return_exprs": entry.get("return_exprs")}
                        for name, entry in methods.items()}


def fingerprint() -> fpfile.Fingerprint:
    """The installed vLLM's fingerprint, runtime facts in place of static ones where import knows them
    (a section whose module the static reader did not find stays as it is)."""
    import vllm

    src = sources.read(Path(vllm.__file__).parent, version=vllm.__version__)
    fp = static.fingerprint(src, obtained_by="import")
    if fp["connector"]["module"] is not None:
        _connector(fp["connector"])
    if fp["kv_transfer_config"]["module"] is not None:
        _kv_transfer_config(fp["kv_transfer_config"])
    if fp["registry"]["module"] is not None:
        _registry(fp["registry"])
    if fp["dtype_map"]["module"] is not None:
        _dtype_map(fp["dtype_map"])
    if fp["cache_dtype"]["module"] is not None:
        _cache_dtype(fp["cache_dtype"])
    _layout_api(fp["layout_api"])
    _backends(fp["backends"])
    return fp
