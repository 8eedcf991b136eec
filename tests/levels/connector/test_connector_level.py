"""The connector-API level against real connectors on the installed vLLM: vLLM's ExampleConnector,
LMCacheMPConnector with LMCache's real server, and the known-bad zoo connectors, each failing
exactly the clauses it breaks. Needs vLLM in this Python: ``nox -s engine``.
"""

from __future__ import annotations

import json

import pytest

from conformance.verdict.clauses import CLAUSES

pytestmark = pytest.mark.engine

API_CLAUSES = {c.id for c in CLAUSES.values() if c.level == "connector"}
ACROSS = {c.id for c in CLAUSES.values() if c.level == "connector" and "persistent" in c.requires}
PD = {c.id for c in CLAUSES.values() if c.level == "connector" and "pd" in c.requires}
# Inherited from ExampleConnector's files: fp8 twins share a key, no checksum, and a file it cannot
# parse raises in the worker instead of being reported (api_load_errors_reported).
FILE_STORE_BUGS = {"api_format_isolation", "api_damaged_storage", "api_load_errors_reported"}
# Also inherited: a key of token ids alone (api_cache_salt), and a save at a prompt's first chunk
# that later claims the whole prompt (a shape mismatch on load), hit by every scenario that prefills
# in chunks (api_chunked_prefill, api_abort, api_preemption).
LIFECYCLE_BUGS = {"api_cache_salt", "api_chunked_prefill", "api_abort", "api_preemption"}
EXAMPLE_BUGS = FILE_STORE_BUGS | LIFECYCLE_BUGS
ZOO = "conformance.zoo.connectors."
GOOD = "conformance.zoo.good."
# Caches that live inside their engine: run as their authors would declare them (not persistent).
IN_ENGINE = {GOOD + "in_engine:InEngineConnector", ZOO + "block_reference:BlockReferenceConnector"}
# connector -> the clauses it must fail under the ci profile (every other clause must pass).
EXPECTED = {
    # Keyed by token ids only, it serves an fp8_e4m3 pair the bytes an fp8_e5m2 pair stored, and one
    # tenant's KV to another (cache_salt); with no checksum, a flipped byte in a stored file is loaded
    # as KV; saved at the first chunk, a prompt prefilled in chunks is claimed whole.
    "ExampleConnector": EXAMPLE_BUGS,
    # Against LMCache's real multiprocess server (started by the tier): chunks are keyed by the
    # torch dtype, uint8 for every fp8 format, so the fp8 twins read each other's chunks. A server
    # restart loses its store: the load misses, which is a pass of api_damaged_storage.
    "LMCacheMPConnector": {"api_format_isolation"},
    # Stores, but never claims a match: it loads nothing (a Fail where a load is required, Not exercised
    # where loaded bytes are compared; damaged storage it never reads is a Pass).
    ZOO + "noop:NoopConnector": {"api_save_load_roundtrip", "api_same_engine_roundtrip"},
    ZOO + "reversed_blocks:ReversedBlocksConnector":
        {"api_save_load_roundtrip", "api_same_engine_roundtrip"} | EXAMPLE_BUGS,
    ZOO + "past_the_end:PastTheEndConnector": {"api_no_collateral_writes"} | EXAMPLE_BUGS,
    ZOO + "first_layer_only:FirstLayerOnlyConnector":
        {"api_save_load_roundtrip", "api_same_engine_roundtrip"} | EXAMPLE_BUGS,
    # Keyed by the first block alone: a prompt sharing only that block is handed the rest of another's KV.
    ZOO + "first_block_keyed:FirstBlockKeyedConnector": {"api_partial_prefix"} | EXAMPLE_BUGS,
    # Correct, but reads vLLM's current config where vLLM's worker has one set: flagged only for
    # what it inherits, or the harness is not running hooks in vLLM's context.
    "conformance.zoo.good.config_reading:ConfigReadingConnector": EXAMPLE_BUGS,
    # Loads only the first request of each step: right one request at a time, wrong in a batch.
    ZOO + "first_load_only:FirstLoadOnlyConnector": {"api_concurrent_loads"} | EXAMPLE_BUGS,
    # A cache inside its engine: the cross-engine clauses are Disabled, never a false Fail.
    GOOD + "in_engine:InEngineConnector": set(),
    # Remembers the slots instead of copying the KV: wrong once freed blocks are overwritten, in every
    # scenario that reloads within the engine.
    ZOO + "block_reference:BlockReferenceConnector":
        {"api_same_engine_roundtrip", "api_chunked_prefill", "api_abort", "api_preemption"},
    # ExampleConnector with its lifecycle put right (salted key, saved once computed, async saves
    # reported once): only its file format's bugs are left; each known-bad below breaks one thing.
    GOOD + "lifecycle:LifecycleConnector": FILE_STORE_BUGS,
    ZOO + "salt_blind:SaltBlindConnector": {"api_cache_salt"} | FILE_STORE_BUGS,
    # Saves at the first chunk: every scenario that prefills in chunks claims what it never saved.
    ZOO + "early_save:EarlySaveConnector":
        {"api_chunked_prefill", "api_abort", "api_preemption"} | FILE_STORE_BUGS,
    ZOO + "double_report:DoubleReportConnector": {"api_transfer_reports"} | FILE_STORE_BUGS,
    ZOO + "abort_leak:AbortLeakConnector": {"api_abort"} | FILE_STORE_BUGS,
    ZOO + "readmission_assert:ReadmissionAssertConnector": {"api_preemption"} | FILE_STORE_BUGS,
    # Reports the blocks of a file it cannot parse (the engine level's recompute control); the
    # known-bad beside it skips the file just the same but reports nothing (a swallowed load error).
    GOOD + "load_error_reporting:LoadErrorReportingConnector": EXAMPLE_BUGS - {"api_load_errors_reported"},
    ZOO + "swallowed_load_error:SwallowedLoadErrorConnector": EXAMPLE_BUGS,
}
# Clauses that compared nothing: the connector loaded nothing there (never a Pass).
NOT_EXERCISED = {ZOO + "noop:NoopConnector": {"api_concurrent_loads", "api_cache_salt", "api_chunked_prefill",
                                               "api_preemption"}}

