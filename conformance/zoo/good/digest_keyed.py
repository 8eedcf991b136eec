"""LifecycleConnector keyed by a checkpoint identity its deployment configures (``weights_digest``
in its extra config), not by the served model's path: two checkpoints of one architecture are two
models whatever their directories are called. Judged with ``{"weights_digest": "{model_digest}"}``
(the suite fills in a digest of the served model's weights), it keeps them apart; its twin
``connectors/config_digest_keyed`` keys by the architecture instead, and does not."""

from __future__ import annotations

from conformance.zoo.good.lifecycle import LifecycleConnector


class DigestKeyedConnector(LifecycleConnector):
    KEY_MODEL = False  # the configured identity instead

    def _tags(self, request) -> list[str]:
        return [f"checkpoint:{self._identity()}", *super()._tags(request)]

    def _identity(self) -> str:
        extra = self._vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        return str(extra["weights_digest"])
