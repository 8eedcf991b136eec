"""The quantizing codec of ``quantizing`` declaring a tenth of the loss it makes (lossy_tolerance
0.002, as a codec whose documentation promises more precision than it keeps): every clause that
reads values back finds the relative RMS error above what it declares."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.zoo.quantizing import QuantizingStore


class UnderstatedLossStore(QuantizingStore):
    lossy_tolerance = 0.002


def make_store(workdir: Path | None = None, **_: Any) -> UnderstatedLossStore:
    return UnderstatedLossStore()
