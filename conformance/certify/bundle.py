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
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from conformance import __version__
from conformance.certify.golden import SHIPPED_GOLDEN, Badge, Golden, load_golden, load_product, test_id
from conformance.matrix.definition import connector_args
from conformance.matrix.runner import suite_command
from conformance.report import render as report
from conformance.util.identity import reproducibility_problems
from conformance.verdict import results
from conformance.verdict.clauses import CLAUSES, disabled_reason

MANIFEST = "MANIFEST.json"
SIGNATURE = MANIFEST + ".sig"  # its detached OpenSSH signature: not listed in it
CERTIFY_PROFILE = "certify"  # the Hypothesis profile: derandomized, recorded


def results_name(badge: str) -> str:
    return f"results-{badge}.json"


def subject_args(badge: Badge, product: Mapping[str, Any]) -> list[str]:
    """The suite's options that put the product's store or connector under ``badge``'s levels."""
    args = [f"--kv-levels={','.join(badge.levels)}"]
    if badge.subject == "store":
        return [f"--kv-store={product['store']}", *args]
    c = product["connector"]
    other = [f"--kv-other-model={product['other_model']}"] if product.get("other_model") else []
    return [*connector_args(c["name"], c["extra_config"], c["capabilities"]), f"--kv-role={c['role']}",
            f"--kv-model={product['model']}", *other, *args]


def badge_command(badge: Badge, product: Mapping[str, Any], where: Path = Path(".")) -> list[str]:
    """The pytest command of ``badge``'s run, its files in ``where``."""
    return suite_command(subject_args(badge, product), CERTIFY_PROFILE, where / results_name(badge.name),
                         where / f"junit-{badge.name}.xml", badge.kv_cache_dtypes)


def declared(badge: Badge, product: Mapping[str, Any]) -> frozenset[str] | None:
    """The capabilities a connector product declares, with those they imply (clauses needing others
    are not required of it); None for a store, which is held to every required test."""
    if badge.subject == "store":
        return None
    from conformance.levels.capabilities import implied

    return implied(_declared(product))


def _declared(product: Mapping[str, Any]) -> frozenset[str]:
    from conformance.levels.capabilities import parse_capabilities

    return parse_capabilities(",".join(product["connector"]["capabilities"]))[0]


def run_problems(badge: Badge, doc: dict[str, Any], product: Mapping[str, Any]) -> list[str]:
    """Why ``doc`` is not a certification run of ``badge`` on the product, whatever its verdicts:
    the checks certify and verify share, so that certify never calls ELIGIBLE what verify rejects."""
    problems = []
    if doc.get("profile") != CERTIFY_PROFILE:
        problems.append(f"ran under Hypothesis profile {doc.get('profile')!r}, not {CERTIFY_PROFILE!r}")
    want_settings = certify_settings()
    if doc.get("hypothesis_settings") != want_settings:
        problems.append(f"ran with Hypothesis settings {doc.get('hypothesis_settings')}, but the {CERTIFY_PROFILE} "
                        f"profile is {want_settings}")
    want_dtypes = list(badge.kv_cache_dtypes) if badge.kv_cache_dtypes else None
    if doc.get("kv_cache_dtypes") != want_dtypes:
        problems.append(f"ran kv_cache_dtypes {doc.get('kv_cache_dtypes')}, badge {badge.name} requires {want_dtypes}")
    if badge.subject == "store":
        tested = doc.get("store") or {}
        if product["store"] not in (tested.get("target"), tested.get("spec")):
            problems.append(f"tested store {tested.get('target')!r}, but PRODUCT.yaml names {product['store']!r}")
    else:
        problems += _connector_problems(doc.get("connector") or {}, product)
    identity = (doc.get(badge.subject) or {}).get("identity")
    problems += [f"tested code: {p}" for p in reproducibility_problems(identity)]
    wanted = product.get("distribution")
    if wanted and identity and not identity.get("problems"):
        got = (identity.get("distribution") or "", identity.get("version"))
        if _normal(got[0]) != _normal(wanted) or got[1] != str(product["version"]):
            problems.append(f"tested code is {got[0] or identity.get('source_tree')} {got[1] or ''}, but PRODUCT.yaml "
                            f"says distribution {wanted} {product['version']}")
    return problems


def _connector_problems(tested: Mapping[str, Any], product: Mapping[str, Any]) -> list[str]:
    c = product["connector"]
    problems = []
    if tested.get("spec") != c["name"]:
        problems.append(f"tested connector {tested.get('spec')!r}, but PRODUCT.yaml names {c['name']!r}")
    for key, want in (("capabilities", sorted(_declared(product))),
                      ("extra_config", results.redact(c["extra_config"])), ("role", c["role"]),
                      ("model", product["model"]), ("other_model", product.get("other_model"))):
        if tested.get(key) != want:
            problems.append(f"tested connector {key} {tested.get(key)!r}, but PRODUCT.yaml says {want!r}")
    if "one-geometry" in _declared(product):  # a badge certifies every block size and dtype it covers
        judged = ", ".join(f"{k}={v}" for k, v in (tested.get("geometry") or {}).items()) or "one geometry"
        problems.append(f"the connector declares one-geometry, so the run judged it at {judged} only: a badge "
                        "certifies every kv_cache_dtype and block size it covers, and isolation between them")
    return problems


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def certify_settings() -> dict[str, Any]:
    """The Hypothesis settings the certify profile runs with, as the results file records them."""
    from hypothesis import settings

    from conformance.verdict import profiles

    profiles.register_profiles()
    return profiles.recorded(settings.get_profile(CERTIFY_PROFILE))


