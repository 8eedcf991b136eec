"""One vLLM engine in its own process: ``python -m conformance.levels.engine.child SPEC.json RESULT.json``.

The parent never imports vLLM; it reads RESULT.json. Whatever happens (an import error, an
engine that refuses the config, a connector that raises) the result file says so, and the
process leaves through ``os._exit`` so that no teardown can hang it.

SPEC: ``model``, ``kv_cache_dtype``, ``block_size``, ``max_model_len``, ``kv_cache_mb``, ``num_blocks``
(the cache's blocks, vLLM's ``num_gpu_blocks_override``; default: what ``kv_cache_mb`` holds),
``torch_threads`` (torch's intra-op threads, set before the engine is built), ``prefill_chunk`` (vLLM's
``max_num_batched_tokens``: each prompt prefilled in chunks of that many tokens), ``cached_prefix``
(N: before each prompt or batch, the prefix cache is reset and each longer prompt's first N tokens
served, so vLLM's own prefix cache holds exactly them when the prompt is asked), ``drain`` (after
the batches, step until every block is back: the saves a later engine reads are reported; ``drained``
in the result says whether they were within ``DRAIN_S``),
``connector`` (KVTransferConfig kwargs or null), ``max_tokens``, ``logprobs`` and ``batches``:
``[{"name", "prompts": [[token ids]], "together": bool, "phase": int, "cache_salt": str,
"kv_transfer_params": [one dict per prompt], "abort_after_steps": int}]``; a batch ``together`` is
submitted in one ``generate`` call (concurrent requests), otherwise prompt by prompt; a batch with
``abort_after_steps`` is added at once and aborted through the engine's own ``abort_request`` after
that many engine steps (``aborted`` in the result says what became of it). Before the
first batch of each later phase the engine's own prefix cache is reset (``reset_prefix_cache``),
so what comes back in that phase comes back through the connector.
Logprobs are recorded as ``float.hex`` strings: compared as bits, never as floats.

A spec with ``lora_adapter`` (a directory) enables LoRA (``enable_lora``): the child writes two
seeded rank-8 adapters there (and beside it, ``-b``) for the model's ``k_proj`` and ``v_proj`` (so
each changes every layer's K and V) and loads them before the engine counts as started; a batch
with ``"lora": true`` runs its requests under the first, ``"lora": "b"`` under the second, and
``"lora": "a2"`` under another version of the first (its name, weights from ``-v2``, loaded in place).

A spec with ``prompt_embeds`` enables prompt embeddings (``enable_prompt_embeds``): a batch with
``"embeds": [seed per prompt]`` gives each prompt as embeddings of its length, drawn from a normal
distribution by that seed (the same seed, the same embeddings), and no token ids.

A spec with ``images`` (the image model recipe's ``images``: its ``image_token``, ``image_size``)
serves one image per prompt: a batch with ``"images": [seed per prompt]`` gives each prompt as the
image token, then its token ids as words (``w12 w7 ...``), with an image of noise drawn by that seed.

A P/D producer's spec has ``kv_transfer_params`` (what every request carries: ``do_remote_decode``)
and ``serve_until`` (a path): once its batches are done it writes RESULT.json, with the params
each request's output returned, and keeps its engine stepping, serving the consumer, until that
path exists.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from typing import Any, Mapping, NoReturn

from conformance.levels.engine import separate
from conformance.levels.engine.adapters import LORA_RANK, lora_adapters
from conformance.levels.engine.counters import COUNTERS, StepCounters, logged
from conformance.levels.engine.specs import (
    DEFAULT_KV_CACHE_MB,
    DEFAULT_LOGPROBS,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_MODEL_DTYPE,
    DEFAULT_MODEL_LEN,
    Batch,
    EngineResult,
    EngineSpec,
    Request,
    Step,
)


def _versions() -> dict[str, str]:
    """What the engine really ran with (the parent's Python may have none of it)."""
    from conformance.verdict.results import package_versions

    return package_versions()


def _kv_tensor_dtype(llm: Any) -> str:
    """The dtype of the KV cache tensors the engine really allocated (best effort)."""
    def probe(worker: Any) -> str:
        caches = getattr(worker.model_runner, "kv_caches", None) or []
        return str(caches[0].dtype) if caches else "unknown"

    try:
        return str(llm.collective_rpc(probe)[0])
    except Exception as exc:  # an internal API moved: say so rather than guess
        return f"unknown ({type(exc).__name__})"


def _kv_cache_groups(llm: Any) -> list[str] | str:
    """The KV cache groups the engine's scheduler manages (one per attention type when vLLM's hybrid
    KV cache manager is on), by spec type; best effort, as ``_kv_tensor_dtype``."""
    try:
        config = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config
        return [type(group.kv_cache_spec).__name__ for group in config.kv_cache_groups]
    except Exception as exc:
        return f"unknown ({type(exc).__name__})"


def _device_type() -> str:
    from vllm.platforms import current_platform

    return str(getattr(current_platform, "device_type", "unknown"))


def _record(output: Any, batch: str, idx: int, group: int, delta: dict[str, float], phase: int) -> Request:
    completion = output.outputs[0]
    steps: list[Step] = [{"token": tok, "logprob": lps[tok].logprob.hex(),
                          "top": sorted([k, v.logprob.hex()] for k, v in lps.items())}
                         for tok, lps in zip(completion.token_ids, completion.logprobs or [])]
    return {"batch": batch, "phase": phase, "idx": idx, "group": group,
            "prompt_len": len(output.prompt_token_ids or []),
            "tokens": list(completion.token_ids), "steps": steps,
            "finish_reason": str(completion.finish_reason),
            "num_cached_tokens": output.num_cached_tokens, "counters_delta": delta,
            "kv_transfer_params": getattr(output, "kv_transfer_params", None)}


def _unshadow_llvmlite() -> None:
    """Let vLLM's kernel rebinding scan a process that has imported llvmlite (LMCache -> numba does).

    In an in-process engine, vLLM's worker init (``register_triton_kernel_overrides``) walks every
    module's ``vars()``; ``llvmlite.binding.ffi.lib`` answers any attribute, ``__dict__`` included,
    with a function wrapper, and the walk dies with AttributeError. Giving it an empty ``__dict__``
    changes nothing else (docs/research/engine-prototype.md, section 6.3).
    """
    try:
        import llvmlite.binding.ffi as ffi  # imported now: the connector would import it inside LLM()
    except ImportError:
        return
    table = getattr(getattr(ffi, "lib", None), "_fntab", None)
    if isinstance(table, dict):
        table["__dict__"] = {}


class _Heard(logging.Handler):
    """vLLM's warnings about the KV cache while an engine starts (a dtype it falls back from, a setting
    it overrides): the words a Not runnable quotes."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # a malformed log call: logging's own handlers print it, and the engine goes on
            return
        if "cache" in text.lower() and len(self.lines) < 8:
            self.lines.append(text.strip())


def _reset_prefix_cache(llm: Any, timeout_s: float = 60.0) -> bool:
    """Reset the engine's own prefix cache; False if it still refused at the deadline.

    vLLM refuses while requests hold blocks, and a connector that saves asynchronously keeps a
    finished request's blocks until its save completes, which only engine steps observe: step
    until the reset is accepted.
    """
    deadline = time.monotonic() + timeout_s
    while not llm.reset_prefix_cache():
        if time.monotonic() > deadline:
            return False
        llm.llm_engine.step()
        time.sleep(0.01)
    return True


def run(spec: EngineSpec, result: EngineResult) -> None:
    """Start the engine ``spec`` describes, record what vLLM made of it, serve its batches."""
    started = time.perf_counter()
    result["imported_vllm"] = "vllm" not in sys.modules  # False in a child an engine host forked
    from vllm import LLM

    result["vllm_version"] = __import__("vllm").__version__
    result["versions"] = _versions()
    result["t_import_s"] = round(time.perf_counter() - started, 2)
    _unshadow_llvmlite()
    adapters = lora_adapters(spec["model"], spec["lora_adapter"]) if spec.get("lora_adapter") else {}
    kwargs = engine_kwargs(spec, result, adapters)
    import torch

    if spec.get("torch_threads"):
        torch.set_num_threads(spec["torch_threads"])
    t = time.perf_counter()
    heard = _Heard()
    logging.getLogger("vllm").addHandler(heard)
    try:
        llm = LLM(**kwargs)
    finally:
        logging.getLogger("vllm").removeHandler(heard)
        result["warnings"] = heard.lines
    for adapter in adapters.values():  # an adapter vLLM cannot load here fails the start, not a request
        if not getattr(adapter, "load_inplace", False):  # a version loaded in place replaces its first at once
            llm.llm_engine.add_lora(adapter)
    result["t_engine_start_s"] = round(time.perf_counter() - t, 2)
    counters = StepCounters(llm)
    record(llm, result)
    serve(llm, spec, result, adapters, counters)
    result["counters"] = counters.read()
    result["counters_logged"] = logged(llm)  # vLLM's own (before 0.28: without the steps that had no output)
    result["ok"] = True
    if spec.get("serve_until"):
        _serve_until_released(llm, spec, result)


def engine_kwargs(spec: EngineSpec, result: EngineResult, adapters: Mapping[str, Any]) -> dict[str, Any]:
    """``LLM``'s keyword arguments for ``spec`` (its defaults ``specs``'), and what this vLLM release
    requires of the cell (``releases.engine_settings``: recorded, its environment set)."""
    from vllm.config import KVTransferConfig

    from conformance.levels.releases import engine_settings

    kwargs: dict[str, Any] = dict(
        model=spec["model"], dtype=spec.get("model_dtype", DEFAULT_MODEL_DTYPE), enforce_eager=True,
        block_size=spec["block_size"], max_model_len=spec.get("max_model_len", DEFAULT_MODEL_LEN),
        kv_cache_dtype=spec["kv_cache_dtype"],
        kv_cache_memory_bytes=spec.get("kv_cache_mb", DEFAULT_KV_CACHE_MB) << 20,
        disable_log_stats=False, seed=0, max_num_seqs=spec.get("max_num_seqs", DEFAULT_MAX_NUM_SEQS),
        enable_prefix_caching=True,
        **({"num_gpu_blocks_override": spec["num_blocks"]} if spec.get("num_blocks") else {}),
        # A prompt's prefill in chunks of this many tokens (a split reference: EngineCell.references).
        **({"max_num_batched_tokens": spec["prefill_chunk"], "enable_chunked_prefill": True}
           if spec.get("prefill_chunk") else {}),
    )
    if spec.get("tensor_parallel_size", 1) > 1:  # its ranks in worker processes of vLLM's own executor
        kwargs.update(tensor_parallel_size=spec["tensor_parallel_size"], distributed_executor_backend="mp")
    if spec.get("connector"):
        kwargs["kv_transfer_config"] = KVTransferConfig(**spec["connector"])
    if adapters:
        kwargs.update(enable_lora=True, max_lora_rank=LORA_RANK, max_loras=len(adapters))
    if spec.get("prompt_embeds"):
        kwargs["enable_prompt_embeds"] = True
    if spec.get("images"):
        kwargs["limit_mm_per_prompt"] = {"image": 1}
    result["engine_settings"] = engine_settings(result["vllm_version"], _device_type(), spec["kv_cache_dtype"])
    for rule in result["engine_settings"]:  # what this vLLM release requires of the cell
        kwargs.update(rule["settings"])
        os.environ.update(rule["environment"])  # vLLM reads its environment when it builds the engine
    return kwargs


def record(llm: Any, result: EngineResult) -> None:
    """What vLLM made of the spec: the interpreter, torch's threads, the KV cache it resolved."""
    import torch

    result["process"] = separate.identity()  # once the engine set vLLM's NONE_HASH
    result["torch_threads"] = torch.get_num_threads()  # what the engine computes on (a release may rebind it)
    cache = llm.llm_engine.vllm_config.cache_config
    model_config = llm.llm_engine.vllm_config.model_config
    result["resolved"] = {"cache_dtype": cache.cache_dtype, "block_size": cache.block_size,
                          "kv_cache_layout": str(getattr(cache, "kv_cache_layout", None)),
                          "kv_tensor_dtype": _kv_tensor_dtype(llm),
                          "use_mla": bool(getattr(model_config, "use_mla", False)),
                          "kv_cache_groups": _kv_cache_groups(llm),
                          "device": _device_type()}


