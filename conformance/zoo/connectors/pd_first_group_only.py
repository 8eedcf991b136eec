"""A P/D consumer that copies only the first KV cache group's blocks (as a connector written before
vLLM's hybrid KV cache manager reads ``block_ids[0]``): on a hybrid model the other groups' layers
(full attention beside gemma3's sliding window) keep whatever their blocks held. On a model with
one group it is correct. ``engine_pd_roundtrip`` must flag it on ``gemma3-hybrid-tiny``."""

from conformance.zoo.good.peer import PeerConnector


class FirstGroupOnlyConnector(PeerConnector):
    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        for load in self._loads:
            if load["request_id"] == request.request_id:
                for side in ("local", "remote"):
                    load[side] = [ids if g == 0 else [] for g, ids in enumerate(load[side])]
