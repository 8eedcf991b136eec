"""The quota control with a lookup index in the scheduler (no stat of storage per lookup, as a
remote store's client keeps one): a prompt is indexed when its save is scheduled and never
unindexed, while the worker evicts its files past the quota. An evicted prompt is still claimed,
and the worker's best-effort load skips the files that are gone: the request runs on whatever its
blocks held. Only a workload past the quota meets it, and the quota is declared nowhere."""

from __future__ import annotations

import os

from conformance.zoo.good.quota import QuotaConnector


class StaleIndexConnector(QuotaConnector):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._index: set[tuple] = set()

    # --- scheduler side
    def _found_match_for_request(self, request) -> bool:
        return self._index_key(request) in self._index or super()._found_match_for_request(request)

    def _add(self, meta, rid: str, *, is_store: bool) -> None:
        super()._add(meta, rid, is_store=is_store)
        if is_store:
            self._index.add(self._index_key(self._admitted[rid]))

    def _index_key(self, request) -> tuple:
        return tuple(self._prompt(request)[:self._whole_blocks(request) * self._block_size]), tuple(self._tags(request))

    # --- worker side
    def start_load_kv(self, forward_context, **kwargs) -> None:
        meta = self._get_connector_metadata()
        meta.requests = [r for r in meta.requests
                         if r.is_store or os.path.isdir(self._generate_foldername_debug(r.token_ids, r.mm_hashes))]
        super().start_load_kv(forward_context, **kwargs)
