"""Engines that are really separate processes (conformance/levels/engine/separate.py): a cell's
second engine runs in an interpreter of another hash seed, which vLLM never sees unless the
connector declares it (--kv-engine-env), and what is declared is recorded by name, its value
only where it is no secret. The engine session shows it on a connector keyed by hash()
(tests/levels/engine/test_engine_level.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conformance.levels.engine import separate
from conformance.levels.engine.launch import EngineHost, run_engine
from conformance.levels.engine.roles import SECOND_ENGINE, side_of
from conformance.levels.subject import ConnectorChoice, parse_engine_env
from conformance.matrix import definition
from conformance.report.answers import answers
from conformance.verdict.results import recorded_env, redact_text

from tests.levels.engine.test_host import _run, fake_vllm  # noqa: F401 (a fixture)

PROBE = ("from conformance.levels.engine import separate; import os; separate.settle(); "
         "print(hash(b'kvconform'), os.environ.get('PYTHONHASHSEED'), separate.started_with())")


def _interpreter(env: dict[str, str]) -> list[str]:
    """What an interpreter started with ``env`` says: its hash() probe, the seed left for vLLM, its own."""
    base = {k: v for k, v in os.environ.items() if k not in (separate.HASH_SEED, separate.DRAWN)}
    return subprocess.run([sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True,
                          check=True).stdout.split()


def test_two_drawn_seeds_hash_apart_and_vllm_sees_neither():
    first = separate.draw_seed()
    second = separate.draw_seed(avoid={first})
    assert first != second and "0" not in (first, second)
    a, b = (_interpreter(separate.interpreter_env(seed, {})) for seed in (first, second))
    assert a[0] != b[0]  # hash() of bytes differs, as between two vllm serve processes
    assert a[1:] == ["None", first] and b[1:] == ["None", second]  # started with it, left none for vLLM


def test_a_declared_seed_is_every_engines_and_vllm_sees_it():
    declared = {"PYTHONHASHSEED": "0", "OTHER": "x"}
    envs = [separate.interpreter_env(separate.draw_seed(), declared) for _ in range(2)]
    assert envs[0] == envs[1] == declared
    a, b = (_interpreter(env) for env in envs)
    assert a == b and a[1:] == ["0", "0"]


def test_the_engines_that_load_what_another_stored_run_in_the_second_interpreter():
    assert {side_of(r) for r in SECOND_ENGINE} == {separate.SECOND}
    for role in ("baseline", "store", "same_engine", "lora", "reuse_store", "producer", "twin_baseline",
                 "baseline_split_at_32", "lora_without_connector"):
        assert side_of(role) == separate.FIRST, role


def test_hosts_of_two_seeds_fork_engines_apart_and_a_fresh_engine_gets_its_sides_seed(fake_vllm, tmp_path):  # noqa: F811
    seeds = ("11", "22")
    hosts = [EngineHost(sys.executable, tmp_path / f"host-{s}.log", ready_timeout_s=60,
                        env=separate.interpreter_env(s, {})) for s in seeds]
    try:
        errors = [_run(h, tmp_path / s, "engine").error for h, s in zip(hosts, seeds)]
        assert [h.describe()["hash_seed"] for h in hosts] == list(seeds)
    finally:
        for h in hosts:
            h.close()
    spec = {"model": "fresh", "kv_cache_dtype": "auto", "block_size": 32, "batches": []}
    errors.append(run_engine(spec, tmp_path / "fresh", "fresh", timeout_s=60, python=sys.executable,
                             env=separate.interpreter_env(seeds[1], {})).error)
    found = [re.search(r"PYTHONHASHSEED (\S+), hash (-?\d+)", e).groups() for e in errors]
    assert [seed for seed, _ in found] == ["None"] * 3, errors  # vLLM sees no seed, as in production
    assert found[0][1] != found[1][1] == found[2][1], errors  # the hash seed each side's interpreter has


def test_the_declared_environment_is_parsed_recorded_by_name_and_redacted_in_commands():
    assert parse_engine_env(["PYTHONHASHSEED=0", "A=1=2", "A=3"]) == (("PYTHONHASHSEED", "0"), ("A", "3"))
    for bad in ("NOVALUE", "1X=2", "=3"):
        with pytest.raises(ValueError, match="--kv-engine-env: expected NAME=VALUE"):
            parse_engine_env([bad])
    choice = ConnectorChoice.parse("ExampleConnector", engine_env=["PYTHONHASHSEED=0", "S3_SECRET=hunter2"])
    assert recorded_env(dict(choice.engine_env)) == {"PYTHONHASHSEED": "0", "S3_SECRET": "***"}
    line = redact_text("pytest --kv-engine-env=PYTHONHASHSEED=0 --kv-engine-env BUCKET_URL=s3://b/x")
    assert line == "pytest --kv-engine-env=PYTHONHASHSEED=0 --kv-engine-env BUCKET_URL=***"


def test_a_matrix_entry_declares_its_engine_environment_and_the_report_shows_it(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text("schema: kvconform.matrix/1\ntiers: {quick: {profile: ci}}\nstores: {}\nconnectors:\n"
                    "  h: {connector: 'm:C', engine_env: {PYTHONHASHSEED: 0}, models: [qwen3-tiny],\n"
                    "      kv_cache_dtypes: [auto], levels: [engine], tiers: [quick]}\n")
    (cell,) = definition.load(path).cells("quick")
    assert "--kv-engine-env=PYTHONHASHSEED=0" in cell.args
    path.write_text(path.read_text().replace("{PYTHONHASHSEED: 0}", "[PYTHONHASHSEED]"))
    with pytest.raises(definition.MatrixError, match="engine_env"):
        definition.load(path)
    report_cell = {"coordinates": {"connector": "m:C", "model": "qwen3-tiny", "kv_cache_dtype": "auto"},
                   "statuses": {"engine_store_then_load": "Pass"}, "engine_env": {"PYTHONHASHSEED": "0"}}
    (subject,) = answers([report_cell])["subjects"]
    assert "its engines run with PYTHONHASHSEED=0, as it declares (--kv-engine-env)" in subject["summary"]


# A cell as a matrix runner spawns it with two hosts: each EngineHost adopts the one handed for its side.
TWO_HOSTS = """
import json, sys
from pathlib import Path
from conformance.levels.engine import separate
from conformance.levels.engine.launch import EngineHost, run_engine
tmp = Path(sys.argv[1])
said = {}
for side in separate.SIDES:
    host = EngineHost(sys.executable, tmp / f"own-{side}.log", ready_timeout_s=60, side=side)
    spec = {"model": side, "kv_cache_dtype": "auto", "block_size": 32, "batches": []}
    run = run_engine(spec, tmp / side, side, timeout_s=60, python=sys.executable, host=host)
    said[side] = {"host": host.describe(), "error": run.error}
    host.close()
print(json.dumps(said))
"""


def test_a_cell_handed_two_hosts_runs_each_side_on_its_own(fake_vllm, tmp_path):  # noqa: F811
    from conformance.levels.engine import handover

    ahead = [handover.AheadHost(sys.executable, tmp_path / f"ahead-{side}.log", os.environ) for side in separate.SIDES]
    env, fds = handover.spawn_with(ahead)
    proc = subprocess.Popen([sys.executable, "-c", TWO_HOSTS, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **env}, pass_fds=fds)
    out, _ = proc.communicate(timeout=120)
    for host in ahead:
        assert host.reclaim()
        host.stop()
    said = __import__("json").loads(out.splitlines()[-1])
    for side, host in zip(separate.SIDES, ahead):
        assert said[side]["host"].get("handed") is True and said[side]["host"]["hash_seed"] == host.hash_seed, said
    hashes = [re.search(r"hash (-?\d+)", said[side]["error"]).group(1) for side in separate.SIDES]
    assert hashes[0] != hashes[1], said
    assert not list(tmp_path.glob("own-*.log"))  # no host of its own was started
