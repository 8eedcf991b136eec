"""Hypothesis strategies for KV specs, KV contents as raw bit patterns, and their views.

A paged KV layer holds tens of thousands of elements, far more than Hypothesis should draw one
by one. So a content is drawn as a *seed* for a byte generator plus a short list of
*overrides*, each placing one of the format's special bit patterns at a drawn position.
Both shrink well: the seed towards 0, the overrides towards none, and a failure's
reproduction is the few specials that broke the store.

Layouts come in every realisation vLLM produces and more: contiguous, HND-permuted, sliced
out of a larger pool, padded with ``as_strided``, offset into its storage, and as one layer
of a cross-layer buffer. Each realisation holds the *same logical content*.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import torch
from hypothesis import strategies as st

from conformance.contract.formats import ElementFormat, special_bit_patterns
from conformance.contract.spec import (
    FORMAT_TWINS,
    FP8_DS_MLA_HEAD_SIZE,
    KV_CACHE_DTYPES,
    MLA_KV_CACHE_DTYPES,
    KVSpec,
    Layout,
    StrideOrder,
    resolve_kv_cache_dtype,
)
from conformance.contract.store import KVEntry

# (num_kv_heads, head_size) of real models, so shapes look like what connectors meet.
REAL_GQA_GEOMETRIES: tuple[tuple[int, int], ...] = (
    (8, 128),  # Llama-3-8B/70B, Qwen3-8B+
    (4, 128),  # Qwen3-4B / Qwen3.6-27B-FP8 (the original report's geometry per TP rank)
    (2, 64),   # small replicas
    (1, 256),  # Gemma-style wide heads, one KV head per rank
    (1, 64),   # a small model's one KV head per rank: an fp8 block of 16 tokens is a 2 KiB entry
)
REAL_MLA_HEAD_SIZES: tuple[int, ...] = (576,)  # DeepSeek-V2/V3: kv_lora_rank 512 + rope 64
BLOCK_SIZES: tuple[int, ...] = (16, 32)  # CUDA default 16; CPU needs multiples of 32
PADDING_BYTE = 0xA5  # fills memory around a view: leaking it shows up as 0xA5 bytes

VIEW_KINDS = ("contiguous", "stride_order", "storage_offset", "sliced", "padded", "cross_layer")
NON_CONTIGUOUS_VIEW_KINDS = ("stride_order", "sliced", "padded", "cross_layer")


_ACTIVE_KV_CACHE_DTYPES: list[tuple[str, ...]] = [tuple(KV_CACHE_DTYPES)]


def restrict_kv_cache_dtypes(names: Sequence[str]) -> None:
    """Limit every drawn spec to these cache dtypes (``--kv-cache-dtypes``; a certification
    profile such as ``fp8``). Unknown names raise ``ValueError`` listing the valid ones."""
    unknown = [n for n in names if n not in KV_CACHE_DTYPES]
    if unknown or not names:
        raise ValueError(f"kv_cache_dtypes={list(names)!r}, but valid: {', '.join(KV_CACHE_DTYPES)}")
    _ACTIVE_KV_CACHE_DTYPES[0] = tuple(names)


def active_kv_cache_dtypes() -> tuple[str, ...]:
    return _ACTIVE_KV_CACHE_DTYPES[0]


@st.composite
def kv_specs(draw: st.DrawFn, *, layouts: Sequence[Layout] = tuple(Layout),
             kv_cache_dtypes: Sequence[str] | None = None,
             max_blocks: int = 2) -> KVSpec:
    """Valid specs over every layout, stride order, cache dtype and a real geometry.

    * ``layouts`` restricts the layout axis.
    * ``kv_cache_dtypes`` restricts the dtype axis (default: ``active_kv_cache_dtypes()``).
    """
    dtypes = [d for d in (kv_cache_dtypes or active_kv_cache_dtypes())]
    usable = [lay for lay in layouts if _dtypes_for(lay, dtypes)]
    layout = draw(st.sampled_from(usable), label="layout")
    dtypes = _dtypes_for(layout, dtypes)
    kv_cache_dtype = draw(st.sampled_from(dtypes), label="kv_cache_dtype")
    if layout is Layout.MLA:
        heads = 1
        head_size = FP8_DS_MLA_HEAD_SIZE if kv_cache_dtype == "fp8_ds_mla" \
            else draw(st.sampled_from(REAL_MLA_HEAD_SIZES), label="head_size")
        stride_order = StrideOrder.NHD
    else:
        heads, head_size = draw(st.sampled_from(REAL_GQA_GEOMETRIES), label="geometry")
        stride_order = draw(st.sampled_from(list(StrideOrder)), label="stride_order")
    return KVSpec(
        kv_cache_dtype=kv_cache_dtype,
        model_dtype=draw(st.sampled_from(["bfloat16", "float16", "float32"]), label="model_dtype"),
        layout=layout,
        stride_order=stride_order,
        num_blocks=draw(st.integers(1, max_blocks), label="num_blocks"),
        block_size=draw(st.sampled_from(BLOCK_SIZES), label="block_size"),
        num_kv_heads=heads,
        head_size=head_size,
    )


def _dtypes_for(layout: Layout, dtypes: Sequence[str]) -> list[str]:
    if layout is Layout.MLA:
        return [d for d in dtypes if d in MLA_KV_CACHE_DTYPES]
    return [d for d in dtypes if d != "fp8_ds_mla"]


def bits_dtype(fmt: ElementFormat) -> torch.dtype:
    """The unsigned-width integer dtype used to write bit patterns of ``fmt``."""
    return {8: torch.uint8, 16: torch.int16, 32: torch.int32}[fmt.bits]


@st.composite
def bit_patterns(draw: st.DrawFn, spec: KVSpec, *, max_overrides: int = 24) -> torch.Tensor:
    """A contiguous tensor of ``spec``'s layer shape and storage dtype, drawn as raw bits.

    Random bytes from a drawn seed, then special bit patterns of the element format (±0, ±inf,
    NaN payloads, subnormals, extremes) at drawn positions; sometimes a whole tensor of one
    special value.
    """
    bits = draw(raw_bit_patterns(spec.element_format, spec.layer_nbytes, max_overrides=max_overrides))
    return bits.view(spec.storage_dtype).view(spec.layer_shape)


@st.composite
def raw_bit_patterns(draw: st.DrawFn, fmt: ElementFormat, nbytes: int, *, max_overrides: int = 24) -> torch.Tensor:
    """``nbytes`` of ``fmt`` elements as a flat tensor of raw bits (see ``bit_patterns``)."""
    specials = special_bit_patterns(fmt)
    numel = nbytes // (fmt.bits // 8)
    seed = draw(st.integers(0, 2**32 - 1), label="seed")
    raw = np.random.default_rng(seed).integers(0, 256, numel * (fmt.bits // 8), dtype=np.uint8)
    bits = torch.from_numpy(raw).view(bits_dtype(fmt))
    if draw(st.booleans(), label="uniform_special"):
        name = draw(st.sampled_from(sorted(specials)), label="uniform_value")
        bits.fill_(_signed(specials[name], fmt.bits))
    overrides = draw(st.lists(st.tuples(st.integers(0, numel - 1), st.sampled_from(sorted(specials))),
                              max_size=max_overrides), label="overrides")
    for index, name in overrides:
        bits[index] = _signed(specials[name], fmt.bits)
    return bits


def _signed(pattern: int, bits: int) -> int:
    """``pattern`` as the signed integer torch's int16/int32 need for the same bits."""
    if bits > 8 and pattern >= 1 << (bits - 1):
        return pattern - (1 << bits)
    return pattern