def serve(llm: Any, spec: EngineSpec, result: EngineResult, adapters: Mapping[str, Any],
          counters: StepCounters) -> None:
    """Serve the spec's batches, phase by phase (the engine's own prefix cache reset before each
    later phase), recording every request; then, for a storing engine, drain its saves."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    def params(transfer: dict[str, Any] | None) -> Any:
        extra = {"extra_args": {"kv_transfer_params": dict(transfer)}} if transfer else {}
        return SamplingParams(temperature=0.0, max_tokens=spec.get("max_tokens", DEFAULT_MAX_TOKENS),
                              logprobs=spec.get("logprobs", DEFAULT_LOGPROBS), ignore_eos=True, seed=0, **extra)

    records, timings, resets, phase = [], {}, [], 0
    for batch in spec["batches"]:
        if batch.get("phase", 0) != phase:
            phase = batch["phase"]
            time.sleep(spec.get("settle_s", 0))  # what the phase before saved: visible only that long after
            resets.append(_reset_prefix_cache(llm))
        t = time.perf_counter()
        if batch.get("abort_after_steps") is not None:
            result.setdefault("aborted", {})[batch["name"]] = _abandon(llm, batch, params(None))
            timings[batch["name"]] = round(time.perf_counter() - t, 3)
            continue
        salt = {"cache_salt": batch["cache_salt"]} if batch.get("cache_salt") else {}
        if batch.get("embeds"):
            prompts = [_embeds_prompt(llm, seed, len(p), salt) for p, seed in zip(batch["prompts"], batch["embeds"])]
        elif batch.get("images"):
            prompts = [_image_prompt(spec["images"], p, seed, salt) for p, seed in zip(batch["prompts"], batch["images"])]
        else:
            prompts = [TokensPrompt(prompt_token_ids=p, **salt) for p in batch["prompts"]]
        transfers = batch.get("kv_transfer_params") or [spec.get("kv_transfer_params")] * len(prompts)
        pairs = list(zip(prompts, map(params, transfers)))
        groups = [pairs] if batch.get("together") else [[p] for p in pairs]
        idx = 0
        adapter = batch.get("lora")  # True: the first adapter, else its name here
        lora = {"lora_request": adapters["a" if adapter is True else str(adapter)]} if adapter else {}
        for g, group in enumerate(groups):
            if spec.get("cached_prefix"):  # a prefix-cache reference (EngineCell.references)
                _cache_prefixes(llm, [p for p, _ in group], spec["cached_prefix"], salt, lora)
            before = counters.read()
            outputs = llm.generate([p for p, _ in group], [sp for _, sp in group], use_tqdm=False, **lora)
            after = counters.read()
            delta = {k.split(":")[1]: after.get(k, 0) - before.get(k, 0) for k in COUNTERS}
            for out in outputs:
                records.append(_record(out, batch["name"], idx, g, delta, phase))
                idx += 1
        timings[f"{batch['name']}@{phase}" if phase else batch["name"]] = round(time.perf_counter() - t, 3)
    if spec.get("drain"):  # what it stored is read by a later engine: let its saves finish first
        # A served engine keeps stepping while finished requests wait for their saves to be reported
        # (Scheduler.has_requests); LLM.generate stops at the last output. Step until every block is back.
        result["drained"] = _reset_prefix_cache(llm, DRAIN_S)
    result["requests"] = records
    result["prefix_cache_resets"] = resets
    result["t_batches_s"] = timings


def _cache_prefixes(llm: Any, prompts: list[Any], cached: int, salt: dict[str, str], lora: dict[str, Any]) -> None:
    """Leave exactly the first ``cached`` tokens of each prompt longer than that in vLLM's own prefix
    cache: reset it, then serve those tokens (one step each), as the same tenant and adapter."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    if not _reset_prefix_cache(llm):
        raise RuntimeError("vLLM did not reset its prefix cache before a prefix-cache reference")
    heads = [TokensPrompt(prompt_token_ids=p["prompt_token_ids"][:cached], **salt)
             for p in prompts if len(p["prompt_token_ids"]) > cached]
    if heads:
        llm.generate(heads, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, seed=0),
                     use_tqdm=False, **lora)


