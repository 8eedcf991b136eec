"""What code was tested: a module from a wheel is its distribution, version and RECORD, with an
installed file edited afterwards named; a module in a git checkout is its commit and dirty flag."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

FILES = {"acme_kv/__init__.py": "", "acme_kv/connector.py": "class AcmeConnector:\n    pass\n"}


def identify_in(path: Path, module: str) -> dict:
    code = "import json, sys; from conformance.util.identity import identify; print(json.dumps(identify(sys.argv[1])))"
    proc = subprocess.run([sys.executable, "-c", code, module], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(path), os.environ.get("PYTHONPATH", "")])})
    return json.loads(proc.stdout)


def installed_wheel(site: Path) -> None:
    """What pip leaves of a wheel: the files and a dist-info whose RECORD hashes them."""
    record = []
    for name, text in FILES.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text)}")
    info = site / "acme_kv-1.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-kv\nVersion: 1.2.0\n")
    (info / "top_level.txt").write_text("acme_kv\n")
    (info / "RECORD").write_text("\n".join([*record, "acme_kv-1.2.0.dist-info/RECORD,,"]) + "\n")


def test_a_wheel_is_its_distribution_and_an_edit_after_install_is_named(tmp_path):
    installed_wheel(tmp_path)
    found = identify_in(tmp_path, "acme_kv.connector")
    assert (found["distribution"], found["version"], found["problems"]) == ("acme-kv", "1.2.0", []), found
    assert len(found["record_sha256"]) == 64
    with open(tmp_path / "acme_kv" / "connector.py", "a") as edit:
        edit.write("# patched in place\n")
    found = identify_in(tmp_path, "acme_kv.connector")
    assert found["modified"] == ["acme_kv/connector.py"]
    assert "differs from the installed wheel's RECORD" in found["problems"][0]


def test_a_checkout_is_its_commit_and_uncommitted_changes_are_named(tmp_path):
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    git = ["git", "-c", "user.name=a", "-c", "user.email=a@example.invalid"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "v1"]):
        subprocess.run([*git, *args], cwd=tmp_path, check=True, capture_output=True)
    clean = identify_in(tmp_path, "acme_kv.connector")
    assert clean["git_commit"] and clean["dirty"] is False and clean["problems"] == [], clean
    (tmp_path / "acme_kv" / "extra.py").write_text("x = 1\n")
    dirty = identify_in(tmp_path, "acme_kv.connector")
    assert dirty["dirty"] is True and "uncommitted changes (acme_kv/extra.py)" in dirty["problems"][0], dirty
    assert dirty["tree_sha256"] != clean["tree_sha256"]


def test_a_loose_directory_or_a_missing_module_has_no_version(tmp_path):
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    loose = identify_in(tmp_path, "acme_kv.connector")
    assert "neither installed from a wheel nor in a git checkout" in loose["problems"][0], loose
    missing = identify_in(tmp_path, "no_such_vendor.connector")
    assert "not importable here" in missing["problems"][0]


def test_the_distribution_of_a_package_is_found_by_its_top_level_name_or_inferred():
    """``distributions.providing`` reads top_level.txt first (a full scan of every file list took 0.7 s
    in a vLLM venv, twice per suite run) and infers only where no distribution names the package."""
    from importlib import metadata

    from conformance.util import distributions

    assert distributions.providing("conformance") == ("kvconform",)
    assert distributions.providing("no_such_top_level_package") == ()
    inferred = {top for top, dists in metadata.packages_distributions().items() if dists}
    assert all(set(distributions.providing(top)) <= set(metadata.packages_distributions()[top])
               for top in sorted(inferred)[:40])
