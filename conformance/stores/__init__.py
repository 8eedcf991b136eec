"""Stores the store level runs, and what they are made from.

- The reference stores (memory.py, file.py): correct implementations of the store protocol, the
  suite's control group; every clause must pass on them, and the known-bad stores in
  ``conformance/zoo`` are small deviations from them.
- Adapters of real stores (lmcache_backends.py over lmcache_eras.py): LMCache's storage backends,
  judged as any store is, their verdicts theirs.
- loader.py chooses the store under test; faults.py injects the faults a test asks for.
- offloading_cpu.py and offloading_tiering.py: the transfer workers vLLM's OffloadingConnector runs
  with on a CPU (stores of KV blocks, for the connector levels); users' configs name them by module
  path (``spec_module_path: conformance.stores.offloading_cpu``), so they stay here.
"""
