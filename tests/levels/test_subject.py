"""The connector under test as the user declares it: capabilities, never guessed, and the private
storage the suite hands it wherever its config says, however nested."""

from __future__ import annotations

import pytest

from conformance.levels.capabilities import (
    CONNECTOR_CAPABILITIES,
    implied,
    parse_capabilities,
    parse_capacity,
    parse_min_span,
    span_pad,
)
from conformance.levels.diagnosis import refuses_platform
from conformance.levels.subject import ConnectorChoice, offloading_worker
from conformance.verdict.clauses import CLAUSES, disabled_reason
from conformance.verdict.guard import HarnessError

DAMAGED: list[tuple[str, str]] = []  # what the test storage hook below was asked to do


class RecordingHook:
    """A user's storage hook: damages what the suite cannot see (here: records the call)."""

    @staticmethod
    def damage(storage: str, how: str) -> str:
        DAMAGED.append((storage, how))
        return f"flipped a byte of the key behind {storage}"


class BrokenHook:
    @staticmethod
    def damage(storage: str, how: str) -> str:
        raise ConnectionError("redis://nowhere refused")


def test_a_capacity_is_a_size():
    assert parse_capacity("persistent,capacity=2MiB") == 2 << 20 and parse_capacity("capacity=4096") == 4096
    assert parse_capabilities("capacity=1KiB") == (frozenset({"capacity"}), None)
    assert parse_capacity("persistent") is None
    for bad in ("capacity", "capacity=x", "capacity=0", "capacity=2MB"):
        with pytest.raises(ValueError, match="capacity"):
            parse_capabilities(bad)


def test_a_min_span_lengthens_prompts_by_whole_blocks():
    assert ConnectorChoice.parse("X", capabilities="persistent,min-span=256").min_span == 256
    assert parse_min_span("persistent") == 0 and ConnectorChoice.parse("X").min_span == 0
    assert (span_pad(256, 32), span_pad(200, 64), span_pad(0, 32)) == (256, 256, 0)
    for bad in ("min-span", "min-span=x", "min-span=0", "min-span=-5"):
        with pytest.raises(ValueError, match="min-span"):
            parse_capabilities(bad)


def test_the_suites_offloading_worker_is_said_where_a_suite_spec_is_named():
    ours = {"spec_name": "OnSuiteWorker", "spec_module_path": "conformance.stores.offloading_cpu", "spec": "p.m:Spec"}
    assert "in place of p.m:Spec's own worker" in offloading_worker(ours)
    assert "a CUDA/XPU worker" in offloading_worker({**ours, "spec": None, "spec_name": "CPUOnlyOffloadingSpec"})
    assert offloading_worker({"kv_connector_extra_config": ours}) == offloading_worker(ours)  # a MultiConnector child
    assert offloading_worker({"spec_name": "MySpec", "spec_module_path": "p.m"}) is None  # its own worker


def test_capabilities_are_declared_and_an_unknown_one_lists_the_valid():
    assert parse_capabilities("persistent, lossy=0.05") == (frozenset({"persistent", "lossy"}), 0.05)
    assert parse_capabilities("") == (frozenset(), None)
    assert parse_capabilities("persistent,one-geometry") == (frozenset({"persistent", "one-geometry"}), None)
    with pytest.raises(ValueError, match="unknown capability 'persistant'; valid: persistent"):
        parse_capabilities("persistant")
    with pytest.raises(ValueError, match="lossy='x' is not a number"):
        parse_capabilities("lossy=x")
    with pytest.raises(ValueError, match="lossy needs its logprob tolerance"):
        parse_capabilities("lossy")
    with pytest.raises(ValueError, match="persistent takes no value"):
        parse_capabilities("persistent=1")
    with pytest.raises(ValueError, match="must be a positive tolerance"):
        parse_capabilities("lossy=-1")
    assert set(CONNECTOR_CAPABILITIES) == {"persistent", "lossy", "pd", "cache", "stats", "events", "hma",
                                            "capacity", "own-server", "min-span", "settle", "one-geometry"}


