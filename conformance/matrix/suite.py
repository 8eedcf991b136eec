"""Where a stack venv gets kvconform itself from.

Run from a checkout, the checkout is installed editable into each stack venv, so a stack sees the
code being edited. Run from an installed wheel (``pip install kvconform`` anywhere), there is no
checkout to point at: the installed distribution's own files are packed back into a wheel, and
that wheel is what every stack venv installs. Either way a stack runs the very suite the runner runs.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from importlib import metadata
from pathlib import Path

DIST = "kvconform"
# Written by the installer, not part of what was built (PEP 376/610/627); RECORD is rewritten.
_INSTALLER_FILES = ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD")


def checkout() -> Path | None:
    """The source checkout this code runs from, or None when it runs from an installed wheel."""
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and f'name = "{DIST}"' in pyproject.read_text():
        return root
    return None


def source(cache: Path) -> Path:
    """What a stack venv installs: the checkout (a directory, installed editable) or a wheel under ``cache``."""
    return checkout() or repack(metadata.distribution(DIST), cache)


def repack(dist: metadata.Distribution, into: Path) -> Path:
    """A wheel holding the files ``dist`` installed under its site-packages, with a fresh RECORD.

    Scripts (installed outside site-packages) are left out: pip writes them again from the
    entry points, which travel in the dist-info like the rest of the metadata.
    """
    info = next((f for f in dist.files or () if f.parent.name.endswith(".dist-info")), None)
    if info is None:
        raise RuntimeError(f"{dist.metadata['Name']} {dist.version}: its installed files are not recorded "
                           f"(no RECORD), so it cannot be packed into a wheel for a stack venv")
    base, dist_info = Path(str(dist.locate_file(""))), info.parent.name
    members = sorted({str(f) for f in dist.files or ()
                      if ".." not in f.parts and "__pycache__" not in f.parts
                      and not (f.parent.name == dist_info and f.name in _INSTALLER_FILES)})
    wheel = Path(into) / f"{DIST}-{dist.version}-{_tag(base / dist_info / 'WHEEL')}.whl"
    wheel.parent.mkdir(parents=True, exist_ok=True)
    record = []
    with zipfile.ZipFile(wheel.with_suffix(".part"), "w", zipfile.ZIP_DEFLATED) as zf:
        for name in members:
            data = (base / name).read_bytes()
            zf.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        record.append(f"{dist_info}/RECORD,,")
        zf.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    wheel.with_suffix(".part").replace(wheel)
    return wheel


def _tag(wheel_file: Path) -> str:
    """The wheel's compatibility tag from its WHEEL metadata (``py3-none-any`` for kvconform)."""
    for line in wheel_file.read_text().splitlines():
        if line.startswith("Tag:"):
            return line.partition(":")[2].strip()
    return "py3-none-any"
