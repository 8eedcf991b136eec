"""The engine hosts a matrix run keeps warm (conformance/matrix/hosts.py): each engine cell borrows one
(two where its load engines run in an interpreter of their own) and gives it back for the next, hosts
wait only for the next cells to come, and none outlives the run. The hosts are stand-ins that record
what was done to them; tests/levels/engine/test_host.py lends real ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.matrix import hosts as warm
from conformance.matrix.definition import Cell, Stack, Tier

TIER = Tier("full", "ci", 600)


class FakeHost:
    started: list[FakeHost] = []

    def __init__(self, python: str, log_path: Path, env) -> None:
        self.python, self.log_path, self.stopped, self.dies = python, log_path, False, False
        self.lent = 0
        FakeHost.started.append(self)

    def logged_while_lent(self) -> str:
        return f"host {FakeHost.started.index(self)} log\n"

    def reclaim(self) -> bool:
        self.lent += 1
        return not self.dies

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def started(monkeypatch):
    FakeHost.started = []
    monkeypatch.setattr(warm, "AheadHost", FakeHost)
    return FakeHost.started


def _cell(name, level="engine", stack="vllm-0.32.0", args=()):
    return Cell(name, level, args, TIER, stack=Stack(stack, "0.32.0", None, {}))


def _run(pool, cell, python, tmp_path):
    """A cell borrowing its hosts and giving them back; the hosts it had."""
    hosts = pool.take(cell, python, {})
    pool.give_back(hosts, tmp_path / f"{cell.name}.host.log")
    return hosts


def test_the_cells_of_one_python_borrow_one_host_in_turn_and_none_outlives_the_run(started, tmp_path):
    cells = [_cell("a"), _cell("b"), _cell("store", level="store"), _cell("c")]
    pool = warm.WarmHosts(cells, tmp_path / ".hosts")
    taken = [_run(pool, c, "/venv/bin/python", tmp_path) for c in cells]
    assert taken[2] == []  # a store cell starts no engine
    assert len(started) == 1 and taken[0] == taken[1] == taken[3] == started  # one import for three cells
    assert [(tmp_path / f"{c}.host.log").read_text() for c in "abc"] == ["host 0 log\n"] * 3  # each its part
    assert started[0].stopped  # the last cell gave it back and no cell to come takes it
    pool.close()
    assert not (tmp_path / ".hosts").exists()


def test_the_hosts_of_the_runners_own_python_start_with_the_run(started, tmp_path):
    cells = [_cell("store", level="store"), _cell("a"), _cell("x", stack="vllm-0.31.0")]
    pool = warm.WarmHosts(cells, tmp_path / ".hosts", known={"vllm-0.32.0": ("/own/bin/python", {})})
    assert [h.python for h in started] == ["/own/bin/python"]  # importing while the store cell runs
    assert _run(pool, cells[1], "/own/bin/python", tmp_path) == started
    assert _run(pool, cells[2], "/v31/bin/python", tmp_path)[0].python == "/v31/bin/python"
    pool.close()
    assert all(h.stopped for h in started)


def test_a_host_is_kept_per_stack_python_and_stopped_when_no_cell_to_come_takes_it(started, tmp_path):
    # The full tier, stack after stack: each stack's ExampleConnector cells, then (an hour later) its
    # LMCacheMPConnector ones. Hosts held for those once filled the machine's memory.
    cells = [_cell("e27", stack="vllm-0.27.1"), _cell("e26", stack="vllm-0.26.0"), _cell("e25", stack="vllm-0.25.1"),
             _cell("m27", stack="vllm-0.27.1")]
    python = {c.name: f"/{c.stack.name}/bin/python" for c in cells}
    pool = warm.WarmHosts(cells, tmp_path / ".hosts")
    taken = []
    for cell in cells:
        taken += _run(pool, cell, python[cell.name], tmp_path)
        # Once e25 is under way, m27's host starts, in the interpreter e27 used: the next cell is m27.
        assert [h.python for h in started if not h.stopped] == (["/vllm-0.27.1/bin/python"] if cell.name == "e25" else [])
    assert [h.python for h in taken] == list(python.values()) and taken == started
    assert all(h.stopped for h in started)  # each once no cell to come took it: none waited for m27 an hour


def test_a_cell_that_starts_its_engines_fresh_takes_no_host(started, tmp_path):
    cell = _cell("fresh", args=("--kv-engine-start=fresh",))
    assert warm.WarmHosts([cell], tmp_path / ".hosts").take(cell, "/p", {}) == []
    assert started == []


def test_a_cell_whose_load_engines_run_apart_borrows_two_hosts(started, tmp_path):
    across = ("--kv-connector-capabilities=persistent",)
    cells = [_cell("a", args=across), _cell("b", args=across), _cell("c"),
             _cell("d", args=(*across, "--kv-engine-env=PYTHONHASHSEED=0"))]
    pool = warm.WarmHosts(cells, tmp_path / ".hosts")
    taken = [_run(pool, c, "/p", tmp_path) for c in cells]
    assert taken[0] == taken[1] == started and len(started) == 2 and taken[3] == []  # d starts its own (its env)
    assert taken[2][0] in started  # c borrows one of them
    assert sorted(p.name for p in tmp_path.glob("*.log")) == [
        "a.host-second.log", "a.host.log", "b.host-second.log", "b.host.log", "c.host.log"]


def test_with_two_jobs_two_hosts_serve_the_cells(started, tmp_path):
    cells = [_cell(n) for n in "abcd"]
    pool = warm.WarmHosts(cells, tmp_path / ".hosts", jobs=2)
    first = pool.take(cells[0], "/p", {})
    assert len(started) == 2  # a's, and b's, which runs beside it
    second = pool.take(cells[1], "/p", {})
    pool.give_back(first, tmp_path / "a.log")
    pool.give_back(pool.take(cells[2], "/p", {}), tmp_path / "c.log")
    pool.give_back(second, tmp_path / "b.log")
    pool.give_back(pool.take(cells[3], "/p", {}), tmp_path / "d.log")
    assert len(started) == 2


def test_a_host_that_could_not_be_taken_back_is_lent_no_more(started, tmp_path):
    cells = [_cell("a"), _cell("b")]
    pool = warm.WarmHosts(cells, tmp_path / ".hosts")
    (host,) = pool.take(cells[0], "/p", {})
    host.dies = True  # the cell left it hung, or it died under the cell
    pool.give_back([host], tmp_path / "a.host.log")
    assert _run(pool, cells[1], "/p", tmp_path) == [started[1]] and len(started) == 2


def test_a_host_log_that_cannot_be_written_leaves_the_cell_alone(started, tmp_path):
    # Once, the results directory was emptied under a run (a second run there): the hand-over raised
    # FileNotFoundError and the run died, its cells in flight lost.
    cells = [_cell("a"), _cell("b")]
    pool = warm.WarmHosts(cells, tmp_path / ".hosts")
    hosts = pool.take(cells[0], "/p", {})
    assert pool.give_back(hosts, tmp_path / "gone" / "a.host.log") == []
    assert _run(pool, cells[1], "/p", tmp_path) == hosts  # still lent on
