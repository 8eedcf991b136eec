"""The kvconform pytest plugin (entry point ``pytest11``).

It loads in every pytest session of an environment where kvconform is installed, so it stays
inert unless asked: options are only added, Hypothesis profiles are only loaded and the store
is only resolved when ``--kv-store``/``KVCONFORM_STORE`` or ``--kv-profile`` is given, or when
a kvconform clause is collected.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

# The fixtures the tiers' clauses use, and how a test's outcome becomes a verdict.
pytest_plugins = ("conformance.plugin_fixtures", "conformance.plugin_verdicts")

KV_STORE_OPTION = "--kv-store"
KV_PROFILE_OPTION = "--kv-profile"
KV_TIMEOUT_OPTION = "--kv-timeout"
KV_RESULTS_OPTION = "--kv-results"
KV_DTYPES_OPTION = "--kv-cache-dtypes"
KV_CONNECTOR_OPTION = "--kv-connector"
KV_TIERS_OPTION = "--kv-tiers"
TIERS = ("store", "connector", "engine")
_STATE = "_kvconform_state"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvconform", "kvconform: KV-cache connector conformance")
    group.addoption(KV_STORE_OPTION, default=None, metavar="STORE",
                    help="store under test: 'module:factory' or a name registered in the "
                         "'kvconform.stores' entry-point group (default: $KVCONFORM_STORE)")
    group.addoption(KV_PROFILE_OPTION, default=None, choices=["dev", "ci", "deep", "certify"],
                    help="Hypothesis profile (default: ci when $CI is set, else dev)")
    group.addoption(KV_TIMEOUT_OPTION, type=float, default=60.0, metavar="SECONDS",
                    help="a store call that takes longer is an Error (default: 60)")
    group.addoption(KV_DTYPES_OPTION, default=None, metavar="LIST",
                    help="comma-separated kv_cache_dtype strings to draw specs from, e.g. "
                         "'fp8,fp8_e4m3,fp8_e5m2' (default: every string vLLM knows)")
    engine = parser.getgroup("kvconform-engine", "kvconform: the engine tier (a real vLLM)")
    engine.addoption(KV_CONNECTOR_OPTION, default=None, metavar="CONNECTOR",
                     help="connector under test, as vLLM chooses it: a registry name (ExampleConnector, "
                          "LMCacheMPConnector) or 'package.module:ClassName' (default: $KVCONFORM_CONNECTOR)")
    engine.addoption("--kv-connector-extra-config", default=None, metavar="JSON",
                     help="kv_connector_extra_config as JSON")
    engine.addoption("--kv-role", default="kv_both", choices=["kv_both", "kv_producer", "kv_consumer"])
    engine.addoption("--kv-cache-dtype", default="auto", metavar="DTYPE", help="the engines' kv_cache_dtype")
    engine.addoption("--model", default="qwen3-tiny", metavar="PROFILE|PATH",
                     help="a profile of fixtures/models (generated locally) or a model directory")
    engine.addoption("--kv-block-size", type=int, default=32, help="block size (a multiple of 32 on CPU)")
    engine.addoption("--kv-engine-python", default=os.environ.get("KVCONFORM_ENGINE_PYTHON"), metavar="PYTHON",
                     help="the Python with vLLM installed that runs engines (default: "
                          "$KVCONFORM_ENGINE_PYTHON, else this one)")
    engine.addoption("--kv-engine-timeout", type=float, default=420.0, metavar="SECONDS",
                     help="an engine that takes longer is killed and its scenarios are Error")
    engine.addoption("--kv-engine-baselines", default=None, metavar="DIR",
                     help="share no-connector baseline runs through DIR across cells (a matrix run passes "
                          "its results' baselines/); default: every cell starts its own")
    group.addoption(KV_TIERS_OPTION, default=None, metavar="LIST",
                    help="comma-separated tiers to run among store, connector (the connector-API tier) and "
                         "engine (default: every tier whose implementation is chosen)")
    group.addoption(KV_RESULTS_OPTION, default=None, metavar="PATH",
                    help="write the results JSON (schema kvconform.results/1) to PATH")


class _State:
    """Per-session plugin state (kept on the config, never in module globals)."""

    def __init__(self, config: pytest.Config) -> None:
        self.store_spec: str | None = config.getoption(KV_STORE_OPTION) or os.environ.get("KVCONFORM_STORE")
        explicit_profile = config.getoption(KV_PROFILE_OPTION)
        self.connector_spec: str | None = (config.getoption(KV_CONNECTOR_OPTION)
                                           or os.environ.get("KVCONFORM_CONNECTOR"))
        self.active = bool(self.store_spec or explicit_profile or self.connector_spec)
        self.profile: str = explicit_profile or ("ci" if os.environ.get("CI") else "dev")
        dtypes = config.getoption(KV_DTYPES_OPTION)
        self.kv_cache_dtypes: list[str] | None = [d.strip() for d in dtypes.split(",")] if dtypes else None
        self.active = self.active or bool(dtypes)
        self.choice: Any = None


def session_state(config: pytest.Config) -> _State:
    """This session's plugin state (the other plugin modules read it too)."""
    return getattr(config, _STATE)


