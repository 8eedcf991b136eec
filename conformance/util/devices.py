"""What devices this machine has, read without touching a device (no CUDA call, no torch import)."""

from __future__ import annotations

import shutil
from pathlib import Path


def nvidia_gpu() -> bool:
    """An NVIDIA driver is loaded (``/proc/driver/nvidia/version``) or ``nvidia-smi`` is installed."""
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None
