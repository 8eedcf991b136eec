"""A matrix run's engine cells on the hosts it kept warm for them, with the real vLLM: each cell's
engines are forked from hosts the runner started and lent it, the second cell borrows the first's
(no vLLM imported again), and no host outlives the run.
(tests/levels/engine/test_host.py hands hosts over with a stand-in vLLM; this is the whole path.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conformance.matrix import definition as matrix
from conformance.matrix import runner
from conformance.verdict.status import Status

pytestmark = pytest.mark.engine

MATRIX = """schema: kvconform.matrix/1
tiers:
  quick: {profile: ci, timeout_s: 900}
stores: {}
connectors:
  ex: {connector: ExampleConnector, capabilities: [persistent], models: [qwen3-tiny],
       kv_cache_dtypes: [auto, bfloat16], levels: [engine], tiers: [quick]}
"""


def test_engine_cells_run_on_hosts_lent_in_turn_and_none_outlives_the_run(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text(MATRIX)
    cells = matrix.load(path).cells("quick")
    assert [c.level for c in cells] == ["engine", "engine"]
    before = set(_hosts_of(os.getpid()))  # this test worker's own, lent to the project's engine runs
    docs = runner.run_cells(cells, tmp_path / "results", say=lambda line: None)
    seeds = {doc["connector"]["engine_timings"]["engine_host"]["hash_seed"] for doc in docs}
    assert len(seeds) == 1  # the same host served both cells
    for n, doc in enumerate(docs):
        timings = doc["connector"]["engine_timings"]
        assert timings["engine_host"].get("handed") is True, timings["engine_host"]
        # two hosts lent: the first engines' and the load engines' (an interpreter of another hash seed),
        # whose imports the first cell paid
        assert "failed" not in timings["engine_host"] and timings["vllm_imports"] == (2 if n == 0 else 0)
        assert timings["engine_host"].get("lent", 0) == n
        assert timings["second_engine_host"].get("handed") is True and "failed" not in timings["second_engine_host"]
        assert timings["second_engine_host"]["hash_seed"] != timings["engine_host"]["hash_seed"]
        assert Status.ERROR.value not in doc["summary"], json.dumps(doc["summary"])
        # the 7 engine clauses ExampleConnector passes (tests/levels/engine/test_engine_level.py: PASSING)
        assert doc["summary"].get(Status.PASS.value, 0) >= 7
    assert sorted(p.name for p in (tmp_path / "results").glob("*.host*.log")) == sorted(
        f"{c.file_stem}.host{side}.log" for c in cells for side in ("", "-second"))
    assert not (tmp_path / "results" / ".hosts").exists()
    assert set(_hosts_of(os.getpid())) <= before  # every host the runner started was stopped


def _hosts_of(parent: int) -> list[int]:
    """The engine hosts still running whose parent is ``parent``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"conformance.levels.engine.host" in cmdline:
            found.append(int(stat.parent.name))
    return found