def test_cross_engine_clauses_are_disabled_for_a_cache_inside_its_engine():
    in_engine = ConnectorChoice.parse("InMem")
    across = [c for c in CLAUSES.values() if c.level in ("connector", "engine") and "persistent" in c.requires
              and c.requires <= {"cache", "persistent"}]
    assert across and all(disabled_reason(c, in_engine.applies, in_engine.label) for c in across)
    for cid in ("api_same_engine_roundtrip", "engine_same_engine_reload", "api_requirements"):
        assert disabled_reason(CLAUSES[cid], in_engine.applies, in_engine.label) is None
    persistent = ConnectorChoice.parse("Files", capabilities="persistent")
    assert not any(disabled_reason(c, persistent.applies, persistent.label) for c in across)
    lossy = ConnectorChoice.parse("Codec", capabilities="persistent,lossy=0.1")
    # A lossy connector's loads are held to its tolerance; only the damage clause (bytes at rest) is off.
    assert disabled_reason(CLAUSES["api_damaged_storage"], lossy.applies, lossy.label)
    for cid in ("api_save_load_roundtrip", "engine_store_then_load"):
        assert disabled_reason(CLAUSES[cid], lossy.applies, lossy.label) is None
    assert lossy.lossy_tolerance == 0.1


def test_storage_placeholder_reaches_every_child():
    extra = ('{"connectors": [{"kv_connector": "ExampleConnector", "kv_connector_extra_config": '
             '{"shared_storage_path": "{storage}/a"}}, {"kv_connector": "X", "kv_connector_extra_config": '
             '{"paths": ["{storage}/b", 3], "url": "redis://h"}}]}')
    cfg = ConnectorChoice.parse("MultiConnector", extra).transfer_config({}, "/run/7")
    children = cfg["kv_connector_extra_config"]["connectors"]
    assert children[0]["kv_connector_extra_config"] == {"shared_storage_path": "/run/7/a"}
    assert children[1]["kv_connector_extra_config"] == {"paths": ["/run/7/b", 3], "url": "redis://h"}
    assert "shared_storage_path" not in cfg["kv_connector_extra_config"]  # the user placed it


def test_without_a_placeholder_the_storage_is_example_connectors_path():
    cfg = ConnectorChoice.parse("pkg.mod:Mine", '{"url": "x"}').transfer_config({"lmcache.mp.port": 1}, "/run/1")
    assert cfg == {"kv_connector": "Mine", "kv_role": "kv_both", "kv_connector_module_path": "pkg.mod",
                   "kv_connector_extra_config": {"shared_storage_path": "/run/1", "lmcache.mp.port": 1, "url": "x"}}


def test_a_subclass_is_not_taken_for_its_base_by_name():
    assert ConnectorChoice.parse("LMCacheMPConnector").is_a("LMCacheMPConnector")
    assert not ConnectorChoice.parse("ExampleConnector").is_a("LMCacheMPConnector")
    # Not importable here: judged by the engine's Python, never guessed from the name.
    assert not ConnectorChoice.parse("no.such.module:LMCacheMPConnector").is_a("LMCacheMPConnector")


@pytest.mark.parametrize("message, refuses", [
    ("Exception: CPU Offloading is currently only supported on CUDA-alike and XPU GPUs", True),  # vLLM 0.32
    ("RuntimeError: Found no NVIDIA driver on your system", True),
    ("AssertionError: Torch not compiled with CUDA enabled", True),
    # A clause's forked process (or a forked engine) after vLLM's import asked PyPI's CUDA torch for a device.
    ("RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must "
     "use the 'spawn' start method", True),
    ("RuntimeError: Index put requires the source and destination dtypes match", False),
    ("ValueError: block_size 16 is not supported; requires a multiple of 32", False),
    ("KeyError: 'model.layers.0.self_attn.attn'", False),
])
def test_a_platform_refusal_names_a_device(message, refuses):
    """Only a refusal that names a device this machine lacks is Not runnable; any other exception a
    connector raises while it is built stays its own Fail."""
    assert refuses_platform(message) is refuses


def test_a_pd_transfer_is_no_prefix_cache_unless_it_says_so():
    """cache is implied for every connector but one that declares pd: a P/D transfer is judged by the
    P/D clauses, and the prefix-cache ones are Disabled for it, never failed."""
    assert implied(frozenset()) == {"cache"} and implied(frozenset({"persistent"})) == {"cache", "persistent"}
    assert implied(frozenset({"pd"})) == {"pd"} and implied(frozenset({"pd", "cache"})) == {"pd", "cache"}
    nixl = ConnectorChoice.parse("NixlConnector", capabilities="pd")
    for cid, applies in (("api_pd_roundtrip", True), ("engine_pd_roundtrip", True), ("api_requirements", True),
                         ("engine_effective_dtype", True), ("api_same_engine_roundtrip", False),
                         ("api_cache_salt", False), ("engine_same_engine_reload", False), ("engine_hma_groups", False)):
        assert (disabled_reason(CLAUSES[cid], nixl.applies, nixl.label) is None) is applies, cid
    example = ConnectorChoice.parse("ExampleConnector", capabilities="persistent")
    assert disabled_reason(CLAUSES["api_same_engine_roundtrip"], example.applies, example.label) is None
    assert disabled_reason(CLAUSES["api_pd_roundtrip"], example.applies, example.label)


