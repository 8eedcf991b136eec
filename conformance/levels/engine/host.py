"""An engine host: ``python -m conformance.levels.engine.host`` imports vLLM once, then forks one
child per engine the suite asks for.

Importing torch and vLLM is most of an engine process's life on a small machine (about 10 of its
15 s: benchmarks/results/engine_tier.json); a child forked from a process that has only imported
them starts where a fresh process would be after its imports, and runs exactly what a fresh
``conformance.levels.engine.child`` process runs. Each child is a new process (its own KV cache,
prefix cache, connector and module state, nothing left by an engine before it), in its own
process group, with its output in its own log: it dies, hangs and is killed alone, and the suite
reads its RESULT.json as before. What a fork cannot give it, an interpreter of its own does: a
cell runs its load engines from a second host, started with another hash seed (``separate``), and
each child gets the random state a fresh interpreter has. The host runs one torch op, on one thread, to compile what every
engine's first step would compile (``_compile_ahead``; a pool of OpenMP threads would not survive
a fork, and none is started), freezes its heap before the first fork (``_freeze_heap``), and never
imports a connector's module. Its
protocol has an fd of its own: what an import prints on stdout goes to the host's log.

Protocol: ``forking``'s. A request is ``{"id", "spec", "result", "log", "env"}``; the ready line is
``{"ready": true, "import_s", "preloaded", "compiled_ahead", "hash_seed"}`` once its imports are done
(``{"ready": false, "why"}``, and it exits, where importing them started a thread or left CUDA
unusable in a fork).
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from conformance.levels.engine import child, separate
from conformance.util import forking
from conformance.util.devices import nvidia_gpu

# What an engine imports after ``from vllm import LLM``: the engine core, the CPU worker and model
# runner, the sampler and loader, LoRA, the connector factory, torch's compiler (vLLM compiles its
# logprob gather). Best effort: a name a release moved is skipped, and the child imports it itself.
PRELOAD = (
    "vllm", "vllm.entrypoints.llm", "vllm.inputs", "vllm.config", "vllm.v1.engine.llm_engine", "vllm.v1.engine.core",
    "vllm.v1.executor.uniproc_executor", "vllm.v1.worker.cpu_worker", "vllm.v1.worker.cpu_model_runner",
    "vllm.v1.worker.gpu_model_runner", "vllm.v1.sample.sampler", "vllm.v1.core.sched.scheduler",
    "vllm.v1.metrics.reader", "vllm.model_executor.model_loader", "vllm.model_executor.models.registry",
    "vllm.lora.request", "vllm.lora.model_manager", "vllm.distributed.kv_transfer.kv_connector.factory",
    "vllm.distributed.kv_transfer.kv_connector.v1.base", "torch._dynamo", "torch._inductor.compile_fx",
    "safetensors.torch", "compressed_tensors", "vllm.model_executor.layers.quantization.online.base",
    "vllm.v1.attention.backends.cpu_attn", "vllm.plugins.lora_resolvers.filesystem_resolver",
    "conformance.levels.releases",
)


def _preload() -> list[str]:
    loaded = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception:
            continue
    return loaded


def _compile_ahead() -> bool:
    """Compile, once, what vLLM torch.compiles at an engine's first step (its logprob rank count,
    ``batched_count_greater_than``: 2.5 s of every engine otherwise, inductor's cache or not), so
    each child forked after finds it compiled. Run on one thread, torch starts no OpenMP pool (the
    state a fork breaks); tqdm starts no monitor thread; ``main`` checks that no thread was left."""
    try:
        import torch
        import tqdm
        from vllm.v1.sample.ops.logprobs import batched_count_greater_than
    except Exception:  # a release without it: each engine compiles its own
        return False
    tqdm.tqdm.monitor_interval = 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for rows, vocab in ((1, 8), (2, 16), (3, 24)):  # both dimensions dynamic: one graph for every shape
            batched_count_greater_than(torch.zeros(rows, vocab), torch.zeros(rows, 1))
    except Exception:
        return False
    finally:
        torch.set_num_threads(threads)
    return True


def _freeze_heap() -> None:
    """Move what the host holds out of the collector's reach before any fork. vLLM collects garbage
    five times while an engine starts (its model loader, ``freeze_gc_heap``), and each full collection
    walks every object the imports made: half of an engine's start on two cores (1 of 2 s), paid by
    every child. Frozen objects are never traversed nor freed; nothing is garbage when they are frozen
    (collected first), so a child frees what it makes as before."""
    gc.collect()
    gc.freeze()


def _native_threads() -> int:
    """The host's threads as the kernel counts them (an OpenMP pool included, which Python does not see)."""
    return len(os.listdir("/proc/self/task"))


def _threads() -> int:
    """Python threads besides this one's. Native threads torch and vLLM start at import (idle pools
    with fork handlers, as when vLLM forks its own engine core process) are not counted."""
    import threading

    return threading.active_count()


def _cuda_unusable_in_forks() -> bool:
    """Whether a child forked now could not use CUDA: torch marks a fork that follows a CUDA call
    (PyPI's CUDA build asks for a device count at vLLM's import, GPU or not) as a bad fork, where a
    connector's ``.cuda()`` fails with another error than in a fresh process. Asked of a probe child."""
    torch = sys.modules.get("torch")
    bad_fork = getattr(getattr(torch, "_C", None), "_cuda_isInBadFork", None)
    if bad_fork is None:
        return False
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the probe
        os.write(write, b"1" if bad_fork() else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    return answer == b"1"


def refusal() -> str | None:
    """Why this host must not fork engines after its imports, or None."""
    threads = _threads()
    if threads > 1:  # a lock another thread holds at the fork stays held in the child forever
        return f"importing vLLM left {threads} Python threads in the host: forking it is unsafe"
    # Without an NVIDIA GPU no engine can use CUDA, forked or not (a connector that asks for it is
    # Not runnable either way); with one, a bad fork would take it from the engines.
    if nvidia_gpu() and _cuda_unusable_in_forks():
        return "importing vLLM made CUDA unusable in the host's forks (torch's bad fork)"
    return None


def _start(request: dict[str, Any], channel: int) -> int:
    def engine() -> None:
        separate.after_fork()
        child.run_spec(request["spec"], request["result"])

    return forking.fork_child(engine, Path(request["log"]), env=request.get("env"), close=(channel,))


def main() -> None:
    channel = forking.protocol_channel()
    child.prepare_environment({})
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # inductor compiles in process: no worker pool
    started = time.perf_counter()
    preloaded = _preload()
    native = _native_threads()
    compiled = _compile_ahead()
    why = refusal()
    left = _native_threads() - native
    if not why and left > 0:
        why = f"compiling vLLM's logprob op in the host left {left} more native thread(s)"
    if why:
        forking.say(channel, {"ready": False, "why": why})
        os._exit(0)
    _freeze_heap()
    ready = {"import_s": round(time.perf_counter() - started, 2), "preloaded": len(preloaded),
             "compiled_ahead": compiled, "hash_seed": separate.started_with()}
    forking.say(channel, {"ready": True, **ready})
    forking.serve(channel, lambda request: _start(request, channel), ready)


if __name__ == "__main__":
    main()
