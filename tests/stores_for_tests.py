"""Factories that fail the way a user's store might, for tests of the plugin's messages."""

from conformance.contract.store import StoreNotRunnable
from conformance.stores.memory import MemoryStore


def raising_factory(workdir):
    raise RuntimeError("server unreachable")


PLANTED = ("S3CRET-IN-URL", "S3CRET-IN-PAIR", "S3CRET-IN-QUERY")


def secret_leaking_factory(workdir):
    """A store whose error message carries credentials, as a client library's often does."""
    raise RuntimeError(f"cannot reach redis://svc:{PLANTED[0]}@10.0.0.1:6379/0 (password={PLANTED[1]}); "
                       f"tried https://kv.example.invalid/x?token={PLANTED[2]}")


def not_runnable_factory(workdir):
    raise StoreNotRunnable("LMCache 0.1.3 has no lmcache.v1.storage_backend.local_cpu_backend.LocalCPUBackend")


class _NoCaps:
    def put(self, key, entry): ...
    def get(self, key, spec): ...
    def contains(self, key, spec): ...
    def close(self): ...


def no_capabilities():
    return _NoCaps()


def unknown_capability():
    store = MemoryStore()
    store.capabilities = frozenset({"teleport"})
    return store


class _DeleteLess(_NoCaps):
    capabilities = frozenset({"delete"})


def claims_delete_without_method():
    return _DeleteLess()


def crashing_factory(workdir):
    import os

    os._exit(3)  # the store's native code took the process down


def sleeping_factory(workdir):
    import time

    time.sleep(3600)  # never comes up


class _Lossy(MemoryStore):
    """Declares itself lossy but states no lossy_tolerance: nothing it returns could be judged."""

    capabilities = frozenset({"lossy", "scales", "delete"})


def lossy_store():
    return _Lossy()


class _Scaleless(MemoryStore):
    capabilities = frozenset({"delete"})


def scaleless_store():
    return _Scaleless()
