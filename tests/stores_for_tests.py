"""Factories that fail the way a user's store might, for tests of the plugin's messages."""

import json
import os

from conformance.contract.store import StoreNotRunnable
from conformance.stores.memory import MemoryStore


def raising_factory(workdir):
    raise RuntimeError("server unreachable")


# Secrets as a deployment configures them (planted_configuration), and the variable that hands
# secret_leaking_store what it was configured with besides its KVCONFORM_* variables.
PLANTED = ("S3CRET-IN-URL", "S3CRET-IN-PAIR", "S3CRET-IN-QUERY", "S3CRET-IN-ENV", "S3CRET-IN-EXTRA",
           "S3CRET-IN-ENGINE-ENV")
LEAKED = "LEAKED_BY_THE_STORE"


def planted_configuration() -> tuple[dict[str, str], list[str]]:
    """Where a deployment puts PLANTED (but the first, a URL's password no config holds): (the
    environment, the suite's options). The store echoes them all (secret_leaking_store)."""
    env = {"KVCONFORM_REDIS_PASSWORD": PLANTED[1], "KVCONFORM_KV_URL": f"https://kv.example.invalid/x?token={PLANTED[2]}",
           "KVCONFORM_REDIS_URL": f"redis://svc:{PLANTED[3]}@h:1", LEAKED: f"{PLANTED[4]} {PLANTED[5]}"}
    extra = {"tier": {"backends": [{"name": "s3", "secret_key": PLANTED[4]}]}}
    return env, [f"--kv-connector-extra-config={json.dumps(extra)}", f"--kv-engine-env=S3_CREDS={PLANTED[5]}"]


class _SecretLeaking(MemoryStore):
    """A store whose errors carry the credentials it was configured with, as a client library's
    often do: a URL's password, its KVCONFORM_* variables, and what LEAKED lists."""

    def put(self, key, entry):
        configured = [v for k, v in sorted(os.environ.items()) if k.startswith("KVCONFORM_")]
        raise RuntimeError(f"cannot reach redis://svc:{PLANTED[0]}@10.0.0.1:6379/0 configured with "
                           f"{[*configured, *os.environ.get(LEAKED, '').split()]}")


def secret_leaking_store():
    return _SecretLeaking()


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
