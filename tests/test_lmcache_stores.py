"""LMCache 0.5.6's real storage backends under the store clauses (needs lmcache: nox -s engine)."""

from __future__ import annotations

import os
import sys

import pytest

pytestmark = pytest.mark.engine

# LMCache's keys carry the torch dtype, uint8 for every vLLM fp8 format; it has nowhere to keep
# k_scale/v_scale. Both are findings the suite must report on every backend.
ALWAYS = {"format_isolation": "Fail", "scales_roundtrip": "Disabled", "byte_exact_roundtrip": "Pass",
          "stride_contract": "Pass", "shape_preserved": "Pass", "metadata_roundtrip": "Pass"}


@pytest.mark.parametrize("store", ["lmcache-cpu", "lmcache-redis"])
def test_lmcache_backend_verdicts(run_suite, store):
    run = run_suite(f"--kv-store={store}", "--kv-profile=ci", timeout=1200,
                    env={"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]})
    statuses = run.statuses()
    assert {c: statuses[c] for c in ALWAYS} == ALWAYS, run.output[-3000:]
    assert not [c for c, s in statuses.items() if s == "Error"], run.output[-3000:]
    (iso,) = [t for t in run.results["tests"] if t["clause"] == "format_isolation"]
    assert "fp8_e" in iso["message"] and "[format_isolation]" in iso["message"]
