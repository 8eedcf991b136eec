"""Fault injection a user can switch on: ``KVCONFORM_FAULT=kill-server-after-puts:K``.

A store whose adapter started its own server (``lmcache-redis``, ``lmcache-lm``) kills that
server with SIGKILL right after its K-th accepted put. The run then shows how the suite
reports a store whose infrastructure died under it: the clause running at that moment and
every later one are *Error* ("... stopped answering ..."), never a Fail and never a Pass on
data the store no longer has, and the run still finishes. Adapters that own no server refuse
the variable at construction rather than silently ignoring it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

FAULT_ENV = "KVCONFORM_FAULT"
KILL_SERVER_AFTER_PUTS = "kill-server-after-puts"
KINDS = (KILL_SERVER_AFTER_PUTS,)


@dataclass(frozen=True)
class Fault:
    """One injected fault: what to do, and after how many events."""

    kind: str
    count: int

    def __str__(self) -> str:
        return f"{FAULT_ENV}={self.kind}:{self.count}"


def parse(text: str) -> Fault:
    """``KIND:COUNT`` -> ``Fault``; ``ValueError`` with the valid forms otherwise."""
    kind, _, count = text.strip().partition(":")
    if kind not in KINDS or not count.isdigit() or int(count) < 1:
        raise ValueError(f"{FAULT_ENV}={text!r} is not understood; valid: "
                         + ", ".join(f"{k}:N (N >= 1)" for k in KINDS))
    return Fault(kind, int(count))


def from_env(env: Mapping[str, str] | None = None) -> Fault | None:
    """The fault ``$KVCONFORM_FAULT`` asks for, or None when it is unset or empty."""
    text = (os.environ if env is None else env).get(FAULT_ENV, "")
    return parse(text) if text.strip() else None