def realise(content: torch.Tensor, spec: KVSpec, kind: str, *, offset: int = 3,
            extra_blocks: int = 1, layer: int = 0, num_layers: int = 3) -> torch.Tensor:
    """A tensor with ``content``'s logical values, laid out in memory as ``kind`` says.

    Memory the view does not cover is filled with ``PADDING_BYTE``.
    """
    shape = spec.layer_shape
    order = list(spec.memory_order)
    inverse = [order.index(d) for d in range(len(order))]
    mem_shape = [shape[d] for d in order]
    if kind == "contiguous":
        out = torch.empty(shape, dtype=content.dtype)
    elif kind == "stride_order":
        out = _padded_empty(mem_shape, content.dtype).permute(inverse)
    elif kind == "storage_offset":
        buf = _padded_empty([content.numel() + offset], content.dtype)
        out = buf[offset:].view(shape)
    elif kind == "sliced":
        # A pool with more blocks than the request owns; the view is a block range inside it.
        pool_shape = list(mem_shape)
        block_pos = order.index(spec.block_dim)
        pool_shape[block_pos] += extra_blocks
        out = _padded_empty(pool_shape, content.dtype).narrow(block_pos, extra_blocks, shape[spec.block_dim])
        out = out.permute(inverse)
    elif kind == "padded":
        # Rows padded past the last dim: what a pitched allocation looks like.
        padded_shape = list(mem_shape)
        padded_shape[-1] += offset
        buf = _padded_empty(padded_shape, content.dtype)
        strides = buf.stride()
        out = buf.as_strided(mem_shape, strides).permute(inverse)
    elif kind == "cross_layer":
        block_pos = order.index(spec.block_dim)
        buf_shape = mem_shape[: block_pos + 1] + [num_layers] + mem_shape[block_pos + 1:]
        out = _padded_empty(buf_shape, content.dtype).select(block_pos + 1, layer).permute(inverse)
    else:
        raise ValueError(f"kind={kind!r}, but valid: {', '.join(VIEW_KINDS)}")
    out.copy_(content)
    return out


