"""What the connector-level clauses draw: dtypes, layouts, prompts, and cache fills.

Prompts start with tokens unique to the example, so that a connector whose storage outlives
an example (a server) never serves one example's KV to the next: a hit is always this
example's own store.
"""

from __future__ import annotations

import itertools
import os
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from hypothesis import strategies as st

from conformance.contract.spec import SAME_WIDTH_TWINS, resolve_kv_cache_dtype
from conformance.contract.strategies import active_kv_cache_dtypes, bits_dtype, raw_bit_patterns
from conformance.levels.connector.geometry import PINNED, kv_dtype, scenario_block
from conformance.verdict.status import not_runnable

if TYPE_CHECKING:
    from conformance.levels.connector.harness import ConnectorHarness
    from conformance.levels.connector.runs import Phase, Run

# The dtypes the CPU backend allocates (vLLM's CacheDType strings); fp8 ones are uint8 tensors.
CPU_KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
# kv_cache_dtype twins the CPU backend allocates: same width, another element format.
TWINS = {dtype: twin for dtype, twin in SAME_WIDTH_TWINS.items() if {dtype, twin} <= set(CPU_KV_CACHE_DTYPES)}
MAX_PROMPT_BLOCKS = 5  # the longest prompt a drawn example asks for, in blocks of its block size
UNIQUE_PREFIX = 2  # tokens that make every example's prompts its own
# What every prompt is lengthened by for a connector that declares min-span=TOKENS (its span in whole
# SPAN_UNITs: the largest block size the level runs, so no prompt moves against a block boundary);
# set once per session, before any clause runs (``session.open_harness``).
SPAN_UNIT = 64
SPAN = [0]
LOW_TOKEN = 2  # 0 and 1 are often special
_counter = itertools.count(1)


FELL_BACK: set[str] = set()  # dtypes vLLM runs as another here (session.probe_fallbacks, before any clause)


def axis_dtypes() -> list[str]:
    """The CPU dtype axis, narrowed by ``--kv-cache-dtypes`` when given, without the dtypes vLLM
    runs as another on this platform (no such KV cache exists to judge); the pinned one alone for a
    one-geometry connector."""
    if PINNED:
        return [PINNED[0].kv_cache_dtype]
    return [d for d in asked_dtypes() if d not in FELL_BACK]


def asked_dtypes() -> list[str]:
    """The CPU dtype axis, narrowed by ``--kv-cache-dtypes`` when given: what the run asks for."""
    return [d for d in CPU_KV_CACHE_DTYPES if d in active_kv_cache_dtypes()] or list(CPU_KV_CACHE_DTYPES)


def kv_cache_dtypes(among: Sequence[str] = ()) -> st.SearchStrategy[str]:
    """The axis, or the dtypes of ``among`` on it; none left: the clause is Not runnable."""
    left = [d for d in among if d in axis_dtypes()] if among else axis_dtypes()
    if not left:
        not_runnable(f"vLLM runs every kv_cache_dtype this clause would draw "
                     f"({', '.join(sorted(FELL_BACK))}) as another dtype here: no such KV cache exists to judge")
    return st.sampled_from(left)


@dataclass(frozen=True)
class Prompts:
    """Token ids for one example: ``stored`` and a ``neighbour`` with nothing in common."""

    stored: list[int]
    neighbour: list[int]
    vocab_size: int

    def diverging(self, k: int, tail_len: int) -> list[int]:
        """A prompt that shares exactly the first ``k`` tokens of ``stored``, then goes elsewhere."""
        tail = _unique(LOW_TOKEN, self.vocab_size) + self.neighbour[UNIQUE_PREFIX:][:tail_len]
        if k < len(self.stored) and tail[0] == self.stored[k]:
            tail[0] = LOW_TOKEN + (tail[0] + 1 - LOW_TOKEN) % (self.vocab_size - LOW_TOKEN)
        return self.stored[:k] + tail

    def twin(self, position: int, width: int = 1) -> list[int]:
        """``stored`` but for its tokens ``position`` to ``position + width``, each another id (the next
        one): a near miss that shares every token of ``stored`` but those, and so exactly its first
        ``position`` as a prefix (early, in the middle or late; by one token or by a block)."""
        changed = [LOW_TOKEN + (token + 1 - LOW_TOKEN) % (self.vocab_size - LOW_TOKEN)
                   for token in self.stored[position:position + width]]
        return self.stored[:position] + changed + self.stored[position + width:]


