"""``kvconform verify DIR``: check a certification bundle.

One line per problem, non-zero exit on any. Without rerunning: the manifest against every file
(edits, additions, removals); the golden list against the one this kvconform version ships;
every required test of every claimed badge present and passed; the README's verdict, the
report, each results file's summary and each JUnit test case agreeing with the per-test
results; the profile, Hypothesis settings, dtype axis, subject and tested code as PRODUCT.yaml
and the golden list require; versions consistent across files. Re-hashing the manifest after
an edit defeats only the first check: every file derived from the results is re-derived here.
With ``allowed_signers``, the manifest's OpenSSH signature is checked; with ``rerun``, every
badge runs again in this environment and each verdict and example count must agree.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from conformance import __version__
from conformance.certify.bundle import (
    MANIFEST,
    SIGNATURE,
    badge_problems,
    bundle_identity,
    read_results,
    render_readme,
    render_report,
    results_name,
    sha256_file,
)
from conformance.certify.golden import SHIPPED_GOLDEN, Golden, GoldenError, load_golden, load_product
from conformance.verdict.status import Status

SIGNATURE_NAMESPACE = "kvconform-certification"


def verify(bundle: Path, *, allowed_signers: Path | None = None, rerun: bool = False,
           say: Callable[[str], None] = lambda line: None) -> list[str]:
    bundle = Path(bundle)
    if not (bundle / MANIFEST).is_file():
        return [f"{bundle}: no {MANIFEST}: not a kvconform bundle"]
    problems = _manifest_problems(bundle)
    if allowed_signers is not None:
        problems += signature_problems(bundle, allowed_signers)
    try:
        golden = load_golden(bundle / "golden.yaml")
        product = load_product(bundle / "PRODUCT.yaml", golden)
        environment = json.loads((bundle / "environment.json").read_text())
    except (GoldenError, OSError, ValueError) as exc:
        return problems + [f"unreadable bundle file: {exc}"]
    made_with = environment.get("kvconform")
    if made_with != __version__:
        problems.append(f"environment.json: made with kvconform {made_with}, verifying with {__version__}: "
                        f"verify with kvconform {made_with}")
    elif golden.sha256 != load_golden(SHIPPED_GOLDEN).sha256:
        problems.append(f"golden.yaml: differs from the golden list shipped with kvconform {__version__}")
    if golden.suite_version != made_with:
        problems.append(f"golden.yaml: suite_version {golden.suite_version}, but the bundle was made with {made_with}")
    earned: list[str] = []
    for name in product["badges"]:
        try:
            found, lost = _badge_problems(bundle, golden, name, product, environment)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:  # edited into another shape
            found, lost = [f"{results_name(name)}: malformed results ({type(exc).__name__}: {exc})"], []
        problems += found
        earned += lost
    try:
        problems += _derived_problems(bundle, product, golden, environment, earned)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:  # results edited into another shape
        problems.append(f"README.md, report.md: cannot be re-derived from malformed results ({type(exc).__name__}: {exc})")
    if rerun:
        problems += rerun_problems(bundle, product, golden, say)
    return problems


def _manifest_problems(bundle: Path) -> list[str]:
    try:
        listed: dict[str, str] = json.loads((bundle / MANIFEST).read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return [f"{MANIFEST}: unreadable"]
    present = {str(p.relative_to(bundle)) for p in bundle.rglob("*")
               if p.is_file() and p.name not in (MANIFEST, SIGNATURE)}
    problems = [f"{name}: listed in {MANIFEST} but missing" for name in sorted(set(listed) - present)]
    problems += [f"{name}: not in {MANIFEST} (added after certification)" for name in sorted(present - set(listed))]
    problems += [f"{name}: SHA-256 differs from {MANIFEST} (modified after certification)"
                 for name in sorted(present & set(listed)) if sha256_file(bundle / name) != listed[name]]
    return problems


def _badge_problems(bundle: Path, golden: Golden, name: str, product: dict[str, Any],
                    environment: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(what is wrong with the badge's files, what keeps the results from earning the badge)."""
    path = bundle / results_name(name)
    doc = read_results(bundle, name)
    if doc is None:
        missing = f"{path.name}: missing or unreadable: claimed badge {name} has no results"
        return [missing], [f"badge {name}: no results"]
    problems = []
    if doc.get("suite_version") != environment.get("kvconform"):
        problems.append(f"{path.name}: suite_version {doc.get('suite_version')}, but environment.json says "
                        f"{environment.get('kvconform')}")
    summary = dict(Counter(t["status"] for t in doc["tests"]))
    if doc.get("summary") != summary:
        problems.append(f"{path.name}: summary {doc.get('summary')} does not count its own tests ({summary})")
    earned = badge_problems(golden.badges[name], doc, product)
    problems += [f"{path.name}: {p}" for p in earned]
    problems += junit_problems(bundle / f"junit-{name}.xml", doc)
    return problems, earned


