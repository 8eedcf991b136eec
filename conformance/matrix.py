"""matrix.yaml: load, validate, and expand into cells.

Validation fails with one line naming the file, the path inside it and what was expected,
because a matrix typo found after an hour of engine starts is an hour lost.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from conformance.clauses import CLAUSES
from conformance.names import KV_CACHE_DTYPE_NAMES

SCHEMA = "kvconform.matrix/1"
PROFILES = ("dev", "ci", "deep", "certify")


class MatrixError(ValueError):
    """matrix.yaml is malformed; the message is one line: file, path, what is expected."""


@dataclass(frozen=True)
class Tier:
    name: str
    profile: str
    timeout_s: float


@dataclass(frozen=True)
class Cell:
    """One run of the suite: an implementation on a tier, and the clauses it is expected to fail."""

    name: str
    kind: str  # "store" or "engine"
    args: tuple[str, ...]  # the pytest options that select the implementation under test
    tier: Tier
    coordinates: Mapping[str, str] = field(default_factory=dict)
    expected_failures: Mapping[str, str] = field(default_factory=dict)  # clause -> reason
    intermittent: Mapping[str, str] = field(default_factory=dict)  # may Pass or Fail: clause -> reason

    @property
    def id(self) -> str:
        if self.kind == "engine":
            return "engine(" + ", ".join(self.coordinates[k] for k in ("connector", "model", "kv_cache_dtype")) + ")"
        return f"store({self.name})"

    @property
    def file_stem(self) -> str:
        return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in self.name)


@dataclass(frozen=True)
class Expectation:
    """Known failures of the cells whose coordinates match ``when`` (as wpt's metadata)."""

    when: Mapping[str, tuple[str, ...]]
    clauses: tuple[str, ...]
    reason: str

    def matches(self, coordinates: Mapping[str, str]) -> bool:
        return all(coordinates.get(k) in values for k, values in self.when.items())


@dataclass(frozen=True)
class Matrix:
    path: Path
    tiers: Mapping[str, Tier]
    stores: Mapping[str, tuple[str, tuple[str, ...]]]  # name -> (target, tiers)
    connectors: Mapping[str, dict[str, Any]]
    expectations: tuple[Expectation, ...]
    control_tiers: tuple[str, ...]

    def cells(self, tier: str) -> list[Cell]:
        if tier not in self.tiers:
            raise MatrixError(f"{self.path}: tier {tier!r} is not defined; valid: {', '.join(self.tiers)}")
        t = self.tiers[tier]
        cells = [Cell(name, "store", (f"--kv-store={target}",), t, {"store": name})
                 for name, (target, tiers) in self.stores.items() if tier in tiers]
        for name, spec in self.connectors.items():
            if tier not in spec["tiers"]:
                continue
            for model in spec["models"]:
                for dtype in spec["kv_cache_dtypes"]:
                    coords = {"connector": spec["connector"], "model": model, "kv_cache_dtype": dtype}
                    args = (f"--kv-connector={spec['connector']}", f"--model={model}", f"--kv-cache-dtype={dtype}",
                            *(["--kv-connector-extra-config=" + json.dumps(spec["extra_config"])]
                              if spec.get("extra_config") else []))
                    cells.append(Cell(f"{name}-{model}-{dtype}", "engine", args, t, coords))
        if tier in self.control_tiers:
            cells += control_cells(t, self.path.resolve().parent)
        return [self._expect(c) for c in cells]

    def _expect(self, cell: Cell) -> Cell:
        expected = dict(cell.expected_failures)
        for e in self.expectations:
            if e.matches(cell.coordinates):
                expected.update({c: e.reason for c in e.clauses})
        return Cell(cell.name, cell.kind, cell.args, cell.tier, cell.coordinates, expected, cell.intermittent)


def control_cells(tier: Tier, checkout: Path) -> list[Cell]:
    """The known-bad zoo as cells; fixtures/ is not installed, it sits beside matrix.yaml."""
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    try:
        from fixtures.zoo import ZOO
    except ImportError as exc:
        raise MatrixError(f"{checkout}: controls are enabled but fixtures.zoo cannot be imported ({exc})") from None
    return [Cell(f"zoo.{name}", "store", (f"--kv-store={m.target}",), tier, {"store": f"zoo.{name}"},
                 {c: m.bug for c in m.fails}, {c: m.bug for c in m.may_fail}) for name, m in sorted(ZOO.items())]


def _expect(cond: bool, path: Path, where: str, what: str) -> None:
    if not cond:
        raise MatrixError(f"{path}: {where}: expected {what}")


def _keys(obj: Any, path: Path, where: str, allowed: set[str], required: set[str] = frozenset()) -> None:
    _expect(isinstance(obj, dict), path, where, f"a mapping with keys {sorted(allowed)}")
    unknown = sorted(set(obj) - allowed)
    _expect(not unknown, path, f"{where}.{unknown[0] if unknown else ''}", f"one of {sorted(allowed)} (unknown key)")
    missing = sorted(required - set(obj))
    _expect(not missing, path, where, f"key {missing[0] if missing else ''!r}")


def load(path: Path) -> Matrix:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise MatrixError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "?"
        raise MatrixError(f"{path}: {where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    _keys(data, path, "(top level)", {"schema", "tiers", "stores", "connectors", "expectations", "controls"},
          {"schema", "tiers", "stores"})
    _expect(data["schema"] == SCHEMA, path, "schema", repr(SCHEMA))
    tiers: dict[str, Tier] = {}
    _expect(isinstance(data["tiers"], dict) and data["tiers"], path, "tiers", "a non-empty mapping")
    for name, spec in data["tiers"].items():
        where = f"tiers.{name}"
        _keys(spec, path, where, {"profile", "timeout_s"}, {"profile"})
        _expect(spec["profile"] in PROFILES, path, f"{where}.profile", f"one of {list(PROFILES)}")
        timeout = spec.get("timeout_s", 900)
        _expect(isinstance(timeout, (int, float)) and timeout > 0, path, f"{where}.timeout_s", "a positive number")
        tiers[name] = Tier(name, spec["profile"], float(timeout))
    stores: dict[str, tuple[str, tuple[str, ...]]] = {}
    _expect(isinstance(data["stores"], dict), path, "stores", "a mapping of store name to {target, tiers}")
    for name, spec in data["stores"].items():
        where = f"stores.{name}"
        _keys(spec, path, where, {"target", "tiers"}, {"target", "tiers"})
        _expect(isinstance(spec["target"], str) and spec["target"], path, f"{where}.target",
                "'module:factory' or a registered store name")
        stores[name] = (spec["target"], _tier_list(spec["tiers"], tiers, path, f"{where}.tiers"))
    connectors: dict[str, dict[str, Any]] = {}
    for name, spec in (data.get("connectors") or {}).items():
        where = f"connectors.{name}"
        _keys(spec, path, where, {"connector", "extra_config", "models", "kv_cache_dtypes", "tiers"},
              {"connector", "models", "kv_cache_dtypes", "tiers"})
        _expect(isinstance(spec["connector"], str), path, f"{where}.connector", "a registry name or module:Class")
        _expect(isinstance(spec.get("extra_config", {}), dict), path, f"{where}.extra_config", "a mapping")
        for key, valid in (("models", model_profiles(path)), ("kv_cache_dtypes", list(KV_CACHE_DTYPE_NAMES))):
            value = spec[key]
            _expect(isinstance(value, list) and value, path, f"{where}.{key}", f"a non-empty list from {valid}")
            for i, v in enumerate(value):
                _expect(v in valid, path, f"{where}.{key}[{i}]", f"one of {valid}, got {v!r}")
        connectors[name] = {**spec, "tiers": _tier_list(spec["tiers"], tiers, path, f"{where}.tiers")}
    expectations = []
    for i, spec in enumerate(data.get("expectations") or []):
        where = f"expectations[{i}]"
        _keys(spec, path, where, {"when", "clauses", "reason", "link"}, {"when", "clauses", "reason"})
        _expect(isinstance(spec["when"], dict) and spec["when"], path, f"{where}.when", "a mapping of coordinates")
        for j, c in enumerate(spec["clauses"]):
            _expect(c in CLAUSES, path, f"{where}.clauses[{j}]", f"a clause id, got {c!r}")
        when = {k: tuple(v if isinstance(v, list) else [v]) for k, v in spec["when"].items()}
        expectations.append(Expectation(when, tuple(spec["clauses"]), spec["reason"]))
    controls = data.get("controls") or {"tiers": []}
    _keys(controls, path, "controls", {"tiers"}, {"tiers"})
    return Matrix(path, tiers, stores, connectors, tuple(expectations),
                  _tier_list(controls["tiers"], tiers, path, "controls.tiers"))


def model_profiles(matrix_path: Path) -> list[str]:
    return sorted(p.stem for p in (matrix_path.resolve().parent / "fixtures" / "models").glob("*.json"))


def _tier_list(value: Any, tiers: Mapping[str, Tier], path: Path, where: str) -> tuple[str, ...]:
    _expect(isinstance(value, list), path, where, f"a list of tiers from {list(tiers)}")
    for i, t in enumerate(value):
        _expect(t in tiers, path, f"{where}[{i}]", f"one of {list(tiers)}, got {t!r}")
    return tuple(value)
