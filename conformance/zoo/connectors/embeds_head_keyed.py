"""The lifecycle control with a cheaper key for a prompt of embeddings: a digest of its first block's
rows only (hashing a long prompt's embeddings costs; their head "identifies" it). Two prompts whose
embeddings differ only after their first block, a conversation's later turns given as embeddings, are
one key: the second is served the first's KV."""

from __future__ import annotations

import hashlib

import torch

from conformance.zoo.good.lifecycle import LifecycleConnector


class EmbedsHeadKeyedConnector(LifecycleConnector):
    KEY_EMBEDS = False  # the control's digest of all of them, replaced below

    def _tags(self, request) -> list[str]:
        tags = super()._tags(request)
        embeds = request.prompt_embeds
        if embeds is None:
            return tags
        head = embeds[:self._block_size].contiguous().view(torch.uint8).numpy().tobytes()
        return [*tags, "embeds-head:" + hashlib.sha256(head).hexdigest()[:32]]
