"""Engine settings a vLLM release requires (conformance/levels/releases.py), as data."""

from __future__ import annotations

import pytest

from conformance.levels.releases import engine_settings


@pytest.mark.parametrize("vllm, platform, dtype, applies", [
    ("0.19.1", "cpu", "fp8_e5m2", True),  # vllm/platforms/cpu.py 0.19.1 raises without the rule
    ("0.20.2", "cpu", "fp8", True),
    ("0.21.0", "cpu", "fp8_e4m3", False),  # 0.21 dropped the check (and the fallback to auto)
    ("0.19.1", "cpu", "auto", False),
    ("0.19.1", "cpu", "bfloat16", False),
    ("0.19.1", "cuda", "fp8_e5m2", False),
    ("0.19.1+cpu", "cpu", "fp8_e5m2", True),  # a local version part does not count
])
def test_fp8_on_vllm_cpu_up_to_0_20_runs_without_prefix_caching_and_chunked_prefill(vllm, platform, dtype, applies):
    found = [r for r in engine_settings(vllm, platform, dtype) if r["settings"]]
    if not applies:
        assert found == []
        return
    (rule,) = found
    assert rule["settings"] == {"enable_prefix_caching": False, "enable_chunked_prefill": False}
    assert "FP8 KV cache" in rule["why"]


@pytest.mark.parametrize("vllm, applies", [("0.19.1", True), ("0.20.2", False), ("0.32.0", False)])
def test_vllm_cpu_0_19_sizes_its_kv_cache_by_its_environment(vllm, applies):
    """0.19's CPU worker ignores kv_cache_memory_bytes: unset, VLLM_CPU_KVCACHE_SPACE took 11.77 GiB."""
    found = [r["environment"] for r in engine_settings(vllm, "cpu", "auto") if r["environment"]]
    assert found == ([{"VLLM_CPU_KVCACHE_SPACE": "1"}] if applies else [])
