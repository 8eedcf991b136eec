"""Connectors the connector level cannot judge, and what it says of each: one that declines this
platform or cannot be built here (Not runnable), one written against a stale vLLM API (named
before anything runs), an unknown name (one clear line), a missing dependency, a crash or a hang
(an Error, and the run goes on). Needs vLLM in this Python: ``nox -s engine``.
"""

from __future__ import annotations

import json

import pytest

from tests.levels.connector.connector_runs import API_CLAUSES, ZOO, api_suite

pytestmark = pytest.mark.engine


def test_a_connector_that_declines_this_platform_is_not_runnable(run_suite):
    """vLLM's own CPU worker for OffloadingConnector raises on a CPU-only vLLM: Not runnable, in its words."""
    stock = {"cpu_bytes_to_use": 100_000_000}
    run = api_suite(run_suite, "OffloadingConnector", f"--kv-connector-extra-config={json.dumps(stock)}",
                    "-k", "same_engine", persistent=False)
    (test,) = run.results["tests"]
    assert test["status"] == "Not runnable" and "only supported on CUDA-alike" in test["message"], test


@pytest.mark.parametrize("connector, says, advised", [
    ("MultiConnector", "AssertionError", True),  # no children configured: a bare assertion, advice may help
    ("FlexKVConnectorV1", "FlexKV is not installed", False),  # its own words say what to do: no config advice
])
def test_a_connector_that_cannot_be_built_here_is_not_runnable_not_failed(run_suite, connector, says, advised):
    """Built from its name alone it raises before any KV moved: no clause was broken, and the
    message says how to give it what it needs, only where its own words do not."""
    run = api_suite(run_suite, connector, "-k", "same_engine", persistent=False)
    (test,) = run.results["tests"]
    assert test["status"] == "Not runnable" and says in test["message"], test
    assert ("--kv-connector-extra-config" in test["message"]) is advised, test


def test_a_malformed_log_call_is_printed_and_the_connector_judged(run_suite):
    """A hook's log call whose arguments do not fit its format is printed and passed over, as in an
    engine; pytest's capture handler, which raises it, never turns it into a Not runnable."""
    run = api_suite(run_suite, "conformance.zoo.good.malformed_log:MalformedLogConnector", "-k", "same_engine")
    (test,) = run.results["tests"]
    assert test["status"] == "Pass", test


def test_stale_layout_api_is_named_before_anything_runs(run_suite):
    """The original report's renamed layout API: flagged with the name and where it was last seen."""
    run = api_suite(run_suite, ZOO + "stale_layout_api:StaleLayoutConnector", "-k", "requirements")
    (req,) = [t for t in run.results["tests"] if t["clause"] == "api_requirements"]
    assert req["status"] == "Fail", req
    assert "get_kv_cache_layout" in req["message"] and "last seen in 0.28.0" in req["message"], req["message"]


def test_a_wrapper_modules_connector_is_read_where_its_code_is(run_suite):
    """A module that only re-exports the stale connector: its requirements are the stale module's."""
    run = api_suite(run_suite, ZOO + "stale_wrapper:WrappedConnector", "-k", "requirements")
    (req,) = [t for t in run.results["tests"] if t["clause"] == "api_requirements"]
    assert req["status"] == "Fail", req
    assert req["message"].startswith("[api_requirements] conformance.zoo.connectors.stale_layout_api (read as the "
                                     "code conformance.zoo.connectors.stale_wrapper:WrappedConnector runs)"), req
    assert "get_kv_cache_layout" in req["message"], req["message"]


@pytest.mark.parametrize("connector, says", [
    ("NoSuchConnector", "is not a connector the installed vLLM registers"),
    ("no.such.module:Foo", "no module 'no.such.module' is importable here"),
])
def test_unknown_connector_is_one_clear_line(run_suite, connector, says):
    run = api_suite(run_suite, connector)
    assert run.returncode == 4, run.output[-2000:]
    assert says in run.output, run.output[-2000:]


def test_a_connector_whose_own_dependency_is_missing_is_an_error_naming_it(run_suite):
    """Its load path imports a module not installed here: no verdict on its KV handling can be had,
    so the clauses that load are Errors naming the module, never Fails."""
    run = api_suite(run_suite, ZOO + "missing_dependency:MissingDependencyConnector", "-k", "roundtrip")
    statuses = {c: s for c, s in run.statuses().items() if s != "Disabled"}
    assert statuses == {"api_save_load_roundtrip": "Error", "api_same_engine_roundtrip": "Error"}, run.output[-3000:]
    for test in run.results["tests"]:
        if test["status"] == "Error":
            assert "needs the module 'kvconform_absent_codec'" in test["message"], test["message"]


def test_a_connector_that_kills_its_process_is_an_error_and_the_run_goes_on(run_suite):
    """A load hook that dies as a segfaulting native library does (os._exit(139)) ends its engine's
    lifetime, not the suite: an Error naming the exit status for each clause that loads, a verdict
    for every other clause, and the results file."""
    run = api_suite(run_suite, ZOO + "crashing:CrashingConnector", "--kv-cache-dtypes=auto")
    statuses = run.statuses()
    assert set(statuses) == API_CLAUSES, run.output[-3000:]
    errors = [t for t in run.results["tests"] if t["status"] == "Error"]
    assert {t["clause"] for t in errors} >= {"api_save_load_roundtrip", "api_same_engine_roundtrip"}, statuses
    for test in errors:
        assert "its process exited with status 139 before it returned" in test["message"], test["message"]
    assert statuses["api_requirements"] == "Pass", statuses


def test_a_hanging_connector_is_an_error_once_then_at_once(run_suite):
    """The first run that loads waits --kv-timeout and is an Error; every later run is an Error at
    once (no second wait), so one hanging connector costs one timeout, not one per clause."""
    timeout = 10
    run = api_suite(run_suite, ZOO + "hanging:HangingConnector", f"--kv-timeout={timeout}")
    tests = run.results["tests"]
    hung = [t for t in tests if "hung in run_worker_step() after 10s" in (t["message"] or "")]
    assert hung and all(t["status"] == "Error" for t in hung), run.output[-3000:]
    # Among the hung clauses (another clause may take that long on a busy machine, hanging nothing).
    waited = [t for t in hung if t["duration_s"] >= timeout]
    assert len(waited) == 1 and "not attempted again" not in waited[0]["message"], tests
    assert all("not attempted again" in t["message"] for t in hung if t is not waited[0])


def test_a_connector_that_hangs_holding_the_gil_is_killed_within_two_timeouts(run_suite):
    """No thread can time out a hook that keeps the GIL; its clause's supervised process is killed
    once no hook call has begun for two timeouts, and every later clause is an Error at once."""
    timeout = 10
    run = api_suite(run_suite, ZOO + "hanging:GilHangingConnector", f"--kv-timeout={timeout}")
    tests = run.results["tests"]
    killed = [t for t in tests if f"no progress for {2 * timeout}s, so its process was killed" in (t["message"] or "")]
    first = [t for t in killed if "not attempted again" not in t["message"]]
    assert len(first) == 1 and first[0]["status"] == "Error", run.output[-3000:]
    assert len(killed) > 1 and all(t["status"] == "Error" for t in killed), tests
