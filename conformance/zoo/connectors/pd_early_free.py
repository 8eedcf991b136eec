"""A P/D producer that lets vLLM free a request's blocks as soon as it finished (``request_finished``
returns False, so it reports no finished_sending) while its worker still serves them to the consumer
later: by the time the consumer pulls, vLLM has given the blocks to other requests and the consumer
is sent their KV. The premature-free bug of disaggregated prefill; ``api_pd_roundtrip`` must flag it."""

from conformance.zoo.good.peer import PeerConnector


class EarlyFreeConnector(PeerConnector):
    DELAY_FREE = False

    def get_finished(self, finished_req_ids):
        _, recving = super().get_finished(finished_req_ids)
        return None, recving  # vLLM already freed them: nothing to report
