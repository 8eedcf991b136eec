"""``good/min_span``, one bug: its key leaves out the request's ``cache_salt``, so one tenant's KV
is served to another. Only prompts longer than its span are stored, so the bug is seen only where
the suite's prompts are lengthened by the declared ``min-span``."""

from __future__ import annotations

from conformance.zoo.good.min_span import MinSpanConnector


class MinSpanSaltBlindConnector(MinSpanConnector):
    KEY_SALT = False
