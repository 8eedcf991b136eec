"""Claims the whole stored prefix whatever vLLM's own prefix cache already holds: its
get_num_new_matched_tokens ignores ``num_computed_tokens`` (the count it returns is of tokens *beyond*
them). With the prefix cache reset before every lookup, as the other scenarios have it, that number is
0 and the bug is silent; a request with local hits is claimed its local tokens twice."""

from __future__ import annotations

from conformance.zoo.good.lifecycle import LifecycleConnector


class OverClaimingConnector(LifecycleConnector):
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return super().get_num_new_matched_tokens(request, 0)
