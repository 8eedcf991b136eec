"""``good/digest_keyed``, one bug: the identity it keys by is a digest of the model's config.json
(its architecture), so another checkpoint of the same architecture (a fine-tune, a later training
run) is served the first one's KV."""

from __future__ import annotations

import hashlib
import os

from conformance.zoo.good.digest_keyed import DigestKeyedConnector


class ConfigDigestKeyedConnector(DigestKeyedConnector):
    def _identity(self) -> str:
        with open(os.path.join(self._vllm_config.model_config.model, "config.json"), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:32]
