"""The engine host (conformance.levels.engine.host): vLLM imported once, each engine a forked child
that crashes, hangs and is killed alone, and starts from nothing an engine before it left.

A stand-in ``vllm`` package on PYTHONPATH plays the engine (this session has no vLLM): its ``LLM``
records each start in a module global and then crashes, hangs or raises as its model name says,
so each case runs the host's real protocol and the real child code in milliseconds. The engine
session runs every engine-level cell through the host with the real vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conformance.levels.engine import handover
from conformance.levels.engine.launch import EngineHost, run_engine
from conformance.util.devices import nvidia_gpu

FAKE_VLLM = '''
import os, signal, threading, time

__version__ = "0.0+stand-in"
STARTED = []  # engines started in this process: a fork carries what the host had, and no more

if os.environ.get("FAKE_VLLM_PRINTS"):  # vLLM 0.19's logger prints INFO lines on stdout at import
    print("INFO 12-01 22:49:09 [importing.py:44] Triton is installed but 0 active driver(s) found", flush=True)

if os.environ.get("FAKE_VLLM_THREAD"):
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()


class LLM:
    def __init__(self, model, **kwargs):
        STARTED.append(model)
        if model == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if model == "oom":  # what the kernel's OOM killer does
            os.kill(os.getpid(), signal.SIGKILL)
        if model == "hang":
            time.sleep(3600)
        # what the engine's vLLM would see of its hash seed, and what hash() does in its interpreter
        raise RuntimeError(f"engine {model}: engines started in this process: {len(STARTED)}, "
                           f"PYTHONHASHSEED {os.environ.get('PYTHONHASHSEED')}, hash {hash(b'kvconform')}, "
                           f"pid {os.getpid()}")


class SamplingParams:
    pass
'''


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """The stand-in vLLM on PYTHONPATH, for every Python this test starts."""
    fake = tmp_path / "fake"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text(textwrap.dedent(FAKE_VLLM))
    (fake / "vllm" / "config.py").write_text("class KVTransferConfig(dict):\n    pass\n")
    (fake / "vllm" / "inputs.py").write_text("class TokensPrompt(dict):\n    pass\n")
    (fake / "vllm" / "platforms.py").write_text("class CpuPlatform:\n    device_type = 'cpu'\n\n\n"
                                                "current_platform = CpuPlatform()\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]))
    return fake


@pytest.fixture
def host(fake_vllm, tmp_path):
    engine_host = EngineHost(sys.executable, tmp_path / "host.log", ready_timeout_s=60)
    yield engine_host
    engine_host.close()


def _run(host, tmp_path, model, timeout_s=60.0):
    spec = {"model": model, "kv_cache_dtype": "auto", "block_size": 32, "batches": []}
    return run_engine(spec, tmp_path / "engines", model, timeout_s=timeout_s, python=sys.executable, host=host)


def _pid(run):
    return int(run.error.rsplit("pid ", 1)[1])


def test_each_engine_is_a_fresh_child_of_one_host(host, tmp_path):
    runs = [_run(host, tmp_path, f"engine{i}") for i in range(3)]
    assert all("engines started in this process: 1," in r.error for r in runs), [r.error for r in runs]
    assert len({_pid(r) for r in runs}) == 3  # three processes
    assert host.describe()["ready_s"] is not None and "failed" not in host.describe()


def test_a_crashed_engine_is_data_and_the_host_runs_the_next(host, tmp_path):
    crashed = _run(host, tmp_path, "crash")
    assert not crashed.ok and not crashed.timed_out
    assert crashed.error == "exited -11 without a result (crashed)"
    assert "engines started in this process: 1" in _run(host, tmp_path, "after").error


def test_a_hung_engine_is_killed_at_its_deadline_with_its_group(host, tmp_path):
    hung = _run(host, tmp_path, "hang", timeout_s=3)
    assert hung.timed_out and hung.error == "did not finish within 3s (killed)"
    after = _run(host, tmp_path, "after")
    assert "engines started in this process: 1" in after.error
    assert host.describe().get("failed") is None


def test_a_host_that_would_fork_threads_hands_engines_to_fresh_processes(host, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_THREAD", "1")
    run = _run(host, tmp_path, "fresh")
    assert "Python threads in the host: forking it is unsafe" in host.describe()["failed"]
    assert "engines started in this process: 1" in run.error  # still run, as a process of its own


def test_what_an_import_prints_on_stdout_does_not_break_the_protocol(host, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_PRINTS", "1")
    run = _run(host, tmp_path, "engine0")
    assert "engines started in this process: 1," in run.error, run.error
    assert host.describe()["ready_s"] is not None and "failed" not in host.describe()
    assert "Triton is installed" in (tmp_path / "host.log").read_text()


def _bad_fork_torch(tmp_path):
    """A torch that marks every fork bad, as PyPI's CUDA build does once vLLM's import asked for a device."""
    fake = tmp_path / "bad-fork" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("class _C:\n    _cuda_isInBadFork = staticmethod(lambda: True)\n")
    return fake.parent


@pytest.mark.skipif(nvidia_gpu(), reason="a machine without an NVIDIA GPU")
def test_without_a_gpu_a_host_whose_forks_cannot_use_cuda_still_forks(host, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(_bad_fork_torch(tmp_path)), os.environ["PYTHONPATH"]]))
    run = _run(host, tmp_path, "hosted")
    assert "failed" not in host.describe() and "engines started in this process: 1," in run.error


def test_with_a_gpu_a_host_whose_forks_cannot_use_cuda_refuses(tmp_path, monkeypatch):
    import importlib.util

    from conformance.levels.engine import host as engine_host

    spec = importlib.util.spec_from_file_location("torch", _bad_fork_torch(tmp_path) / "torch" / "__init__.py")
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(engine_host, "nvidia_gpu", lambda: True)
    monkeypatch.setattr(engine_host, "_threads", lambda: 1)
    assert engine_host.refusal() == "importing vLLM made CUDA unusable in the host's forks (torch's bad fork)"
    monkeypatch.setattr(engine_host, "nvidia_gpu", lambda: False)
    assert engine_host.refusal() is None


def test_an_engine_killed_by_a_sigkill_the_suite_did_not_send_is_the_suites_error(host, tmp_path):
    killed = _run(host, tmp_path, "oom")
    assert not killed.ok and killed.killed and killed.suite_error and not killed.timed_out
    assert "SIGKILL the suite did not send (the kernel's OOM killer" in killed.error
    assert not _run(host, tmp_path, "crash").suite_error  # a crash is the connector's to answer for


# A cell as a matrix runner spawns it: its EngineHost adopts the host handed to it, runs one engine
# and says what its host was.
CELL = """
import json, sys
from pathlib import Path
from conformance.levels.engine import handover
from conformance.levels.engine.launch import EngineHost, run_engine
tmp = Path(sys.argv[1])
host = EngineHost(sys.executable, tmp / "own-host.log", ready_timeout_s=60)
spec = {"model": "engine0", "kv_cache_dtype": "auto", "block_size": 32, "batches": []}
run = run_engine(spec, tmp / "engines", "engine0", timeout_s=60, python=sys.executable, host=host)
print(json.dumps({"host": host.describe(), "error": run.error}))
host.close()
"""


def _cell(tmp_path, handed):
    env, fds = handover.spawn_with([handed] if handed is not None else [])
    proc = subprocess.Popen([sys.executable, "-c", CELL, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **env}, pass_fds=fds)
    out, _ = proc.communicate(timeout=120)
    return json.loads(out.splitlines()[-1])


def test_a_host_started_ahead_is_lent_to_one_cell_after_another(fake_vllm, tmp_path):
    ahead = handover.AheadHost(sys.executable, tmp_path / "ahead.log", os.environ)
    said = [_cell(tmp_path, ahead)]
    assert ahead.reclaim()
    said.append(_cell(tmp_path, ahead))  # the same host, its imports not paid again
    assert ahead.reclaim()
    ahead.stop()
    for n, cell in enumerate(said):
        assert cell["host"].get("handed") is True and "failed" not in cell["host"], cell
        assert cell["host"]["hash_seed"] == ahead.hash_seed  # started with a seed of its own, and says so
        assert cell["host"].get("lent", 0) == n  # the second cell knows a cell before it paid the imports
        assert "engines started in this process: 1," in cell["error"]  # forked fresh for each cell
    assert not (tmp_path / "own-host.log").exists()  # no host of its own was started
    assert ahead.lent == 2


def test_a_host_taken_back_from_a_cell_killed_mid_engine_ends_its_engines_first(fake_vllm, tmp_path):
    """A cell killed at its deadline leaves its engine running in the host: taking the host back
    kills it (and reads its end) before the next cell can borrow the host."""
    ahead = handover.AheadHost(sys.executable, tmp_path / "ahead.log", os.environ)
    env, fds = handover.spawn_with([ahead])
    proc = subprocess.Popen([sys.executable, "-c", HANGING_CELL, str(tmp_path)], env={**os.environ, **env},
                            pass_fds=fds, stdout=subprocess.PIPE, text=True)
    engine = int(proc.stdout.readline())  # the engine it asked for, running
    proc.kill()
    proc.wait()
    assert ahead.reclaim()
    assert not os.path.exists(f"/proc/{engine}")  # killed and reaped by its host
    assert _cell(tmp_path, ahead)["host"].get("lent") == 1  # and it serves the next cell
    ahead.stop()


# A cell that asks its lent host for an engine that hangs, says the engine's pid and waits to be killed.
HANGING_CELL = """
import sys, time
from pathlib import Path
from conformance.levels.engine.launch import EngineHost
tmp = Path(sys.argv[1])
host = EngineHost(sys.executable, tmp / "own-host.log", ready_timeout_s=60)
(tmp / "hang.json").write_text('{"model": "hang", "kv_cache_dtype": "auto", "block_size": 32, "batches": []}')
child = host.start(tmp / "hang.json", tmp / "hang-result.json", tmp / "hang.log", {})
print(child.pid, flush=True)
time.sleep(600)
"""


def test_a_cell_handed_no_host_starts_its_own_and_a_stale_hand_over_is_ignored(fake_vllm, tmp_path, monkeypatch):
    monkeypatch.setenv(handover.HANDED_ENV, json.dumps({"pid": 1, "read_fd": 1000, "write_fd": 1001,
                                                        "python": sys.executable, "log": "x"}))
    said = _cell(tmp_path, None)  # the runner passes no hand-over on: the outer value never reaches the cell
    assert "handed" not in said["host"] and said["host"]["ready_s"] is not None
    monkeypatch.setenv(handover.HANDED_ENV, json.dumps({"pid": 1, "read_fd": 1000, "write_fd": 1001,
                                                        "python": sys.executable, "log": "x"}))
    assert handover.adopt(sys.executable) is None  # fds this process does not have: not its host


@pytest.mark.parametrize("python, accept", [("/another/venv/bin/python", True), (sys.executable, False)],
                         ids=["another-python", "declined"])
def test_a_host_handed_for_another_python_or_declined_is_not_adopted_and_ends(fake_vllm, tmp_path, monkeypatch,
                                                                              python, accept):
    """Declined: a connector that declares its engines' environment, which the host was not started with."""
    ahead = handover.AheadHost(sys.executable, tmp_path / "ahead.log", os.environ)
    env, _ = ahead.handed()
    handed = json.loads(env[handover.HANDED_ENV])  # as the cell has it: ends of the pipes of its own
    handed.update(read_fd=os.dup(handed["read_fd"]), write_fd=os.dup(handed["write_fd"]))
    monkeypatch.setenv(handover.HANDED_ENV, json.dumps(handed))
    assert handover.adopt(python, accept=accept) is None
    assert ahead.reclaim()  # the cell closed its ends only: the host is its runner's to lend again
    ahead.stop()


def test_an_engine_that_raised_a_bare_assertion_says_where():
    """vLLM's scheduler asserts with no message; the failure quotes where, from the child's traceback."""
    from conformance.levels.engine.launch import EngineRun

    traceback = ('Traceback (most recent call last):\n  File "/x/core.py", line 667, in step\n'
                 '    out = self.scheduler.schedule()\n          ^^^^^^^^^^^^^^\n  File "/x/scheduler.py", line 1048, '
                 'in schedule\n    assert num_computed_tokens <= request.num_tokens\n           ^^^^^^^^^^^^^^\n'
                 'AssertionError\n')
    said = EngineRun("load", False, {"traceback": traceback}, error="AssertionError: ").describe_failure()
    assert "line 1048, in schedule\n    assert num_computed_tokens <= request.num_tokens\nAssertionError" in said
    assert "^^^" not in said
    assert "raised at" not in EngineRun("load", False, error="boom").describe_failure()
