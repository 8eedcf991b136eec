"""The plugin's command-line options and the per-session state read from them.

The plugin's other modules import it, it imports none of them; the option names themselves are
the vocabulary's (conformance.vocabulary), where rooms that import no test framework read them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from conformance.verdict.profiles import PROFILES as PROFILE_SETTINGS
from conformance.vocabulary import (
    BLOCK_SIZE,
    CACHE_DTYPE,
    CAPABILITIES,
    CONNECTOR,
    DEFAULT_MODEL,
    DTYPES,
    ENGINE_BASELINES,
    ENGINE_ENV,
    ENGINE_LANES,
    ENGINE_PYTHON,
    ENGINE_START,
    ENGINE_TIMEOUT,
    EXTRA_CONFIG,
    LEVELS_OPTION,
    LMCACHE_SERVER_ARG,
    MODEL,
    NO_SHRINK,
    OTHER_MODEL,
    PROFILE,
    RESULTS,
    ROLE,
    STORAGE_HOOK,
    STORE,
    TENSOR_PARALLEL,
    TIMEOUT,
    TRANSFER_CONFIG,
)

PROFILES = tuple(PROFILE_SETTINGS)


def add_options(parser: pytest.Parser) -> None:
    """Every --kv-* option, declared to pytest.

    Over 80 lines: one declaration per option, grouped as ``pytest --help`` shows them."""
    group = parser.getgroup("kvconform", "kvconform: KV-cache connector conformance")
    group.addoption(STORE, default=None, metavar="STORE",
                    help="store under test: 'module:factory' or a name registered in the "
                         "'kvconform.stores' entry-point group (default: $KVCONFORM_STORE)")
    group.addoption(PROFILE, default=None, choices=list(PROFILES),
                    help="Hypothesis profile (default: ci when $CI is set, else dev)")
    group.addoption(NO_SHRINK, action="store_true",
                    help="report each failing example as found, unshrunk (the matrix's known-bad controls: "
                         "their failures are expected, and shrinking one can take a minute)")
    group.addoption(TIMEOUT, type=float, default=60.0, metavar="SECONDS",
                    help="a store call that takes longer is an Error (default: 60)")
    group.addoption(DTYPES, default=None, metavar="LIST",
                    help="comma-separated kv_cache_dtype strings to draw specs from, e.g. "
                         "'fp8,fp8_e4m3,fp8_e5m2' (default: every string vLLM knows)")
    group.addoption(LEVELS_OPTION, "--kv-tiers", dest="kv_levels", default=None, metavar="LIST",
                    help="comma-separated levels to run among store, connector (the connector level) and "
                         "engine (default: every level whose implementation is chosen; --kv-tiers is its "
                         "deprecated spelling)")
    group.addoption(RESULTS, default=None, metavar="PATH",
                    help="write the results JSON (schema kvconform.results/1) to PATH")
    engine = parser.getgroup("kvconform-engine", "kvconform: the connector and engine levels")
    engine.addoption(CONNECTOR, default=None, metavar="CONNECTOR",
                     help="connector under test, as vLLM chooses it: a registry name (ExampleConnector, "
                          "LMCacheMPConnector) or 'package.module:ClassName' (default: $KVCONFORM_CONNECTOR)")
    engine.addoption(EXTRA_CONFIG, default=None, metavar="JSON",
                     help="kv_connector_extra_config as JSON; '{storage}' anywhere in it (however nested: a "
                          "MultiConnector's children) becomes a directory private to each run")
    engine.addoption(TRANSFER_CONFIG, action="append", default=[], metavar="FIELD=VALUE",
                     help="a field of vLLM's KVTransferConfig the connector runs with, as its deployment sets it "
                          "(repeatable; the value read as JSON where it parses): 'kv_load_failure_policy=recompute' "
                          "for a connector that refuses to run without it. Recorded in the results")
    engine.addoption(LMCACHE_SERVER_ARG, action="append", default=[], metavar="ARG",
                     help="an argument for the LMCache server the suite starts for an LMCacheMPConnector "
                          "(repeatable, in order): '--l2-adapter' then '{\"type\": \"fs\", \"base_path\": "
                          "\"{server}/l2\"}' judges LMCache's fs tier, or a serde, with no glue; '{server}' "
                          "becomes a directory of each server start's own. Recorded in the results")
    engine.addoption(CAPABILITIES, default=None, metavar="LIST",
                     help="what the connector declares, comma-separated: 'persistent' (its cache outlives its "
                          "engine: the cross-engine clauses apply), 'lossy=TOL' (a codec: loaded KV held to TOL "
                          "as values, the engine level's logprobs within TOL), 'pd' (a prefill/decode "
                          "transfer: the P/D clauses apply), 'cache' (a prefix cache: implied unless pd), "
                          "'hma' (works with vLLM's hybrid KV cache manager); default: none")
    engine.addoption(STORAGE_HOOK, default=None, metavar="MODULE:OBJECT",
                     help="how to damage what the connector stored where the suite cannot see it (a server, a "
                          "remote store): OBJECT.damage(storage, how) -> what it did, given the run's {storage} "
                          "directory and 'flip_middle' or 'truncate' (default: the suite damages the files "
                          "under {storage}, or restarts the LMCache server it started)")
    engine.addoption(ROLE, default="kv_both", choices=["kv_both", "kv_producer", "kv_consumer"])
    engine.addoption(CACHE_DTYPE, default="auto", metavar="DTYPE", help="the engines' kv_cache_dtype")
    engine.addoption(MODEL, default=DEFAULT_MODEL, metavar="NAME|PATH",
                     help="a model shipped with kvconform (fixtures/models, generated locally) "
                          "or a model directory")
    engine.addoption(OTHER_MODEL, default=None, metavar="PATH",
                     help="another checkpoint of the model (a directory: the same architecture and KV geometry, "
                          "other weights), for the model-isolation clauses; the suite makes one for a model it "
                          "ships, and without one they are Not runnable for a model directory")
    engine.addoption(BLOCK_SIZE, type=int, default=32, help="block size (a multiple of 32 on CPU)")
    engine.addoption(ENGINE_PYTHON, default=os.environ.get("KVCONFORM_ENGINE_PYTHON"), metavar="PYTHON",
                     help="the Python with vLLM installed that runs engines (default: "
                          "$KVCONFORM_ENGINE_PYTHON, else this one)")
    engine.addoption(ENGINE_TIMEOUT, type=float, default=420.0, metavar="SECONDS",
                     help="an engine that takes longer is killed and its scenarios are Error")
    engine.addoption(ENGINE_START, default="host", choices=["host", "fresh"],
                     help="host: each engine is a process forked from one that imported vLLM once per cell "
                          "(the default); fresh: each engine is a new Python process, importing vLLM itself")
    engine.addoption(ENGINE_LANES, type=int, default=2, choices=[1, 2], metavar="N",
                     help="2 (the default): the roles whose storage no other role touches (the format twin's "
                          "baseline, LoRA, block reuse) run beside the rest once the baseline ran; 1: one engine at a time")
    engine.addoption(TENSOR_PARALLEL, type=int, default=1, metavar="N",
                     help="N > 1 judges engine_tensor_parallel: a store and a load engine of N tensor-parallel "
                          "ranks (and vLLM's own output with N ranks), each rank bound to a core of its own "
                          "(three more engines: asked for, never by default)")
    engine.addoption(ENGINE_ENV, action="append", default=[], metavar="NAME=VALUE",
                     help="an environment variable every engine of the connector runs with, as its deployment "
                          "sets it (repeatable): 'PYTHONHASHSEED=0' for a connector whose documentation requires "
                          "a fixed hash seed. Without one, each engine that loads what another stored runs in an "
                          "interpreter of another hash seed, as a separately started vllm serve does. Recorded "
                          "by name; values only of PYTHONHASHSEED")
    engine.addoption(ENGINE_BASELINES, default=None, metavar="DIR",
                     help="share no-connector baseline runs through DIR across cells (a matrix run passes "
                          "its results' baselines/); default: every cell starts its own")


class State:
    """What this session is asked to check, read once from the options and environment."""

    def __init__(self, config: pytest.Config) -> None:
        self.store_spec: str | None = config.getoption(STORE) or os.environ.get("KVCONFORM_STORE")
        explicit_profile = config.getoption(PROFILE)
        self.connector_spec: str | None = config.getoption(CONNECTOR) or os.environ.get("KVCONFORM_CONNECTOR")
        dtypes = config.getoption(DTYPES)
        self.kv_cache_dtypes: list[str] | None = [d.strip() for d in dtypes.split(",")] if dtypes else None
        self.active = bool(self.store_spec or explicit_profile or self.connector_spec or dtypes)
        self.profile: str = explicit_profile or ("ci" if os.environ.get("CI") else "dev")
        self.shrink: bool = not config.getoption(NO_SHRINK)
        self.choice: Any = None  # the resolved store (conformance.stores.loader.StoreChoice)
        self.connector: Any = None  # the parsed connector (conformance.levels.subject.ConnectorChoice)


STATE = pytest.StashKey[State]()
# What the engine cell saw, for the results file.
ENGINE_TIMINGS = pytest.StashKey[dict]()
ENGINE_VERSIONS = pytest.StashKey[dict]()
ENGINE_EVIDENCE = pytest.StashKey[dict]()
# The one geometry a connector that declares one-geometry was judged at, for the results file.
GEOMETRY = pytest.StashKey[dict]()


def evidence_dir(results: Path) -> Path:
    """Where a run's evidence (engine logs, per-request outcomes) is kept: beside its results file."""
    return results.with_name(results.stem + ".evidence")


def session_state(config: pytest.Config) -> State:
    """This session's plugin state."""
    return config.stash[STATE]
