"""The format-refusing control, with the format it writes beside a prompt's files taken from the
``kv_cache_dtype`` string alone: an fp8_e4m3 engine over fp8_e5m2 KV is refused, but under "auto" a
bf16 model's KV and an fp16 model's are one format to it, and the second is served the first's bytes
(in place, they do not even have the same element type: the worker raises)."""

from __future__ import annotations

from conformance.zoo.good.format_refusing import FormatRefusingConnector


class ConfigStringFormatConnector(FormatRefusingConnector):
    def _format(self) -> str:
        return str(self._vllm_config.cache_config.cache_dtype)
