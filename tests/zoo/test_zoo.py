"""The suite earns its place: it passes the correct stores and fails each known-bad one on
exactly the clauses that store breaks, with messages that name them."""

from __future__ import annotations

import pytest

from conformance.verdict.clauses import CLAUSES
from conformance.zoo import ZOO

from tests.conftest import REPO


@pytest.mark.parametrize("store", ["memory", "file", "conformance.zoo.good.bounded_store:make_store"])
def test_reference_stores_pass(run_suite, store):
    # Under ci, as CI's cells run; under deep (100 s each here) they are the full tier's memory and
    # file cells, whose expectations are none.
    run = run_suite(f"--kv-store={store}", "--kv-profile=ci")
    statuses = run.statuses()
    assert run.returncode == 0, run.output[-3000:]
    assert set(statuses) == {c.id for c in CLAUSES.values() if c.level == "store"}
    assert {c for c, s in statuses.items() if s != "Pass"} <= {"corruption_detected"}
    assert all(t["examples"] > 0 for t in run.results["tests"] if t["status"] == "Pass")


@pytest.mark.parametrize("name", sorted(ZOO))
def test_known_bad_store_fails_exactly_its_clauses(run_suite, name):
    member = ZOO[name]
    run = run_suite(f"--kv-store={member.target}", "--kv-profile=ci", "--kv-no-shrink")  # as its control cell runs
    assert run.returncode == 1, run.output[-3000:]
    failed = run.failed_clauses()
    assert member.fails <= failed <= member.fails | member.may_fail, f"{name}: {member.bug}: {failed}"
    others = {c: s for c, s in run.statuses().items() if c not in member.fails | member.may_fail}
    assert set(others.values()) <= {"Pass", "Disabled"}, others
    for test in run.results["tests"]:
        if test["status"] == "Fail":
            assert f"[{test['clause']}]" in test["message"], test


def test_zoo_names_only_known_clauses():
    for member in ZOO.values():
        assert member.fails and member.fails | member.may_fail <= set(CLAUSES), member
        assert not member.fails & member.may_fail, member


def test_hanging_store_is_error_and_the_run_finishes(run_suite):
    run = run_suite("--kv-store=conformance.zoo.hanging:make_store", "--kv-profile=ci",
                    "--kv-timeout=1", timeout=300)
    assert run.returncode == 1
    statuses = run.statuses()
    assert set(statuses.values()) == {"Error", "Disabled"}, statuses
    assert "hung in get()" in run.output


def test_the_connector_zoo_names_only_known_clauses_and_importable_members():
    """The connector zoo's expectations (``zoo.connectors.ZOO``, ``PD_ZOO``) are data: a misspelt clause or
    member would otherwise surface only in the 15-minute engine run that reads them."""
    from conformance.zoo.connectors import PD_ZOO
    from conformance.zoo.connectors import ZOO as CONNECTORS

    for member in CONNECTORS.values():
        named = member.fails | member.may_fail | member.not_exercised | member.not_inherited
        assert named <= set(CLAUSES), (member.target, named - set(CLAUSES))
        assert not member.fails & member.may_fail, member
        assert member.inherits is None or member.inherits.isidentifier(), member
    for target, fails in PD_ZOO.items():
        assert set(fails) <= set(CLAUSES), (target, set(fails) - set(CLAUSES))
    for target in (*CONNECTORS, *PD_ZOO):
        module, _, name = target.partition(":")
        assert (REPO / (module.replace(".", "/") + ".py")).is_file(), target
        assert f"class {name}" in (REPO / (module.replace(".", "/") + ".py")).read_text(), target
