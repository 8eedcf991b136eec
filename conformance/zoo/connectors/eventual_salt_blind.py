"""``good/eventual``, one bug: its key leaves out the request's ``cache_salt``, so once a save is
visible, one tenant is served another's KV. Asked before its saves settle, every tenant misses
and it looks isolated: flagged only where the suite waits out the delay it declares (settle=1)."""

from conformance.zoo.good.eventual import EventualConnector


class EventualSaltBlindConnector(EventualConnector):
    KEY_SALT = False
