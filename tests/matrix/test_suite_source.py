"""kvconform installed from a wheel provisions stack venvs with itself: its installed files are
packed back into a wheel that pip installs, entry points and package data included."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

from conformance.matrix import suite
from conformance.matrix.stacks import suite_steps

from tests.conftest import REPO


def _installed(site: Path) -> metadata.Distribution:
    """A distribution as pip leaves it: package, data, dist-info with installer files, a script, bytecode."""
    pkg, info = site / "kvconform_demo", site / "kvconform-9.9.dist-info"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__pycache__").mkdir()
    info.mkdir()
    files = {pkg / "__init__.py": "VALUE = 42\n", pkg / "data" / "model.json": '{"layers": 2}\n',
             pkg / "__pycache__" / "__init__.cpython-311.pyc": "bytecode",
             info / "METADATA": "Metadata-Version: 2.1\nName: kvconform\nVersion: 9.9\n",
             info / "WHEEL": "Wheel-Version: 1.0\nGenerator: setuptools\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             info / "entry_points.txt": "[pytest11]\nkvconform_demo = kvconform_demo\n",
             info / "INSTALLER": "pip\n", info / "direct_url.json": '{"url": "file:///somewhere/kvconform.whl"}\n'}
    for path, text in files.items():
        path.write_text(text)
    record = [f"{p.relative_to(site)},," for p in files] + ["../../../bin/kvconform,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(record) + "\n")
    return metadata.PathDistribution(info)


def test_an_installed_wheel_is_packed_back_with_what_pip_built_and_nothing_the_installer_wrote(tmp_path: Path) -> None:
    wheel = suite.repack(_installed(tmp_path / "site"), tmp_path / "cache")
    assert wheel.name == "kvconform-9.9-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    assert names == {"kvconform_demo/__init__.py", "kvconform_demo/data/model.json", "kvconform-9.9.dist-info/METADATA",
                     "kvconform-9.9.dist-info/WHEEL", "kvconform-9.9.dist-info/entry_points.txt",
                     "kvconform-9.9.dist-info/RECORD"}
    target = tmp_path / "target"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target),
                    str(wheel)], check=True, capture_output=True)
    assert (target / "kvconform_demo" / "data" / "model.json").read_text() == '{"layers": 2}\n'
    again = metadata.PathDistribution(target / "kvconform-9.9.dist-info")
    assert [ep.value for ep in again.entry_points.select(group="pytest11")] == ["kvconform_demo"]


def test_a_distribution_without_a_record_cannot_be_packed_and_says_so(tmp_path: Path) -> None:
    info = tmp_path / "kvconform-9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvconform\nVersion: 9.9\n")
    try:
        suite.repack(metadata.PathDistribution(info), tmp_path / "cache")
    except RuntimeError as exc:
        assert "no RECORD" in str(exc)
    else:
        raise AssertionError("a distribution without RECORD was packed")


def test_the_checkout_is_installed_editable_and_a_wheel_as_it_is(tmp_path: Path) -> None:
    assert suite.checkout() == REPO  # these tests run from the checkout
    wheel = tmp_path / "kvconform-9.9-py3-none-any.whl"
    wheel.write_bytes(b"")
    by_suite = {str(s): next(step.args for step in suite_steps(str(s), ()) if "kvconform" in step.what)
                for s in (REPO, wheel)}
    assert by_suite == {str(REPO): ("--no-deps", "-e", str(REPO)), str(wheel): ("--no-deps", str(wheel))}