def _embeds_prompt(llm: Any, seed: int, length: int, salt: dict[str, str]) -> Any:
    """A prompt of ``length`` embeddings drawn by ``seed``, in the model's dtype and hidden size."""
    import torch
    from vllm.inputs import EmbedsPrompt

    config = llm.llm_engine.vllm_config.model_config
    drawn = torch.randn(length, config.get_hidden_size(), generator=torch.Generator().manual_seed(seed))
    return EmbedsPrompt(prompt_embeds=drawn.to(config.dtype), **salt)


def _image_prompt(images: dict[str, Any], words: list[int], seed: int, salt: dict[str, str]) -> dict[str, Any]:
    """A prompt of an image of noise drawn by ``seed`` (``images["image_size"]`` pixels a side), then
    ``words`` as the word-level tokenizer's words; vLLM puts the image's placeholder tokens in place
    of its ``image_token``."""
    import numpy as np
    from PIL import Image

    side = images["image_size"]
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    return {"prompt": " ".join([images["image_token"], *(f"w{t}" for t in words)]),
            "multi_modal_data": {"image": Image.fromarray(pixels)}, **salt}


DRAIN_S = 60.0  # how long a storing engine steps after its last batch for its saves to be reported


def _abandon(llm: Any, batch: Batch, params: Any, timeout_s: float = 60.0) -> dict[str, Any]:
    """Add ``batch``'s requests, step the engine ``abort_after_steps`` times, abort the ones still running
    through the engine's own ``abort_request`` (as a client that went away), step until the engine
    holds no request, and ask vLLM to reset its prefix cache: which it refuses while any block is held."""
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    ids = [f"{batch['name']}-{i}" for i in range(len(batch["prompts"]))]
    for rid, prompt in zip(ids, batch["prompts"]):
        engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt), params)
    finished = set()
    for _ in range(batch["abort_after_steps"]):
        finished |= {out.request_id for out in engine.step() if out.finished}
    running = [rid for rid in ids if rid not in finished]
    engine.abort_request(running)
    deadline = time.monotonic() + timeout_s
    while engine.has_unfinished_requests() and time.monotonic() < deadline:
        engine.step()
    return {"requests": len(ids), "aborted": len(running), "steps": batch["abort_after_steps"],
            "drained": not engine.has_unfinished_requests(), "blocks_back": _reset_prefix_cache(llm, timeout_s)}


