"""``kvconform certify``: run a badge's required tests and write a verifiable bundle.

Modelled on the Kubernetes conformance submission: the run may not skip a required test, and
the bundle carries everything a reviewer needs without rerunning it: results, JUnit, the
rendered report, PRODUCT.yaml, the golden list used, the environment, the exact command, a
README with reproduction steps, and a manifest with the SHA-256 of every file.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

from conformance import __version__
from conformance.certify.golden import SHIPPED_GOLDEN, Badge, Golden, load_golden, load_product, test_id
from conformance.matrix.runner import suite_command
from conformance.report import render as report
from conformance.verdict import results
from conformance.verdict.clauses import CLAUSES
from conformance.verdict.results import ResultsDocument

MANIFEST = "MANIFEST.json"
CERTIFY_PROFILE = "certify"  # the Hypothesis profile: derandomized, recorded


def results_name(badge: str) -> str:
    return f"results-{badge}.json"


def run_problems(badge: Badge, doc: dict[str, Any], connector: str) -> list[str]:
    """Why ``doc`` is not a certification run of ``badge`` on ``connector``, whatever its verdicts:
    the checks certify and verify share, so that certify never calls ELIGIBLE what verify rejects."""
    problems = []
    if doc.get("profile") != CERTIFY_PROFILE:
        problems.append(f"ran under Hypothesis profile {doc.get('profile')!r}, not {CERTIFY_PROFILE!r}")
    if (doc.get("store") or {}).get("target") != connector:
        problems.append(f"tested {doc.get('store', {}).get('target')!r}, but PRODUCT.yaml names connector {connector!r}")
    want_dtypes = list(badge.kv_cache_dtypes) if badge.kv_cache_dtypes else None
    if doc.get("kv_cache_dtypes") != want_dtypes:
        problems.append(f"ran kv_cache_dtypes {doc.get('kv_cache_dtypes')}, badge {badge.name} requires {want_dtypes}")
    return problems


# Variables that change what a pytest run of the suite runs: a certification run refuses them
# rather than record a run its verifier would reject.
OVERRIDES = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "HYPOTHESIS_PROFILE")
OVERRIDE_PREFIX = "KVCONFORM_"


def overrides(environ: Mapping[str, str]) -> list[str]:
    """The variables in ``environ`` that would change what a certification run runs."""
    return sorted(k for k in environ if k in OVERRIDES or k.startswith(OVERRIDE_PREFIX))


def required_problems(badge: Badge, doc: dict[str, Any] | None) -> list[str]:
    """Why ``doc`` does not satisfy ``badge``'s required tests (empty: it does)."""
    if doc is None:
        return [f"badge {badge.name}: no results"]
    by_id = {test_id(CLAUSES[t["clause"]].level, t["clause"]): t for t in doc.get("tests", [])
             if isinstance(t, dict) and t.get("clause") in CLAUSES}
    problems = []
    for tid in badge.required:
        test = by_id.get(tid)
        if test is None:
            problems.append(f"badge {badge.name}: required test {tid} did not run")
        elif test.get("status") != "Pass":
            first = (test.get("message") or "").splitlines()[0] if test.get("message") else ""
            problems.append(f"badge {badge.name}: required test {tid} is {test.get('status')}"
                            + (f": {first}" if first else ""))
    return problems


def git_commit() -> str:
    """The kvconform commit, marked ``-dirty`` when the checkout has uncommitted changes."""
    here = Path(__file__).parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=here, capture_output=True,
                               text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def gpu_description() -> dict[str, Any]:
    try:
        import torch

        if torch.cuda.is_available():
            return {"name": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
                    "driver": _nvidia_driver()}
    except Exception as exc:  # a broken CUDA install must not stop a CPU certification
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {}


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def environment_fingerprint() -> dict[str, Any]:
    env = results.environment()
    env.update({"kvconform": __version__, "kvconform_commit": git_commit(), "gpu": gpu_description()})
    return env


