"""vLLM's ExampleConnector with one fix: a stored file it cannot read is reported as failed blocks
(``get_block_ids_with_load_errors``) instead of raised, so vLLM recomputes those blocks under
``kv_load_failure_policy=recompute`` (or fails only that request under ``fail``) and the engine
lives. The positive control of ``engine_load_failure_recompute``, which ExampleConnector fails.

It still has no checksum: a flipped byte that leaves the file parseable is loaded as KV
(``api_damaged_storage`` keeps failing it for that)."""

import safetensors.torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector


class LoadErrorReportingConnector(ExampleConnector):
    def start_load_kv(self, forward_context, **kwargs):
        metadata = self._get_connector_metadata()
        unreadable = [r for r in metadata.requests if not r.is_store and not self._readable(r, forward_context)]
        for request in unreadable:
            self._failed_blocks = getattr(self, "_failed_blocks", set())
            self._failed_blocks |= {int(s) // self._block_size for s in request.slot_mapping.tolist()}
        dropped = {id(r) for r in unreadable}
        metadata.requests = [r for r in metadata.requests if id(r) not in dropped]
        super().start_load_kv(forward_context, **kwargs)

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed: set[int] = getattr(self, "_failed_blocks", set())
        self._failed_blocks = set()
        return failed

    def _readable(self, request, forward_context) -> bool:
        for name, layer in forward_context.no_compile_layers.items():
            if getattr(layer, "kv_cache", None) is None:
                continue
            try:
                safetensors.torch.load_file(self._generate_filename_debug(name, request.token_ids, request.mm_hashes))
            except Exception:  # truncated, missing, unparseable: all one answer
                return False
        return True
