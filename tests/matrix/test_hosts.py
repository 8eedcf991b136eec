"""The engine hosts a matrix run keeps warm (conformance/matrix/hosts.py): each engine cell takes one
(two where its load engines run in an interpreter of their own), spares wait only for the next cells
to come, and none outlives the run. The hosts
are stand-ins that record what was done to them; tests/levels/engine/test_host.py hands real ones over."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.matrix import hosts as warm
from conformance.matrix.definition import Cell, Stack, Tier

TIER = Tier("full", "ci", 600)


class FakeHost:
    started: list[FakeHost] = []

    def __init__(self, python: str, log_path: Path, env) -> None:
        self.python, self.log_path, self.stopped = python, log_path, False
        log_path.write_text("host log\n")
        FakeHost.started.append(self)

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def started(monkeypatch):
    FakeHost.started = []
    monkeypatch.setattr(warm, "AheadHost", FakeHost)
    return FakeHost.started


def _cell(name, level="engine", stack="vllm-0.32.0", args=()):
    return Cell(name, level, args, TIER, stack=Stack(stack, "0.32.0", None, {}))


def test_each_engine_cell_takes_a_host_and_a_spare_waits_only_for_a_cell_still_to_come(started, tmp_path):
    cells = [_cell("a"), _cell("b"), _cell("store", level="store"), _cell("c")]
    pool = warm.WarmHosts(cells, tmp_path / ".hosts")
    taken = [pool.take(c, "/venv/bin/python", {}, tmp_path / f"{c.name}.host.log") for c in cells]
    assert taken[2] == []  # a store cell starts no engine
    assert [h.log_path.name for hosts in taken for h in hosts] == ["a.host.log", "b.host.log", "c.host.log"]
    assert len(started) == 3  # a's, then the spare b took, then the spare c took; none after the last
    pool.close()
    assert not any(h.stopped for h in started) and not (tmp_path / ".hosts").exists()


def test_a_spare_is_kept_per_stack_python_and_stopped_when_no_cell_took_it(started, tmp_path):
    cells = [_cell("a"), _cell("x", stack="vllm-0.31.0"), _cell("b")]
    pool = warm.WarmHosts(cells, tmp_path / ".hosts")
    (first,) = pool.take(cells[0], "/v32/bin/python", {}, tmp_path / "a.host.log")
    (other,) = pool.take(cells[1], "/v31/bin/python", {}, tmp_path / "x.host.log")
    assert first.python == "/v32/bin/python" and other.python == "/v31/bin/python"
    # b's spare is started once b is the next cell (while x runs), in the interpreter a's cell used.
    assert [h.python for h in started] == ["/v32/bin/python", "/v31/bin/python", "/v32/bin/python"]
    pool.close()  # b never ran (its stack failed to install, say): its spare is stopped
    assert [h.stopped for h in started] == [False, False, True]


def test_no_spare_waits_for_a_cell_other_stacks_cells_come_before(started, tmp_path):
    # The full tier, stack after stack: each stack's ExampleConnector cells, then (an hour later) its
    # LMCacheMPConnector ones. Spares held for those once filled the machine's memory.
    cells = [_cell("e27", stack="vllm-0.27.1"), _cell("e26", stack="vllm-0.26.0"), _cell("e25", stack="vllm-0.25.1"),
             _cell("m27", stack="vllm-0.27.1")]
    python = {c.name: f"/{c.stack.name}/bin/python" for c in cells}
    pool = warm.WarmHosts(cells, tmp_path / ".hosts")

    for done, cell in enumerate(cells[:3], 1):
        pool.take(cell, python[cell.name], {}, tmp_path / f"{cell.name}.host.log")
        live_spares = sum(not h.stopped for h in started) - done
        assert live_spares == (1 if cell.name == "e25" else 0), cell.name  # m27's, once it is next
    (host,) = pool.take(cells[3], python["m27"], {}, tmp_path / "m27.host.log")
    assert host is started[-1] and host.python == "/vllm-0.27.1/bin/python" and len(started) == 4


def test_a_spare_the_next_cells_no_longer_take_is_stopped_at_once(started, tmp_path):
    cells = [_cell("a"), _cell("b"), _cell("x", stack="vllm-0.31.0")]
    pool = warm.WarmHosts(cells, tmp_path / ".hosts")
    pool.take(cells[0], "/v32/bin/python", {}, tmp_path / "a.host.log")
    assert len(started) == 2  # b's spare
    pool.take(cells[2], "/v31/bin/python", {}, tmp_path / "x.host.log")  # b never ran (its stack failed, say)
    assert started[1].stopped  # no cell to come takes it: stopped now, not when the run ends


def test_a_cell_that_starts_its_engines_fresh_takes_no_host(started, tmp_path):
    cell = _cell("fresh", args=("--kv-engine-start=fresh",))
    assert warm.WarmHosts([cell], tmp_path / ".hosts").take(cell, "/p", {}, tmp_path / "f.log") == []
    assert started == []


def test_a_cell_whose_load_engines_run_apart_takes_two_hosts_and_its_spares_wait(started, tmp_path):
    across = ("--kv-connector-capabilities=persistent",)
    cells = [_cell("a", args=across), _cell("b", args=across), _cell("c"),
             _cell("d", args=(*across, "--kv-engine-env=PYTHONHASHSEED=0"))]
    pool = warm.WarmHosts(cells, tmp_path / ".hosts")
    taken = [pool.take(c, "/p", {}, tmp_path / f"{c.name}.host.log") for c in cells]
    assert [[h.log_path.name for h in hosts] for hosts in taken] == [
        ["a.host.log", "a.host-second.log"], ["b.host.log", "b.host-second.log"], ["c.host.log"], []]
    assert len(started) == 5  # a's two, b's two started while a ran, c's; d starts its own (its declared env)


def test_with_two_jobs_two_spares_wait(started, tmp_path):
    cells = [_cell(n) for n in "abcd"]
    pool = warm.WarmHosts(cells, tmp_path / ".hosts", jobs=2)
    pool.take(cells[0], "/p", {}, tmp_path / "a.log")
    assert len(started) == 3  # a's and two spares for b and c, which run beside each other
    for c in cells[1:]:
        pool.take(c, "/p", {}, tmp_path / f"{c.name}.log")
    assert len(started) == 4  # one per cell in all


def test_a_spare_whose_log_was_removed_under_it_is_stopped_and_its_cell_starts_its_own(started, tmp_path):
    # Once, the results directory was emptied under a run (a second run there): the hand-over raised
    # FileNotFoundError and the run died, its cells in flight lost.
    cells = [_cell("a"), _cell("b")]
    pool = warm.WarmHosts(cells, tmp_path / ".hosts")
    pool.take(cells[0], "/p", {}, tmp_path / "a.host.log")
    (tmp_path / ".hosts" / started[1].log_path.name).unlink()  # b's spare
    assert pool.take(cells[1], "/p", {}, tmp_path / "b.host.log") == []
    assert started[1].stopped
