"""LoadErrorReportingConnector keyed, like ExampleConnector, by token ids alone, but with the
format each prompt was stored in written beside its files: asked for in another format (an
fp8_e4m3 engine over fp8_e5m2 KV, the same uint8 bytes), it still finds the prompt, then reports
its blocks as failed loads (``get_block_ids_with_load_errors``) instead of serving them. vLLM
fails those requests cleanly (``kv_load_failure_policy=fail``): the refusal the format clauses
ask for, never KV of the other format. The positive control that a clean refusal is judged a
miss (ExampleConnector, the same without the check, is served the other format's bytes)."""

from __future__ import annotations

import os

from conformance.zoo.good.load_error_reporting import LoadErrorReportingConnector

FORMAT_FILE = "kv_cache_dtype"  # beside a prompt's layer files: the format they were stored in (and model dtype)


class FormatRefusingConnector(LoadErrorReportingConnector):
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        super().save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
        for request in self._get_connector_metadata().requests:
            if request.is_store:
                with open(self._format_file(request), "w") as f:
                    f.write(self._format())

    def _readable(self, request, forward_context) -> bool:
        try:
            with open(self._format_file(request)) as f:
                stored = f.read()
        except (OSError, ValueError):  # missing, or damaged past decoding: unreadable either way
            return False
        return stored == self._format() and super()._readable(request, forward_context)

    def _format_file(self, request) -> str:
        folder = self._generate_foldername_debug(request.token_ids, request.mm_hashes, create_folder=True)
        return os.path.join(folder, FORMAT_FILE)

    def _format(self) -> str:
        """The KV's element format: the config string, and under "auto" the model's dtype (the cache
        takes it, so one string names other bytes)."""
        return f"{self._vllm_config.cache_config.cache_dtype}/{self._vllm_config.model_config.dtype}"
