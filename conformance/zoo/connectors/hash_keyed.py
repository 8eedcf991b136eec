"""Keys what it stores by Python's builtin ``hash()`` of the prompt's token bytes, as a cache whose
author took ``hash()`` for a content hash. Within one interpreter (or across processes forked from
one) the key is stable; across two separately started ``vllm serve`` processes it is not: Python
salts the hash of str and bytes with a seed each interpreter draws at start (``PYTHONHASHSEED``),
so every restart, and every other instance, silently misses. ``engine_store_then_load`` flags it
(its load engine runs in an interpreter of another hash seed: 0 external hits); declared with
``--kv-engine-env PYTHONHASHSEED=0``, as such a connector's documentation would require, it loads.

(A tuple of ints would not do: CPython's int and tuple hashes are not salted, so ``hash(tuple(ids))``
is the same in every process. Bytes and str are.)
"""

import os

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector


class HashKeyedConnector(ExampleConnector):
    def _generate_foldername_debug(self, token_ids, mm_hashes, create_folder=False):
        key = token_ids.numpy().tobytes() + "-".join(mm_hashes or ()).encode()
        foldername = os.path.join(self._storage_path, f"{hash(key) & 0xFFFFFFFFFFFFFFFF:016x}")
        if create_folder:
            os.makedirs(foldername, exist_ok=True)
        return foldername
