"""``good/mirrored``, one bug: its mirror leaves out the model's last layer, whose loads read the
file under its storage, with no checksum: after the suite damaged that storage, a flipped byte is
served as KV (api_damaged_storage), where the good one's loads never touch it."""

from conformance.zoo.good.mirrored import MirroredConnector


class MirrorGapConnector(MirroredConnector):
    def _mirrored(self, layer_name: str) -> bool:
        return not layer_name.startswith(f"model.layers.{self._vllm_config.model_config.hf_config.num_hidden_layers - 1}.")