def _padded_empty(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    raw = torch.full((n * dtype.itemsize,), PADDING_BYTE, dtype=torch.uint8)
    return raw.view(dtype).view(list(shape))


class Realisation(NamedTuple):
    kind: str
    tensor: torch.Tensor


@st.composite
def realisations(draw: st.DrawFn, content: torch.Tensor, spec: KVSpec,
                 kinds: Sequence[str] = VIEW_KINDS) -> Realisation:
    """``content`` laid out as one of ``kinds`` (with drawn offsets, pools and layer)."""
    kind = draw(st.sampled_from(list(kinds)), label="view_kind")
    tensor = realise(content, spec, kind,
                     offset=draw(st.integers(1, 7), label="offset"),
                     extra_blocks=draw(st.integers(1, 2), label="extra_blocks"),
                     layer=draw(st.integers(0, 2), label="layer"))
    return Realisation(kind, tensor)


scales: st.SearchStrategy[float] = st.one_of(
    st.just(1.0),
    st.sampled_from([0.0078125, 0.5, 2.0, 448.0 / 240.0]),  # typical calibrated fp8 scales
    st.floats(min_value=1e-6, max_value=1e4, allow_nan=False, allow_infinity=False),
)


@st.composite
def kv_entries(draw: st.DrawFn, *, specs: st.SearchStrategy[KVSpec] | None = None,
               kinds: Sequence[str] = ("contiguous",)) -> KVEntry:
    """Entries whose tensor is drawn bit by bit and realised as one of ``kinds``."""
    spec = draw(specs if specs is not None else kv_specs(), label="spec")
    content = draw(bit_patterns(spec), label="content")
    kind, tensor = draw(realisations(content, spec, kinds), label="realisation")
    return KVEntry(spec, tensor, draw(scales, label="k_scale"), draw(scales, label="v_scale"))


# Payload sizes that straddle the limits real stores have (value-size caps, page sizes, message
# frames, chunking): each is swept at exactly the limit and one block past it. 64 MiB only where a
# run looks hard (deep, certify); beyond 2 GiB - 1 (32-bit lengths) is not swept: it would take
# more than a tenth of a 24 GiB machine's memory per copy.
MiB = 1 << 20
SIZE_LIMITS = (64 << 10, 512 << 10, MiB, 4 * MiB, 16 * MiB)
DEEP_SIZE_LIMITS = (*SIZE_LIMITS, 64 * MiB)


def sweep_entries(*, kinds: Sequence[str] = ("contiguous",), limits: Sequence[int] = ()) -> list[tuple[str, KVEntry]]:
    """Explicit examples a byte-level clause runs after its drawn ones, so that no run leaves a
    ``kv_cache_dtype`` of its axis, or a payload size limit, unexercised whatever the draws: one
    entry per active dtype (each realised as the next of ``kinds``), then, for the first dtype,
    one just at and one just past each of ``limits`` bytes. Their bits are random from a fixed seed
    with the format's specials in the first and the last elements."""
    out = []
    dtypes = list(active_kv_cache_dtypes())
    for i, dtype in enumerate(dtypes):
        spec = _sweep_spec(dtype, num_blocks=1)
        out.append((f"kv_cache_dtype={dtype}", seeded_entry(spec, kinds[i % len(kinds)], seed=i)))
    small = small_entry(kinds[len(dtypes) % len(kinds)])
    out.append((f"{small.spec.layer_nbytes} bytes (the smallest real entry, {small.spec.kv_cache_dtype})", small))
    wide = wide_entry(kinds[(len(dtypes) + 1) % len(kinds)])
    out.append((f"{wide.spec.num_blocks:,} blocks of {wide.spec.block_size} token (a dimension past 16 bits, "
                f"{wide.spec.kv_cache_dtype})", wide))
    first = _sweep_spec(dtypes[0], num_blocks=1)
    per_block = first.layer_nbytes
    for limit in limits:
        for blocks in sorted({max(1, limit // per_block), limit // per_block + 1}):
            spec = first.replace(num_blocks=blocks)
            out.append((f"{spec.layer_nbytes} bytes (limit {limit})", seeded_entry(spec, kinds[0], seed=blocks)))
    return out


# The smallest entry a real deployment writes: one KV head of 64 per rank, 16 tokens, 8-bit (2 KiB;
# 4 KiB in a 16-bit format). Stores that special-case small values (inline rows, slab classes,
# a minimum page) meet it in every byte-level clause's sweep, whatever the draws.
SMALL_ENTRY_GEOMETRY = (1, 64)


def small_entry_spec(dtypes: Sequence[str]) -> KVSpec:
    """The smallest real entry (``SMALL_ENTRY_GEOMETRY``, one block of 16) in the first 8-bit format of
    ``dtypes`` (else the first of them)."""
    usable = [d for d in dtypes if d != "fp8_ds_mla"] or ["auto"]
    narrow = [d for d in usable if resolve_kv_cache_dtype(d, "bfloat16")[1].bits == 8]
    heads, head_size = SMALL_ENTRY_GEOMETRY
    return KVSpec(kv_cache_dtype=(narrow or usable)[0], model_dtype="bfloat16", layout=Layout.KV_FIRST,
                  num_blocks=1, block_size=16, num_kv_heads=heads, head_size=head_size)


def small_entry(kind: str = "contiguous", *, seed: int = 7) -> KVEntry:
    """The smallest real entry (``small_entry_spec`` over the active dtypes), its bits from ``seed``."""
    return seeded_entry(small_entry_spec(active_kv_cache_dtypes()), kind, seed=seed)


# A dimension past 65,535: a pool of 65,537 one-token blocks (vLLM pools hold 100k blocks and more on a
# large GPU; block_size 1 is what MLA and sparse backends ask). A store that packs a shape into 16-bit
# fields, or indexes blocks by uint16, wraps it to 1; the entry is 8 MiB in an 8-bit format.
WIDE_BLOCKS = (1 << 16) + 1


def wide_entry(kind: str = "contiguous", *, seed: int = 11) -> KVEntry:
    """The smallest real entry's heads and format, in ``WIDE_BLOCKS`` one-token blocks."""
    spec = small_entry_spec(active_kv_cache_dtypes()).replace(num_blocks=WIDE_BLOCKS, block_size=1)
    return seeded_entry(spec, kind, seed=seed)


def sized_entry(nbytes: int, *, seed: int) -> KVEntry:
    """An entry of the first active dtype in the blocks that make ``nbytes`` (one at least), its bits from ``seed``."""
    first = _sweep_spec(active_kv_cache_dtypes()[0], num_blocks=1)
    return seeded_entry(first.replace(num_blocks=max(1, nbytes // first.layer_nbytes)), "contiguous", seed=seed)


def _sweep_spec(dtype: str, *, num_blocks: int) -> KVSpec:
    if dtype == "fp8_ds_mla":
        return KVSpec(kv_cache_dtype=dtype, layout=Layout.MLA, num_blocks=num_blocks, block_size=16,
                      num_kv_heads=1, head_size=FP8_DS_MLA_HEAD_SIZE)
    return KVSpec(kv_cache_dtype=dtype, model_dtype="bfloat16", layout=Layout.KV_FIRST, num_blocks=num_blocks,
                  block_size=16, num_kv_heads=8, head_size=128)


def seeded_entry(spec: KVSpec, kind: str = "contiguous", *, seed: int) -> KVEntry:
    """An entry of ``spec``: random bits from ``seed``, the format's specials at its start, middle
    and end, realised as ``kind``; scales 1.0 and 0.5."""
    fmt = spec.element_format
    width = fmt.bits // 8
    raw = np.random.default_rng(seed).integers(0, 256, spec.layer_nbytes, dtype=np.uint8)
    bits = torch.from_numpy(raw).view(bits_dtype(fmt))
    specials = [_signed(v, fmt.bits) for _, v in sorted(special_bit_patterns(fmt).items())]
    n = bits.numel()
    for i, value in enumerate(specials):  # at the start, at the very end, and in the middle
        bits[i % n] = value
        bits[n - 1 - i % n] = value
        bits[(n // 2 + i) % n] = value
    assert width * n == spec.layer_nbytes
    content = bits.view(spec.storage_dtype).view(spec.layer_shape)
    return KVEntry(spec, realise(content, spec, kind), 1.0, 0.5)


class TwinSpecs(NamedTuple):
    first: KVSpec
    second: KVSpec


# Under kv_cache_dtype "auto" the cache takes the model's dtype: two specs of one config string whose
# bytes mean different things, told apart only by their model dtype (a near miss of the format twins,
# which swap the config string).
MODEL_DTYPE_TWINS: tuple[tuple[str, str], ...] = (("bfloat16", "float16"), ("float16", "float32"))


def model_dtype_twins() -> list[TwinSpecs]:
    """Specs identical but for their model dtype, under "auto" (none unless "auto" is active)."""
    if "auto" not in active_kv_cache_dtypes():
        return []
    base = small_entry_spec(["auto"])
    return [TwinSpecs(base.replace(model_dtype=a), base.replace(model_dtype=b)) for a, b in MODEL_DTYPE_TWINS]


def active_format_twins() -> list[tuple[str, str]]:
    active = set(active_kv_cache_dtypes())
    return [pair for pair in FORMAT_TWINS if set(pair) <= active]


@st.composite
def format_twins(draw: st.DrawFn) -> TwinSpecs:
    """Two specs identical but for their ``kv_cache_dtype``, whose bytes mean different things.

    Only pairs within ``active_kv_cache_dtypes()``; the caller checks there is one.
    """
    a, b = draw(st.sampled_from(active_format_twins()), label="twin_dtypes")
    if draw(st.booleans(), label="swap"):
        a, b = b, a
    base = draw(kv_specs(layouts=[Layout.KV_FIRST, Layout.BLOCKS_FIRST, Layout.FUSED],
                         kv_cache_dtypes=[a]), label="base")
    twin = base.replace(kv_cache_dtype=b)
    assert (twin.element_format, twin.storage_dtype) != (base.element_format, base.storage_dtype)
    return TwinSpecs(base, twin)
