"""LifecycleConnector configured through its environment, as many deployments configure theirs (a
token, a region, a seed): it refuses to start without ``KVCONFORM_ZOO_TENANT`` and names what it
stores by it. Declared with ``--kv-engine-env KVCONFORM_ZOO_TENANT=...``, every level gives it that
environment; its twin ``connectors/env_salt_blind`` is then judged (and flagged) at the connector
level too, where without the declaration both are Not runnable."""

from __future__ import annotations

import os

from conformance.zoo.good.lifecycle import LifecycleConnector

TENANT = "KVCONFORM_ZOO_TENANT"


class EnvConfiguredConnector(LifecycleConnector):
    def __init__(self, *args, **kwargs):
        if not os.environ.get(TENANT):
            raise RuntimeError(f"{type(self).__name__} needs {TENANT} in its environment (its deployment sets it)")
        super().__init__(*args, **kwargs)

    def _tags(self, request) -> list[str]:
        return [f"tenant:{os.environ[TENANT]}", *super()._tags(request)]
