"""A P/D consumer that writes the producer's blocks into its own in reverse order (a block table
read back to front): every multi-block prompt is handed another position's KV. ``api_pd_roundtrip``
and ``engine_pd_roundtrip`` must flag it."""

from conformance.zoo.good.peer import PeerConnector


class ReversedBlocksPeerConnector(PeerConnector):
    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        for load in self._loads:
            if load["request_id"] == request.request_id:
                load["local"] = [group[::-1] for group in load["local"]]
