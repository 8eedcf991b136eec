"""The KV geometries the connector level shows a connector, and the one it shows a connector that
declares one-geometry (a daemon that sizes its slots once): every draw and scenario asks here for
its block size and dtype, so that pinned, no pair of another geometry is ever built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from conformance.levels.capabilities import one_geometry_refusal
from conformance.verdict.clauses import observe
from conformance.verdict.guard import HarnessError
from conformance.verdict.status import not_runnable

BLOCK_SIZES = (16, 32)  # what the drawn examples draw
SCENARIO_BLOCK = 16  # the scenarios' block size: the smallest the level draws, the most blocks per prompt


@dataclass(frozen=True)
class Geometry:
    """What a connector pair's KV caches are shaped by, besides the model: a daemon that sizes its
    slots once (one-geometry) takes one of these per process."""

    block_size: int
    kv_cache_dtype: str
    layout: str

    def __str__(self) -> str:
        return f"block_size={self.block_size}, kv_cache_dtype={self.kv_cache_dtype}, layout={self.layout}"


# The one geometry shown a connector that declares one-geometry: every draw and scenario is of it, and
# what would show it another is left out or Not runnable (``session.open_harness`` sets it once per
# session, before any clause runs). Empty: the level draws every geometry it has.
PINNED: list[Geometry] = []


def block_sizes(sizes: Sequence[int] = BLOCK_SIZES) -> tuple[int, ...]:
    """``sizes``, or the pinned block size alone."""
    return (PINNED[0].block_size,) if PINNED else tuple(sizes)


def block(size: int) -> int:
    """``size``, or the pinned block size: the block size of a scenario that would run at ``size``."""
    return block_sizes((size,))[0]


def scenario_block() -> int:
    """The scenarios' block size: SCENARIO_BLOCK, or the pinned one."""
    return block(SCENARIO_BLOCK)


def kv_dtype(name: str) -> str:
    """``name``, or the pinned kv_cache_dtype: the dtype of a scenario that would run with ``name``."""
    return PINNED[0].kv_cache_dtype if PINNED else name


def second_geometry(what: str) -> bool:
    """Whether a clause may show the connector ``what``, a second geometry in its process (a pair of
    another block size over the same storage); not for a one-geometry connector, and the clause's
    result says what it left out."""
    if PINNED:
        observe(f"left out, as the connector takes one geometry ({PINNED[0]}): {what}")
    return not PINNED


def one_geometry_refuses(what: str) -> None:
    """Not runnable for a one-geometry connector: the clause's promise is about ``what``, a second
    geometry shown to one connector's storage."""
    if PINNED:
        not_runnable(one_geometry_refusal(str(PINNED[0]), what))


def within_pin(geometry: Geometry, model_dtype: str | None) -> None:
    """A one-geometry connector is shown its pinned geometry only: a scenario that asks for another is
    the suite's fault (a HarnessError, never the connector's Fail)."""
    if PINNED and (geometry != PINNED[0] or model_dtype is not None):
        served = f" with the model served as {model_dtype}" if model_dtype else ""
        raise HarnessError(f"kvconform asked for a connector pair of {geometry}{served}, but the connector declares "
                           f"one-geometry and is judged at {PINNED[0]} only: a scenario the pin missed (kvconform's bug)")