# Clauses that catch the same bug when their drawn examples exercise it (a partial prefix that
# happens to hit a whole stored block): allowed to fail, not required to (wpt's intermittent).
# A connector that loads wrong bytes one request at a time loads them wrong two at a time too.
MAY_FAIL = {
    ZOO + "reversed_blocks:ReversedBlocksConnector": {"api_partial_prefix", "api_concurrent_loads"},
    ZOO + "first_layer_only:FirstLayerOnlyConnector": {"api_partial_prefix", "api_concurrent_loads"},
    ZOO + "past_the_end:PastTheEndConnector": {"api_partial_prefix", "api_concurrent_loads"},
}


def api_suite(run_suite, connector: str, *extra: str, persistent: bool | None = None):
    persistent = connector not in IN_ENGINE if persistent is None else persistent
    declared = ("--kv-connector-capabilities=persistent",) if persistent else ()
    return run_suite(f"--kv-connector={connector}", "--kv-levels=connector", "--kv-profile=ci", *declared, *extra,
                     timeout=900)


@pytest.mark.parametrize("connector", sorted(EXPECTED))
def test_connector_fails_exactly_what_it_breaks(run_suite, connector):
    run = api_suite(run_suite, connector)
    statuses = run.statuses()
    assert set(statuses) == API_CLAUSES, run.output[-3000:]
    failing = {c for c, s in statuses.items() if s == "Fail"}
    assert EXPECTED[connector] <= failing <= EXPECTED[connector] | MAY_FAIL.get(connector, set()), run.output[-3000:]
    assert {c for c, s in statuses.items() if s == "Not exercised"} == NOT_EXERCISED.get(connector, set())
    disabled = {c for c, s in statuses.items() if s == "Disabled"}
    assert disabled == (ACROSS if connector in IN_ENGINE else set()) | PD, run.output[-3000:]
    assert set(statuses.values()) <= {"Pass", "Fail", "Not runnable", "Not exercised", "Disabled"}
    for test in run.results["tests"]:
        if test["status"] == "Fail":
            assert test["message"].startswith(f"[{test['clause']}]"), test["message"]


# P/D pairs (declared pd only): the positive control and one known-bad per P/D clause, each failing
# exactly it, with what its message must say; every prefix-cache clause is Disabled for them.
PD_EXPECTED = {
    # vLLM's own, NIXL over UCX between the two pairs' CPU DRAM (no GPU)
    "NixlConnector": {},
    GOOD + "peer:PeerConnector": {},
    ZOO + "pd_early_free:EarlyFreeConnector": {"api_pd_roundtrip": "had been given back to vLLM (and reused)"},
    ZOO + "pd_reversed_blocks:ReversedBlocksPeerConnector": {
        "api_pd_roundtrip": "that differ from what the producer computed"},
    ZOO + "pd_format_blind:FormatBlindConnector": {"api_pd_format_isolation": "took the other format's bytes"},
    ZOO + "pd_peer_raises:PeerRaisesConnector": {
        "api_pd_lost_peer": "the connector raised in worker hooks: ConnectionRefusedError"},
}


@pytest.mark.parametrize("connector", sorted(PD_EXPECTED))
def test_a_pd_pair_fails_exactly_what_it_breaks(run_suite, connector):
    extra = '{"backends": ["UCX"]}' if connector == "NixlConnector" else '{"rendezvous": "{storage}"}'
    run = run_suite(f"--kv-connector={connector}", "--kv-levels=connector", "--kv-profile=ci",
                    "--kv-connector-capabilities=pd", f"--kv-connector-extra-config={extra}", timeout=900)
    statuses, expected = run.statuses(), PD_EXPECTED[connector]
    assert {c for c, s in statuses.items() if s == "Disabled"} == API_CLAUSES - PD - {"api_requirements"}
    assert {c for c, s in statuses.items() if s == "Fail"} == set(expected), run.output[-3000:]
    assert {c for c, s in statuses.items() if s == "Pass"} == (PD | {"api_requirements"}) - set(expected)
    for test in run.results["tests"]:
        if test["status"] == "Fail":
            assert expected[test["clause"]] in test["message"], test["message"]
