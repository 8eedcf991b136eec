"""What an engine cell records for its cost model: per clause, the seconds its test spent on each
engine run, a wait on the second lane charged to the role waited for (engines faked: no vLLM)."""

from __future__ import annotations

import time

from conformance.levels.engine import cell as cells
from conformance.levels.engine.launch import EngineRun
from conformance.levels.subject import ConnectorChoice
from conformance.verdict.clauses import end_test, start_test


def test_each_clause_is_charged_for_the_engines_it_started_or_waited_for(tmp_path, monkeypatch):
    def engine(spec, workdir, role, **_):
        time.sleep(0.2)
        return EngineRun(role, True, {"resolved": {"cache_dtype": spec["kv_cache_dtype"]}, "requests": []}, wall_s=0.2)

    monkeypatch.setattr(cells, "run_engine", engine)
    cell = cells.EngineCell(connector=ConnectorChoice.parse("ExampleConnector"), model=tmp_path / "m",
                            kv_cache_dtype="auto", block_size=16, workdir=tmp_path, timeout_s=5, python="python",
                            hosted=False, lanes=2, clauses=["engine_store_then_load", "engine_block_reuse"])
    token = start_test("n::engine_block_reuse", "engine_block_reuse")
    try:  # the first clause starts the baseline, then waits for the lane's block-reuse pair
        cell.baseline()
        cell.run("reuse_load")
    finally:
        end_test(token)
    token = start_test("n::engine_store_then_load", "engine_store_then_load")
    try:  # load needs store: each is charged its own engine, not the other's
        cell.run("load")
        cell.run("baseline")  # ran before: nothing more to charge
    finally:
        end_test(token)
    cell.close()
    timings = cell.timings()
    charged = timings["clause_roles_s"]
    assert set(charged) == {"engine_block_reuse", "engine_store_then_load"}, charged
    # It waited for reuse_load's run, which the lane ran after reuse_store: both engines' seconds.
    assert set(charged["engine_block_reuse"]) == {"baseline", "reuse_load"}, charged
    assert charged["engine_block_reuse"]["baseline"] >= 0.19 and charged["engine_block_reuse"]["reuse_load"] >= 0.3
    assert set(charged["engine_store_then_load"]) == {"store", "load"}, charged
    assert all(0.19 <= s < 0.39 for s in charged["engine_store_then_load"].values()), charged
    # The lane's engines are charged to no clause: their own walls say what they took.
    assert timings["reuse_store"]["wall_s"] == 0.2 and timings["models_s"] == {}
