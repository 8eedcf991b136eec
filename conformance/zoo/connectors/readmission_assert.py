"""Keeps per-request state from a request's first admission and asserts it is never admitted
again; vLLM re-admits a preempted request (``get_num_new_matched_tokens`` is asked again), and the
assertion kills the engine (vLLM #46014, OffloadingConnector)."""

from conformance.zoo.good.lifecycle import LifecycleConnector


class ReadmissionAssertConnector(LifecycleConnector):
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        seen = self.__dict__.setdefault("_seen", set())
        assert request.request_id not in seen or not request.num_preemptions, \
            f"request {request.request_id} admitted twice"
        seen.add(request.request_id)
        return super().get_num_new_matched_tokens(request, num_computed_tokens)
