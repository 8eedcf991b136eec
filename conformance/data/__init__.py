"""Package data, read with importlib.resources: the model recipes (``models/``) and the committed vLLM
API fingerprints (``api/``). In a checkout both are links to the top-level ``fixtures/``, where the suite's
fixture data lives; a wheel ships them as files here."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def data_dir(name: str) -> Path:
    """The directory of package data ``name`` (``models``, ``api``)."""
    return Path(str(files(__name__) / name))
