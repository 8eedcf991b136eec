"""Connectors judged on what they declare and are configured with (#54): an eventually consistent one
(its saves visible a second after they were written) is judged once they settle, and its
tenant-leaking twin is flagged; advice in a Not exercised message follows from what the run saw; a
connector keyed by a configured checkpoint identity is given the served model's (``{model_digest}``).
Needs vLLM in this Python: ``nox -s engine``.
"""

from __future__ import annotations

import pytest

from tests.levels.connector.connector_runs import GOOD, ZOO

pytestmark = pytest.mark.engine

EVENTUAL = GOOD + "eventual:EventualConnector"
LEAKING = ZOO + "eventual_salt_blind:EventualSaltBlindConnector"
CLAUSES = ("-k", "save_load_roundtrip or cache_salt")


def _suite(run_suite, connector: str, capabilities: str, *extra: str):
    return run_suite(f"--kv-connector={connector}", "--kv-levels=connector", "--kv-profile=ci",
                     f"--kv-connector-capabilities={capabilities}", "--kv-cache-dtypes=auto", *extra, timeout=900)


def test_an_eventually_consistent_connector_is_judged_once_its_saves_settle(run_suite):
    """Declared settle=1 it passes; undeclared, its first load finds nothing, and the message says how
    to declare the delay (it never says so to a connector that declared one)."""
    declared = _suite(run_suite, EVENTUAL, "persistent,settle=1", *CLAUSES)
    assert declared.statuses() == {"api_save_load_roundtrip": "Pass", "api_cache_salt": "Pass"}, declared.output[-3000:]
    undeclared = _suite(run_suite, EVENTUAL, "persistent", "-k", "save_load_roundtrip")
    (test,) = undeclared.results["tests"]
    assert test["status"] == "Fail" and "declares settle=SECONDS" in test["message"], test


def test_its_tenant_leaking_twin_is_flagged_once_the_suite_waits(run_suite):
    """Asked at once, every tenant of the leaking twin misses and it looks isolated; asked once its
    saves are visible, one tenant is served another's KV."""
    run = _suite(run_suite, LEAKING, "persistent,settle=1", *CLAUSES)
    assert run.statuses() == {"api_save_load_roundtrip": "Pass", "api_cache_salt": "Fail"}, run.output[-3000:]
    (salt,) = [t for t in run.results["tests"] if t["clause"] == "api_cache_salt"]
    assert "one tenant is served another's KV" in salt["message"], salt


REPORTED = GOOD + "reported:ReportedConnector"


@pytest.mark.parametrize("connector, capabilities, verdicts", [
    (REPORTED, "persistent,settle=0.1", {"api_save_load_roundtrip": "Pass", "api_cache_salt": "Pass"}),
    (REPORTED, "persistent", {"api_save_load_roundtrip": "Fail"}),
    (ZOO + "reported_salt_blind:ReportedSaltBlindConnector", "persistent,settle=0.1",
     {"api_save_load_roundtrip": "Pass", "api_cache_salt": "Fail"}),
])
def test_a_connector_whose_scheduler_hears_of_saves_from_its_workers_is_judged_after_traffic(
        run_suite, connector, capabilities, verdicts):
    """Its scheduler serves only what its workers reported (vLLM's worker metadata, a step late), so a
    fresh pair finds nothing before it served a request. Declared settle, each pass that asks for
    stored KV comes after a request of the pair's own: it passes, and its salt-blind twin is flagged;
    undeclared, the fresh pair's miss is a Fail whose advice names the declaration."""
    run = _suite(run_suite, connector, capabilities, "-k", " or ".join(c.removeprefix("api_") for c in verdicts))
    assert run.statuses() == verdicts, run.output[-3000:]
    if "settle" not in capabilities:
        (test,) = run.results["tests"]
        assert "declares settle=SECONDS" in test["message"] and "a request of its own" in test["message"], test


def test_a_connector_that_declines_every_lookup_is_given_no_advice_its_declaration_contradicts(run_suite):
    """The noop connector stores and never claims: its Not exercised verdicts may say how to declare a
    min span or a visibility delay, but not once it declares them."""
    run = _suite(run_suite, ZOO + "noop:NoopConnector", "persistent,min-span=32,settle=0.1",
                 "-k", "cache_salt or lora_isolation or async_load")
    not_exercised = [t for t in run.results["tests"] if t["status"] == "Not exercised"]
    assert not_exercised, run.output[-3000:]
    for test in not_exercised:
        assert "min-span=TOKENS" not in test["message"] and "settle=SECONDS" not in test["message"], test


DIGEST = '--kv-connector-extra-config={"weights_digest": "{model_digest}", "shared_storage_path": "{storage}"}'


@pytest.mark.parametrize("connector, status", [(GOOD + "digest_keyed:DigestKeyedConnector", "Pass"),
                                               (ZOO + "config_digest_keyed:ConfigDigestKeyedConnector", "Fail")])
def test_a_connector_keyed_by_a_configured_weights_digest_is_judged_with_the_models_own(run_suite, connector, status):
    """``{model_digest}`` is the served model's weights' digest: another checkpoint of one architecture
    gets another, so a connector keyed by it keeps them apart; keyed by the architecture, it does not."""
    run = _suite(run_suite, connector, "persistent", DIGEST, "-k", "model_isolation")
    assert run.statuses() == {"api_model_isolation": status}, run.output[-3000:]


@pytest.mark.parametrize("connector, status", [(GOOD + "mirrored:MirroredConnector", "Not exercised"),
                                               (ZOO + "mirror_gap:MirrorGapConnector", "Fail")])
def test_damage_no_load_read_is_not_exercised_and_damage_read_is_judged(run_suite, connector, status):
    """A replica the suite cannot reach serves every load after the damage: nothing damaged was read, so
    no Pass; its twin reads one layer's damaged file, and serves the flipped byte."""
    run = _suite(run_suite, connector, "persistent", "-k", "damaged_storage")
    assert set(run.statuses().values()) == {status}, run.output[-3000:]
    if status == "Not exercised":
        judged = [t for t in run.results["tests"] if t["status"] == status]
        assert judged and all("no load read the damaged object" in t["message"] for t in judged), judged


@pytest.mark.parametrize("connector, status", [(GOOD + "env_configured:EnvConfiguredConnector", "Pass"),
                                               (ZOO + "env_salt_blind:EnvSaltBlindConnector", "Fail")])
def test_the_environment_a_connector_declares_reaches_the_connector_level(run_suite, connector, status):
    """--kv-engine-env is the connector's environment at every level: declared, the connector that needs
    it is judged (its salt-blind twin flagged); undeclared, it cannot start: Not runnable, never judged."""
    declared = _suite(run_suite, connector, "persistent", "--kv-engine-env=KVCONFORM_ZOO_TENANT=acme",
                      "-k", "cache_salt")
    assert declared.statuses() == {"api_cache_salt": status}, declared.output[-3000:]
    undeclared = _suite(run_suite, connector, "persistent", "-k", "cache_salt")
    (test,) = undeclared.results["tests"]
    assert test["status"] == "Not runnable" and "KVCONFORM_ZOO_TENANT" in test["message"], test