def _derived_problems(bundle: Path, product: dict[str, Any], golden: Golden, environment: dict[str, Any],
                      earned: list[str]) -> list[str]:
    """README.md and report.md must be what the results make of them, word for word."""
    problems = []
    readme = render_readme(product, golden, environment, bundle_identity(bundle, product, golden), earned)
    if _read(bundle / "README.md") != readme:
        said = "ELIGIBLE" if "Verdict: ELIGIBLE." in _read(bundle / "README.md") else "something else"
        problems.append(f"README.md: does not say what the results earn (they earn "
                        f"{'ELIGIBLE' if not earned else 'NOT ELIGIBLE'}; the README says {said}, or was edited)")
    if _read(bundle / "report.md") != render_report(bundle, product, golden):
        problems.append("report.md: differs from the report the results render")
    return problems


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


# How each status shows in JUnit: a passing case, a <failure>/<error>, or a <skipped>.
_JUNIT = {Status.PASS.value: "passed", Status.XPASS.value: "passed", Status.FAIL.value: "failed",
          Status.ERROR.value: "failed"}


def junit_problems(path: Path, doc: dict[str, Any]) -> list[str]:
    """Each results test has one JUnit test case of the same outcome, and there are no others."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return [f"{path.name}: missing or not JUnit XML"]
    cases = {}
    for case in root.iter("testcase"):
        outcome = ("failed" if case.find("failure") is not None or case.find("error") is not None
                   else "skipped" if case.find("skipped") is not None else "passed")
        cases[f"{case.get('classname')}::{case.get('name')}"] = outcome
    problems = []
    for test in doc["tests"]:
        module, _, name = test["nodeid"].partition("::")
        key = f"{module.removesuffix('.py').replace('/', '.')}::{name}"
        want = _JUNIT.get(test["status"], "skipped")
        got = cases.pop(key, None)
        if got != want:
            problems.append(f"{path.name}: {test['nodeid']} is {got or 'absent'} there, but {test['status']} in the results")
    problems += [f"{path.name}: test case {key} is not in the results" for key in sorted(cases)]
    return problems


def signature_problems(bundle: Path, allowed_signers: Path) -> list[str]:
    """The manifest's detached OpenSSH signature, checked against ``allowed_signers`` for the
    product's contact e-mail (``ssh-keygen -Y verify``)."""
    sig = bundle / SIGNATURE
    if not sig.is_file():
        return [f"{SIGNATURE}: missing: the bundle is not signed"]
    try:
        product = load_product(bundle / "PRODUCT.yaml", load_golden(bundle / "golden.yaml"))
    except GoldenError as exc:
        return [f"{SIGNATURE}: cannot tell the signer: {exc}"]
    proc = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(allowed_signers), "-I",
                           str(product["contact_email"]), "-n", SIGNATURE_NAMESPACE, "-s", str(sig)],
                          input=(bundle / MANIFEST).read_bytes(), capture_output=True)
    if proc.returncode != 0:
        words = (proc.stderr or proc.stdout).decode(errors="replace").strip().splitlines()
        return [f"{SIGNATURE}: not a valid signature of {MANIFEST} by {product['contact_email']} in "
                f"{allowed_signers}: {words[-1] if words else 'ssh-keygen refused it'}"]
    return []


def sign(bundle: Path, key: Path) -> None:
    """Sign the manifest with the OpenSSH private ``key`` (MANIFEST.json.sig beside it)."""
    subprocess.run(["ssh-keygen", "-Y", "sign", "-f", str(key), "-n", SIGNATURE_NAMESPACE, str(bundle / MANIFEST)],
                   check=True, capture_output=True)


def rerun_problems(bundle: Path, product: dict[str, Any], golden: Golden,
                   say: Callable[[str], None]) -> list[str]:
    """Run every claimed badge again here (certify into a scratch directory) and compare each
    test's verdict and example count, and the tested code, with the bundle's."""
    from conformance.certify.bundle import certify

    problems = []
    with tempfile.TemporaryDirectory(prefix="kvconform-rerun-") as scratch:
        again = Path(scratch) / "bundle"
        certify(bundle / "PRODUCT.yaml", again, say=say)
        for name in product["badges"]:
            before, after = read_results(bundle, name) or {}, read_results(again, name) or {}
            subject = golden.badges[name].subject
            if _code(before, subject) != _code(after, subject):
                problems.append(f"rerun {name}: the code tested here is not the bundle's: "
                                f"{_code(after, subject)} vs {_code(before, subject)}")
            then = {t["nodeid"]: (t["status"], t["examples"]) for t in before.get("tests", [])}
            now = {t["nodeid"]: (t["status"], t["examples"]) for t in after.get("tests", [])}
            for nodeid in sorted(set(then) | set(now)):
                if then.get(nodeid) != now.get(nodeid):
                    problems.append(f"rerun {name}: {nodeid}: (status, examples) {now.get(nodeid)} here, "
                                    f"{then.get(nodeid)} in the bundle")
    return problems


def _code(doc: dict[str, Any], subject: str) -> dict[str, Any]:
    identity = (doc.get(subject) or {}).get("identity") or {}
    return {k: identity.get(k) for k in ("module", "distribution", "version", "record_sha256", "git_commit",
                                         "tree_sha256", "dirty")}
