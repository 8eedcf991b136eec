"""``kvconform verify DIR``: check a certification bundle without rerunning it.

One line per problem, non-zero exit on any: the manifest against every file (edits,
additions, removals), the golden list against the one this kvconform version ships, every
required test of every claimed badge present and passed, versions consistent across files,
and JUnit agreeing with the results.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from conformance import __version__
from conformance.certify.bundle import MANIFEST, required_problems, results_name, run_problems, sha256_file
from conformance.certify.golden import SHIPPED_GOLDEN, GoldenError, load_golden, load_product
from conformance.verdict.status import is_red


def verify(bundle: Path) -> list[str]:
    bundle = Path(bundle)
    if not (bundle / MANIFEST).is_file():
        return [f"{bundle}: no {MANIFEST}: not a kvconform bundle"]
    problems = _manifest_problems(bundle)
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
    for name in product["badges"]:
        try:
            problems += _badge_problems(bundle, golden.badges[name], product, made_with)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:  # edited into another shape
            problems.append(f"{results_name(name)}: malformed results ({type(exc).__name__}: {exc})")
    return problems


def _manifest_problems(bundle: Path) -> list[str]:
    try:
        listed: dict[str, str] = json.loads((bundle / MANIFEST).read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return [f"{MANIFEST}: unreadable"]
    present = {str(p.relative_to(bundle)) for p in bundle.rglob("*") if p.is_file() and p.name != MANIFEST}
    problems = [f"{name}: listed in {MANIFEST} but missing" for name in sorted(set(listed) - present)]
    problems += [f"{name}: not in {MANIFEST} (added after certification)" for name in sorted(present - set(listed))]
    problems += [f"{name}: SHA-256 differs from {MANIFEST} (modified after certification)"
                 for name in sorted(present & set(listed)) if sha256_file(bundle / name) != listed[name]]
    return problems


def _badge_problems(bundle: Path, badge: Any, product: dict[str, Any], made_with: str) -> list[str]:
    path = bundle / results_name(badge.name)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return [f"{path.name}: missing or unreadable: claimed badge {badge.name} has no results"]
    problems = [f"{path.name}: {p}" for p in required_problems(badge, doc)]
    if doc.get("suite_version") != made_with:
        problems.append(f"{path.name}: suite_version {doc.get('suite_version')}, but environment.json says {made_with}")
    problems += [f"{path.name}: {p}" for p in run_problems(badge, doc, product["connector"])]
    problems += _junit_problems(bundle / f"junit-{badge.name}.xml", doc)
    return problems


def _junit_problems(path: Path, doc: dict[str, Any]) -> list[str]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return [f"{path.name}: missing or not JUnit XML"]
    cases = root.iter("testcase")
    failing = sum(1 for c in cases if c.find("failure") is not None or c.find("error") is not None)
    bad = sum(1 for t in doc["tests"] if is_red(t.get("status", "")))
    if failing != bad:
        return [f"{path.name}: {failing} failing test cases, but the results file has {bad} Fail/Error"]
    return []