# Variables that change what a pytest run of the suite runs: a certification run refuses them
# rather than record a run its verifier would reject.
OVERRIDES = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "HYPOTHESIS_PROFILE")
OVERRIDE_PREFIX = "KVCONFORM_"


def overrides(environ: Mapping[str, str]) -> list[str]:
    """The variables in ``environ`` that would change what a certification run runs."""
    return sorted(k for k in environ if k in OVERRIDES or k.startswith(OVERRIDE_PREFIX))


def required_problems(badge: Badge, doc: dict[str, Any] | None,
                      capabilities: frozenset[str] | None = None) -> list[str]:
    """Why ``doc`` does not satisfy ``badge``'s required tests (empty: it does). Every test of a
    required clause (a parametrized clause has several) must Pass, or Skip beside one that passed;
    a connector's clause that needs a capability outside ``capabilities`` (its declaration) is not
    required of it."""
    if doc is None:
        return [f"badge {badge.name}: no results"]
    by_id: dict[str, list[dict[str, Any]]] = {}
    for t in doc.get("tests", []):
        if isinstance(t, dict) and t.get("clause") in CLAUSES:
            by_id.setdefault(test_id(CLAUSES[t["clause"]].level, t["clause"]), []).append(t)
    problems = []
    for tid in badge.required:
        clause = CLAUSES[tid.partition(":")[2]]
        if capabilities is not None and disabled_reason(clause, capabilities, "it"):
            continue  # not applicable as declared: the bundle's README states the declaration
        tests = by_id.get(tid)
        if not tests:
            problems.append(f"badge {badge.name}: required test {tid} did not run")
            continue
        statuses = [t.get("status") for t in tests]
        bad = next((t for t in tests if t.get("status") not in ("Pass", "Skip")), None)
        if bad is None and "Pass" in statuses:
            continue
        bad = bad or tests[0]
        first = (bad.get("message") or "").splitlines()[0] if bad.get("message") else ""
        problems.append(f"badge {badge.name}: required test {tid} is {bad.get('status')}" + (f": {first}" if first else ""))
    return problems


def badge_problems(badge: Badge, doc: dict[str, Any] | None, product: Mapping[str, Any]) -> list[str]:
    """Everything that keeps ``doc`` from earning ``badge`` for the product."""
    problems = required_problems(badge, doc, declared(badge, product))
    if doc is not None:
        problems += [f"badge {badge.name}: {p}" for p in run_problems(badge, doc, product)]
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
    # The results' environment, with the suite's commit and the GPU described in full.
    return {**results.environment(), "kvconform": __version__, "kvconform_commit": git_commit(), "gpu": gpu_description()}