def test_a_storage_hook_damages_what_the_suite_cannot_see():
    hooked = ConnectorChoice.parse("Remote", storage_hook=f"{__name__}:RecordingHook")
    assert hooked.damage_with_hook("/run/3", "truncate") == (
        f"the storage hook {__name__}:RecordingHook: flipped a byte of the key behind /run/3")
    assert DAMAGED[-1] == ("/run/3", "truncate")
    assert ConnectorChoice.parse("Files").damage_with_hook("/run/3", "truncate") is None
    with pytest.raises(HarnessError, match="ConnectionError: redis://nowhere refused"):
        ConnectorChoice.parse("Remote", storage_hook=f"{__name__}:BrokenHook").damage_with_hook("/run/3", "truncate")
    with pytest.raises(ValueError, match="is not 'package.module:object'"):
        ConnectorChoice.parse("Remote", storage_hook="just-a-name")


def test_what_the_suite_started_reaches_a_multiconnectors_children():
    """LMCache's server, started for an LMCacheMPConnector child, is handed to the children too (a
    child's own setting wins); a MultiConnector with such a child wants the server."""
    from conformance.levels.services import LMCacheService

    extra = '{"connectors": [{"kv_connector": "LMCacheMPConnector"}, {"kv_connector": "ExampleConnector", ' \
            '"kv_connector_extra_config": {"shared_storage_path": "{storage}/b", "lmcache.mp.port": 7}}]}'
    multi = ConnectorChoice.parse("MultiConnector", extra)
    assert LMCacheService.wanted_by(multi) and not LMCacheService.wanted_by(ConnectorChoice.parse("MultiConnector"))
    children = multi.transfer_config({"lmcache.mp.port": 5}, "/run/2")["kv_connector_extra_config"]["connectors"]
    assert children[0]["kv_connector_extra_config"] == {"lmcache.mp.port": 5}
    assert children[1]["kv_connector_extra_config"] == {"lmcache.mp.port": 7, "shared_storage_path": "/run/2/b"}


def test_a_connector_that_starts_its_own_server_is_given_none():
    """An LMCacheMPConnector (or subclass) declared own-server, or pointed at a server, is judged with
    its own: the suite starts none and supplies nothing (``connector.supplied`` is empty)."""
    from conformance.levels.services import LMCacheService

    assert LMCacheService.wanted_by(ConnectorChoice.parse("LMCacheMPConnector"))
    assert not LMCacheService.wanted_by(ConnectorChoice.parse("LMCacheMPConnector", capabilities="own-server"))
    assert not LMCacheService.wanted_by(ConnectorChoice.parse("LMCacheMPConnector", '{"lmcache.mp.port": 6}'))


def test_kv_transfer_config_fields_reach_vllms_config_as_the_deployment_sets_them(monkeypatch):
    from conformance.levels import subject

    choice = ConnectorChoice.parse("ExampleConnector", transfer_fields=["kv_load_failure_policy=recompute",
                                                                        "kv_buffer_size=1e9", "kv_rank=0"])
    cfg = choice.transfer_config({}, "/run/1")
    assert (cfg["kv_load_failure_policy"], cfg["kv_buffer_size"], cfg["kv_rank"]) == ("recompute", 1e9, 0)
    assert cfg["kv_connector"] == "ExampleConnector"  # the suite's own fields are never overridden
    with pytest.raises(ValueError, match="kv_role is set with --kv-role"):
        ConnectorChoice.parse("ExampleConnector", transfer_fields=["kv_role=kv_producer"])
    with pytest.raises(ValueError, match="expected FIELD=VALUE"):
        ConnectorChoice.parse("ExampleConnector", transfer_fields=["recompute"])
    monkeypatch.setattr(subject, "_transfer_config_fields", lambda: {"kv_load_failure_policy", "kv_role"})
    with pytest.raises(ValueError, match="has no field 'kv_load_failure_polcy'; its fields: kv_load_failure_policy"):
        ConnectorChoice.parse("ExampleConnector", transfer_fields=["kv_load_failure_polcy=fail"])


