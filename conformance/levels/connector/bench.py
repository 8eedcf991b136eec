"""The connector under test on one model geometry (``Bench``), and how the suite calls its hooks.

What a connector pair (pair.py) is built from and calls the connector through, and what the harness
(harness.py) extends with whole engine lifetimes; both import it, so neither imports the other's
privates. An exception from a hook is the connector's (``ConnectorRaised``); from a hook that builds
it or registers the caches, it declines the layout (``LayoutRefused``) or leaves the connector
unbuilt (``NotBuilt``); what is built is guarded under the timeout, each call a heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from conformance.levels.connector.eras import Era
from conformance.levels.connector.runs import ConnectorRaised, LayoutRefused, NotBuilt
from conformance.levels.subject import ConnectorChoice
from conformance.verdict.forked import beat
from conformance.verdict.guard import Guarded, HarnessError, call_within


@dataclass
class Bench:
    """The connector under test on one model geometry: what each of its connector pairs is built from."""

    era: Era
    connector: ConnectorChoice
    model: Path
    workdir: Path
    num_blocks: int = 64
    timeout_s: float = 60.0
    extra_config: Mapping[str, Any] = field(default_factory=dict)  # what the suite started (servers)

    def guarded(self, target: Any, name: str) -> Guarded:
        """``target``'s calls under the timeout, each a heartbeat, named ``name`` after the connector."""
        return Guarded(target, name=f"{self.connector.label} {name}", timeout_s=self.timeout_s, noun="connector",
                       on_call=beat)

    def build(self, name: str, factory: Callable[..., Any], *args: Any) -> Guarded:
        """``factory(*args)`` as a setup hook, under the timeout (a constructor that waits forever is an
        Error, not a hung run), its result guarded as ``name``."""
        phase = f"building the {name}"
        def timed(*a: Any) -> Any:
            beat()
            return call_within(self.timeout_s, f"{self.connector.label} {phase}", factory, *a)

        return self.guarded(setup(phase, timed, *args), name)


def hook(phase: str, call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)``, a hook of the connector: what it raises is the connector's (``ConnectorRaised``),
    but for the suite's own ``HarnessError`` (a hang)."""
    try:
        return call(*args)
    except HarnessError:
        raise
    except Exception as exc:
        raise ConnectorRaised(phase, exc) from exc


def setup(phase: str, call: Callable[..., Any], *args: Any) -> Any:
    """A hook that builds a connector or registers the caches: NotImplementedError there declines
    the layout; anything else it raises there is NotBuilt (Not runnable)."""
    try:
        return hook(phase, call, *args)
    except ConnectorRaised as exc:
        if isinstance(exc.exc, NotImplementedError):
            raise LayoutRefused(exc.phase, exc.exc) from exc.exc
        raise NotBuilt(exc.phase, exc.exc) from exc.exc
