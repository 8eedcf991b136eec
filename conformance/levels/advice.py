"""Advice a Not exercised message may give a connector's author: only what the run's own
observations support, else none. A hint that the run contradicts (a min-span hint to a connector
that declares one, or that was asked for prompts longer than any span) sends its author the wrong way.
"""

from __future__ import annotations

from conformance.levels.subject import ConnectorChoice

# A prompt at least this long is past any span a connector stores at once (LMCache's chunks are 256
# tokens, vLLM's blocks at most 128): a connector that declined it declined for a reason of its own.
LONGEST_SPAN = 4096


def span_advice(connector: ConnectorChoice, longest: int) -> str:
    """For a connector that loaded nothing: how long the prompts it was asked for were (``longest``
    tokens; 0: not observed), and how to declare a min span, where that could be why."""
    if connector.min_span or not 0 < longest < LONGEST_SPAN:
        return ""
    return (f"the longest prompt it was asked for had {longest} tokens: a connector that stores only longer spans "
            "declares min-span=TOKENS, and every prompt is then that much longer")


def settle_advice(connector: ConnectorChoice) -> str:
    """For a connector whose stored KV was not there when asked: how to declare a visibility delay,
    unless it declares one (then the suite waited it out)."""
    if connector.settle_s:
        return ""
    return ("a connector whose saves become visible only some time after the step that made them (or once its "
            "scheduler heard of them from its workers) declares settle=SECONDS: every later pass then waits that long "
            "and serves a request of its own first")


def geometry_advice(connector: ConnectorChoice) -> str:
    """For a connector that declined most drawn configurations once built for another in the same
    process: how to declare that it takes one geometry, unless it declares so (then it was shown one)."""
    if "one-geometry" in connector.capabilities:
        return ""
    return ("a connector (or its daemon) that takes one KV geometry per process declares one-geometry, and is judged "
            "at that one: --kv-block-size and the first of --kv-cache-dtypes")


def advised(*hints: str) -> str:
    """The hints that apply, as one parenthesis to end a message with (nothing where none does)."""
    found = [hint for hint in hints if hint]
    return f" ({'; or '.join(found)})" if found else ""
