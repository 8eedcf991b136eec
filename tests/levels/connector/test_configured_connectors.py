"""vLLM's own connectors as their users configure them, judged at the connector level: a
MultiConnector's children, the OffloadingConnector on kvconform's CPU worker (its specs, its file
tier), LMCache's server with an L2 adapter, an LMCacheMPConnector subclass with a server of its own.
Needs vLLM in this Python: ``nox -s engine``.
"""

from __future__ import annotations

import json

import pytest

from tests.levels.connector.connector_runs import BOUNDED_ONLY, GOOD, PD, ZOO, api_suite

pytestmark = pytest.mark.engine


def test_a_multiconnector_reaches_every_childs_storage(run_suite):
    """MultiConnector's children get the suite's private directory through '{storage}', so damage
    reaches both (two files per layer pair) and the clauses judge the pair, not ExampleConnector
    alone."""
    child = {"kv_connector": "ExampleConnector", "kv_role": "kv_both"}
    extra = {"connectors": [{**child, "kv_connector_extra_config": {"shared_storage_path": "{storage}/a"}},
                            {**child, "kv_connector_extra_config": {"shared_storage_path": "{storage}/b"}}]}
    run = api_suite(run_suite, "MultiConnector", f"--kv-connector-extra-config={json.dumps(extra)}",
                    "--kv-cache-dtypes=auto", "-k", "roundtrip or damaged")
    statuses = run.statuses()
    assert statuses["api_save_load_roundtrip"] == statuses["api_same_engine_roundtrip"] == "Pass", run.output[-3000:]
    (damaged,) = [t for t in run.results["tests"] if t["clause"] == "api_damaged_storage" and t["status"] != "Skip"]
    assert damaged["status"] == "Fail" and "each of the 4 files" in damaged["message"], damaged


OFFLOADING_CPU = {"spec_name": "CPUOnlyOffloadingSpec", "spec_module_path": "conformance.stores.offloading_cpu",
                  "cpu_bytes_to_use": 100_000_000}


def test_vllms_offloading_connector_is_judged_within_its_engine(run_suite):
    """vLLM's OffloadingConnector, its scheduler side unmodified, with kvconform's CPU transfer worker:
    a cache inside its engine, so the same-engine clause judges it and the cross-engine ones are Disabled."""
    statuses = api_suite(run_suite, "OffloadingConnector", f"--kv-connector-extra-config={json.dumps(OFFLOADING_CPU)}",
                         "-k", "same_engine or roundtrip", persistent=False).statuses()
    assert statuses == {"api_same_engine_roundtrip": "Pass", "api_save_load_roundtrip": "Disabled",
                        "api_pd_roundtrip": "Disabled"}, statuses


@pytest.mark.parametrize("spec, status", [(GOOD + "offloading_spec:TopDownOffloadingSpec", "Pass"),
                                          (ZOO + "offloading_sorted_load:SortedLoadSpec", "Fail")])
def test_a_third_party_offloading_spec_is_judged_on_the_suites_cpu_worker(run_suite, spec, status):
    """An offloading spec with its own manager, named in the extra config beside the suite's
    dispatcher (no glue): its allocator is judged, and the results say the worker was the suite's."""
    extra = {"spec_name": "OnSuiteWorker", "spec_module_path": "conformance.stores.offloading_cpu", "spec": spec,
             "cpu_bytes_to_use": 100_000_000}
    run = api_suite(run_suite, "OffloadingConnector", f"--kv-connector-extra-config={json.dumps(extra)}",
                    "-k", "same_engine", persistent=False)
    assert run.statuses() == {"api_same_engine_roundtrip": status}, run.output[-3000:]
    (supplied,) = run.results["connector"]["supplied"]
    assert f"in place of {spec}'s own worker" in supplied, supplied


OFFLOADING_FILE = {"spec_name": "TieringCPUOnlyOffloadingSpec", "spec_module_path": "conformance.stores.offloading_tiering",
                   "cpu_bytes_to_use": 100_000_000, "secondary_tiers": [{"type": "fs", "root_dir": "{storage}/fs"}]}


def test_vllms_offloading_connector_file_tier_outlives_its_engine(run_suite):
    """vLLM's tiered OffloadingConnector with its fs tier (kvconform's CPU worker over the shared
    region the tiers read): persistent, so a fresh connector pair loads from its files; its files
    carry no checksum, so a byte flipped at rest is served as KV (api_damaged_storage). Its transfer
    statistics and KV events (declared) reach vLLM's stats logger and event publisher intact."""
    run = api_suite(run_suite, "OffloadingConnector", f"--kv-connector-extra-config={json.dumps(OFFLOADING_FILE)}")
    statuses = run.statuses()
    assert {c for c, s in statuses.items() if s == "Fail"} == {"api_damaged_storage"}, run.output[-3000:]
    assert {c for c, s in statuses.items() if s == "Disabled"} == PD | BOUNDED_ONLY, run.output[-3000:]
    assert statuses["api_save_load_roundtrip"] == statuses["api_same_engine_roundtrip"] == "Pass"
    assert statuses["api_format_isolation"] == "Pass"  # the twin misses where the same format loads
    assert statuses["api_connector_stats"] == statuses["api_kv_events"] == "Pass"


FS_TIER = ("--kv-lmcache-server-arg=--l2-adapter",
           '--kv-lmcache-server-arg={"type": "fs", "base_path": "{server}/l2"}')


def test_an_lmcache_l2_adapter_is_judged_through_the_suites_server(run_suite, tmp_path):
    """LMCache's fs L2 adapter, given as arguments of the server the suite starts (no glue): the
    round trip passes, the results say the suite's server ran with those arguments, and the tier
    holds what was stored."""
    run = api_suite(run_suite, "LMCacheMPConnector", *FS_TIER, "-k", "save_load_roundtrip")  # its basetemp: tmp_path/base
    assert run.statuses() == {"api_save_load_roundtrip": "Pass"}, run.output[-3000:]
    (supplied,) = run.results["connector"]["supplied"]
    assert supplied.endswith('with your arguments --l2-adapter {"type": "fs", "base_path": "{server}/l2"}'), supplied
    assert any(tmp_path.rglob("lmcache-server-data-*/l2/*")), sorted(map(str, tmp_path.rglob("*")))[:20]


SELF_SERVED = {"self_served.dir": "{storage}"}


def test_an_lmcache_subclass_with_its_own_server_is_judged_with_it(run_suite):
    """An LMCacheMPConnector subclass that starts its own LMCache server (a disk tier beside its memory
    one), declared own-server: the suite starts none and passes no lmcache.mp.* key, so what it stores
    lands in its own tier, which the damage clause then finds (LMCache's fs tier keeps raw bytes, no
    checksum: a flipped byte is served, as for vLLM's file tier above). The results say the suite
    supplied nothing. (Its round trips pass in engines: tests/levels/engine. Here each drawn example's
    storage starts a server of its own: api_save_load_roundtrip took 5 min of CI.)"""
    run = api_suite(run_suite, GOOD + "self_served:SelfServedConnector", "--kv-connector-capabilities=own-server,persistent",
                    f"--kv-connector-extra-config={json.dumps(SELF_SERVED)}", "-k", "damaged_storage", persistent=False)
    assert run.statuses() == {"api_damaged_storage": "Fail"}, run.output[-3000:]
    assert run.results["connector"]["supplied"] == []
    for damaged in (t["message"] for t in run.results["tests"] if t["status"] == "Fail"):
        assert "files the connector stored" in damaged and "served damaged bytes as KV" in damaged, damaged
