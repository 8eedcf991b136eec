"""``good/env_configured``, one bug: its key leaves out the request's ``cache_salt``: one tenant of an
engine is served another's KV. Reached only where the suite gives it the environment it declares."""

from conformance.zoo.good.env_configured import EnvConfiguredConnector


class EnvSaltBlindConnector(EnvConfiguredConnector):
    KEY_SALT = False