def _serve_until_released(llm: Any, spec: EngineSpec, result: EngineResult) -> None:
    """A P/D producer: say it is ready (its result, with each request's kv_transfer_params), then
    keep the engine stepping (finished transfers reported, held blocks freed) until released."""
    _write(spec["result_path"], result)
    deadline = time.monotonic() + spec.get("serve_s", 600)
    while not os.path.exists(spec["serve_until"]) and time.monotonic() < deadline:
        llm.llm_engine.step()
        time.sleep(0.01)


def _write(path: str, result: EngineResult) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)  # the parent never reads half a file


def prepare_environment(spec: Mapping[str, Any]) -> None:
    """The environment an engine runs in, set before vLLM is imported (a host sets it once)."""
    separate.settle()  # a hash seed the suite drew is the interpreter's, never vLLM's
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # In-process engine core: 4-5x cheaper to start than vLLM's default EngineCore process and a
    # third of the memory; the same model code, so the same bits (docs/research/engine-prototype.md).
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if spec.get("multiprocessing") else "0"
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")


def run_spec(spec_path: str, result_path: str) -> NoReturn:
    """Run the engine SPEC.json describes, write RESULT.json, and leave the process."""
    spec = json.loads(open(spec_path).read())
    spec["result_path"] = result_path
    prepare_environment(spec)
    result: EngineResult = {"ok": False}
    try:
        run(spec, result)
    except BaseException as exc:  # everything becomes data for the parent
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-6000:]
    if not (result["ok"] and spec.get("serve_until")):  # a producer wrote its result when it was ready
        _write(result_path, result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if result["ok"] else 3)


if __name__ == "__main__":
    run_spec(sys.argv[1], sys.argv[2])
