"""The lifecycle control behind a daemon that sizes its slots once, as KV daemons with preallocated
shared memory are started: for one block size and one kv_cache_dtype (``"slots":
"BLOCK_SIZE/KV_CACHE_DTYPE"`` in its extra config; "32/auto", the engine level's defaults, when not
given). A connector pair of another geometry is refused where it connects: its constructor raises,
as a client whose slot size the daemon does not take. Legal (a deployment runs one geometry), and
unjudgeable by a level that mixes block sizes and dtypes in one run: declared ``one-geometry``,
every clause shows it its slots' geometry only. Its one-bug twin is
``connectors/one_geometry_salt_blind``, whose bug only a judged run reaches."""

from __future__ import annotations

from conformance.zoo.good.lifecycle import LifecycleConnector

DEFAULT_SLOTS = "32/auto"


class OneGeometryConnector(LifecycleConnector):
    def __init__(self, vllm_config, *args, **kwargs):
        slots = str(vllm_config.kv_transfer_config.kv_connector_extra_config.get("slots", DEFAULT_SLOTS))
        block_size, _, kv_cache_dtype = slots.partition("/")
        cache = vllm_config.cache_config
        if (cache.block_size, cache.cache_dtype) != (int(block_size), kv_cache_dtype):
            raise RuntimeError(f"slot size mismatch: the daemon's slots hold blocks of {block_size} tokens of "
                               f"kv_cache_dtype={kv_cache_dtype}; this engine has blocks of {cache.block_size} "
                               f"tokens of kv_cache_dtype={cache.cache_dtype}")
        super().__init__(vllm_config, *args, **kwargs)
