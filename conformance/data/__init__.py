"""Package data, installed with the package (a wheel has it too): model recipes (``models/``)
and the committed vLLM API fingerprints (``api/``)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def data_dir(name: str) -> Path:
    """The directory of package data ``name`` (``models``, ``api``)."""
    return Path(str(files(__name__) / name))