def sha256_file(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(bundle: Path) -> None:
    files = sorted(p for p in bundle.rglob("*") if p.is_file() and p.name not in (MANIFEST, SIGNATURE))
    manifest = {"kvconform": __version__, "files": {str(p.relative_to(bundle)): sha256_file(p) for p in files}}
    (bundle / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


README = """# kvconform certification bundle: {name} {version} ({vendor})

Made by kvconform {suite} (commit {commit}) with:

    {command}

Badges claimed: {badges}. Verdict: {verdict}.

Certified: {subject}. Tested code: {identity}.

## Check it without rerunning

    pip install kvconform=={suite}
    kvconform verify .

`verify` checks every file against MANIFEST.json (SHA-256), that every required test of each
claimed badge (golden.yaml, identical to the list shipped with kvconform {suite}) is present
and passed, that this README, the report and the JUnit files say what the results say, and
that versions, settings and the tested code agree across files. An unsigned manifest proves
only that nothing was edited by accident: whoever can edit the files can re-hash them. A
signed one (MANIFEST.json.sig, `verify --allowed-signers FILE`) proves who made it, and
`verify --rerun` runs every badge again here and compares each verdict.

## Reproduce it

Install the {noun} ({target}) and kvconform {suite} beside the packages in
environment.json, then run the command above. Each badge's run is also, on its own:

{per_badge}
"""
# The command a bundle records: its PRODUCT.yaml is in the bundle, the output directory is new.
COMMAND = "kvconform certify --product PRODUCT.yaml --out NEW_BUNDLE_DIR"


def certify(product_path: Path, out: Path, *, say: Callable[[str], None] = print) -> int:
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
    problems = []
    for name in product["badges"]:
        badge = golden.badges[name]
        log = out / f"log-{name}.txt"
        say(f"kvconform certify: badge {name}: running {len(badge.required)} required tests")
        proc = subprocess.run(badge_command(badge, product, out), capture_output=True, text=True)
        log.write_text(results.redact_text(proc.stdout + proc.stderr))  # shipped: no secret in it
        junit = out / f"junit-{name}.xml"
        if junit.exists():
            junit.write_text(results.redact_text(junit.read_text(errors="replace")))
        doc = read_results(out, name)
        problems += badge_problems(badge, doc, product)
        if doc is None:  # the reason is in the log: say it here, not only there
            tail = [line for line in log.read_text().splitlines() if line.strip()][-3:]
            problems.append(f"badge {name}: the suite exited {proc.returncode} without results: " + " | ".join(tail))
    _write_bundle(out, product_path, product, golden, problems)
    for problem in problems:
        say(f"NOT ELIGIBLE: {problem}")
    say(f"kvconform certify: {'ELIGIBLE' if not problems else 'NOT ELIGIBLE'}; bundle in {out}")
    return 0 if not problems else 1


def read_results(bundle: Path, badge: str) -> dict[str, Any] | None:
    try:
        doc = json.loads((bundle / results_name(badge)).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def render_report(bundle: Path, product: Mapping[str, Any], golden: Golden) -> str:
    """report.md: the badges' results as one matrix report."""
    cells: list[Any] = []
    for name in product["badges"]:
        doc = read_results(bundle, name)
        if doc is not None:
            command = shlex.join(["python", *badge_command(golden.badges[name], product)[1:]])
            cells.append({**doc, "cell": {"id": f"{product['name']} [{name}]", "store": product["name"],
                                          "target": _target(product), "tier": f"certify:{name}",
                                          "command": results.redact_text(command), "wall_s": None}})
    return report.markdown(report.matrix_document(cells))


def render_readme(product: Mapping[str, Any], golden: Golden, env: Mapping[str, Any], identity: Any,
                  problems: list[str]) -> str:
    """README.md: what was certified, the verdict the results earn, how to check and reproduce it."""
    per_badge = [results.redact_text("    " + shlex.join(["python", *badge_command(golden.badges[n], product)[1:]]))
                 for n in product["badges"]]
    subject = next(golden.badges[n].subject for n in product["badges"])
    if subject == "connector":
        caps = product["connector"]["capabilities"]
        what = f"the vLLM connector {_target(product)}, declared {', '.join(caps) if caps else 'with no capabilities'}"
    else:
        what = f"the store {_target(product)}"
    verdict = "ELIGIBLE" if not problems else "NOT ELIGIBLE (" + "; ".join(problems) + ")"
    return README.format(
        name=product["name"], version=product["version"], vendor=product["vendor"], suite=__version__,
        commit=env.get("kvconform_commit"), command=COMMAND, badges=", ".join(product["badges"]),
        verdict=verdict, subject=what, identity=describe_identity(identity), noun=subject,
        target=_target(product), per_badge="\n".join(per_badge))


def describe_identity(identity: Any) -> str:
    if not isinstance(identity, dict):
        return "not recorded"
    if identity.get("distribution"):
        return (f"{identity['distribution']} {identity.get('version')} (module {identity.get('module')}, "
                f"RECORD sha256 {identity.get('record_sha256')})")
    if identity.get("git_commit"):
        return (f"{identity.get('source_tree')}/ at git commit {identity['git_commit']}"
                f"{' with uncommitted changes' if identity.get('dirty') else ''} (tree sha256 {identity.get('tree_sha256')})")
    return "; ".join(identity.get("problems") or ["unknown"])


def bundle_identity(bundle: Path, product: Mapping[str, Any], golden: Golden) -> Any:
    """The tested code's identity as the first badge's results record it."""
    first = product["badges"][0]
    doc = read_results(bundle, first) or {}
    return (doc.get(golden.badges[first].subject) or {}).get("identity")


def _target(product: Mapping[str, Any]) -> str:
    return product["store"] if "store" in product else product["connector"]["name"]


def ship_product(product_path: Path, to: Path) -> None:
    """PRODUCT.yaml as the vendor wrote it, or, where it holds a secret, with each one masked (verify
    compares it with results whose extra config is masked the same way)."""
    raw = yaml.safe_load(product_path.read_text())
    masked = results.redact(raw)
    if masked == raw:
        shutil.copyfile(product_path, to)
    else:
        to.write_text(yaml.safe_dump(masked, sort_keys=False))


def _write_bundle(out: Path, product_path: Path, product: dict[str, Any], golden: Golden,
                  problems: list[str]) -> None:
    ship_product(product_path, out / "PRODUCT.yaml")
    shutil.copyfile(SHIPPED_GOLDEN, out / "golden.yaml")
    env = environment_fingerprint()
    (out / "environment.json").write_text(json.dumps(env, indent=2, sort_keys=True) + "\n")
    (out / "command.txt").write_text(COMMAND + "\n")
    (out / "report.md").write_text(render_report(out, product, golden))
    (out / "README.md").write_text(render_readme(product, golden, env, bundle_identity(out, product, golden), problems))
    write_manifest(out)
