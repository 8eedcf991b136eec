"""What a connector's failure to run says about it, read from its own words: a platform it refuses
(Not runnable, never Fail), a module it lacks, a config key it wanted, a cache it chose to run
without. Shared by the connector and the engine level."""

from __future__ import annotations

import contextlib
import logging
import re
from typing import Iterator

# How a connector says this machine is not one it runs on (vLLM's CPU offloading worker: "CPU
# Offloading is currently only supported on CUDA-alike and XPU GPUs"; a load path that moves
# tensors to CUDA: "Found no NVIDIA driver on your system"). Said while it is built or registers
# its caches, before any KV moved, it is Not runnable with those words, not the connector's Fail.
# "re-initialize CUDA in forked subprocess": a CUDA call in a process forked after torch touched CUDA
# (the suite forks each clause's process), which on any machine means no usable device there.
_REFUSAL = re.compile(r"only supported on|not supported on|no NVIDIA driver|not compiled with CUDA|"
                      r"re-initialize CUDA in forked subprocess|requires? (a |an )?(CUDA|GPU|NVIDIA|XPU)", re.IGNORECASE)
_DEVICE = re.compile(r"\b(CUDA|CUDA-alike|GPUs?|XPU|ROCm|NVIDIA|HPU|TPU|NPU)\b", re.IGNORECASE)


def refuses_platform(message: str) -> bool:
    """Whether ``message`` is a connector declining this platform: a refusal naming a device."""
    found = _REFUSAL.search(message)
    return bool(found and _DEVICE.search(message, found.start()))


def cannot_run_here(label: str, error: str) -> str:
    """Why ``label`` is Not runnable when building it (or starting an engine with it) raised ``error``
    before any KV moved: a platform it declines, or (where its words name configuration) what to pass it."""
    if refuses_platform(error):
        return f"{label} declines this platform ({error})"
    return f"{label} could not be built here ({error}){_advice(error)}"


# KVTransferConfig fields a connector's refusal may name (--kv-transfer-config sets any of them).
TRANSFER_FIELD_NAMES = ("kv_load_failure_policy", "kv_buffer_size", "kv_buffer_device", "kv_port", "kv_ip",
                        "kv_rank", "kv_parallel_size", "engine_id", "enable_permute_local_kv")
_EXTRA_CONFIG_WORDS = re.compile(r"extra[_ ]config|KeyError", re.IGNORECASE)
_SAYS_NOTHING = re.compile(r"\b\w+(?:Error|Exception): ?\)?$")  # an exception raised with no message


def _advice(error: str) -> str:
    """What to pass, only where the error names it: a KVTransferConfig field, or the extra config."""
    field = next((f for f in TRANSFER_FIELD_NAMES if f in error), None)
    if field is not None:
        return f"; if it needs another {field}, pass --kv-transfer-config {field}=VALUE"
    if _EXTRA_CONFIG_WORDS.search(error):
        return "; if it needs configuration, pass it with --kv-connector-extra-config"
    if _SAYS_NOTHING.search(error.strip()):
        return "; it raised with no message: if it needs configuration, pass it with --kv-connector-extra-config"
    return ""


_NO_MODULE = re.compile(r"(?:ModuleNotFoundError|ImportError)\b.*?No module named '([\w.]+)'")


# What a connector logs when it chose, on this platform, to run without its cache (LMCache's
# "System will operate in degraded mode (recompute)").
_DEGRADED = re.compile(r"degraded mode|fall(?:ing|s)? back to recompute", re.IGNORECASE)
_ERROR_LINE = re.compile(r"^\w*(?:Error|Exception): .+$", re.MULTILINE)


@contextlib.contextmanager
def heard_degradation() -> Iterator[list[str]]:
    """The warnings logged while the block runs, by any logger (LMCache's do not propagate), that say
    the connector runs degraded: each quoted as its first line, the error it names and its verdict."""
    said: list[str] = []
    original = logging.Logger.handle

    def handle(self: logging.Logger, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            try:
                message = record.getMessage()
            except Exception:  # a malformed log call: logging's own handlers print it and go on, as they do
                message = ""
            if _DEGRADED.search(message):
                errors = _ERROR_LINE.findall(message)
                verdict = next(line for line in reversed(message.splitlines()) if _DEGRADED.search(line))
                said.append(" ... ".join(dict.fromkeys([message.splitlines()[0][:200], *errors[-1:], verdict.strip()])))
        original(self, record)

    logging.Logger.handle = handle  # type: ignore[method-assign]
    try:
        yield said
    finally:
        logging.Logger.handle = original  # type: ignore[method-assign]


def runs_degraded(label: str, said: list[str]) -> str:
    """Why a connector that chose to run without its cache here is Not runnable, in its own words."""
    return (f"{label} runs degraded on this platform, by its own account: {said[0]!r}; nothing it would store "
            "or load here is what it does where it is supported")


def missing_module(error: str) -> str | None:
    """The module an error says is not installed (a connector's own dependency), or None."""
    found = _NO_MODULE.search(error)
    return found.group(1) if found else None


def missing_dependency(label: str, error: str) -> str | None:
    """The Error message for a connector whose own dependency is not installed where it runs (no
    verdict can be had without it), or None where ``error`` says no such thing."""
    module = missing_module(error)
    if module is None:
        return None
    return (f"{label} needs the module {module!r}, which is not installed in the Python it runs in "
            f"({error.splitlines()[0][:300]}): install its dependencies there; no clause is judged without them")