def sha256_file(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(bundle: Path) -> None:
    files = sorted(p for p in bundle.rglob("*") if p.is_file() and p.name != MANIFEST)
    manifest = {"kvconform": __version__, "files": {str(p.relative_to(bundle)): sha256_file(p) for p in files}}
    (bundle / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


README = """# kvconform certification bundle: {name} {version} ({vendor})

Made by kvconform {suite} (commit {commit}) with:

    {command}

Badges claimed: {badges}. Verdict: {verdict}.

## Check it without rerunning

    pip install kvconform=={suite}
    kvconform verify .

`verify` checks every file against MANIFEST.json (SHA-256), that every required test of each
claimed badge (golden.yaml, identical to the list shipped with kvconform {suite}) is present
and passed, and that versions agree across files.

## Reproduce it

Install the connector ({connector}) and kvconform {suite} beside the packages in
environment.json, then run the command above. Each badge's run is also, on its own:

{per_badge}
"""


def certify(product_path: Path, out: Path, *, say: Callable[[str], None] = print,
            argv: list[str] | None = None) -> int:
    golden = load_golden()
    product = load_product(product_path, golden)
    changed = overrides(os.environ)
    if changed:
        say(f"kvconform certify: {', '.join(changed)} set: it changes what the required tests run; "
            "a certification run takes none (unset it)")
        return 2
    if out.exists() and any(out.iterdir()):
        say(f"kvconform certify: {out} is not empty; choose a new directory")
        return 2
    out.mkdir(parents=True, exist_ok=True)
    problems, per_badge = [], []
    for name in product["badges"]:
        badge = golden.badges[name]
        res, junit, log = out / results_name(name), out / f"junit-{name}.xml", out / f"log-{name}.txt"
        cmd = suite_command([f"--kv-store={product['connector']}"], CERTIFY_PROFILE, res, junit, badge.kv_cache_dtypes)
        say(f"kvconform certify: badge {name}: running {len(badge.required)} required tests")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log.write_text(results.redact_text(proc.stdout + proc.stderr))  # shipped: no secret in it
        if junit.exists():
            junit.write_text(results.redact_text(junit.read_text(errors="replace")))
        doc = json.loads(res.read_text()) if res.exists() else None
        problems += required_problems(badge, doc)
        problems += [f"badge {name}: {p}" for p in run_problems(badge, doc, product["connector"])] if doc else []
        per_badge.append("    " + shlex.join(["python", *cmd[1:]]).replace(str(out) + "/", ""))
    _write_bundle(out, product_path, product, golden, problems, per_badge, argv or sys.argv)
    for problem in problems:
        say(f"NOT ELIGIBLE: {problem}")
    say(f"kvconform certify: {'ELIGIBLE' if not problems else 'NOT ELIGIBLE'}; bundle in {out}")
    return 0 if not problems else 1


def _write_bundle(out: Path, product_path: Path, product: dict[str, Any], golden: Golden,
                  problems: list[str], per_badge: list[str], argv: list[str]) -> None:
    shutil.copyfile(product_path, out / "PRODUCT.yaml")
    shutil.copyfile(SHIPPED_GOLDEN, out / "golden.yaml")
    env = environment_fingerprint()
    (out / "environment.json").write_text(json.dumps(env, indent=2, sort_keys=True) + "\n")
    command = shlex.join(["kvconform", *argv[1:]]) if argv else "kvconform certify"
    (out / "command.txt").write_text(command + "\n")
    docs: list[ResultsDocument] = [json.loads((out / results_name(n)).read_text()) for n in product["badges"]
            if (out / results_name(n)).exists()]
    cells: list[Any] = [{**d, "cell": {"id": f"{product['name']} [{n}]", "store": product["name"], "target": product["connector"],
                            "tier": f"certify:{n}", "command": c.strip(), "wall_s": None}}
             for d, n, c in zip(docs, product["badges"], per_badge)]
    (out / "report.md").write_text(report.markdown(report.matrix_document(cells)))
    verdict = "ELIGIBLE" if not problems else "NOT ELIGIBLE (" + "; ".join(problems) + ")"
    (out / "README.md").write_text(README.format(
        name=product["name"], version=product["version"], vendor=product["vendor"], suite=__version__,
        commit=env["kvconform_commit"], command=command, badges=", ".join(product["badges"]),
        verdict=verdict, connector=product["connector"], per_badge="\n".join(per_badge)))
    write_manifest(out)
