"""Choosing the store under test: one option, one variable, or an entry point.

``--kv-store`` (or ``KVCONFORM_STORE``) takes either ``module:factory`` or the name of an
entry point in the ``kvconform.stores`` group. The factory is called with a private working
directory (one per pytest-xdist worker, so workers never share paths) and returns a store.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from conformance.contract.store import CAPABILITIES, KVStore, StoreNotRunnable
from conformance.util import distributions

ENTRY_POINT_GROUP = "kvconform.stores"
# The methods of the store protocol, in the order it declares them.
REQUIRED_METHODS = tuple(name for name, member in vars(KVStore).items() if callable(member) and not name.startswith("_"))
CAPABILITY_METHODS = {"delete": "delete", "at_rest": "damage"}


class StoreLoadError(Exception):
    """The chosen store cannot be loaded or does not implement the protocol; one-line message."""


@dataclass(frozen=True)
class StoreChoice:
    spec: str  # what the user wrote
    target: str  # module:factory it resolved to
    factory: Callable[..., Any]

    @property
    def distribution_version(self) -> str:
        top = self.target.split(":", 1)[0].split(".", 1)[0]
        for dist in distributions.providing(top):
            try:
                return f"{dist} {metadata.version(dist)}"
            except metadata.PackageNotFoundError:
                continue
        return f"{top} (not an installed distribution)"


def registered_stores() -> dict[str, str]:
    return {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def resolve(spec: str) -> StoreChoice:
    """Resolve ``spec`` (``module:factory`` or an entry-point name) to its factory."""
    names = registered_stores()
    target = names.get(spec, spec)
    if ":" not in target:
        raise StoreLoadError(
            f"kvconform: --kv-store {spec!r} is neither 'module:factory' nor a registered store "
            f"name (registered: {', '.join(sorted(names)) or 'none'})")
    module_name, _, attr = target.partition(":")
    module = _import(module_name, spec)
    factory: Any = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise StoreLoadError(f"kvconform: --kv-store {spec!r}: module {module_name!r} has no "
                                 f"attribute {attr!r}")
    if not callable(factory):
        raise StoreLoadError(f"kvconform: --kv-store {spec!r}: {attr!r} is not callable")
    return StoreChoice(spec, target, factory)


def _import(module_name: str, spec: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Like `python -m`: a module next to where the user stands is importable.
        if exc.name == module_name.split(".")[0] and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
            return _import(module_name, spec)
        raise StoreLoadError(f"kvconform: --kv-store {spec!r}: cannot import {module_name!r} "
                             f"(no module named {exc.name!r})") from None
    except Exception as exc:  # the module itself is broken: say so in one line
        raise StoreLoadError(f"kvconform: --kv-store {spec!r}: importing {module_name!r} raised "
                             f"{type(exc).__name__}: {exc}") from None


def build(choice: StoreChoice, workdir: Path) -> KVStore:
    """Call the factory and check that what it returns implements the protocol."""
    takes_workdir = bool(inspect.signature(choice.factory).parameters)
    try:
        store = choice.factory(workdir) if takes_workdir else choice.factory()
    except StoreNotRunnable:
        raise
    except Exception as exc:
        raise StoreLoadError(f"kvconform: store factory {choice.target} raised "
                             f"{type(exc).__name__}: {exc}") from exc
    check_protocol(store, choice.target)
    return store


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")


def check_protocol(store: Any, name: str) -> None:
    missing = [m for m in REQUIRED_METHODS if not callable(getattr(store, m, None))]
    caps = getattr(store, "capabilities", None)
    if not isinstance(caps, (set, frozenset)):
        raise StoreLoadError(f"kvconform: store {name} has no 'capabilities' set "
                             f"(claim any of: {', '.join(CAPABILITIES)}; an empty frozenset is fine)")
    unknown = sorted(set(caps) - set(CAPABILITIES))
    if unknown:
        raise StoreLoadError(f"kvconform: store {name} claims unknown capabilities {unknown}; "
                             f"valid: {', '.join(CAPABILITIES)}")
    if "lossy" in caps and not _positive(getattr(store, "lossy_tolerance", None)):
        raise StoreLoadError(f"kvconform: store {name} claims 'lossy' but states no lossy_tolerance (the relative RMS "
                             "error of its round trip, a positive number): without it nothing it returns can be judged")
    missing += [m for c, m in CAPABILITY_METHODS.items() if c in caps and not callable(getattr(store, m, None))]
    if missing:
        raise StoreLoadError(f"kvconform: store {name} lacks method(s) {', '.join(missing)} "
                             "required by the protocol and its claimed capabilities")
