"""``good/reported``, one bug: its key leaves out the request's ``cache_salt``, so one tenant's KV is
served to another once its scheduler heard of the save."""

from __future__ import annotations

from conformance.zoo.good.reported import ReportedConnector


class ReportedSaltBlindConnector(ReportedConnector):
    KEY_SALT = False
