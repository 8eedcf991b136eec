"""The KV contract: one ``KVSpec`` says what a paged KV tensor is, in vLLM's vocabulary.

Two components that move KV bytes must agree on four things, and the original fp8 bug broke
each of them: the storage dtype vLLM allocates (``uint8`` for every fp8 string), the element
format those bytes encode (only the ``kv_cache_dtype`` string says e4m3 vs e5m2), the tensor
layout and stride order (which change across vLLM releases and attention backends), and the
per-layer ``k_scale``/``v_scale`` (which live on the attention layer, not in the page).

Every level of the suite (store, connector, engine) builds its inputs from this module, so
a spec means the same thing everywhere and appears identically in every report.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

import torch

from conformance.contract.formats import BF16, E4M3FN, E5M2, FP16, FP32, INT8, ElementFormat
from conformance.contract.names import KV_CACHE_DTYPE_NAMES


class KVSpecError(ValueError):
    """A spec that no vLLM engine could allocate, or a string no vLLM release knows."""


# kv_cache_dtype string -> (storage dtype, element format); None means "the model dtype".
# Mirrors vLLM's STR_DTYPE_TO_TORCH_DTYPE plus the "auto" rule; the fp8 strings are uint8
# in storage, so the element format is the only thing that tells them apart.
KV_CACHE_DTYPES: Mapping[str, tuple[torch.dtype | None, ElementFormat | None]] = {
    "auto": (None, None),
    "bfloat16": (torch.bfloat16, BF16),
    "float16": (torch.float16, FP16),
    "half": (torch.float16, FP16),
    "float": (torch.float32, FP32),
    "float32": (torch.float32, FP32),
    "fp8": (torch.uint8, E4M3FN),  # CUDA's fp8 is e4m3 (ROCm's fnuz variant is not modelled)
    "fp8_e4m3": (torch.uint8, E4M3FN),
    "fp8_e5m2": (torch.uint8, E5M2),
    "fp8_inc": (torch.float8_e4m3fn, E4M3FN),  # Intel Neural Compressor: a real float8 tensor
    "fp8_ds_mla": (torch.uint8, E4M3FN),  # DeepSeek sparse MLA: 656-byte packed tokens
    "int8": (torch.int8, INT8),
}

assert tuple(KV_CACHE_DTYPES) == KV_CACHE_DTYPE_NAMES  # sanity check: one list of names

MODEL_DTYPES: Mapping[str, ElementFormat] = {
    "bfloat16": BF16,
    "float16": FP16,
    "half": FP16,
    "float32": FP32,
    "float": FP32,
}

# MLA backends in vLLM accept these cache dtypes; e5m2/int8/fp8_inc have no MLA kernel.
MLA_KV_CACHE_DTYPES = frozenset({"auto", "bfloat16", "float16", "half", "float", "float32",
                                 "fp8", "fp8_e4m3", "fp8_ds_mla"})
FP8_DS_MLA_HEAD_SIZE = 656


class Layout(str, enum.Enum):
    """Logical per-layer shapes vLLM hands to connectors, by era and backend.

    B = blocks, N = tokens per block, H = KV heads, D = head size.
    """

    KV_FIRST = "kv_first"  # (2, B, N, H, D): FlashAttention <=0.22
    BLOCKS_FIRST = "blocks_first"  # (B, 2, N, H, D): FlashInfer/Triton; FlashAttention 0.23-0.25
    FUSED = "fused"  # (B, H, N, 2D): K|V packed in the last dim, 0.26+ and the CPU backend
    MLA = "mla"  # (B, N, D): one latent vector per token, no head dim


class StrideOrder(str, enum.Enum):
    """Memory order of the token and head dims; the logical shape never changes."""

    NHD = "NHD"
    HND = "HND"


# Logical dims -> memory order (vLLM's get_kv_cache_stride_order); identity = contiguous.
_STRIDE_ORDERS: Mapping[tuple[Layout, StrideOrder], tuple[int, ...]] = {
    (Layout.KV_FIRST, StrideOrder.NHD): (0, 1, 2, 3, 4),
    (Layout.KV_FIRST, StrideOrder.HND): (0, 1, 3, 2, 4),
    (Layout.BLOCKS_FIRST, StrideOrder.NHD): (0, 1, 2, 3, 4),
    (Layout.BLOCKS_FIRST, StrideOrder.HND): (0, 1, 3, 2, 4),
    (Layout.FUSED, StrideOrder.NHD): (0, 2, 1, 3),
    (Layout.FUSED, StrideOrder.HND): (0, 1, 2, 3),
    (Layout.MLA, StrideOrder.NHD): (0, 1, 2),
}
_BLOCK_DIM = {Layout.KV_FIRST: 1, Layout.BLOCKS_FIRST: 0, Layout.FUSED: 0, Layout.MLA: 0}


def _choices(valid: Any) -> str:
    return ", ".join(str(getattr(v, "value", v)) for v in valid)


@dataclass(frozen=True)
class KVSpec:
    """What one layer's paged KV tensor is: format, layout and geometry.

    >>> KVSpec(kv_cache_dtype="fp8_e5m2").storage_dtype
    torch.uint8
    >>> KVSpec(kv_cache_dtype="fp8_e5m2").element_format.name
    'e5m2'
    """

    kv_cache_dtype: str = "auto"
    model_dtype: str = "bfloat16"
    layout: Layout = Layout.BLOCKS_FIRST
    stride_order: StrideOrder = StrideOrder.NHD
    num_blocks: int = 2
    block_size: int = 16
    num_kv_heads: int = 8
    head_size: int = 128
    num_layers: int = 1
    cross_layer: bool = False
    _resolved: tuple[torch.dtype, ElementFormat] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layout", _coerce(Layout, self.layout, "layout"))
        object.__setattr__(self, "stride_order", _coerce(StrideOrder, self.stride_order, "stride_order"))
        object.__setattr__(self, "_resolved", resolve_kv_cache_dtype(self.kv_cache_dtype, self.model_dtype))
        self._validate_geometry()

    def _validate_geometry(self) -> None:
        for name in ("num_blocks", "block_size", "num_kv_heads", "head_size", "num_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise KVSpecError(f"{name}={value!r}, but it must be a positive integer")
        if (self.layout, self.stride_order) not in _STRIDE_ORDERS:
            valid = [o.value for (lay, o) in _STRIDE_ORDERS if lay is self.layout]
            raise KVSpecError(f"stride_order={self.stride_order.value!r} is impossible with "
                              f"layout={self.layout.value!r}; valid: {_choices(valid)}")
        if self.layout is Layout.MLA:
            if self.num_kv_heads != 1:
                raise KVSpecError(f"num_kv_heads={self.num_kv_heads}, but MLA caches one latent "
                                  "vector per token: num_kv_heads must be 1")
            if self.kv_cache_dtype not in MLA_KV_CACHE_DTYPES:
                raise KVSpecError(f"kv_cache_dtype={self.kv_cache_dtype!r} is not supported with "
                                  f"MLA; valid: {_choices(sorted(MLA_KV_CACHE_DTYPES))}")
        if self.kv_cache_dtype == "fp8_ds_mla" and (
                self.layout is not Layout.MLA or self.head_size != FP8_DS_MLA_HEAD_SIZE):
            raise KVSpecError(f"kv_cache_dtype='fp8_ds_mla' requires layout='mla' and "
                              f"head_size={FP8_DS_MLA_HEAD_SIZE}; got layout="
                              f"{self.layout.value!r}, head_size={self.head_size}")

    @property
    def storage_dtype(self) -> torch.dtype:
        """The torch dtype vLLM allocates for this cache (uint8 for the fp8 strings)."""
        return self._resolved[0]

    @property
    def element_format(self) -> ElementFormat:
        """What the stored bytes encode (e4m3fn vs e5m2 for two uint8 caches)."""
        return self._resolved[1]

    @property
    def layer_shape(self) -> tuple[int, ...]:
        """The logical shape of one layer's paged tensor."""
        b, n, h, d = self.num_blocks, self.block_size, self.num_kv_heads, self.head_size
        return {
            Layout.KV_FIRST: (2, b, n, h, d),
            Layout.BLOCKS_FIRST: (b, 2, n, h, d),
            Layout.FUSED: (b, h, n, 2 * d),
            Layout.MLA: (b, n, d),
        }[self.layout]

    @property
    def memory_order(self) -> tuple[int, ...]:
        """Logical dims in the order they are laid out in memory (outermost first)."""
        return _STRIDE_ORDERS[(self.layout, self.stride_order)]

    @property
    def block_dim(self) -> int:
        return _BLOCK_DIM[self.layout]

    @property
    def layer_nbytes(self) -> int:
        numel = 1
        for s in self.layer_shape:
            numel *= s
        return numel * self.storage_dtype.itemsize

    def replace(self, **changes: Any) -> KVSpec:
        """A copy with ``changes`` applied (and validated)."""
        return KVSpec(**{**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, stable: this is how specs appear in stored headers and reports."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        out["layout"] = self.layout.value
        out["stride_order"] = self.stride_order.value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KVSpec:
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(data) - known)
        if unknown:
            raise KVSpecError(f"unknown KVSpec field(s) {unknown}; valid: {_choices(sorted(known))}")
        return cls(**dict(data))

    def describe(self) -> str:
        """One line for ids and messages, e.g. ``fp8_e5m2(e5m2 in uint8) blocks_first/HND 2x16x8x128``."""
        fmt = self.element_format
        storage = str(self.storage_dtype).removeprefix("torch.")
        geometry = "x".join(str(x) for x in (self.num_blocks, self.block_size,
                                              self.num_kv_heads, self.head_size))
        cross = "+xlayer" if self.cross_layer else ""
        return (f"{self.kv_cache_dtype}({fmt.name} in {storage}) "
                f"{self.layout.value}/{self.stride_order.value}{cross} {geometry}")


def resolve_kv_cache_dtype(kv_cache_dtype: str, model_dtype: str) -> tuple[torch.dtype, ElementFormat]:
    """(storage dtype, element format) for a vLLM ``kv_cache_dtype`` string.

    ``auto`` means the model dtype, as in vLLM's ``kv_cache_dtype_str_to_dtype``.
    """
    if model_dtype not in MODEL_DTYPES:
        raise KVSpecError(f"model_dtype={model_dtype!r} is unknown; valid: {_choices(MODEL_DTYPES)}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise KVSpecError(f"kv_cache_dtype={kv_cache_dtype!r} is unknown; valid: {_choices(KV_CACHE_DTYPES)}")
    storage, fmt = KV_CACHE_DTYPES[kv_cache_dtype]
    if storage is None:
        fmt = MODEL_DTYPES[model_dtype]
        storage = fmt.torch_dtype
    assert fmt is not None  # sanity check: only "auto" leaves the format open
    return storage, fmt


# Pairs of kv_cache_dtype strings whose bytes mean different things (or sit in different containers):
# the same key must never serve one's bytes to the other. Most share a storage dtype, so nothing but
# the spec tells them apart. The store level draws every pair; the connector and engine levels, which
# allocate real caches, use each dtype's same-width twin (SAME_WIDTH_TWINS).
FORMAT_TWINS: tuple[tuple[str, str], ...] = (
    ("fp8_e4m3", "fp8_e5m2"),
    ("fp8", "fp8_e5m2"),
    ("bfloat16", "float16"),
    ("bfloat16", "fp8_e4m3"),
    ("float16", "fp8_e5m2"),
    ("fp8_e4m3", "fp8_inc"),
    ("int8", "fp8_e4m3"),
)


def _same_width_twins() -> dict[str, str]:
    width = {name: resolve_kv_cache_dtype(name, "bfloat16")[0].itemsize for pair in FORMAT_TWINS for name in pair}
    twins: dict[str, str] = {}
    for a, b in FORMAT_TWINS:
        if width[a] == width[b]:
            twins.setdefault(a, b)
            twins.setdefault(b, a)
    return twins


# kv_cache_dtype -> the first twin of the same element width: what a connector that keys KV by
# tokens alone serves in its place, with bytes of the same size and another meaning.
SAME_WIDTH_TWINS: Mapping[str, str] = _same_width_twins()


def same_width_twin(kv_cache_dtype: str, model_dtype: str) -> str | None:
    """The same-width twin of ``kv_cache_dtype`` (``auto`` is the model dtype), or None."""
    return SAME_WIDTH_TWINS.get(model_dtype if kv_cache_dtype == "auto" else kv_cache_dtype)


def _coerce(enum_cls: type[enum.Enum], value: Any, name: str) -> Any:
    try:
        return enum_cls(value)
    except ValueError:
        raise KVSpecError(f"{name}={value!r} is unknown; valid: {_choices(enum_cls)}") from None


def allocate_layers(spec: KVSpec) -> list[torch.Tensor]:
    """Zeroed per-layer tensors laid out exactly as vLLM's model runner lays them out.

    Each layer is ``raw.view(memory_shape).permute(inverse_order)``, so HND layers are
    non-contiguous views. With ``cross_layer`` every layer is a view into one buffer whose
    memory order is (blocks, layers, ...), as vLLM's cross-layer blocks are.
    """
    shape = spec.layer_shape
    order = list(spec.memory_order)
    mem_shape = [shape[d] for d in order]
    inverse = [order.index(d) for d in range(len(order))]
    if not spec.cross_layer:
        return [torch.zeros(mem_shape, dtype=spec.storage_dtype).permute(inverse)
                for _ in range(spec.num_layers)]
    # Cross-layer: the layer dim sits right after the block dim in memory.
    block_pos = order.index(spec.block_dim)
    buf_shape = mem_shape[: block_pos + 1] + [spec.num_layers] + mem_shape[block_pos + 1:]
    buf = torch.zeros(buf_shape, dtype=spec.storage_dtype)
    return [buf.select(block_pos + 1, i).permute(inverse) for i in range(spec.num_layers)]
