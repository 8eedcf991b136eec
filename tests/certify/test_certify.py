"""Certification: a bundle of the reference store verifies; any tampering is a precise line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conformance.certify.bundle import overrides, write_manifest
from conformance.certify.golden import GoldenError, known_test_ids, load_golden, load_product
from conformance.certify.verify import verify

from tests.conftest import REPO, require_tool

PRODUCT = {"vendor": "Acme", "name": "acme file store", "version": "0.1.0",
           "store": "acme_store.store:make_store", "contact_email": "m@example.invalid",
           "badges": ["core", "fp8"]}


@pytest.fixture(scope="session")
def vendor_tree(tmp_path_factory) -> Path:
    """A vendor's source tree, committed: the package acme_store wraps the reference file store, so
    the tested code has an identity (commit, clean) whatever state this checkout is in."""
    tree = tmp_path_factory.mktemp("vendor")
    (tree / "acme_store").mkdir()
    (tree / "acme_store" / "__init__.py").write_text("")
    (tree / "acme_store" / "store.py").write_text("from conformance.stores.file import make_store  # noqa: F401\n")
    (tree / "acme_key.py").write_text("from conformance.stores.file import make_store  # noqa: F401\n")  # a name, not a secret
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=acme", "-c", "user.email=m@example.invalid",
                                               "commit", "-qm", "acme_store 0.1.0"]):
        subprocess.run(["git", *args], cwd=tree, check=True, capture_output=True)
    return tree


def certify(tmp: Path, env: dict[str, str] | None = None, *extra: str,
            **changes) -> tuple[subprocess.CompletedProcess, Path]:
    product = tmp / "PRODUCT.yaml"
    product.write_text(yaml.safe_dump({**PRODUCT, **changes}))
    out = tmp / "bundle"
    proc = subprocess.run([sys.executable, "-m", "conformance.cli", "certify", "--product", str(product),
                           "--out", str(out), *extra], capture_output=True, text=True, cwd=REPO,
                          env={**{k: v for k, v in os.environ.items() if k not in overrides(os.environ)}, **(env or {})})
    return proc, out


@pytest.fixture
def in_vendor_tree(vendor_tree, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(vendor_tree), os.environ.get("PYTHONPATH")])))


@pytest.mark.parametrize("variable, value", [("PYTEST_ADDOPTS", "--kv-cache-dtypes=auto"),
                                             ("KVCONFORM_STORE", "conformance.stores.memory:make_store")])
def test_certify_refuses_what_would_change_the_run(tmp_path, variable, value):
    # With PYTEST_ADDOPTS narrowing the dtype axis, a store failing `core` printed ELIGIBLE before.
    proc, out = certify(tmp_path, env={variable: value})
    assert proc.returncode == 2 and f"{variable} set" in proc.stdout, proc.stdout + proc.stderr
    assert not out.exists()


@pytest.fixture(scope="module")
def good_bundle(tmp_path_factory, vendor_tree) -> Path:
    path = os.pathsep.join(filter(None, [str(vendor_tree), os.environ.get("PYTHONPATH")]))
    proc, out = certify(tmp_path_factory.mktemp("cert"), {"PYTHONPATH": path})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ELIGIBLE" in proc.stdout
    return out


@pytest.fixture
def bundle(good_bundle, tmp_path) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(good_bundle, copy)
    return copy


def test_reference_store_bundle_verifies(good_bundle):
    assert verify(good_bundle) == []
    names = {p.name for p in good_bundle.iterdir()}
    assert {"MANIFEST.json", "PRODUCT.yaml", "golden.yaml", "environment.json", "command.txt", "README.md",
            "report.md", "results-core.json", "junit-core.xml", "results-fp8.json", "junit-fp8.xml"} <= names
    env = json.loads((good_bundle / "environment.json").read_text())
    assert {"kvconform", "kvconform_commit", "python", "cpu", "gpu", "packages"} <= set(env)
    assert "kvconform certify --product" in (good_bundle / "command.txt").read_text()
    identity = json.loads((good_bundle / "results-core.json").read_text())["store"]["identity"]
    assert identity["git_commit"] and identity["dirty"] is False and identity["problems"] == []
    readme = (good_bundle / "README.md").read_text()
    assert "Verdict: ELIGIBLE." in readme and f"at git commit {identity['git_commit']}" in readme
    assert str(good_bundle) not in readme + (good_bundle / "command.txt").read_text()  # no machine's paths


def test_verify_cli_exit_codes(good_bundle, bundle):
    ok = subprocess.run([sys.executable, "-m", "conformance.cli", "verify", str(good_bundle)],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and "OK" in ok.stdout
    (bundle / "extra.txt").write_text("x")
    bad = subprocess.run([sys.executable, "-m", "conformance.cli", "verify", str(bundle)],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "extra.txt: not in MANIFEST.json" in bad.stdout


@pytest.mark.parametrize("name", ["PRODUCT.yaml", "golden.yaml", "environment.json", "command.txt", "README.md",
                                  "report.md", "results-core.json", "junit-core.xml", "results-fp8.json",
                                  "junit-fp8.xml", "log-core.txt", "log-fp8.txt"])
def test_flipping_one_byte_in_any_file_is_caught(bundle, name):
    path = bundle / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    assert f"{name}: SHA-256 differs from MANIFEST.json (modified after certification)" in verify(bundle)


def test_manifest_itself_is_checked_by_content(bundle):
    (bundle / "results-core.json").unlink()
    problems = verify(bundle)
    assert "results-core.json: listed in MANIFEST.json but missing" in problems
    assert any("claimed badge core has no results" in p for p in problems)


def test_deleting_a_required_result_is_caught_even_with_a_forged_manifest(bundle):
    path = bundle / "results-core.json"
    doc = json.loads(path.read_text())
    doc["tests"] = [t for t in doc["tests"] if t["clause"] != "stride_contract"]
    path.write_text(json.dumps(doc))
    write_manifest(bundle)  # a forger who also rewrites the manifest
    problems = verify(bundle)
    assert "results-core.json: badge core: required test store:stride_contract did not run" in problems
    assert any(p.startswith("results-core.json: summary") for p in problems), problems
    assert any("is not in the results" in p and "stride_contract" in p for p in problems), problems
    assert any(p.startswith("README.md: does not say what the results earn") for p in problems), problems


def test_claiming_a_badge_that_did_not_run_is_caught(tmp_path, in_vendor_tree):
    proc, out = certify(tmp_path, badges=["core"])
    assert proc.returncode == 0
    product = yaml.safe_load((out / "PRODUCT.yaml").read_text())
    product["badges"] = ["core", "fp8"]
    (out / "PRODUCT.yaml").write_text(yaml.safe_dump(product))
    write_manifest(out)
    problems = verify(out)
    assert problems[0] == "results-fp8.json: missing or unreadable: claimed badge fp8 has no results"
    assert any(p.startswith("README.md: does not say what the results earn") for p in problems), problems


def test_a_forged_verdict_is_caught_though_the_manifest_was_rehashed(tmp_path):
    """The measured forgery: a Fail flipped to Pass in the results, its <failure> cut from the
    JUnit, the manifest re-hashed. The README, the summary and the report still tell the truth."""
    proc, out = certify(tmp_path, store="conformance.zoo.scale_dropping:make_store", badges=["fp8"])
    assert proc.returncode == 1
    path = out / "results-fp8.json"
    doc = json.loads(path.read_text())
    for test in doc["tests"]:
        if test["status"] == "Fail":
            test["status"], test["message"] = "Pass", ""
    path.write_text(json.dumps(doc))
    junit = out / "junit-fp8.xml"
    junit.write_text(re.sub(r"<failure.*?</failure>", "", junit.read_text(), flags=re.S))
    write_manifest(out)
    problems = verify(out)
    assert any(p.startswith("results-fp8.json: summary") for p in problems), problems
    assert any(p.startswith("README.md: does not say what the results earn (they earn ELIGIBLE; the README "
                            "says something else") for p in problems), problems
    assert "report.md: differs from the report the results render" in problems


def test_junit_that_disagrees_with_a_verdict_is_named(bundle):
    junit = bundle / "junit-core.xml"
    text = junit.read_text()
    junit.write_text(text.replace('name="test_byte_exact_roundtrip"', 'name="test_byte_exact_roundtrip">'
                                  '<failure message="x"/></testcase><testcase classname="x" name="y"', 1))
    write_manifest(bundle)
    problems = verify(bundle)
    assert any("test_byte_exact_roundtrip is failed there, but Pass in the results" in p for p in problems), problems
    assert "junit-core.xml: test case x::y is not in the results" in problems


def test_a_signed_bundle_verifies_and_a_resigned_edit_does_not(tmp_path, in_vendor_tree):
    key = tmp_path / "vendor_key"
    subprocess.run([require_tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    signers = tmp_path / "allowed_signers"
    signers.write_text(f"{PRODUCT['contact_email']} {(tmp_path / 'vendor_key.pub').read_text()}")
    proc, out = certify(tmp_path, None, "--sign", str(key), badges=["core"])
    assert proc.returncode == 0 and (out / "MANIFEST.json.sig").is_file(), proc.stdout + proc.stderr
    assert verify(out, allowed_signers=signers) == []
    (out / "command.txt").write_text("kvconform certify --product PRODUCT.yaml --out X\n")
    write_manifest(out)  # re-hashed by someone without the key
    problems = verify(out, allowed_signers=signers)
    assert len(problems) == 1 and problems[0].startswith("MANIFEST.json.sig: not a valid signature"), problems
    (out / "MANIFEST.json.sig").unlink()
    assert verify(out, allowed_signers=signers) == ["MANIFEST.json.sig: missing: the bundle is not signed"]


def test_other_golden_list_is_caught(bundle):
    golden = bundle / "golden.yaml"
    golden.write_text(golden.read_text().replace("      - store:scales_roundtrip\n", ""))
    write_manifest(bundle)
    assert "golden.yaml: differs from the golden list shipped with kvconform 0.1.0" in verify(bundle)


def test_a_store_module_named_like_a_secret_key_certifies_eligible(tmp_path, in_vendor_tree):
    # "acme_key:make_store" says key: but holds no secret; masked, the tested store would differ
    # from the one PRODUCT.yaml names (NOT ELIGIBLE), and the README would name neither.
    proc, out = certify(tmp_path, store="acme_key:make_store", badges=["core"])
    assert proc.returncode == 0 and "kvconform certify: ELIGIBLE" in proc.stdout, proc.stdout + proc.stderr
    assert json.loads((out / "results-core.json").read_text())["store"]["spec"] == "acme_key:make_store"
    assert "Certified: the store acme_key:make_store." in (out / "README.md").read_text()
    assert verify(out) == []


def test_known_bad_store_is_not_eligible(tmp_path):
    proc, out = certify(tmp_path, store="conformance.zoo.scale_dropping:make_store", badges=["fp8"])
    assert proc.returncode == 1
    assert "NOT ELIGIBLE: badge fp8: required test store:scales_roundtrip is Fail: [scales_roundtrip]" in proc.stdout
    assert any("scales_roundtrip is Fail" in p for p in verify(out))


def test_disabled_required_test_makes_the_run_ineligible(tmp_path):
    proc, _ = certify(tmp_path, store="tests.stores_for_tests:scaleless_store", badges=["fp8"])
    assert proc.returncode == 1
    assert "required test store:scales_roundtrip is Disabled" in proc.stdout


def test_golden_list_names_only_existing_tests():
    golden = load_golden()
    for badge in golden.badges.values():
        assert set(badge.required) <= known_test_ids()


def test_golden_list_with_a_vanished_test_fails(tmp_path):
    path = tmp_path / "golden.yaml"
    path.write_text((REPO / "conformance/certify/required-tests.yaml").read_text()
                    .replace("store:shape_preserved", "store:shape_kept"))
    with pytest.raises(GoldenError, match=r"badges.core.required\[2\]: expected a test id of this suite \(level:clause\), got 'store:shape_kept'"):
        load_golden(path)


@pytest.mark.parametrize("change, says", [
    ({"contact_email": None}, "contact_email: expected a value (required)"),
    ({"badges": ["gold"]}, "badges[0]: expected one of ['core', 'fp8', 'connector-core'"),
    ({"logo": "x"}, "logo: expected one of"),
    ({"store": None, "connector": "conformance.stores.file:make_store"},
     "store: expected the store under test: badge core certifies a store (`connector:` names a vLLM connector"),
    ({"connector": "ExampleConnector"}, "connector: expected nothing: the badges claimed certify a store"),
    ({"badges": ["core", "connector-core"]}, "badges: expected badges of one subject"),
    ({"store": None, "badges": ["connector-core"]}, "connector: expected the connector under test"),
    ({"store": None, "badges": ["connector-core"], "connector": {"name": "X", "capabilities": ["fast"]}},
     "connector.capabilities: --kv-connector-capabilities: unknown capability 'fast'"),
])
def test_product_yaml_errors_are_one_line(tmp_path, change, says):
    path = tmp_path / "PRODUCT.yaml"
    path.write_text(yaml.safe_dump({**PRODUCT, **change}))
    with pytest.raises(GoldenError) as info:
        load_product(path, load_golden())
    assert says in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("position", [0.1, 0.3, 0.5, 0.7, 0.9])
def test_flipped_results_never_crash_verify(bundle, position):
    # Wherever the byte lands (a key, a value, the JSON syntax), verify reports; it never raises.
    path = bundle / "results-core.json"
    data = bytearray(path.read_bytes())
    data[int(len(data) * position)] ^= 0x01
    path.write_bytes(bytes(data))
    write_manifest(bundle)
    assert isinstance(verify(bundle), list)


def test_a_run_that_writes_no_results_says_why_on_the_terminal(tmp_path):
    proc, _ = certify(tmp_path, store="no_such_vendor_module:make_store", badges=["core"])
    assert proc.returncode == 1
    assert "NOT ELIGIBLE: badge core: the suite exited 4 without results" in proc.stdout, proc.stdout
    assert "no_such_vendor_module" in proc.stdout
