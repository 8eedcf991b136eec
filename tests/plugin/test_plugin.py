"""The plugin as a user meets it: choosing a store, bad choices, headers, xdist, results."""

from __future__ import annotations

import pytest

from conformance.verdict.clauses import CLAUSES
from conformance.verdict.results import SCHEMA, redact, redact_text


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("ERROR")]


@pytest.mark.parametrize("store, says", [
    ("no.such:thing", "cannot import 'no.such' (no module named 'no')"),
    ("conformance.stores.memory:nope", "has no attribute 'nope'"),
    ("memroy", "neither 'module:factory' nor a registered store name (registered: file, lmcache-cpu"),
])
def test_bad_store_is_one_clear_line(run_suite, store, says):
    run = run_suite(f"--kv-store={store}")
    assert run.returncode != 0
    (line,) = error_lines(run.output)
    assert says in line, run.output


def test_no_store_chosen_is_one_clear_line(run_suite):
    run = run_suite()
    assert run.returncode != 0
    (line,) = error_lines(run.output)
    assert "no store chosen" in line and "--kv-store" in line and "KVCONFORM_STORE" in line


@pytest.mark.parametrize("factory, says", [
    ("tests.stores_for_tests:raising_factory", "raised RuntimeError: server unreachable"),
    ("tests.stores_for_tests:no_capabilities", "has no 'capabilities' set"),
    ("tests.stores_for_tests:unknown_capability", "claims unknown capabilities ['teleport']"),
    ("tests.stores_for_tests:claims_delete_without_method", "lacks method(s) delete"),
])
def test_broken_factories_are_reported_not_crashed(run_suite, factory, says):
    run = run_suite(f"--kv-store={factory}", "--kv-profile=ci")
    assert run.returncode != 0
    assert says in run.output, run.output[-2000:]
    assert "Traceback" not in run.output


def test_factory_that_cannot_run_here_makes_every_clause_not_runnable(run_suite):
    """An unsupported version is a fact about the platform: Not runnable with its reason, no traceback."""
    run = run_suite("--kv-store=tests.stores_for_tests:not_runnable_factory", "--kv-profile=ci")
    assert set(run.statuses().values()) == {"Not runnable"}, run.output[-2000:]
    assert all("Not runnable: LMCache 0.1.3 has no lmcache.v1" in t["message"] for t in run.results["tests"])
    assert run.returncode == 0 and "Traceback" not in run.output


def test_store_from_environment_and_header(run_suite):
    run = run_suite("-v", "--kv-profile=ci", env={"KVCONFORM_STORE": "memory", "KVCONFORM_TYPO": "1"})
    assert run.returncode == 0, run.output[-2000:]
    assert "kvconform store: memory -> conformance.stores.memory:make_store" in run.output
    assert "Hypothesis profile ci (max_examples=40, derandomize=True" in run.output
    assert "KVCONFORM_TYPO=1" in run.output  # every KVCONFORM_* variable is shown


def test_the_old_name_of_levels_still_works_and_says_it_is_deprecated(run_suite):
    run = run_suite("--kv-store=memory", "--kv-profile=ci", "--kv-tiers=store", "-k", "roundtrip")
    assert run.returncode == 0 and run.results["tests"], run.output[-2000:]
    assert "--kv-tiers is deprecated: it is --kv-levels" in run.output


def test_disabled_is_not_fail(run_suite):
    run = run_suite("--kv-store=memory", "--kv-profile=ci")
    assert run.statuses()["corruption_detected"] == "Disabled"
    (test,) = [t for t in run.results["tests"] if t["clause"] == "corruption_detected"]
    assert "needs capability at_rest" in test["message"]
    assert run.returncode == 0


def test_results_document(run_suite):
    run = run_suite("--kv-store=file", "--kv-profile=ci")
    doc = run.results
    assert doc["schema"] == SCHEMA and doc["profile"] == "ci"
    assert doc["store"]["capabilities"] == ["at_rest", "delete", "scales"]
    assert doc["hypothesis_settings"]["derandomize"] is True
    assert {"python", "cpu", "packages"} <= set(doc["environment"])
    assert doc["environment"]["packages"]["torch"]
    assert doc["summary"] == {"Pass": len([c for c in CLAUSES.values() if c.level == "store"])}
    assert doc["store"]["identity"]["module"] == "conformance.stores.file"  # what code was tested


def test_xdist_gives_the_same_verdicts(run_suite):
    serial = run_suite("--kv-store=conformance.zoo.wrong_stride_view:make_store", "--kv-profile=ci")
    parallel = run_suite("--kv-store=conformance.zoo.wrong_stride_view:make_store", "--kv-profile=ci", "-n", "2")
    assert serial.statuses() == parallel.statuses()
    assert parallel.failed_clauses() == {"stride_contract"}


def test_redaction_masks_secret_pairs_but_never_a_module_object_spec():
    # A store or connector named module:object (a module ending in "key") is a name, not a secret pair.
    for name in ("tested store 'acme_key:make_store'", "conformance.zoo.format_blind_key:make_store"):
        assert redact_text(name) == name
    for text, masked in [("api_key: abc", "api_key: ***"), ('{"api_key":"abc"}', '{"api_key":"***"}'),
                         ("TOKEN=abc", "TOKEN=***"), ("Authorization: Bearer xyz", "Authorization: Bearer ***")]:
        assert redact_text(text) == masked


def test_redaction():
    config = {"url": "redis://user:hunter2@127.0.0.1:6379/0", "api_token": "abc",
              "nested": [{"password": "x", "host": "h"}], "plain": "lm://127.0.0.1:65432"}
    assert redact(config) == {"url": "redis://user:***@127.0.0.1:6379/0", "api_token": "***",
                              "nested": [{"password": "***", "host": "h"}], "plain": "lm://127.0.0.1:65432"}


def test_lossy_store_disables_lossless_clauses_and_is_held_to_its_tolerance(run_suite):
    """A quantizing codec: the byte-exact clauses are Disabled; every other clause that reads values
    back holds them to its declared relative RMS error, and to exact bytes nowhere."""
    run = run_suite("--kv-store=conformance.zoo.quantizing:make_store", "--kv-profile=ci")
    statuses = run.statuses()
    assert statuses["byte_exact_roundtrip"] == statuses["no_aliasing"] == "Disabled"
    assert statuses["stride_contract"] == statuses["format_isolation"] == statuses["state_machine"] == "Pass"
    assert statuses["dtype_preserved"] == "Pass" and run.returncode == 0, run.output[-3000:]


def test_a_lossy_store_must_state_its_tolerance(run_suite):
    run = run_suite("--kv-store=tests.stores_for_tests:lossy_store", "--kv-profile=ci")
    assert run.returncode != 0 and "claims 'lossy' but states no lossy_tolerance" in run.output, run.output[-2000:]
