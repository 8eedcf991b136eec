"""Certification of a vLLM connector: a vendor's connector from its committed source tree earns
connector-core with the capabilities it declares, its bundle verifies and reruns to the same
verdicts; what the connector does not declare is stated, never silently skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from conformance.certify.bundle import badge_problems, overrides, render_readme, run_problems, ship_product
from conformance.certify.golden import load_golden, load_product
from conformance.certify.verify import verify
from conformance.verdict import secrets
from conformance.verdict.clauses import CLAUSES
from conformance.verdict.results import redact

from tests.conftest import REPO

PRODUCT = {"vendor": "Acme", "name": "acme in-engine cache", "version": "0.1.0", "contact_email": "m@example.invalid",
           "badges": ["connector-core"], "connector": {"name": "acme_kv.connector:AcmeConnector"}}


@pytest.fixture(scope="module")
def connector_tree(tmp_path_factory):
    """A vendor's committed source tree whose connector is the zoo's known-good in-engine cache."""
    tree = tmp_path_factory.mktemp("acme")
    (tree / "acme_kv").mkdir()
    (tree / "acme_kv" / "__init__.py").write_text("")
    (tree / "acme_kv" / "connector.py").write_text(
        "from conformance.zoo.good.in_engine import InEngineConnector\n\n\n"
        "class AcmeConnector(InEngineConnector):\n    pass\n")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=acme", "-c", "user.email=m@example.invalid",
                                               "commit", "-qm", "acme_kv 0.1.0"]):
        subprocess.run(["git", *args], cwd=tree, check=True, capture_output=True)
    return tree


@pytest.mark.engine
def test_a_connector_is_certified_as_declared_and_its_bundle_reruns(tmp_path_factory, connector_tree):
    tmp = tmp_path_factory.mktemp("cert")
    (tmp / "PRODUCT.yaml").write_text(yaml.safe_dump(PRODUCT))
    # A vendor's shell: none of the variables a certification run refuses (nox -s engine sets
    # KVCONFORM_ENGINE_PYTHON for the other engine tests).
    env = {k: v for k, v in os.environ.items() if k not in overrides(os.environ)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(connector_tree), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "conformance.cli", "certify", "--product", str(tmp / "PRODUCT.yaml"),
                           "--out", str(tmp / "bundle")], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=1200)
    assert proc.returncode == 0 and "ELIGIBLE" in proc.stdout, proc.stdout + proc.stderr
    bundle = tmp / "bundle"
    doc = json.loads((bundle / "results-connector-core.json").read_text())
    assert doc["connector"]["identity"]["git_commit"] and doc["connector"]["identity"]["problems"] == []
    # Disabled: the cross-engine clauses (not persistent) and the P/D ones (not pd)
    beyond_cache = {c.id for c in CLAUSES.values() if c.level == "connector" and not c.requires <= {"cache"}}
    assert doc["summary"]["Pass"] >= 7 and len(beyond_cache) == 14
    assert {t["clause"] for t in doc["tests"] if t["status"] == "Disabled"} == beyond_cache
    assert "declared with no capabilities" in (bundle / "README.md").read_text()
    assert verify(bundle) == []
    rerun = subprocess.run([sys.executable, "-m", "conformance.cli", "verify", "--rerun", str(bundle)],
                           capture_output=True, text=True, cwd=REPO, env=env, timeout=1200)
    assert rerun.returncode == 0 and "kvconform verify: OK" in rerun.stdout, rerun.stdout + rerun.stderr
    with open(connector_tree / "acme_kv" / "connector.py", "a") as edit:
        edit.write("# edited after certification\n")
    try:
        edited = subprocess.run([sys.executable, "-m", "conformance.cli", "verify", "--rerun", str(bundle)],
                                capture_output=True, text=True, cwd=REPO, env=env, timeout=1200)
    finally:
        subprocess.run(["git", "checkout", "--", "."], cwd=connector_tree, check=True)
    assert edited.returncode == 1 and "the code tested here is not the bundle's" in edited.stdout, edited.stdout


def _doc(statuses: dict[str, str], capabilities: list[str]) -> dict:
    return {"tests": [{"nodeid": f"t::{c}", "clause": c, "status": s, "message": ""} for c, s in statuses.items()],
            "connector": {"capabilities": capabilities}}


def test_a_clause_outside_the_declaration_is_not_required_and_one_inside_is():
    badge = load_golden().badges["connector-core"]
    statuses = {t.partition(":")[2]: "Pass" for t in badge.required}
    statuses["api_save_load_roundtrip"] = "Disabled"  # needs persistent
    product = {**PRODUCT, "model": "qwen3-tiny",
               "connector": {"name": "X", "extra_config": {}, "capabilities": [], "role": "kv_both"}}
    required = [p for p in badge_problems(badge, _doc(statuses, []), product) if "required test" in p]
    assert required == []
    product["connector"]["capabilities"] = ["persistent"]
    required = [p for p in badge_problems(badge, _doc(statuses, ["persistent"]), product) if "required test" in p]
    assert required == ["badge connector-core: required test connector:api_save_load_roundtrip is Disabled"]
    statuses["api_abort"] = "Not exercised"
    required = [p for p in badge_problems(badge, _doc(statuses, ["persistent"]), product) if "required test" in p]
    assert "badge connector-core: required test connector:api_abort is Not exercised" in required


def test_product_secrets_are_masked_in_the_bundle_and_compared_alike(tmp_path, monkeypatch):
    # PRODUCT.yaml's secrets (a nested password, a URL's password, a signed URL's sig) are registered
    # where it is read: the README's commands and the shipped PRODUCT.yaml mask them, nothing else,
    # and verify, reading the shipped copy, compares the tested extra config as certify did.
    monkeypatch.setattr(secrets, "KNOWN", secrets.SecretValues())
    extra = {"backend": {"auth": {"password": "S3CRET-IN-PRODUCT"}}, "note": "primary key: block 3",
             "endpoint": "s3://acme:S3CRET-PW@h/b?sig=S3CRET-SIG"}
    path = tmp_path / "PRODUCT.yaml"
    path.write_text(yaml.safe_dump({**PRODUCT, "connector": {**PRODUCT["connector"], "extra_config": extra}}))
    golden = load_golden()
    product = load_product(path, golden)
    assert {"S3CRET-IN-PRODUCT", "S3CRET-PW", "S3CRET-SIG"} <= secrets.KNOWN.values
    readme = render_readme(product, golden, {}, None, [])
    assert "S3CRET" not in readme and "primary key: block 3" in readme
    shipped = tmp_path / "bundle" / "PRODUCT.yaml"
    shipped.parent.mkdir()
    ship_product(path, shipped)
    assert "S3CRET" not in shipped.read_text() and "primary key: block 3" in shipped.read_text()
    tested = {"spec": product["connector"]["name"], "capabilities": [], "extra_config": redact(extra), "role": "kv_both",
              "model": product["model"]}  # as the suite's results file records it
    for read in (product, load_product(shipped, golden)):
        problems = run_problems(golden.badges["connector-core"], {"connector": tested}, read)
        assert not [p for p in problems if p.startswith("tested connector")], problems


def test_a_model_directory_is_certified_against_the_other_checkpoint_its_product_names(tmp_path):
    """The model-isolation clauses the connector badges require need a second checkpoint; for a model
    directory, PRODUCT.yaml's other_model gives it: the run is told, and a run without it is named."""
    from conformance.certify.bundle import subject_args

    path = tmp_path / "PRODUCT.yaml"
    path.write_text(yaml.safe_dump({**PRODUCT, "model": "/models/base", "other_model": "/models/fine-tune"}))
    golden = load_golden()
    product = load_product(path, golden)
    badge = golden.badges["connector-core"]
    assert "--kv-other-model=/models/fine-tune" in subject_args(badge, product)
    tested = {"spec": product["connector"]["name"], "capabilities": sorted(product["connector"]["capabilities"]),
              "extra_config": redact(product["connector"]["extra_config"]), "role": product["connector"]["role"],
              "model": "/models/base"}
    problems = run_problems(badge, {"connector": tested}, product)
    assert "tested connector other_model None, but PRODUCT.yaml says '/models/fine-tune'" in problems
    problems = run_problems(badge, {"connector": {**tested, "other_model": "/models/fine-tune"}}, product)
    assert not [p for p in problems if p.startswith("tested connector")], problems
    one = {**product, "connector": {**product["connector"], "capabilities": ["persistent", "one-geometry"]}}
    problems = run_problems(badge, {"connector": {**tested, "geometry": {"block_size": 32}}}, one)
    assert ("the connector declares one-geometry, so the run judged it at block_size=32 only: a badge certifies every "
            "kv_cache_dtype and block size it covers, and isolation between them") in problems
    without = {k: v for k, v in product.items() if k != "other_model"}
    assert not any(a.startswith("--kv-other-model") for a in subject_args(badge, without))
