"""The plugin as a user meets it: choosing a store, bad choices, headers, xdist, results."""

from __future__ import annotations

import json

import pytest

from conformance.verdict import secrets
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


@pytest.fixture
def known(monkeypatch):
    """A registry of secrets of the test's own (the session's stays as it was)."""
    fresh = secrets.SecretValues()
    monkeypatch.setattr(secrets, "KNOWN", fresh)
    return fresh


@pytest.mark.parametrize("text", [
    "KeyError: missing key: 12 in cache", "primary key: block 3 differs", "token=5 tokens",
    "tested store 'acme_key: make_store'", "conformance.zoo.format_blind_key:make_store",
    "api_key: abc", '{"api_key":"abc"}', "TOKEN=abc", "Authorization: Bearer xyz", "?token=abc&sig=def",
])
def test_redaction_leaves_text_that_only_names_a_key_alone(known, text):
    # A name that looks secret says nothing of the words after it: only configured values are masked.
    known.add("hunter2-secret")
    assert redact_text(text) == text


def test_a_registered_secret_is_masked_wherever_it_appears(known):
    secrets.register_config({"api_key": "sk-live-0123"})
    assert redact_text("store said: bad credentials sk-live-0123 (key: 12)") == "store said: bad credentials *** (key: 12)"
    assert redact_text("python -m pytest --kv-store=m:f --opt=sk-live-0123 -q") == "python -m pytest --kv-store=m:f --opt=*** -q"
    assert redact_text('{"auth": {"header": "Bearer sk-live-0123"}}') == '{"auth": {"header": "Bearer ***"}}'
    assert redact({"message": "tried sk-live-0123", "n": 3}) == {"message": "tried ***", "n": 3}


def test_the_longest_registered_secret_is_masked_whole(known):
    secrets.register_config({"token": "abcd", "password": "abcdefgh"})
    assert redact_text("x abcdefgh y abcd") == "x *** y ***"


def test_nested_secret_keys_url_passwords_and_query_tokens_in_config_are_registered(known):
    secrets.register_config({"tier": {"backends": [{"name": "s3", "credentials": {"secret_access_key": "AKIA-deep-1"}}]},
                             "url": "redis://svc:pa%40ss-2@h:6379/0", "remote": "https://kv.example/x?region=eu&token=tok-3",
                             "plain": "lm://127.0.0.1:65432", "block_size": 32, "password": "x", "api_token": True,
                             "auth": {"aws": {"id": "AKID-under-5"}}, "token_budget": 4096})
    # Short values, numbers and booleans are settings (masking "x" everywhere would eat the text around it).
    assert known.values == {"AKIA-deep-1", "pa%40ss-2", "pa@ss-2", "tok-3", "AKID-under-5"}


def test_secret_named_kvconform_variables_and_the_engine_environment_are_registered(known):
    secrets.register_environment({"KVCONFORM_API_TOKEN": "tok-env-1", "KVCONFORM_STORE": "acme_key:make_store",
                                  "KVCONFORM_REDIS_URL": "redis://svc:pw-env-2@h:1", "OTHER_PASSWORD": "not-ours"})
    secrets.register_engine_env(["PYTHONHASHSEED=12345", "S3_BUCKET_URL=s3://bucket-4/x", "OMP_NUM_THREADS=16"])
    assert known.values == {"tok-env-1", "pw-env-2", "s3://bucket-4/x"}


def test_a_suite_command_line_registers_its_connector_options(known):
    extra = json.dumps({"a": {"private_key": "pk-cmd-1"}})
    secrets.register_args(["python", "-m", "pytest", "--kv-connector-extra-config", extra, "--kv-engine-env=S3=env-cmd-2",
                           "--kv-transfer-config=kv_secret=tc-cmd-3", "--kv-lmcache-server-arg", '{"auth_token": "ls-cmd-4"}'])
    assert known.values == {"pk-cmd-1", "env-cmd-2", "tc-cmd-3", "ls-cmd-4"}


def test_a_command_lines_extra_config_and_engine_env_are_masked_by_their_shape(known):
    # A sink may print a child's command with values this process never read: masked by key, any length.
    raw = 'pytest --kv-connector-extra-config={"host": "h", "n": {"password": "ab"}} --kv-engine-env=S3=ab -q'
    masked = 'pytest --kv-connector-extra-config={"host": "h", "n": {"password": "***"}} --kv-engine-env=S3=*** -q'
    assert redact_text(raw) == masked
    quoted = """'--kv-connector-extra-config={"token": "ab"}' '--kv-engine-env=PYTHONHASHSEED=0'"""
    assert redact_text(quoted) == """'--kv-connector-extra-config={"token": "***"}' '--kv-engine-env=PYTHONHASHSEED=0'"""
    compact = '--kv-connector-extra-config={"backends":["UCX"]}'
    assert redact_text(compact) == compact  # nothing secret in it: not even re-spaced


def test_the_plugin_masks_what_it_was_configured_with(run_suite):
    # Each process registers its options and KVCONFORM_* variables at configure (the controller here
    # writes the results; an xdist worker or a forked child registers the same for what it writes).
    from tests.stores_for_tests import PLANTED, planted_configuration

    env, options = planted_configuration()
    run = run_suite("--kv-store=tests.stores_for_tests:secret_leaking_store", "--kv-profile=ci", "--kv-no-shrink",
                    "-k", "roundtrip", "-n", "2", "-v", *options, env=env)
    said = [t["message"] for t in run.results["tests"] if "cannot reach" in t["message"]]
    assert said and "redis://svc:***@10.0.0.1" in said[0], run.output[-2000:]
    assert not [s for s in PLANTED if s in run.results_path.read_text()]
    assert "KVCONFORM_REDIS_PASSWORD=***" in run.output  # the header


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
    assert statuses["long_reuse_distance"] == statuses["dtype_preserved"] == "Pass" and run.returncode == 0, run.output[-3000:]


def test_a_lossy_store_must_state_its_tolerance(run_suite):
    run = run_suite("--kv-store=tests.stores_for_tests:lossy_store", "--kv-profile=ci")
    assert run.returncode != 0 and "claims 'lossy' but states no lossy_tolerance" in run.output, run.output[-2000:]
