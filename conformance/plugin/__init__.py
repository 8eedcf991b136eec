"""The kvconform pytest plugin (entry point ``pytest11``).

It loads in every pytest session of an environment where kvconform is installed, so it stays
inert unless asked: options are only added, Hypothesis profiles are only loaded and the store
is only resolved when ``--kv-store``/``KVCONFORM_STORE`` or ``--kv-profile`` is given, or when
a kvconform clause is collected.
"""

from __future__ import annotations

import os

import pytest

from conformance.plugin import options
from conformance.plugin.options import State, session_state
from conformance.vocabulary import CONNECTOR_LEVELS, LEVELS, LEVELS_OPTION, Level

# The fixtures the levels' clauses use, how a test's outcome becomes a verdict, and the child
# process a connector-level test runs in.
pytest_plugins = ("conformance.plugin.fixtures", "conformance.plugin.verdicts", "conformance.plugin.isolation")


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    from conformance.verdict.clauses import CLAUSE_MARK

    config.addinivalue_line("markers", f"{CLAUSE_MARK}(id): the kvconform clause this test checks")
    if any(arg.split("=", 1)[0] == "--kv-tiers" for arg in config.invocation_params.args):
        config.issue_config_time_warning(pytest.PytestDeprecationWarning(
            "--kv-tiers is deprecated: it is --kv-levels (store, connector, engine); a tier is matrix.yaml's"), 2)
    _register_secrets(config)
    state = State(config)
    config.stash[options.STATE] = state
    from conformance.plugin.verdicts import Recorder

    config.pluginmanager.register(Recorder(config), "kvconform-recorder")
    if state.active:
        _activate(state)


def _register_secrets(config: pytest.Config) -> None:
    """Learn the secrets this session was configured with, before anything is written: every process
    of a run (an xdist worker, a forked child) parses the same options and environment."""
    from conformance.verdict import secrets

    opt = config.getoption
    secrets.register_options(opt(options.EXTRA_CONFIG), opt(options.ENGINE_ENV), opt(options.TRANSFER_CONFIG),
                             opt(options.LMCACHE_SERVER_ARG))
    secrets.register_environment(os.environ)


def _activate(state: State) -> None:
    from conformance.contract.strategies import restrict_kv_cache_dtypes
    from conformance.stores import loader
    from conformance.verdict import profiles

    profiles.load(state.profile, shrink=state.shrink)
    state.active = True
    if state.kv_cache_dtypes:
        try:
            restrict_kv_cache_dtypes(state.kv_cache_dtypes)
        except ValueError as exc:
            raise pytest.UsageError(f"kvconform: {options.DTYPES}: {exc}") from None
    if state.store_spec and state.choice is None:
        try:
            state.choice = loader.resolve(state.store_spec)
        except loader.StoreLoadError as exc:
            raise pytest.UsageError(str(exc)) from None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from conformance.verdict.clauses import clause_of

    state = session_state(config)
    levels = {id(item): c.level for item in items if (c := clause_of(item)) is not None}
    if not levels:
        return
    chosen: dict[Level, bool] = {level: bool(state.connector_spec if level in CONNECTOR_LEVELS else state.store_spec)
                                 for level in LEVELS}
    if not any(chosen.values()):
        raise pytest.UsageError(
            "kvconform: no store chosen: pass --kv-store module:factory (or a registered name "
            "such as 'memory'), or set KVCONFORM_STORE; for the connector and engine levels pass --kv-connector")
    wanted = config.getoption("kv_levels")
    if wanted:
        names = [name.strip() for name in wanted.split(",") if name.strip()]
        unknown = [name for name in names if name not in LEVELS]
        if unknown:
            raise pytest.UsageError(f"kvconform: {LEVELS_OPTION}: unknown level {unknown[0]!r}; valid: {', '.join(LEVELS)}")
        chosen = {level: ok and level in names for level, ok in chosen.items()}
    # A level whose implementation was not chosen is not collected (like -k), not failed.
    keep = [item for item in items if id(item) not in levels or chosen[levels[id(item)]]]
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
    from conformance.verdict.profiles import describe
    from conformance.verdict.results import package_versions, redact

    lines = [f"kvconform {__version__}: Hypothesis profile {describe(state.profile)}"]
    if state.choice is not None:
        lines.append(f"kvconform store: {state.choice.spec} -> {state.choice.target} "
                     f"[{state.choice.distribution_version}]")
    if state.connector_spec:
        opt = config.getoption
        lines.append(f"kvconform connector: {state.connector_spec} role={opt(options.ROLE)} "
                     f"capabilities={opt(options.CAPABILITIES) or 'none'} "
                     f"kv_cache_dtype={opt(options.CACHE_DTYPE)} model={opt(options.MODEL)} "
                     f"block_size={opt(options.BLOCK_SIZE)} engine python={opt(options.ENGINE_PYTHON) or 'this'}")
    if state.kv_cache_dtypes:
        lines.append(f"kvconform kv_cache_dtypes: {', '.join(state.kv_cache_dtypes)}")
    lines.append("kvconform versions: " + ", ".join(f"{k} {v}" for k, v in package_versions().items()))
    env = redact({k: v for k, v in os.environ.items() if k.startswith("KVCONFORM_")})
    if env:  # printed so that a typo in a variable name is visible; values are redacted
        lines.append("kvconform env: " + ", ".join(f"{k}={v}" for k, v in sorted(env.items())))
    return lines
