"""Version strings, read one way everywhere (matrix columns, API history, server gates)."""

from __future__ import annotations

import re


def version_key(version: str) -> tuple[int, ...]:
    """A sort key: ``0.10.2`` after ``0.9.2``; a local part (``+cpu``) or suffix does not count, and a
    string with no number (``not installed``) sorts before every release."""
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3])