def test_advice_is_given_only_where_the_error_names_what_to_pass():
    from conformance.levels.diagnosis import cannot_run_here, missing_module

    said = cannot_run_here("C", "ValueError: C needs kv_load_failure_policy='recompute'")
    assert said.endswith("pass --kv-transfer-config kv_load_failure_policy=VALUE")
    assert "--kv-connector-extra-config" in cannot_run_here("C", "KeyError: 'daemon_socket'")
    assert cannot_run_here("C", "TypeError: unsupported operand") == "C could not be built here (TypeError: unsupported operand)"
    assert missing_module("ModuleNotFoundError: No module named 'scipy.signal'") == "scipy.signal"
    assert missing_module("ValueError: no module to speak of") is None


def test_unreachable_storage_says_what_would_reach_it():
    from conformance.levels.subject import unreachable_storage

    named = ConnectorChoice.parse("X", '{"path": "{storage}/kv"}')
    assert "puts '{storage}' in it, but no file was written" in unreachable_storage(named)
    assert "put '{storage}' where its extra config names a place" in unreachable_storage(ConnectorChoice.parse("X"))


def test_a_daemon_backed_connector_gets_a_namespace_private_to_each_run():
    """'{namespace}': one name per run's storage, the same for every engine or pair sharing it."""
    choice = ConnectorChoice.parse("Daemon", '{"socket": "/run/kvd.sock", "namespace": "{namespace}", '
                                             '"tiers": [{"prefix": "{namespace}/l2"}]}')
    a, again, b = (choice.transfer_config({}, s)["kv_connector_extra_config"] for s in ("/run/1", "/run/1", "/run/2"))
    assert a == again and a["namespace"] != b["namespace"] and a["namespace"].startswith("kvconform-")
    assert a["tiers"] == [{"prefix": f"{a['namespace']}/l2"}] and a["socket"] == "/run/kvd.sock"
    assert "shared_storage_path" not in a  # it names a place of its own: no default given


def test_a_settle_delay_is_declared_in_seconds_and_bounded():
    from conformance.levels.capabilities import MAX_SETTLE_S, parse_settle

    assert ConnectorChoice.parse("X", capabilities="persistent,settle=1.5").settle_s == 1.5
    assert parse_settle("persistent") == 0 and ConnectorChoice.parse("X").settle_s == 0
    for bad in ("settle=soon", "settle=0", f"settle={MAX_SETTLE_S + 1}", "settle="):
        with pytest.raises(ValueError, match="settle="):
            ConnectorChoice.parse("X", capabilities=f"persistent,{bad}")


def test_advice_is_given_only_where_what_the_run_saw_supports_it():
    """The min-span hint needs an undeclared span and prompts shorter than any span; the settle hint an
    undeclared delay; none applies, nothing is said."""
    from conformance.levels.advice import LONGEST_SPAN, advised, settle_advice, span_advice

    plain = ConnectorChoice.parse("X", capabilities="persistent")
    declared = ConnectorChoice.parse("X", capabilities="persistent,min-span=64,settle=2")
    assert "had 85 tokens" in span_advice(plain, 85) and "min-span=TOKENS" in span_advice(plain, 85)
    assert span_advice(declared, 85) == span_advice(plain, LONGEST_SPAN) == span_advice(plain, 0) == ""
    assert "settle=SECONDS" in settle_advice(plain) and settle_advice(declared) == ""
    assert advised(span_advice(declared, 85), settle_advice(declared)) == ""
    assert advised(span_advice(plain, 85), settle_advice(plain)).count("; or ") == 1


def test_model_digest_is_the_weights_identity_not_the_directory_name(tmp_path):
    """``{model_digest}``: two checkpoints in directories of one name differ; one checkpoint anywhere is the same."""
    a, b, moved = tmp_path / "a" / "tiny", tmp_path / "b" / "tiny", tmp_path / "c" / "copy"
    for directory, weights in ((a, b"\x01" * 64), (b, b"\x02" * 64), (moved, b"\x01" * 64)):
        directory.mkdir(parents=True)
        (directory / "model.safetensors").write_bytes(weights)
        (directory / "config.json").write_text("{}")
    choice = ConnectorChoice.parse("X", '{"id": "{model}/{model_digest}"}')
    ids = [choice.transfer_config({}, "/run/1", model=m)["kv_connector_extra_config"]["id"] for m in (a, b, moved)]
    assert ids[0].split("/")[0] == ids[1].split("/")[0] == "tiny" and ids[0] != ids[1]
    assert ids[0].split("/")[1] == ids[2].split("/")[1] and len(ids[0].split("/")[1]) == 64  # SHA-256 hex
    with pytest.raises(ValueError, match="holds no weight file"):
        choice.transfer_config({}, "/run/1", model=tmp_path)
