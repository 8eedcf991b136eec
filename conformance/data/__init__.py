"""Package data, read with importlib.resources: the model recipes (``models/``), the committed vLLM
API fingerprints (``api/``) and pip's constraints (``constraints/``, where the suite's torch pin is
written). In a checkout each is a link to the top-level folder of that name (``fixtures/models``,
``fixtures/api``, ``constraints``), where the data lives; a wheel ships them as files here."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def data_dir(name: str) -> Path:
    """The directory of package data ``name`` (``models``, ``api``, ``constraints``)."""
    return Path(str(files(__name__) / name))


def constraints(platform: str = "cpu") -> Path:
    """pip's constraints for the stacks of ``platform`` (``constraints/cpu.txt``): ``pip install -c``."""
    return data_dir("constraints") / f"{platform}.txt"


def torch_pin(platform: str = "cpu") -> str:
    """The torch requirement of ``platform``'s constraints (``torch==X.Y.Z``): the suite's one torch
    pin, written in that file alone (pip reads it there with ``-c``; the install recipe, a wheel
    outside a checkout and the PR gate's workflow read it here)."""
    for line in constraints(platform).read_text().splitlines():
        if line.split("#")[0].split("==")[0].strip().lower() == "torch":
            return line.split("#")[0].strip()
    raise LookupError(f"{constraints(platform)} pins no torch")
