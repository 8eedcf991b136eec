"""LMCache 0.5.6's real storage backends under the store clauses (needs lmcache: nox -s engine)."""

from __future__ import annotations

import os
import sys

import pytest

from tests.conftest import require_tool

pytestmark = pytest.mark.engine

# LMCache's keys carry the torch dtype, uint8 for every vLLM fp8 format; it has nowhere to keep
# k_scale/v_scale. Both are findings the suite must report on every backend.
ALWAYS = {"format_isolation": "Fail", "scales_roundtrip": "Disabled"}
ROUND_TRIP = ("byte_exact_roundtrip", "stride_contract", "shape_preserved", "metadata_roundtrip", "dtype_preserved",
              "no_aliasing")
# LMCache's remote protocol has no torch.int8 in its dtype table (DTYPE_TO_INT, lmcache/v1/protocol.py):
# a remote backend drops an int8 entry, and a get right after the put misses. The per-dtype sweep
# every byte-level clause runs meets it on every run; the local CPU backend keeps tensors as they are.
# LocalCPUBackend keeps the first put under a key (a put of a present key is a no-op): the state
# machine's explicit overwrite run meets it on every run, whatever its draws.
EXPECTED = {"lmcache-cpu": {**ALWAYS, **{c: "Pass" for c in ROUND_TRIP}, "state_machine": "Fail"},
            "lmcache-redis": {**ALWAYS, **{c: "Fail" for c in ROUND_TRIP}}}


@pytest.mark.parametrize("store", sorted(EXPECTED))
def test_lmcache_backend_verdicts(run_suite, store):
    if store == "lmcache-redis":
        require_tool("redis-server")
    run = run_suite(f"--kv-store={store}", "--kv-profile=ci", timeout=1200,
                    env={"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]})
    statuses = run.statuses()
    assert {c: statuses[c] for c in EXPECTED[store]} == EXPECTED[store], run.output[-3000:]
    for test in run.results["tests"]:
        if test["clause"] in ROUND_TRIP and test["status"] == "Fail":
            assert "int8(int8 in int8)" in test["message"] and "returned None right after put" in test["message"], test
    assert not [c for c, s in statuses.items() if s == "Error"], run.output[-3000:]
    if store == "lmcache-cpu":
        (machine,) = [t for t in run.results["tests"] if t["clause"] == "state_machine"]
        assert "after the model's last put (overwrites replace)" in machine["message"], machine
    (iso,) = [t for t in run.results["tests"] if t["clause"] == "format_isolation"]
    assert "fp8_e" in iso["message"] and "[format_isolation]" in iso["message"]


# KVCONFORM_FAULT kills the server right after the K-th accepted put. On redis, K lies past
# corruption_detected (~210 puts) inside format_isolation, so clauses before, at and after the kill
# are all in the run; lm:// has no corruption_detected (no at_rest) and a get costs ~44 ms there,
# so it is killed early in format_isolation. Each run takes 40-50 s on 2 cores.
@pytest.mark.parametrize("store,server,kill_after", [("lmcache-redis", "redis-server", 300),
                                                     ("lmcache-lm", "lmcache-server", 40)])
def test_server_killed_mid_run_is_error_not_verdict(run_suite, store, server, kill_after):
    """The store's server dies mid-run: the run finishes, that clause and every later one are Error."""
    if server == "redis-server":
        require_tool(server)
    from conformance.verdict.clauses import CLAUSES

    run = run_suite(f"--kv-store={store}", "--kv-profile=ci", "--kv-timeout=30", timeout=600,
                    env={"KVCONFORM_FAULT": f"kill-server-after-puts:{kill_after}",
                         "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]})
    tests = run.results["tests"] if run.results else []
    assert {t["clause"] for t in tests} == {c.id for c in CLAUSES.values() if c.level == "store"}, run.output[-3000:]
    errors = [i for i, t in enumerate(tests) if t["status"] == "Error"]
    assert errors, run.output[-3000:]
    killed = tests[errors[0]]
    assert f"{server} at 127.0.0.1:" in killed["message"] and "stopped answering" in killed["message"]
    assert f"kill-server-after-puts:{kill_after} fired after put {kill_after}" in killed["message"]
    assert all(t["status"] != "Error" for t in tests[:errors[0]]), tests
    after = {t["clause"]: t["status"] for t in tests[errors[0]:]}
    assert set(after.values()) <= {"Error", "Disabled"}, after  # no Pass or Fail on a dead server
    assert all(t["message"] == killed["message"] for t in tests[errors[0]:] if t["status"] == "Error")


def test_fault_on_a_store_without_a_server_is_refused(monkeypatch, tmp_path):
    """A kill asked of a store that owns no server must not be silently ignored."""
    from conformance.stores.lmcache_backends import make_local_cpu

    monkeypatch.setenv("KVCONFORM_FAULT", "kill-server-after-puts:1")
    with pytest.raises(ValueError, match="starts no server to kill"):
        make_local_cpu(tmp_path)


def test_era_detection_tells_the_copy_conventions_apart(monkeypatch):
    """0.4+ helpers copy flat bytes; 0.3.x helpers ``tensor.copy_`` in the memory object's shape."""
    from lmcache.v1.gpu_connector import gpu_ops

    from conformance.stores import lmcache_eras

    assert lmcache_eras._copies_bytes("installed")  # the engine stack's LMCache (0.5.6)
    monkeypatch.setattr(gpu_ops, "lmcache_memcpy_async_d2h", lambda buf, obj: obj.tensor.copy_(buf))
    assert not lmcache_eras._copies_bytes("0.3-style")


def test_missing_lmcache_api_is_not_runnable_with_its_name():
    from conformance.contract.store import StoreNotRunnable
    from conformance.stores import lmcache_eras

    with pytest.raises(StoreNotRunnable, match=r"LMCache 9\.9 has no lmcache\.utils\.NoSuchKey"):
        lmcache_eras._require("9.9", "lmcache.utils", "NoSuchKey")
    with pytest.raises(StoreNotRunnable, match="importing lmcache.no_such_module fails here: ModuleNotFoundError"):
        lmcache_eras._require("9.9", "lmcache.no_such_module", "X")
