"""A cell's cost model, derived from its results document (``conformance.verdict.cost``): small
documents written here, no engine run."""

from __future__ import annotations

import threading
import time
from typing import Any

from conformance.verdict.clauses import end_test, start_test
from conformance.verdict.cost import Charges, cell_cost, cost_line


def entry(clause: str, seconds: float, nodeid: str = "") -> dict[str, Any]:
    """A clause test's results entry that took ``seconds``."""
    return {"nodeid": nodeid or f"n::{clause}", "clause": clause, "status": "Pass", "duration_s": seconds}


def engine_doc(**timings: Any) -> dict[str, Any]:
    """An engine cell's results: two clauses, three engine runs (one a reused baseline), two hosts."""
    return {
        "schema": "kvconform.results/1",
        "cell": {"id": "c", "wall_s": 40.0},
        "tests": [entry("engine_block_size", 25.0), entry("engine_abort", 0.5), entry("engine_abort", 0.25, "n::b")],
        "connector": {"engine_timings": {
            "baseline": {"wall_s": 1.5, "engine_start_s": 0.4, "batches_s": {"boundaries": 0.1}},
            "bs_baseline": {"wall_s": 13.0, "engine_start_s": 0.9, "reused_from": "/x/b.json"},
            "bs_store": {"wall_s": 0.9, "engine_start_s": 0.5, "batches_s": None},
            "engine_host": {"import_s": 19.5, "ready_s": 11.5, "handed": True},
            "second_engine_host": {"import_s": 20.5, "ready_s": 0.0},
            "engine_starts": 2, "vllm_imports": 2, "lanes": 2, "hash_seeds": {"first": "1"},
            **timings}},
    }


def test_a_cells_cost_is_its_wall_its_clauses_and_its_engines():
    cost = cell_cost(engine_doc())
    assert cost["wall_s"] == 40.0
    # A parametrized clause's tests are summed; slowest first.
    assert cost["clauses_s"] == {"engine_block_size": 25.0, "engine_abort": 0.75}
    assert list(cost["clauses_s"]) == ["engine_block_size", "engine_abort"]
    assert cost["outside_clauses_s"] == 14.25
    assert (cost["engines_started"], cost["engines_reused"], cost["vllm_imports"]) == (2, 1, 2)
    assert (cost["host_import_s"], cost["host_ready_s"]) == (40.0, 11.5)
    # A reused baseline's wall is another cell's: only the engines this cell started have seconds here.
    assert cost["roles_s"] == {"baseline": 1.5, "bs_store": 0.9}
    # Results written before the clause's engine seconds were recorded: not joined, never guessed.
    assert "clause_roles_s" not in cost and "models_s" not in cost
    # A host lent to the cell after an earlier one imported vLLM for that cell, not this one.
    lent = engine_doc(second_engine_host={"import_s": 20.5, "ready_s": 0.0, "lent": True})
    assert cell_cost(lent)["host_import_s"] == 19.5


def test_where_recorded_each_clause_names_the_engines_it_started_or_waited_for():
    cost = cell_cost(engine_doc(clause_roles_s={"engine_block_size": {"baseline": 1.6, "bs_store": 12.0}},
                                models_s={"qwen3-tiny": 0.4, "qwen3-tiny-retrained1": 2.5}))
    assert cost["clause_roles_s"] == {"engine_block_size": {"bs_store": 12.0, "baseline": 1.6}}
    assert cost["models_s"] == {"qwen3-tiny-retrained1": 2.5, "qwen3-tiny": 0.4}
    line = cost_line(cost)
    assert line.startswith("40 s wall, 2 engines started (1 baseline reused), 2 vLLM imports (40 s in its hosts), "
                           "models 2.9 s; slowest clauses: engine_block_size 25 s (on bs_store 12 s, baseline 1.6 s), "
                           "engine_abort 0.8 s"), line
    assert line.endswith("; outside any clause 14 s")


def test_a_store_cell_and_a_bare_run_cost_what_they_recorded():
    store = {"cell": {"id": "memory", "wall_s": 7.0}, "tests": [entry("roundtrip", 0.5), entry("state_machine", 1.0)]}
    cost = cell_cost(store)
    assert cost == {"wall_s": 7.0, "outside_clauses_s": 5.5, "clauses_s": {"state_machine": 1.0, "roundtrip": 0.5}}
    assert cost_line(cost) == "7.0 s wall; slowest clauses: state_machine 1.0 s, roundtrip 0.5 s; outside any clause 5.5 s"
    bare = cell_cost({"tests": [entry("roundtrip", 0.5)]})
    assert bare == {"clauses_s": {"roundtrip": 0.5}}
    assert cost_line(bare) == "no wall recorded; slowest clauses: roundtrip 0.5 s"


def test_the_line_reads_a_key_sorted_matrix_json_in_order_of_seconds():
    cost = cell_cost(engine_doc())
    resorted = {**cost, "clauses_s": dict(sorted(cost["clauses_s"].items()))}  # as json.dumps(sort_keys=True) has it
    assert cost_line(resorted) == cost_line(cost)


def test_a_clause_is_charged_for_the_engines_it_waited_on_each_to_its_own():
    """Nested: a role started with what it needs first charges each run its own seconds; outside a
    clause test, and on another thread (a lane's), nothing is charged."""
    charges = Charges()
    with charges.charge("baseline"):  # no clause test running
        time.sleep(0.01)
    token = start_test("n::engine_store_then_load", "engine_store_then_load")
    try:
        with charges.charge("load"):
            time.sleep(0.05)
            with charges.charge("store"):
                time.sleep(0.1)
        def on_a_lane() -> None:
            with charges.charge("lora"):
                time.sleep(0.01)

        lane = threading.Thread(target=on_a_lane)
        lane.start()
        lane.join()
        with charges.charge("load_again"):  # under 0.005 s: not recorded
            pass
    finally:
        end_test(token)
    recorded = charges.recorded()
    assert set(recorded) == {"engine_store_then_load"} and set(recorded["engine_store_then_load"]) == {"load", "store"}
    load, store = recorded["engine_store_then_load"]["load"], recorded["engine_store_then_load"]["store"]
    assert 0.04 <= load < 0.09 and 0.09 <= store < 0.2, recorded
