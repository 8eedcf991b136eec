"""AsyncCommitConnector reporting a save when it is queued, not when it is written: the requests
vLLM says finished are reported in ``finished_sending`` at once, and their blocks written a step
later. vLLM frees the blocks on the report, hands them to the next request, and its forward pass
overwrites them before the write reads them: what is stored as the prompt's KV is another's. The
one-bug twin of the async-commit known-good (the report must follow the write)."""

from __future__ import annotations

from conformance.zoo.good.async_commit import AsyncCommitConnector


class EarlyReportConnector(AsyncCommitConnector):
    def get_finished(self, finished_req_ids):
        super().get_finished(finished_req_ids)  # commits what the step before noted
        return set(finished_req_ids) or None, None