def pytest_configure(config: pytest.Config) -> None:
    from conformance.clauses import CLAUSE_MARK

    config.addinivalue_line("markers", f"{CLAUSE_MARK}(id): the kvconform clause this test checks")
    state = _State(config)
    setattr(config, _STATE, state)
    from conformance.plugin_verdicts import Recorder

    config.pluginmanager.register(Recorder(config), "kvconform-recorder")
    if state.active:
        _activate(state)


def _activate(state: _State) -> None:
    from hypothesis import settings

    from conformance import loader, profiles

    from conformance.strategies import restrict_kv_cache_dtypes

    profiles.register_profiles()
    settings.load_profile(state.profile)
    profiles.ACTIVE[0] = state.profile
    state.active = True
    if state.kv_cache_dtypes:
        try:
            restrict_kv_cache_dtypes(state.kv_cache_dtypes)
        except ValueError as exc:
            raise pytest.UsageError(f"kvconform: {KV_DTYPES_OPTION}: {exc}") from None
    if state.store_spec and state.choice is None:
        try:
            state.choice = loader.resolve(state.store_spec)
        except loader.StoreLoadError as exc:
            raise pytest.UsageError(str(exc)) from None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from conformance.clauses import clause_of

    state = session_state(config)
    tiers = {id(item): c.tier for item in items if (c := clause_of(item)) is not None}
    if not tiers:
        return
    chosen = {"store": bool(state.store_spec), "engine": bool(state.connector_spec),
              "connector": bool(state.connector_spec)}
    if not any(chosen.values()):
        raise pytest.UsageError(
            "kvconform: no store chosen: pass --kv-store module:factory (or a registered name "
            "such as 'memory'), or set KVCONFORM_STORE; for the connector-API and engine tiers pass --kv-connector")
    wanted = config.getoption(KV_TIERS_OPTION)
    if wanted:
        names = [t.strip() for t in wanted.split(",") if t.strip()]
        unknown = [t for t in names if t not in TIERS]
        if unknown:
            raise pytest.UsageError(f"kvconform: {KV_TIERS_OPTION}: unknown tier {unknown[0]!r}; valid: {', '.join(TIERS)}")
        chosen = {t: ok and t in names for t, ok in chosen.items()}
    # A tier whose implementation was not chosen is not collected (like -k), not failed.
    keep = [item for item in items if chosen.get(tiers.get(id(item), ""), True)]
    dropped = [item for item in items if item not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    _activate(state)


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    state = session_state(config)
    if not state.active:
        return None
    from conformance import __version__
    from conformance.profiles import describe
    from conformance.results import package_versions

    lines = [f"kvconform {__version__}: Hypothesis profile {describe(state.profile)}"]
    if state.choice is not None:
        lines.append(f"kvconform store: {state.choice.spec} -> {state.choice.target} "
                     f"[{state.choice.distribution_version}]")
    if state.connector_spec:
        opt = config.getoption
        lines.append(f"kvconform connector: {state.connector_spec} role={opt('--kv-role')} "
                     f"kv_cache_dtype={opt('--kv-cache-dtype')} model={opt('--model')} "
                     f"block_size={opt('--kv-block-size')} engine python={opt('--kv-engine-python') or 'this'}")
    if state.kv_cache_dtypes:
        lines.append(f"kvconform kv_cache_dtypes: {', '.join(state.kv_cache_dtypes)}")
    lines.append("kvconform versions: " + ", ".join(f"{k} {v}" for k, v in package_versions().items()))
    env = {k: v for k, v in os.environ.items() if k.startswith("KVCONFORM_")}
    if env:  # printed so that a typo in a variable name is visible
        lines.append("kvconform env: " + ", ".join(f"{k}={v}" for k, v in sorted(env.items())))
    return lines
