"""vLLM's Python sources from a directory, an sdist (tar.gz) or a wheel (zip), without importing them.

Archives are streamed member by member and only ``vllm/**/*.py`` is kept (in memory), so a
40 MB sdist is read without unpacking it to disk.
"""

from __future__ import annotations

import ast
import hashlib
import re
import tarfile
import zipfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator


class SourceError(ValueError):
    """The path holds no vLLM package that can be read; the message is one line."""


@dataclass
class SourceTree:
    """``vllm/...py`` path -> text, the version they are, and where they came from."""

    files: dict[str, str]
    version: str
    origin: dict[str, Any]
    _trees: dict[str, ast.Module] = field(default_factory=dict, repr=False)

    def module_name(self, path: str) -> str:
        parts = path[: -len(".py")].split("/")
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    @cached_property
    def modules(self) -> dict[str, str]:
        """Dotted module name -> path."""
        return {self.module_name(p): p for p in sorted(self.files)}

    def tree(self, module: str) -> ast.Module:
        if module not in self._trees:
            path = self.modules[module]
            try:
                self._trees[module] = ast.parse(self.files[path], filename=path)
            except SyntaxError:  # a file for another Python; nothing connector-facing lives there
                self._trees[module] = ast.Module(body=[], type_ignores=[])
        return self._trees[module]

    def grep(self, pattern: str) -> Iterator[str]:
        """Modules (sorted) whose text matches ``pattern`` (a multiline regex): the cheap filter before ``ast``."""
        rx = re.compile(pattern, re.MULTILINE)
        return (m for m, p in self.modules.items() if rx.search(self.files[p]))


def _keep(name: str) -> str | None:
    """The ``vllm/...py`` path of an archive member, or None; sdists nest everything under ``vllm-X.Y/``."""
    if not name.startswith("vllm/"):
        name = name.split("/", 1)[1] if "/" in name else ""
    return name if name.startswith("vllm/") and name.endswith(".py") else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _version_from_module(text: str | None) -> str | None:
    """``__version__ = version = '0.32.0'`` in ``vllm/_version.py`` (setuptools-scm writes it)."""
    for node in ast.parse(text or "").body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    return None


def _version_from_metadata(text: str | None) -> str | None:
    return HeaderParser().parsestr(text).get("Version") if text else None


def _read_archive(path: Path) -> tuple[dict[str, str], str | None]:
    files: dict[str, str] = {}
    metadata: str | None = None
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            for name in zf.namelist():
                if (key := _keep(name)) is not None:
                    files[key] = zf.read(name).decode("utf-8", "replace")
                elif name.endswith((".dist-info/METADATA", "/PKG-INFO")) and metadata is None:
                    metadata = zf.read(name).decode("utf-8", "replace")
        return files, metadata
    try:
        with tarfile.open(path, "r|*") as tf:
            for member in tf:
                wanted = _keep(member.name)
                is_meta = member.name.count("/") == 1 and member.name.endswith("/PKG-INFO")
                if member.isfile() and (wanted or is_meta):
                    text = tf.extractfile(member).read().decode("utf-8", "replace")  # type: ignore[union-attr]
                    if wanted:
                        files[wanted] = text
                    else:
                        metadata = text
    except tarfile.TarError as exc:
        raise SourceError(f"{path}: not a readable zip or tar archive ({exc})") from None
    return files, metadata


def _read_directory(path: Path) -> tuple[Path, dict[str, str]]:
    package = path / "vllm" if (path / "vllm" / "__init__.py").exists() else path
    if not (package / "__init__.py").exists() or package.name != "vllm":
        raise SourceError(f"{path}: no vllm package here (expected {path}/vllm/__init__.py or a vllm/ directory)")
    files = {"vllm/" + p.relative_to(package).as_posix(): p.read_text("utf-8", "replace")
             for p in sorted(package.rglob("*.py")) if "__pycache__" not in p.parts}
    return package, files


def read(path: Path, version: str | None = None) -> SourceTree:
    """The vLLM sources at ``path``: a source tree, an installed ``vllm/`` package, an sdist or a wheel."""
    path = Path(path)
    if path.is_dir():
        package, files = _read_directory(path)
        origin: dict[str, Any] = {"kind": "directory", "path": str(package)}
        found = _version_from_module(files.get("vllm/_version.py"))
    elif path.is_file():
        files, metadata = _read_archive(path)
        origin = {"kind": "archive", "filename": path.name, "sha256": _sha256(path)}
        found = _version_from_module(files.get("vllm/_version.py")) or _version_from_metadata(metadata)
    else:
        raise SourceError(f"{path}: no such file or directory")
    if "vllm/__init__.py" not in files:
        raise SourceError(f"{path}: no vllm/__init__.py inside")
    return SourceTree(files, version or found or "unknown", origin)
