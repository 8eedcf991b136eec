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
from typing import Any

from conformance.api_surface import sources, static

WRAPPERS = {classmethod: "classmethod", staticmethod: "staticmethod", property: "property",
            functools.cached_property: "property"}


def _function_of(raw: Any) -> Any:
    for attr in ("__func__", "fget", "func"):
        if hasattr(raw, attr) and callable(getattr(raw, attr)):
            return getattr(raw, attr)
    return raw


def _params(func: Any, static_params: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runtime's parameter names and kinds, with the static reader's source text for each name."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return static_params
    text = {p["name"]: p for p in static_params}
    return [{"name": p.name, "kind": p.kind.name.lower(),
             "annotation": text.get(p.name, {}).get("annotation"), "default": text.get(p.name, {}).get("default")}
            for p in sig.parameters.values()]


def callable_entry(raw: Any, static_entry: dict[str, Any] | None, in_class: bool = True) -> dict[str, Any]:
    """A def as the runtime sees it (``raw`` as found by ``inspect.getattr_static``)."""
    entry = dict(static_entry or {"params": [], "returns": None})
    kind = next((k for t, k in WRAPPERS.items() if isinstance(raw, t)), "method" if in_class else "function")
    entry.update(kind=kind, abstract=bool(getattr(raw, "__isabstractmethod__", False)),
                 params=_params(_function_of(raw), entry["params"]))
    return entry


def _members(cls: type) -> dict[str, str]:
    return {name: repr(member.value) for name, member in cls.__members__.items()}  # type: ignore[attr-defined]


def _resolve(module: str | None, qualname: str) -> Any:
    obj: Any = importlib.import_module(module or "")
    for part in qualname.split("."):
        obj = inspect.getattr_static(obj, part)
    return obj


def _class_methods(cls: type, static_methods: dict[str, Any]) -> dict[str, Any]:
    return {name: callable_entry(raw, static_methods.get(name)) for name, raw in vars(cls).items()
            if not isinstance(raw, type) and (callable(raw) or type(raw) in WRAPPERS)}


def _connector(section: dict[str, Any]) -> None:
    base = _resolve(section["module"], section["class"])
    section["methods"] = _class_methods(base, section["methods"])
    section["role"]["members"] = _members(_resolve(section["role"]["module"], "KVConnectorRole"))


def _kv_transfer_config(section: dict[str, Any]) -> None:
    cls = _resolve(section["module"], "KVTransferConfig")
    names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else list(cls.model_fields)
    section["fields"] = {n: section["fields"].get(n, {"annotation": None, "default": None}) for n in names}


def _registry(section: dict[str, Any]) -> None:
    factory = _resolve(section["module"], "KVConnectorFactory")
    connectors = {}
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


def _dtype_map(section: dict[str, Any]) -> None:
    table = _resolve(section["module"], section["name"])
    section["entries"] = {k: str(v) for k, v in table.items()}


def _cache_dtype(section: dict[str, Any]) -> None:
    section["values"] = list(typing.get_args(_resolve(section["module"], "CacheDType")))


def _layout_api(section: dict[str, list[dict[str, Any]]]) -> None:
    for places in section.values():
        for i, place in enumerate(places):
            raw = _resolve(place["module"], place["qualname"])
            if isinstance(raw, type):
                place["members"] = _members(raw) if hasattr(raw, "__members__") else {}
            else:
                places[i] = callable_entry(raw, place, in_class="." in place["qualname"])


def _backends(section: dict[str, dict[str, Any]]) -> None:
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


CHECKS = {"connector": _connector, "kv_transfer_config": _kv_transfer_config, "registry": _registry,
          "dtype_map": _dtype_map, "cache_dtype": _cache_dtype, "layout_api": _layout_api, "backends": _backends}


def fingerprint() -> dict[str, Any]:
    """The installed vLLM's fingerprint, runtime facts in place of static ones where import knows them."""
    import vllm

    src = sources.read(Path(vllm.__file__).parent, version=vllm.__version__)
    fp = static.fingerprint(src, obtained_by="import")
    for section, check in CHECKS.items():
        if fp[section].get("module", True) is not None:  # None: the static reader found no such thing
            check(fp[section])
    return fp
