"""LifecycleConnector over eventually consistent storage: what it saved is found by a lookup only
``VISIBLE_AFTER_S`` after it was written (a store that commits in the background, replicates
before it serves, or lists objects some time after their upload). Legal: a deployment asks again
later. Declared ``settle=1``, the suite asks only once that long has passed since the saves were
reported, and it passes; its tenant-leaking twin (``connectors/eventual_salt_blind``) is flagged
only because the suite waits."""

from __future__ import annotations

import os
import time

from conformance.zoo.good.lifecycle import LifecycleConnector


class EventualConnector(LifecycleConnector):
    VISIBLE_AFTER_S = 1.0

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        found = super().get_num_new_matched_tokens(request, num_computed_tokens)
        return found if self._visible(request) else (0, False)

    def _visible(self, request) -> bool:
        """Whether what a lookup of ``request`` would find was written long enough ago to be listed."""
        folder = self._lookup_folder(request)
        return not os.path.isdir(folder) or time.time() - os.path.getmtime(folder) >= self.VISIBLE_AFTER_S