@st.composite
def prompts(draw: st.DrawFn, *, vocab_size: int, max_len: int, min_len: int = 1,
            min_neighbour_len: int = 1) -> Prompts:
    """Two prompts of drawn lengths (plus their unique prefix tokens) and seeded random tokens."""
    n = draw(st.integers(min_len, max_len), label="prompt_len")
    m = draw(st.integers(min_neighbour_len, max_len), label="neighbour_len")
    return unique_prompts(vocab_size, n, m, seed=draw(st.integers(0, 2**16), label="token_seed"))


def unique_prompts(vocab_size: int, n: int, m: int = 8, *, seed: int, spanned: bool = True) -> Prompts:
    """A stored prompt of ``n`` and a neighbour of ``m`` random tokens, each after its unique prefix
    (``spanned``: each lengthened by the declared min span, ``SPAN``)."""
    n, m = (n + SPAN[0], m + SPAN[0]) if spanned else (n, m)
    body = torch.randint(LOW_TOKEN, vocab_size, (n + m,), generator=torch.Generator().manual_seed(seed)).tolist()
    return Prompts(_unique(LOW_TOKEN, vocab_size) + body[:n], _unique(LOW_TOKEN, vocab_size) + body[n:], vocab_size)


def _unique(low: int, vocab_size: int) -> list[int]:
    """Two tokens no other example of this process (or of a parallel one) starts with."""
    value = next(_counter) * 7919 + os.getpid()
    span = vocab_size - low
    return [low + value % span, low + (value // span) % span]


def seeded_fill(seed: int) -> Callable[[torch.Tensor, torch.dtype, str], None]:
    """Random bytes from ``seed``: a fixed fill for the suite's own probes."""

    def fill(raw: torch.Tensor, allocated: torch.dtype, model_dtype: str) -> None:
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)))

    return fill


def filler(data: st.DataObject, kv_cache_dtype: str) -> Callable[[torch.Tensor, torch.dtype, str], None]:
    """Fills a run's backing bytes with drawn bit patterns of the dtype's element format.

    The storage dtype vLLM allocated must be the one the KV contract names for the string
    (uint8 for every fp8 format); a disagreement is reported, never papered over.
    """
    def fill(raw: torch.Tensor, allocated: torch.dtype, model_dtype: str) -> None:
        storage, fmt = resolve_kv_cache_dtype(kv_cache_dtype, model_dtype)
        if allocated != storage:
            raise AssertionError(f"vLLM allocated {allocated} for kv_cache_dtype={kv_cache_dtype!r}, "
                                 f"the KV contract says {storage}")
        bits = data.draw(raw_bit_patterns(fmt, raw.numel()), label="cache_bits")
        raw.view(bits_dtype(fmt)).copy_(bits)

    return fill


def scenario_lifetime(api: ConnectorHarness, phases: list[Phase], **knobs: Any) -> list[Run]:
    """One connector pair's lifetime over fresh storage, in the scenarios' block size, the default
    kv_cache_dtype (or the pinned geometry's) and the first layout the installed vLLM allocates."""
    return api.lifetime(kv_cache_dtype=kv_dtype("auto"), layout=api.era.layouts()[0], block_size=scenario_block(),
                        phases=phases, storage=f"scenario-{uuid.uuid4().hex[:12]}", **knobs)
